"""Bad input to inference.py that is refused before any upstream code or weights are needed."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from deliverykit.errors import ExitCode

from .conftest import DELIVERY_DIR
from .test_loader import make_folder


@pytest.fixture(autouse=True)
def _no_upstream(monkeypatch):
    monkeypatch.delenv("URSA_SRC", raising=False)
    monkeypatch.delenv("DELIVERY_DEVICE", raising=False)


def test_needs_weights_or_smoke_and_a_prompt(run_cli, tmp_path):
    code, _, err = run_cli("--output", tmp_path / "out.jpg")
    assert code == ExitCode.USAGE and "pass --weights DIR" in err
    code, _, err = run_cli("--weights", tmp_path, "--output", tmp_path / "out.jpg")
    assert code == ExitCode.USAGE and "--prompt is required" in err


def test_output_must_be_an_image_file(run_cli, tmp_path):
    code, _, err = run_cli("--smoke", "--output", tmp_path / "out.gif")
    assert code == ExitCode.USAGE and "use a .jpg, .jpeg or .png" in err


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


def _one_error_line(code, out, err, expected: ExitCode, match: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == expected and f"EXIT_CODE={int(expected)}" in out, err
    assert len(lines) == 1 and lines[0].startswith("error: ") and match in lines[0], err


@pytest.mark.parametrize("side", ["height", "width"])
def test_a_zero_size_is_refused_not_replaced_by_the_default(run_cli, tmp_path, side):
    _one_error_line(
        *run_cli("--smoke", "--device", "cpu", f"--{side}", "0", "--output", tmp_path / "out.jpg"),
        ExitCode.USAGE, f"--{side} 0 is not supported",
    )  # fmt: skip
    assert list(tmp_path.iterdir()) == []


def test_a_vae_config_that_is_not_json_names_the_file(run_cli, tmp_path):
    (tmp_path / "URSA").mkdir()
    folder = make_folder(tmp_path / "URSA")
    (folder / "vae" / "config.json").write_text("{not json")
    out = tmp_path / "out"
    _one_error_line(
        *run_cli("--weights", folder, "--prompt", "x", "--device", "cpu", "--output", out / "o.jpg"),
        ExitCode.WEIGHTS, f"{folder / 'vae' / 'config.json'} is not valid JSON",
    )  # fmt: skip
    assert not out.exists()


def test_bad_arguments_are_refused_before_torch_is_imported():
    """inference.py imports everything at its top; none of it imports torch, so a usage error takes no model stack."""
    probe = (
        "import sys; from deliverykit.testing import CliRunner; "
        "code, _, err = CliRunner(sys.argv[1])('--smoke', '--output', 'out.gif'); "
        "print(code, 'torch' in sys.modules, 'diffnext' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, DELIVERY_DIR / "inference.py"], capture_output=True, text=True, timeout=120
    )
    assert done.stdout.split() == [str(int(ExitCode.USAGE)), "False", "False"], done.stderr


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"prompt": "a cat", "height": 33}', r"b.jsonl:2: --height 33 is not supported"),
        ('{"negative_prompt": "blur"}', r"b.jsonl:2: missing prompt"),
    ],
)
def test_a_bad_batch_line_is_refused_with_its_line_before_anything_loads(run_cli, tmp_path, line, message):
    batch_file = tmp_path / "b.jsonl"
    batch_file.write_text('{"prompt": "fine"}\n' + line + "\n")
    code, _, err = run_cli("--smoke", "--batch", batch_file, "--output", tmp_path / "out")  # no upstream needed
    assert code == ExitCode.USAGE and err.count("error: ") == 1
    assert re.search(message, err), err
    assert not (tmp_path / "out").exists()


def test_batch_takes_no_prompt_flag(run_cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "b.txt").write_text("a cat\n")
    code, _, err = run_cli("--smoke", "--batch", "b.txt", "--prompt", "x", "--output", tmp_path / "out.jpg")
    assert code == ExitCode.USAGE and "--batch takes the prompts from its file" in err
