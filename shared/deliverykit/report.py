"""Run reports (JSON) and the evidence lines every delivery prints.

The evidence lines are ``KEY=VALUE``, one per line, so that a log can be checked with ``grep``; the JSON report
holds the same values plus an environment fingerprint, so every figure in a README traces back to a file that
says which device, which versions, which commit and whether the weights were random.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from . import __version__
from .files import write_json_atomic
from .imports import package_version

SCHEMA_VERSION = 1
SCHEMA_PATH = Path(__file__).with_name("schemas") / "run_report.schema.json"

# Printed in this order; EXIT_CODE is printed by errors.run_main on every path, success or not.
EVIDENCE_KEYS = (
    "INPUT_DEVICE",
    "MODEL_DEVICE",
    "OUTPUT_DEVICE",
    "CPU_FALLBACK",
    "LATENT_SHAPE",
    "OUTPUT_SHAPE",
    "EMBEDDING_HEAD",
    "TIMING_MEDIAN_MS",
    "TIMING_P90_MS",
    "PEAK_MEMORY_MB",
)

# Environment variables worth recording; never the whole environment (tokens live there).
_ENV_PREFIXES = ("ASCEND_", "PYTORCH_NPU_", "HCCL_", "TORCH_NPU_")
_ENV_NAMES = ("TASK_QUEUE_ENABLE", "CPU_AFFINITY_CONF", "DELIVERY_DEVICE", "TORCH_DEVICE_BACKEND_AUTOLOAD")
_PACKAGES = ("torch", "torch_npu", "transformers", "diffusers", "accelerate", "safetensors", "numpy")


def format_evidence_value(value: Any) -> str:
    """``true``/``false`` for booleans, ``[1, 2]`` for shapes, 4 decimals for floats, ``n/a`` for None."""
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.4f}"
    if isinstance(value, Sequence) and not isinstance(value, str):
        return "[" + ", ".join(format_evidence_value(v) if isinstance(v, float) else str(v) for v in value) + "]"
    return str(value)


def evidence_lines(evidence: Mapping[str, Any], extra_keys: Sequence[str] = ()) -> list[str]:
    """The ``KEY=VALUE`` lines for the known keys present in ``evidence``, in the documented order.

    ``extra_keys``: a delivery's own keys (all must be present), printed after the documented ones.
    """
    keys = [key for key in EVIDENCE_KEYS if key in evidence] + list(extra_keys)
    return [f"{key}={format_evidence_value(evidence[key])}" for key in keys]


def parse_evidence(text: str) -> dict[str, str]:
    """Read ``KEY=VALUE`` evidence lines back from a log (later lines win)."""
    known = (*EVIDENCE_KEYS, "EXIT_CODE")
    found = {}
    for line in text.splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and key in known:
            found[key] = value
    return found


def cann_version() -> str | None:
    """CANN version: from torch_npu when it is loaded, else from the toolkit's version file."""
    torch = sys.modules.get("torch")
    cann = getattr(getattr(torch, "version", None), "cann", None) if torch else None
    if cann:
        return str(cann)
    home = os.environ.get("ASCEND_HOME_PATH") or "/usr/local/Ascend/ascend-toolkit/latest"
    for candidate in (Path(home) / "version.cfg", Path(home) / "compiler" / "version.info"):
        try:
            for line in candidate.read_text(encoding="utf-8").splitlines():
                if "version" in line.lower() and "=" in line:
                    return line.split("=", 1)[1].strip()
        except OSError:
            continue
    return None


def git_commit(path: str | os.PathLike | None = None) -> str | None:
    """Commit of the checkout holding ``path`` (None outside git), with ``-dirty`` when it has local changes."""
    cwd = Path(path or ".").resolve()
    cwd = cwd if cwd.is_dir() else cwd.parent
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("-dirty" if dirty else "")


def environment_fingerprint(device: Any = None, source_path: str | os.PathLike | None = None) -> dict[str, Any]:
    """Python, platform, package versions, CANN, device name, git commit and the relevant environment variables."""
    from .device import device_name

    env = {
        key: value for key, value in sorted(os.environ.items()) if key.startswith(_ENV_PREFIXES) or key in _ENV_NAMES
    }
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "packages": {name: package_version(name.replace("_", "-")) or package_version(name) for name in _PACKAGES},
        "deliverykit": __version__,
        "cann": cann_version(),
        "device": None if device is None else str(device),
        "device_name": None if device is None else device_name(device),
        "git_commit": git_commit(source_path),
        "env": env,
    }


def build_report(
    kind: str,
    delivery: str,
    *,
    random_weights: bool,
    evidence: Mapping[str, Any] | None = None,
    environment: Mapping[str, Any] | None = None,
    command: Iterable[str] | None = None,
    **sections: Any,
) -> dict[str, Any]:
    """A JSON-ready run report. ``sections`` (e.g. ``timing=``, ``results=``) are stored as given."""
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": kind,
        "delivery": delivery,
        "created_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": list(command if command is not None else sys.argv),
        "random_weights": bool(random_weights),
        "environment": dict(environment or {}),
        "evidence": {key: format_evidence_value(value) for key, value in (evidence or {}).items()},
        **sections,
    }


def delivery_report(
    kind: str, delivery_dir: str | os.PathLike, *, device: Any, random_weights: bool, **sections: Any
) -> dict[str, Any]:
    """:func:`build_report` for the delivery in ``delivery_dir`` (named by its folder), fingerprinted on ``device``.

    What a delivery's scripts and benchmarks write: the git commit is read from the delivery's own checkout.
    """
    delivery_dir = Path(delivery_dir)
    return build_report(
        kind,
        delivery_dir.name,
        random_weights=random_weights,
        environment=environment_fingerprint(device, delivery_dir),
        **sections,
    )


def write_report(path: str | os.PathLike, report: Mapping[str, Any]) -> Path:
    """Write a report atomically (a reader never sees half a file)."""
    return write_json_atomic(path, report)


def load_report(path: str | os.PathLike) -> dict[str, Any]:
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)
