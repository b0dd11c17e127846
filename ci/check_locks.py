"""Every lock resolves to wheels on manylinux x86_64 and aarch64 (CPython 3.11), so a pin without wheels is caught
when it is added, not on a user's aarch64 Ascend server.

For each lock and architecture: the lines whose markers apply there (evaluated for the target, which pip's
``--platform`` does not do) go to ``pip install --dry-run --no-deps --only-binary=:all: --platform ...``; the pins
listed in SDIST_EXCEPTIONS are checked apart, for an sdist on the index. One line per lock and architecture.
Needs the package index (CI has it). Exit codes: 0 all resolve, 1 a pin has no wheel (or the index is unreachable),
2 no such lock.

usage: .venv/bin/python ci/check_locks.py [--python-version 3.11 ...] [LOCK ...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
LOCKS = ("trellis2-npu/requirements.txt", "sulphur2-npu/requirements.txt", "ursa-npu/requirements.txt")
LOCKS += ("trellis2-npu/requirements-app.txt", "sulphur2-npu/requirements-app.txt", "ursa-npu/requirements-app.txt")
LOCKS += ("ci/requirements-dev.txt",)
ARCHES = ("x86_64", "aarch64")
# glibc 2.17 (manylinux2014) ... 2.28 (the oldest glibc of the Ascend host OSes we support: EulerOS 2.x, Kylin V10)
MANYLINUX = ("manylinux2014", "manylinux_2_17", "manylinux_2_24", "manylinux_2_27", "manylinux_2_28")
# (architecture, package) -> why pip builds it from the sdist there: known and accepted; everything else needs a wheel.
SDIST_EXCEPTIONS = {
    # scikit-build-core fetches cmake and ninja wheels when the system has none; tests/test_xatlas_sdist.py builds it
    ("aarch64", "xatlas"): "no aarch64 wheel on PyPI; pip builds the sdist (needs a C++17 compiler, Python headers)",
}


def target_environment(arch: str, python_version: str) -> dict[str, str]:
    """PEP 508 marker values of CPython ``python_version`` on manylinux ``arch``."""
    return {
        "implementation_name": "cpython",
        "os_name": "posix",
        "platform_machine": arch,
        "platform_python_implementation": "CPython",
        "platform_system": "Linux",
        "python_full_version": f"{python_version}.0",
        "python_version": python_version,
        "sys_platform": "linux",
        "extra": "",
    }


def pins_for(lock: Path, arch: str, python_version: str) -> list[Requirement]:
    """The requirements of ``lock`` whose markers hold on the target."""
    environment = target_environment(arch, python_version)
    pins = []
    for line in lock.read_text(encoding="utf-8").splitlines():
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        requirement = Requirement(line)
        if requirement.marker is None or requirement.marker.evaluate(environment):
            pins.append(requirement)
    return pins


def _has_sdist(requirement: Requirement) -> bool:
    index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")
    request = urllib.request.Request(
        f"{index}/{canonicalize_name(requirement.name)}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        files = json.load(response)["files"]
    version = next(iter(requirement.specifier)).version
    names = {f"{requirement.name}-{version}.tar.gz", f"{requirement.name}-{version}.zip"}
    return any(file["filename"] in names for file in files)


def check(lock: str, arch: str, python_version: str) -> tuple[bool, str]:
    """(ok, the one report line) for one lock on one architecture."""
    started = time.monotonic()
    pins = pins_for(REPO / lock, arch, python_version)
    exceptions = [pin for pin in pins if (arch, canonicalize_name(pin.name)) in SDIST_EXCEPTIONS]
    wheels = [pin for pin in pins if pin not in exceptions]
    platforms = [argument for tag in MANYLINUX for argument in ("--platform", f"{tag}_{arch}")]
    with tempfile.TemporaryDirectory() as work:
        requirements = Path(work) / "requirements.txt"
        requirements.write_text("\n".join(str(pin) for pin in wheels) + "\n", encoding="utf-8")
        command = [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--ignore-installed", "--no-deps"]
        command += ["--only-binary=:all:", *platforms, "--python-version", python_version, "--implementation", "cp"]
        command += ["--target", str(Path(work) / "target"), "-r", str(requirements)]
        result = subprocess.run(command, capture_output=True, text=True)
    errors = [line for line in result.stderr.splitlines() if line.startswith("ERROR:")]
    notes = []
    ok = result.returncode == 0
    for pin in exceptions:
        reason = SDIST_EXCEPTIONS[(arch, canonicalize_name(pin.name))]
        try:
            has_sdist = _has_sdist(pin)
        except OSError as err:
            ok = False
            notes.append(f"could not read the index for {pin.name}: {err}")
            continue
        if has_sdist:
            notes.append(f"sdist (listed exception) {pin}: {reason}")
        else:
            ok = False
            notes.append(f"{pin} is a listed sdist exception but has no sdist on the index")
    status = f"{len(wheels)} wheels" if result.returncode == 0 else "; ".join(errors) or result.stderr.strip()[-300:]
    elapsed = time.monotonic() - started
    line = f"{'ok  ' if ok else 'FAIL'} {lock} cp{python_version.replace('.', '')} {arch}: {status}"
    return ok, line + "".join(f"; {note}" for note in notes) + f" ({elapsed:.0f} s)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("locks", nargs="*", default=list(LOCKS))
    parser.add_argument("--python-version", action="append", help="target CPython (repeatable; default 3.11)")
    args = parser.parse_args(argv)
    versions = args.python_version or ["3.11"]
    for lock in args.locks:
        if not (REPO / lock).is_file():
            print(f"error: lock {lock} does not exist; pass a path relative to the repo root", file=sys.stderr)
            return 2
    jobs = [(lock, arch, version) for version in versions for lock in args.locks for arch in ARCHES]
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda job: check(*job), jobs))
    for _, line in results:
        print(line)
    return 0 if all(ok for ok, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
