"""pytest helpers shared by the deliveries' tests: device-dependent skips and upstream checkouts.

A test that needs hardware or an upstream checkout skips with a reason that says how to run it, never silently.
``DELIVERYKIT_TEST_DEVICE`` retargets device tests (default ``cpu``); ``RUN_SLOW=1`` enables slow tests.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

TEST_DEVICE_ENV_VAR = "DELIVERYKIT_TEST_DEVICE"


def get_test_device() -> str:
    """The device device-dependent tests run on: ``$DELIVERYKIT_TEST_DEVICE`` or ``cpu``."""
    return os.environ.get(TEST_DEVICE_ENV_VAR, "cpu")


def _npu_reason() -> str | None:
    from .device import probe_npu

    status = probe_npu()
    return None if status.available else f"needs an Ascend NPU ({status.reason})"


def require_npu(test):
    """Skip unless a usable NPU is present."""
    reason = _npu_reason()
    return pytest.mark.skipif(reason is not None, reason=reason or "")(test)


def require_accelerator(test):
    """Skip unless an NPU or a CUDA device is present."""
    from .device import probe_accelerators

    available = any(status.available for status in probe_accelerators().values())
    return pytest.mark.skipif(not available, reason="needs an NPU or a CUDA device")(test)


def slow(test):
    """Skip unless ``RUN_SLOW=1``: long tests stay out of the default ``make test``."""
    return pytest.mark.skipif(os.environ.get("RUN_SLOW") != "1", reason="slow test; run with RUN_SLOW=1")(test)


def upstream_checkout(env_var: str, marker_file: str) -> Path:
    """The upstream checkout named by ``$env_var``, or skip the test saying how to provide one.

    ``marker_file`` is a path inside the checkout that must exist (guards against pointing at the wrong folder).
    """
    value = os.environ.get(env_var)
    if not value:
        pytest.skip(f"needs an upstream checkout: set {env_var}=/path/to/checkout (see the delivery's README)")
    path = Path(value)
    if not (path / marker_file).exists():
        pytest.fail(f"{env_var}={value} does not look like the upstream checkout ({marker_file} missing)")
    return path


def load_script(path: str | os.PathLike, name: str):
    """Import a script (``inference.py``, ``scripts/accuracy.py``) as a module, to call ``main(argv)`` in process."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pristine_copy(source: str | os.PathLike, target: str | os.PathLike, commit: str, paths: list[str]) -> Path:
    """Copy an upstream git checkout to ``target`` and reset ``paths`` to ``commit`` (undoing any local patches).

    Tests patch this copy, never the user's checkout; ``__pycache__`` folders are left behind.
    """
    import shutil
    import subprocess

    target = Path(target)
    shutil.copytree(source, target, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(["git", "-C", str(target), "checkout", "-q", "--force", commit, "--", *paths], check=True)
    return target


def ignore_tests_below_python(minimum: tuple[int, int], why: str) -> list[str]:
    """A conftest's ``collect_ignore_glob``: all its tests when this Python is older than ``minimum``, else none.

    For a delivery whose pinned stack needs a newer Python than the monorepo's floor: ``ci/setup_venv.sh`` leaves
    its requirements out there, so its tests could not even import. Says so on stderr instead of failing.
    """
    if sys.version_info >= minimum:
        return []
    print(f"not collected: {why} (this is Python {sys.version.split()[0]})", file=sys.stderr)
    return ["test_*.py"]


def header_only_png(path: str | os.PathLike, width: int, height: int) -> Path:
    """A PNG whose header says ``width`` x ``height`` and which has no pixel data: a decompression bomb in 45 bytes.

    Pillow checks the size when it opens the file, so it never decodes; a 40000x40000 bomb costs nothing to test.
    """
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)  # 1-bit grayscale
    path = Path(path)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IEND", b""))
    return path
