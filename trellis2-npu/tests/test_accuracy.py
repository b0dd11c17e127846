"""The CPU-vs-target accuracy runner: a self-check passes exactly, and a real precision loss is caught."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from deliverykit.errors import ExitCode

from .conftest import DELIVERY_DIR

SCRIPT = DELIVERY_DIR / "scripts" / "accuracy.py"


def _run(tmp_path, *extra: str) -> tuple[subprocess.CompletedProcess, dict]:
    output = tmp_path / "accuracy.json"
    command = [sys.executable, str(SCRIPT), "--smoke", "tiny", "--samples", "1", "--output", str(output), *extra]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    return result, json.loads(output.read_text()) if output.exists() else {}


@pytest.mark.heavy
def test_cpu_self_check_passes_and_reports_determinism(tmp_path):
    result, report = _run(tmp_path, "--target", "cpu", "--precision-patch")
    results = report["results"]
    # Two CPU processes give identical features on an idle machine; under heavy load their BLAS rounding was seen to
    # differ by ~1e-6. The harness must report either case truthfully: exit 0 only when the baseline repeated
    # exactly, exit 8 otherwise, and a self-check sample never beyond rounding.
    deterministic = results["determinism"]["deterministic"]
    assert result.returncode == (0 if deterministic else ExitCode.ACCURACY), result.stderr
    assert results["determinism"]["max_abs"] < 1e-5
    assert results["self_check"] is True
    sample = results["samples"][0]
    assert sample["max_abs"] < 1e-5 and sample["verdict"] == "pass" and results["summary"]["verdict"] == "pass"
    assert "self-check" in results["tables"][0]["title"]
    assert (tmp_path / "accuracy.md").read_text().startswith("| passing |")


@pytest.mark.heavy
def test_precision_loss_is_reported_and_localized(tmp_path):
    """bf16 on the target side is a real numerical difference: the runner must not call it a pass."""
    result, report = _run(tmp_path, "--target", "cpu", "--dtype", "bf16", "--localize")
    assert result.returncode == ExitCode.ACCURACY, result.stderr
    sample = report["results"]["samples"][0]
    assert sample["verdict"] in ("fixable", "fail") and sample["max_abs"] > 0.01
    divergence = report["results"]["first_divergence"]
    assert divergence is not None and divergence["max_abs"] > 0.01
    assert "first diverging layer" in result.stdout
