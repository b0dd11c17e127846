"""Fixtures for the trellis2-npu tests: tiny random DINOv3 weights in the hub layout, and the CLIs in process."""

from __future__ import annotations

from pathlib import Path

import pytest

from deliverykit.device import guard_cpu_kernels
from deliverykit.errors import ExitCode
from deliverykit.testing import CliRunner
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
