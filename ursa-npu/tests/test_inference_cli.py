"""Bad input to inference.py that is refused before any upstream code or weights are needed."""

from __future__ import annotations

import pytest

from deliverykit.errors import ExitCode


@pytest.fixture(autouse=True)
def _no_upstream(monkeypatch):
    monkeypatch.delenv("URSA_SRC", raising=False)
    monkeypatch.delenv("DELIVERY_DEVICE", raising=False)


def test_needs_weights_or_smoke_and_a_prompt(run_cli, tmp_path):
    code, _, err = run_cli("--output", tmp_path / "out.jpg")
    assert code == ExitCode.USAGE and "pass --weights DIR" in err
    code, _, err = run_cli("--weights", tmp_path, "--output", tmp_path / "out.jpg")
    assert code == ExitCode.USAGE and "--prompt is required" in err


def test_output_must_be_an_image_file_in_a_writable_place(run_cli, tmp_path):
    code, _, err = run_cli("--smoke", "--output", tmp_path / "out.gif")
    assert code == ExitCode.USAGE and "use a .jpg, .jpeg or .png" in err
    blocker = tmp_path / "file"
    blocker.write_text("")
    code, _, err = run_cli("--smoke", "--device", "cpu", "--output", blocker / "out.jpg")
    assert code == ExitCode.OUTPUT and err.count("error: ") == 1 and "exists and is not a folder" in err


def test_npu_requested_without_one(run_cli, tmp_path):
    code, _, err = run_cli("--smoke", "--device", "npu", "--output", tmp_path / "out.jpg")
    assert code == ExitCode.DEVICE and "--device npu requested but" in err
    assert not list(tmp_path.iterdir())  # nothing written


def test_weights_folder_without_model_index(run_cli, tmp_path):
    code, _, err = run_cli("--weights", tmp_path, "--prompt", "x", "--device", "cpu", "--output", tmp_path / "o.jpg")
    assert code == ExitCode.WEIGHTS and "has no model_index.json" in err
    assert not (tmp_path / "o.jpg").exists()


def test_no_upstream_checkout_names_the_clone_command(run_cli, tmp_path):
    code, _, err = run_cli("--smoke", "--device", "cpu", "--output", tmp_path / "out.jpg")
    assert code == ExitCode.INPUT
    assert "no --upstream, no $URSA_SRC" in err and "deliverykit upstream clone --delivery ursa-npu" in err


def test_unsupported_size_names_the_nearest_valid_values(run_cli, tmp_path):
    code, _, err = run_cli("--smoke", "--device", "cpu", "--height", "33", "--output", tmp_path / "out.jpg")
    assert code == ExitCode.USAGE and "--height 33 is not supported" in err and "nearest valid: 32 or 34" in err
