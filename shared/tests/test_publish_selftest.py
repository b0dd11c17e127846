"""Out-of-tree self-test: a delivery staged outside the monorepo installs, runs and passes its tests on its own.

Cost: one to two minutes per delivery (a fresh venv, ``pip install`` of every pin, torch included, from the package
index or pip's configured find-links, then the smoke run and the delivery's test suite without its ``heavy`` tests,
which the in-tree run covers). Where every pin of the staged locks is the version this interpreter has installed,
the in-tree run has already run those tests on those packages (the same files: the staged copy changes no code), so
the staged run only collects every test module, which proves each imports with only the staged pins and the
vendored deliverykit; ``SELFTEST_ALL_TESTS=1`` runs them anyway. It runs with the rest of shared/tests, so in CI
too; alone: ``pytest shared/tests/test_publish_selftest.py`` (or ``make publish-selftest``). It skips only when pip
cannot reach the index.
"""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from deliverykit.tools import publish

pytestmark = pytest.mark.heavy  # minutes: the root conftest.py starts it first, so it never runs alone at the end
REPO = Path(__file__).resolve().parents[2]
# Variables that could make a child Python find the monorepo's packages (or another environment's).
LEAKING_ENV = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "VIRTUAL_ENV", "PYTEST_ADDOPTS")


def isolated_env(venv: Path) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in LEAKING_ENV}
    env["PATH"] = os.pathsep.join([str(venv / "bin"), *env.get("PATH", "").split(os.pathsep)])
    env["PYTHONNOUSERSITE"] = "1"
    return env


def run(command: list[str], cwd: Path, env: dict[str, str], timeout: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def tail(done: subprocess.CompletedProcess[str]) -> str:
    return (done.stdout + done.stderr)[-3000:]


# ursa-npu's smoke run needs its upstream cloned from GitHub: only its tests run here (the upstream ones skip).
@pytest.mark.parametrize(
    ("delivery", "run_smoke"), [("trellis2-npu", True), ("sulphur2-npu", True), ("ursa-npu", False)]
)
def test_selftest_staged_delivery_works_outside_the_monorepo(tmp_path, delivery, run_smoke):
    if tmp_path.resolve().is_relative_to(REPO.resolve()):
        pytest.skip(f"the temporary folder {tmp_path} is inside the monorepo; set --basetemp outside it")
    if delivery != "trellis2-npu" and sys.version_info < (3, 11):
        pytest.skip(f"{delivery} needs Python >= 3.11 (diffusers 0.42.1)")
    staged = publish.stage_delivery(REPO / delivery, tmp_path / delivery, "modelscope").path
    venv = tmp_path / "venv"
    env = isolated_env(venv)

    probe = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--dest",
        str(tmp_path / "probe"),
        "iniconfig==2.3.0",
    ]
    reached = run(probe, tmp_path, env, 300)
    if reached.returncode != 0:
        pytest.skip(f"pip cannot reach the package index: {tail(reached).strip()[-300:]}")

    created = run([sys.executable, "-m", "venv", str(venv)], tmp_path, env, 300)
    assert created.returncode == 0, tail(created)
    python = str(venv / "bin" / "python")
    # --no-compile: byte-compiling every installed module (torch's thousands) took most of the install's time, and
    # this venv serves a handful of processes (the suite's venv keeps its .pyc files: with PYTHONDONTWRITEBYTECODE
    # set, as on CI machines here, each of its hundreds of test processes would compile torch again)
    install = [
        python,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--no-compile",
        "-r",
        "requirements.txt",
        "-r",
        "requirements-test.txt",
    ]
    installed = run(install, staged, env, 1200)
    assert installed.returncode == 0, tail(installed)

    # Before the tree itself is installed, only a process started in it finds the vendored deliverykit.
    where = "import importlib.util as u; s = u.find_spec('{}'); print(s.origin if s else None)"
    inside = run([python, "-c", where.format("deliverykit")], staged, env, 60)
    assert Path(inside.stdout.strip()) == staged / "deliverykit" / "__init__.py", tail(inside)
    assert run([python, "-c", where.format("deliverykit")], tmp_path, env, 60).stdout.strip() == "None"
    # The staged pyproject.toml installs the delivery's package with that copy, for scripts run from anywhere.
    editable = run([python, "-m", "pip", "install", "--quiet", "--no-deps", "-e", "."], staged, env, 600)
    assert editable.returncode == 0, tail(editable)
    package = delivery.replace("-", "_")
    for name in ("deliverykit", package):
        found = run([python, "-c", where.format(name)], tmp_path, env, 60)
        assert Path(found.stdout.strip()) == staged / name / "__init__.py", tail(found)

    if run_smoke:  # the commands the staged README shows
        for command in publish.load_hub_metadata(staged).smoke:
            smoke = run([python, *command.split()[1:]], staged, env, 600)
            assert smoke.returncode == 0, tail(smoke)
            assert "EXIT_CODE=0" in smoke.stdout
        assert list(staged.glob("outputs/**/report.json")), "the smoke run wrote no report.json"

    # Every test module is collected (so each imports with only the staged pins); the heavy tests are deselected:
    # they run the same code in the in-tree run, and here they doubled CI's time. The others run where some pin
    # differs from the in-tree run's packages (module docstring).
    run_all = bool(os.environ.get("SELFTEST_ALL_TESTS")) or bool(pins_not_installed_here(staged))
    pytest_command = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not heavy"]
    tests = run(pytest_command + ([] if run_all else ["--collect-only"]), staged, env, 1800)
    assert tests.returncode == 0, tail(tests)
    assert (" passed" if run_all else " tests collected") in tests.stdout, tail(tests)


def pins_not_installed_here(staged: Path) -> list[str]:
    """The staged locks' pins (for this platform) whose version this interpreter does not have installed."""
    differ = []
    for lock in ("requirements.txt", "requirements-test.txt"):
        for line in (staged / lock).read_text(encoding="utf-8").splitlines():
            line = line.split(" #", 1)[0].strip()
            if not line or line.startswith(("#", "-")):
                continue
            requirement = Requirement(line)
            if requirement.marker is not None and not requirement.marker.evaluate():
                continue
            try:
                installed = Version(metadata.version(requirement.name)).public  # torch's "+cpu" is a build label
            except metadata.PackageNotFoundError:
                installed = None
            if installed is None or not requirement.specifier.contains(installed, prereleases=True):
                differ.append(f"{requirement} (here: {installed})")
    return differ
