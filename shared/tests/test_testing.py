"""Skip helpers: they skip with a reason that says how to run the test, and run when the condition holds."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch

from deliverykit import device as devices
from deliverykit import testing


def _skip_marks(test) -> list:
    return [m for m in getattr(test, "pytestmark", []) if m.name == "skipif"]


def _fresh():
    def test_function():
        pass

    return test_function


def test_require_npu_skips_with_the_probe_reason(monkeypatch):
    monkeypatch.setattr(devices, "probe_npu", lambda: devices.AcceleratorStatus("npu", False, 0, "no CANN"))
    (mark,) = _skip_marks(testing.require_npu(_fresh()))
    assert mark.args[0] is True and "no CANN" in mark.kwargs["reason"]
    monkeypatch.setattr(devices, "probe_npu", lambda: devices.AcceleratorStatus("npu", True, 1, "1 NPU"))
    (mark,) = _skip_marks(testing.require_npu(_fresh()))
    assert mark.args[0] is False


def test_require_cards_counts_the_visible_devices(monkeypatch):
    def probed(count: int, reason: str) -> None:
        statuses = {"npu": devices.AcceleratorStatus("npu", count > 0, count, reason)}
        monkeypatch.setattr(devices, "probe_accelerators", lambda: statuses)

    for count, reason, skips in [(0, "no CANN", True), (1, "1 NPU", True), (2, "2 NPUs", False), (8, "8 NPUs", False)]:
        probed(count, reason)
        test = testing.require_cards("npu", 2)(_fresh())
        (mark,) = _skip_marks(test)
        assert mark.args[0] is skips and reason in mark.kwargs["reason"], (count, mark)
        assert "device" in {m.name for m in test.pytestmark}  # what deliverykit npu-check runs


def test_slow_and_test_device(monkeypatch):
    monkeypatch.delenv("RUN_SLOW", raising=False)
    assert _skip_marks(testing.slow(_fresh()))[0].args[0] is True
    monkeypatch.setenv("RUN_SLOW", "1")
    assert _skip_marks(testing.slow(_fresh()))[0].args[0] is False
    monkeypatch.setenv(testing.TEST_DEVICE_ENV_VAR, "npu:1")
    assert testing.get_test_device() == "npu:1"


def test_upstream_checkout(monkeypatch, tmp_path):
    monkeypatch.delenv("SOME_SRC", raising=False)
    with pytest.raises(pytest.skip.Exception, match="set SOME_SRC="):
        testing.upstream_checkout("SOME_SRC", "setup.py")
    monkeypatch.setenv("SOME_SRC", str(tmp_path))
    with pytest.raises(pytest.fail.Exception, match=r"setup\.py missing"):
        testing.upstream_checkout("SOME_SRC", "setup.py")
    (tmp_path / "setup.py").write_text("")
    assert testing.upstream_checkout("SOME_SRC", "setup.py") == tmp_path


def test_load_script_imports_a_file_as_a_module(tmp_path):
    script = tmp_path / "inference.py"
    script.write_text("def main(argv=None):\n    return len(argv or [])\n")
    module = testing.load_script(script, "some_inference")
    assert module.__name__ == "some_inference" and module.main(["a", "b"]) == 2


def test_cli_runner_returns_exit_code_and_both_streams(tmp_path):
    script = tmp_path / "my-npu" / "inference.py"
    script.parent.mkdir()
    script.write_text(
        "import sys\n"
        "from deliverykit.errors import DeliveryError\n"
        "def main(argv):\n"
        "    print('OUT=' + ','.join(argv))\n"
        "    if argv == ['bad']:\n"
        "        raise DeliveryError('bad input; pass good')\n"
        "    print('note', file=sys.stderr)\n"
        "    return 0\n"
    )
    run = testing.CliRunner(script)
    assert run.module.__name__ == "my_npu_inference"
    assert run("a", 1) == (0, "OUT=a,1\nEXIT_CODE=0\n", "note\n")
    code, out, err = run("bad")
    assert (code, out) == (1, "OUT=bad\nEXIT_CODE=1\n") and err == "error: bad input; pass good\n"


def test_pristine_copy_resets_the_named_paths_and_leaves_the_source_alone(tmp_path):
    import subprocess

    from .conftest import GIT_ENV

    source = tmp_path / "src"
    (source / "pkg").mkdir(parents=True)
    (source / "pkg" / "model.py").write_text("device = 'cuda'\n")
    env = {**os.environ, **GIT_ENV}
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "base"]):
        subprocess.run(["git", *args], cwd=source, env=env, check=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=source, capture_output=True, text=True).stdout.strip()
    (source / "pkg" / "model.py").write_text("device = 'npu'\n")  # a patched checkout
    (source / "pkg" / "__pycache__").mkdir()

    copy = testing.pristine_copy(source, tmp_path / "copy", commit, ["pkg"])
    assert (copy / "pkg" / "model.py").read_text() == "device = 'cuda'\n"
    assert not (copy / "pkg" / "__pycache__").exists()
    assert (source / "pkg" / "model.py").read_text() == "device = 'npu'\n"


def test_ignore_tests_below_python(monkeypatch, capsys):
    from deliverykit.testing import ignore_tests_below_python

    assert ignore_tests_below_python((3, 10), "needs 3.10") == []
    monkeypatch.setattr(sys, "version_info", (3, 10, 14, "final", 0))
    assert ignore_tests_below_python((3, 11), "x needs Python >= 3.11") == ["test_*.py"]
    assert "not collected: x needs Python >= 3.11" in capsys.readouterr().err


def test_reordering_tolerance_accepts_rounding_noise_and_catches_real_changes():
    expected = torch.linspace(-2.0, 2.0, 1000)
    eps = torch.finfo(torch.float32).eps
    testing.assert_equal_up_to_reordering(expected + 16 * eps * 2.0, expected, "16 ulps of the peak")
    with pytest.raises(AssertionError, match="ulps of the peak"):
        testing.assert_equal_up_to_reordering(expected + 1e-3, expected, "a real change")
    with pytest.raises(AssertionError, match="shape"):
        testing.assert_equal_up_to_reordering(expected[:10], expected, "truncated")
    # the scale is the peak: bf16 outputs get bf16's much larger tolerance
    assert testing.reordering_tolerance(expected.bfloat16()) == pytest.approx(2**8 * 2**-7 * 2.0)


def test_images_may_differ_by_one_level_in_a_few_pixels_only():
    image = np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)
    image[0, 0, 0] = 100
    nudged = image.copy()
    nudged[0, 0, 0] += 1
    testing.assert_images_equal_up_to_rounding(nudged, image)
    two_levels = image.copy()
    two_levels[0, 0, 0] += 2
    with pytest.raises(AssertionError, match="2 levels"):
        testing.assert_images_equal_up_to_rounding(two_levels, image)
    with pytest.raises(AssertionError, match="moved by one level"):
        testing.assert_images_equal_up_to_rounding(np.clip(image.astype(int) + 1, 0, 255), image)
