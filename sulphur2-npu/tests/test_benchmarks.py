"""Fast checks of the accuracy script and the benchmarks at tiny sizes (the full runs are `make`-level commands)."""

from __future__ import annotations

import json

import pytest
import torch

from deliverykit.errors import ExitCode, run_main
from deliverykit.testing import load_script, slow

from .conftest import DELIVERY_DIR


@pytest.fixture()
def bench():
    """Import a benchmark script as a module, to call its functions in process."""
    return lambda name: load_script(DELIVERY_DIR / "benchmarks" / f"{name}.py", f"sulphur2_bench_{name}")


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([], "2 steps\nguidance: 3.0\nschedule: dev"),
        (["--schedule", "distilled"], "8 steps\nguidance: 1.0\nschedule: distilled"),
    ],
    ids=["auto-dev", "distilled"],
)
def test_accuracy_dry_run_prints_the_plan_and_writes_nothing(tmp_path, capsys, argv, expected):
    script = load_script(DELIVERY_DIR / "scripts" / "accuracy.py", "sulphur2_accuracy")
    output = tmp_path / "accuracy.json"
    code = run_main(lambda: script.main(["--dry-run", "--target", "cpu", "--output", str(output), *argv]))
    plan = capsys.readouterr().out
    assert code == ExitCode.OK and not output.exists()
    assert "target: cpu fp32" in plan and "self_check: True" in plan and f"96x64, 9 frames, {expected}" in plan
    assert "['transformer_blocks.0', 'transformer_blocks.1']" in plan and "LPIPS omitted" in plan


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--skip-cpu"], "--skip-cpu needs --save"),
        (["--model", "x.safetensors"], "--model and --text-encoder go together"),
        (["--model", "x", "--text-encoder", "y", "--preset", "smoke"], "pick one of mini, balanced, quality"),
    ],
)
def test_accuracy_rejects_inconsistent_flags(argv, message, tmp_path, capsys):
    script = load_script(DELIVERY_DIR / "scripts" / "accuracy.py", "sulphur2_accuracy")
    code = run_main(lambda: script.main([*argv, "--output", str(tmp_path / "a.json")]))
    assert code == ExitCode.USAGE and message in capsys.readouterr().err


def test_overhead_benchmark_times_identical_work(bench, tmp_path):
    script = bench("sulphur_overhead")
    output = tmp_path / "overhead.json"
    assert script.main(["--rounds", "1", "--output", str(output)]) == 0
    results = json.loads(output.read_text())["results"]
    assert results["outputs_identical"] is True  # ours and bare compute the same frames and audio
    (ours,), (bare,) = results["samples_ms"][script.OURS], results["samples_ms"][script.BARE]
    assert results["ratio"] == pytest.approx(ours / bare)  # no bound: a shared CI machine makes one round noisy
    assert set(results["attention_dispatch_us"]) == {"ours (dispatch_ltx2_attention)", "diffusers"}


def test_wide_file_reaches_its_size_and_loads_strictly(bench, tmp_path, smoke_files):
    """The widened model's layer count hits the requested size, and the delivery's loader takes the file."""
    script = bench("loader_throughput")
    checkpoint = tmp_path / "wide.safetensors"
    written = script.write_wide_file(checkpoint, 0.1, torch.bfloat16)
    size = checkpoint.stat().st_size
    _, per_block = script.parameter_counts(1)
    assert abs(size - 0.1e9) <= per_block * 2  # within one block (bf16: 2 bytes a parameter) of the target
    measured = script.measure(checkpoint, smoke_files.text_encoder, "bf16")
    assert measured["bytes_read"] >= written["parameters"] * 2  # every weight of the file was read (+ text encoder)
    assert measured["gb_per_s"] > 0
    if measured["growth_bytes"] is not None:  # one copy of the weights, not two
        assert measured["rss_per_file"] < script.COPY_RATIO_LIMIT + 0.5


def test_rope_latent_grids_of_the_presets(bench):
    """Latent (frames, height, width) of each preset: 8x temporal with the causal first frame, 32x spatial."""
    from sulphur2_npu.presets import PRESETS

    script = bench("rope_precision")
    grids = {name: script.latent_grid(p.width, p.height, p.num_frames) for name, p in PRESETS.items()}
    assert grids == {"mini": (7, 10, 16), "balanced": (16, 16, 24), "quality": (16, 17, 30)}


