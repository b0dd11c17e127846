"""ci/setup_venv.sh with a platform ("system") torch: what ci/system_torch.py keeps and what the script refuses.

The full run on a real system torch (set-up, smokes and the suite on torch 2.6.0 and 2.9.0) is ci/compat_check.py;
these are the parts that need no install.
"""

from __future__ import annotations

import importlib.metadata as metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
LOCKS = ["trellis2-npu/requirements.txt", "sulphur2-npu/requirements.txt", "ursa-npu/requirements.txt"]


def _lock_names(path: Path) -> list[str]:
    names = []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split(" #", 1)[0].strip()
        if line and not line.startswith("#"):
            names.append(canonicalize_name(Requirement(line).name))
    return names


def test_system_torch_constrains_torch_and_leaves_out_what_torch_requires(tmp_path):
    """This interpreter's torch plays the platform torch; its Requires-Dist, read here with packaging, is the
    independent reference for which lock lines must go."""
    requirements, constraints = tmp_path / "requirements.txt", tmp_path / "constraints.txt"
    subprocess.run(
        [sys.executable, "ci/system_torch.py", str(requirements), str(constraints), *LOCKS],
        cwd=REPO,
        check=True,
        capture_output=True,
    )
    assert constraints.read_text().split() == [f"torch=={metadata.version('torch')}"]

    direct = set()
    for line in metadata.requires("torch") or []:
        requirement = Requirement(line)
        if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
            direct.add(canonicalize_name(requirement.name))
    direct.discard("setuptools")  # kept from the lock on purpose: the venv builds `pip install -e shared` with it
    kept = set(_lock_names(requirements))
    locked = {name for lock in LOCKS for name in _lock_names(REPO / lock)}
    assert "sympy" in direct and "sympy" in locked  # the pin that made pip replace torch 2.6
    assert not kept & (direct | {"torch", "torch-npu"})
    assert {"transformers", "diffusers", "safetensors"} <= kept
    # nothing else is lost: a dropped name is torch's, or (transitively) one of its requirements' requirements
    for name in locked - kept:
        assert name in direct or name in {"torch", "mpmath", "markupsafe"}, name


@pytest.mark.skipif(sys.prefix == sys.base_prefix, reason="needs to run inside a venv (as `make test` does)")
def test_setup_venv_refuses_a_python_that_is_itself_a_venv(tmp_path):
    target = tmp_path / "venv"
    env = dict(os.environ, PYTHON=sys.executable, VENV=str(target))
    result = subprocess.run(["ci/setup_venv.sh"], cwd=REPO, env=env, capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "virtual environment" in lines[0]
    assert f"PYTHON={sys._base_executable}" in lines[0]
    assert not target.exists()


def _check_locks():
    from deliverykit.testing import load_script

    return load_script(REPO / "ci" / "check_locks.py", "check_locks")


def test_check_locks_evaluates_markers_for_the_target_not_this_machine():
    """pip's --platform leaves markers to the running machine; the check must judge them for the target."""
    check_locks = _check_locks()
    dev = REPO / "ci" / "requirements-dev.txt"
    names = {arch: {pin.name for pin in check_locks.pins_for(dev, arch, "3.11")} for arch in ("x86_64", "aarch64")}
    assert "spconv" in names["x86_64"] and "spconv" not in names["aarch64"]  # its marker: platform_machine == x86_64
    assert "pytest" in names["aarch64"]
    assert "tomli" not in names["x86_64"]  # python_version < "3.11"
    assert "tomli" in {pin.name for pin in check_locks.pins_for(dev, "x86_64", "3.10")}


def test_every_listed_sdist_exception_is_pinned_in_a_lock():
    """The exception list stays explicit: an entry for a package no lock pins any more is stale."""
    check_locks = _check_locks()
    for arch, name in check_locks.SDIST_EXCEPTIONS:
        pinned = {
            canonicalize_name(pin.name)
            for lock in check_locks.LOCKS
            for pin in check_locks.pins_for(REPO / lock, arch, "3.11")
        }
        assert name in pinned, f"{name} ({arch}) is listed in SDIST_EXCEPTIONS but no lock pins it there"


@pytest.mark.parametrize("delivery", ["trellis2-npu", "sulphur2-npu", "ursa-npu"])
def test_app_lock_only_adds_to_the_delivery_lock(delivery):
    """requirements-app.txt is installed on top of requirements.txt: a name in both could pin two versions."""
    app = _lock_names(REPO / delivery / "requirements-app.txt")
    assert "gradio" in app and len(app) == len(set(app))
    assert not set(app) & set(_lock_names(REPO / delivery / "requirements.txt"))
