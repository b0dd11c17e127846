"""Fixtures for the trellis2-npu tests: tiny random DINOv3 weights in the hub layout, and the CLI entry point."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from deliverykit.device import guard_cpu_kernels

guard_cpu_kernels()  # in-process CPU runs under a forced ATEN_CPU_CAPABILITY (see its docstring)
DELIVERY_DIR = Path(__file__).resolve().parents[1]
if str(DELIVERY_DIR) not in sys.path:  # the delivery's own package, as `python inference.py` sees it
    sys.path.insert(0, str(DELIVERY_DIR))

from trellis2_npu.smoke import save_random_dinov3  # noqa: E402


@pytest.fixture(scope="session")
def tiny_weights(tmp_path_factory) -> Path:
    """A tiny DINOv3 folder (config.json, preprocessor_config.json, model.safetensors), seed 0. Do not modify."""
    return save_random_dinov3(tmp_path_factory.mktemp("dinov3-tiny"), variant="tiny", seed=0)


@pytest.fixture(scope="session")
def inference_module():
    """``trellis2-npu/inference.py`` imported as a module, to call ``main(argv)`` in process."""
    spec = importlib.util.spec_from_file_location("trellis2_inference", DELIVERY_DIR / "inference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def run_cli(inference_module, capsys):
    """Run the CLI in process like ``python inference.py ARGS``; return (exit code, stdout, stderr)."""
    from deliverykit.errors import run_main

    def run(*argv: str) -> tuple[int, str, str]:
        code = run_main(lambda: inference_module.main([str(a) for a in argv]))
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run