def test_accuracy_refuses_a_reference_that_ran_other_weights(tmp_path, capsys):
    """A reference saved on another machine must have run the same files (sha256), else the comparison is moot."""
    import numpy as np

    from sulphur2_npu.accuracy import SideRun

    other = {"path": "sulphur2-tiny.safetensors", "bytes": 1, "sha256": "0" * 64, "sha256_source": "computed"}
    reference = SideRun("cpu", "fp32", {}, {}, {}, np.zeros((1, 2, 2, 3), np.float32), np.zeros((2, 4), np.float32))
    reference.info["weights"] = [{**other, "status": "random"}]
    reference.save(tmp_path / "reference.safetensors")
    script = load_script(DELIVERY_DIR / "scripts" / "accuracy.py", "sulphur2_accuracy")
    argv = ["--reference", str(tmp_path / "reference.safetensors"), "--target", "cpu", "--output", str(tmp_path / "a")]
    code = run_main(lambda: script.main(argv))
    err = capsys.readouterr().err
    assert code == ExitCode.WEIGHTS and "ran other weights than this one" in err and not (tmp_path / "a").exists()


def test_parallel_scaling_launches_inference_per_world_size(bench, tmp_path):
    scaling = bench("parallel_scaling")
    args = scaling.parse_args(["--ranks", "1,4", "--output", "x.json", "--", "--smoke", "--steps", "3"])
    assert args.ranks == [1, 4] and args.extra == ["--smoke", "--steps", "3"]
    one, four = (scaling.command_for(n, args, tmp_path) for n in args.ranks)
    assert one[1] == str(scaling.INFERENCE) and "--parallel" not in one
    assert four[1:4] == ["-m", "torch.distributed.run", "--nproc-per-node=4"]
    assert four[-2:] == ["--parallel", "guidance=4"] and "--bench" in four and "--report" in four
    assert (
        scaling.parallel_spec(8, "mixed") == "ulysses=2,guidance=4"
        and scaling.parallel_spec(2, "ulysses") == "ulysses=2"
    )


@slow
def test_parallel_scaling_prints_one_and_two_ranks_side_by_side(bench, tmp_path, capsys):
    """One run per N (the figures are not checked: timing belongs to the benchmark, not to a test)."""
    output = tmp_path / "parallel.json"
    argv = ["--ranks", "1,2", "--warmup", "0", "--runs", "1", "--output", str(output)]
    assert run_main(lambda: bench("parallel_scaling").main(argv)) == 0
    rows = json.loads(output.read_text())["results"]["rows"]
    assert [row["N ranks"] for row in rows] == [1, 2]
    assert rows[0]["bytes received per step (rank 0)"] == 0 < rows[1]["bytes received per step (rank 0)"]


def test_vae_decode_share_brackets_the_decoders_the_header_count_allows(bench):
    """The decoder layouts: every one has the header's 170 VAE tensors and 0.73B ± 2 % parameters, and the per-block
    linear FLOP count of the lightest equals a direct count of its decoder (meta device, a small grid)."""
    from diffusers import AutoencoderKLLTX2Video

    from sulphur2_npu.keymap import map_to_original

    script = bench("vae_decode_share")
    assert script.latent_grid(704, 480, 161) == (21, 15, 22)
    assert script.audio_tokens(161) == 168  # 161 / 24 s x 16000 Hz / hop 160 / 4, rounded (LTX2Pipeline.__call__)
    grid = (2, 2, 3)
    layouts = script.decoder_layouts(grid)
    assert len(layouts) > 1 and layouts[0]["flops"] <= layouts[-1]["flops"]
    for layout in (layouts[0], layouts[-1]):
        vae = script.build(AutoencoderKLLTX2Video, layout["config"], "meta")
        assert len(map_to_original("vae", vae.state_dict())) == script.HEADER_VAE_TENSORS
        assert sum(p.numel() for p in vae.parameters()) == layout["parameters"]
        assert abs(layout["parameters"] / script.HEADER_VAE_PARAMETERS - 1) <= 0.02
        direct = script.count_flops(lambda v=vae: v.decoder(torch.empty(1, 128, *grid, device="meta"), None))
        assert direct == layout["flops"]
