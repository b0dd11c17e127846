"""``deliverykit env``: a paste-ready environment check with ``[PASS]``/``[FAIL]``/``[INFO]`` lines.

Exits non-zero only on what blocks inference: torch missing, or an explicitly requested device (``--device``)
that is not usable. A missing NPU on a CPU machine is information, not a failure.
"""

from __future__ import annotations

import argparse
import platform
import sys
from dataclasses import dataclass

from deliverykit.imports import is_package_installed, package_version


@dataclass
class Check:
    status: str  # PASS | FAIL | INFO
    name: str
    detail: str

    def line(self) -> str:
        return f"[{self.status}] {self.name}: {self.detail}"


def collect_checks(device: str | None = None) -> list[Check]:
    """Compute the checks; printing is left to the caller."""
    checks = [Check("PASS" if sys.version_info >= (3, 10) else "FAIL", "python", platform.python_version())]
    if not is_package_installed("torch"):
        checks.append(Check("FAIL", "torch", "not installed; pip install -r <delivery>/requirements.txt"))
        return checks
    import torch

    from deliverykit.device import probe_cuda, probe_npu, resolve_device
    from deliverykit.errors import DeliveryError
    from deliverykit.report import cann_version

    checks.append(Check("PASS", "torch", torch.__version__))
    npu = probe_npu()
    npu_version = package_version("torch-npu") or package_version("torch_npu")
    checks.append(Check("PASS" if npu.available else "INFO", "torch_npu", f"{npu_version or 'not installed'}"))
    checks.append(Check("INFO", "CANN", cann_version() or "not found"))
    checks.append(Check("PASS" if npu.available else "INFO", "npu devices", f"{npu.device_count} ({npu.reason})"))
    cuda = probe_cuda()
    checks.append(Check("PASS" if cuda.available else "INFO", "cuda devices", f"{cuda.device_count} ({cuda.reason})"))
    for package in ("transformers", "diffusers", "safetensors", "accelerate"):
        checks.append(Check("INFO", package, package_version(package) or "not installed"))
    try:
        resolved = resolve_device(device)
        checks.append(Check("PASS", "device", f"{device or 'auto'} -> {resolved}"))
    except DeliveryError as err:
        checks.append(Check("FAIL", "device", str(err)))
    return checks


def env_command(args: argparse.Namespace) -> int:
    checks = collect_checks(args.device)
    for check in checks:
        print(check.line())
    failed = [c for c in checks if c.status == "FAIL"]
    print(f"{len(checks) - len(failed)} passed, {len(failed)} failed" if failed else "environment OK")
    return 1 if failed else 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("env", help="check python, torch, torch_npu, CANN and devices")
    parser.add_argument("--device", default=None, help="device to check (auto|npu|npu:N|cuda|cuda:N|cpu)")
    parser.set_defaults(func=env_command)
