"""Fixtures for the trellis2-npu tests: tiny random DINOv3 weights, the CLIs in process, a patched upstream copy."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from deliverykit.device import guard_cpu_kernels
from deliverykit.errors import ExitCode
from deliverykit.testing import CliRunner, upstream_checkout
from trellis2_npu.tiny import save_random_dinov3

guard_cpu_kernels()  # in-process CPU runs under a forced ATEN_CPU_CAPABILITY (see its docstring)
DELIVERY_DIR = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def tiny_weights(tmp_path_factory) -> Path:
    """A tiny DINOv3 folder (config.json, preprocessor_config.json, model.safetensors), seed 0. Do not modify."""
    return save_random_dinov3(tmp_path_factory.mktemp("dinov3-tiny"), variant="tiny", seed=0)


@pytest.fixture(scope="session")
def run_cli() -> CliRunner:
    """``inference.py`` (image → 3D) run in process like ``python inference.py ARGS``: (exit code, stdout, stderr)."""
    return CliRunner(DELIVERY_DIR / "inference.py")


@pytest.fixture(scope="session")
def run_conditioning() -> CliRunner:
    """``scripts/conditioning.py`` (DINOv3 features) run in process: (exit code, stdout, stderr)."""
    return CliRunner(DELIVERY_DIR / "scripts" / "conditioning.py")


def assert_failed_cleanly(result, code: ExitCode, message: str, output_dir) -> None:
    """One ``error:`` line holding ``message``, exit ``code`` (also as EXIT_CODE=), no traceback, no --output left."""
    exit_code, stdout, stderr = result
    assert exit_code == code, stderr
    lines = [line for line in stderr.splitlines() if line.strip() and not line.startswith("Loading weights")]
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], stderr
    assert f"EXIT_CODE={int(code)}" in stdout and "Traceback" not in stderr
    assert not output_dir.exists(), "a failed run left its --output folder (or files in it) behind"


@pytest.fixture(scope="session")
def pristine(tmp_path_factory) -> Path:
    """A scratch clone of the checkout at the pinned commit, without local changes (patches not applied)."""
    source = upstream_checkout("TRELLIS2_SRC", "trellis2/__init__.py")
    pin = json.loads((DELIVERY_DIR / "patches" / "upstream.json").read_text())["commit"]
    target = tmp_path_factory.mktemp("upstream") / "TRELLIS.2"
    shutil.copytree(source, target, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    if (target / ".git").exists():
        subprocess.run(["git", "-C", str(target), "checkout", "-q", "--force", pin, "--", "trellis2"], check=True)
    return target


@pytest.fixture(scope="session")
def patched(pristine: Path, tmp_path_factory) -> Path:
    target = tmp_path_factory.mktemp("patched") / "TRELLIS.2"
    shutil.copytree(pristine, target, symlinks=True)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "deliverykit",
            "patches",
            "apply",
            "--delivery",
            str(DELIVERY_DIR),
            "--upstream",
            str(target),
        ],
        cwd=DELIVERY_DIR.parent,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return target


# Start-up refusals that app.py and serve.py share with inference.py (argv, exit code, what the error line names);
# "UPSTREAM" stands for the patched checkout, which only the cases that get that far need.
START_UP_REFUSALS = [
    (("--smoke", "--texture-size", "1000"), ExitCode.USAGE, "--texture-size 1000"),
    (("--weights", "/nonexistent/TRELLIS.2-4B", "--upstream", "UPSTREAM"), ExitCode.WEIGHTS, "pipeline.json"),
    (
        ("--smoke", "--upstream", "UPSTREAM", "--rembg-model", "/nonexistent/BiRefNet"),
        ExitCode.WEIGHTS,
        "--rembg-model /nonexistent/BiRefNet: no folder",
    ),
]
