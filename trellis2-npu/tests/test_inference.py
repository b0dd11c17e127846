"""The image → 3D CLI (``inference.py``) without an upstream checkout: usage errors and every check it makes before
the checkout (the runs themselves, with ``$TRELLIS2_SRC``: test_pipeline_upstream.py)."""

from __future__ import annotations

from deliverykit.errors import ExitCode

from .conftest import assert_failed_cleanly


def test_usage_errors(run_cli, tmp_path):
    code, _, err = run_cli("--output", tmp_path / "o")
    assert code == ExitCode.USAGE and "--weights" in err
    code, _, _ = run_cli("--smoke", "tiny", "--device", "gpu", "--output", tmp_path / "o")
    assert code == ExitCode.USAGE
    code, _, err = run_cli("--smoke", "--steps", "0", "--output", tmp_path / "o")
    assert code == ExitCode.USAGE and "--steps 0: need at least 1" in err
    code, _, err = run_cli("--smoke", "--max-num-tokens", "0", "--output", tmp_path / "o")
    assert code == ExitCode.USAGE and "--max-num-tokens: 0: need at least 1" in err
    code, _, err = run_cli("--smoke", "--image", "x.png", "--batch", "b.txt", "--output", tmp_path / "o")
    assert code == ExitCode.USAGE and "without --image or --report" in err
    assert not (tmp_path / "o").exists()


def test_the_bench_flag_points_at_scripts_conditioning(run_cli, tmp_path):
    """``--bench`` was the DINOv3-only mode of this CLI: refused, naming where it went."""
    code, _, err = run_cli("--smoke", "tiny", "--bench", "--output", tmp_path / "o")
    assert code == ExitCode.USAGE and "scripts/conditioning.py" in err


def test_smoke_full_passes_the_usage_checks(run_cli, tmp_path, monkeypatch):
    """``--smoke full`` (the released sizes) is accepted: the run gets to the upstream check (exit 3, no checkout),
    after the same usage checks as ``tiny``; nothing is written."""
    monkeypatch.delenv("TRELLIS2_SRC", raising=False)
    out = tmp_path / "o"
    args = ("--smoke", "full", "--pipeline", "512", "--steps", "1", "--device", "cpu")
    assert_failed_cleanly(run_cli(*args, "--output", out), ExitCode.INPUT, "no --upstream, no $TRELLIS2_SRC", out)
    code, _, err = run_cli("--smoke", "full", "--steps", "0", "--output", out)
    assert code == ExitCode.USAGE and "--steps 0: need at least 1" in err


def test_full_pipeline_bad_input_without_upstream(run_cli, tmp_path, monkeypatch):
    """The full pipeline's input checks that need no upstream checkout: one line, documented code, no files."""
    monkeypatch.delenv("TRELLIS2_SRC", raising=False)
    out = tmp_path / "o"
    code, _, err = run_cli("--smoke", "tiny", "--pipeline", "2048", "--device", "cpu", "--output", out)
    assert code == ExitCode.USAGE and "unsupported" in err and "1024_cascade" in err
    assert_failed_cleanly(
        run_cli("--smoke", "tiny", "--pipeline", "512", "--device", "npu", "--output", out),
        ExitCode.DEVICE, "--device cpu", out,
    )  # fmt: skip
    assert_failed_cleanly(
        run_cli("--smoke", "tiny", "--device", "cpu", "--dtype", "bf16", "--output", out),
        ExitCode.USAGE, "pass --dtype fp32", out,
    )  # fmt: skip
    assert_failed_cleanly(
        run_cli("--smoke", "tiny", "--upstream", tmp_path / "nowhere", "--device", "cpu", "--output", out),
        ExitCode.INPUT, "deliverykit upstream clone", out,
    )  # fmt: skip
    assert_failed_cleanly(
        run_cli("--smoke", "tiny", "--device", "cpu", "--output", out),
        ExitCode.INPUT, "no --upstream, no $TRELLIS2_SRC", out,
    )  # fmt: skip


def test_faces_is_the_face_budget(run_cli):
    """``--faces N`` is upstream's ``decimation_target``, under either name."""
    for flag in ("--faces", "--decimation-target"):
        args = run_cli.module.parse_args(["--smoke", "tiny", flag, "20000", "--output", "o"])
        assert args.decimation_target == 20_000
