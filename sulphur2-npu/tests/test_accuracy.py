"""The accuracy tooling: hooks see the right blocks, a real precision change is caught, saved runs round-trip."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from deliverykit.errors import InputError
from deliverykit.testing import assert_equal_up_to_reordering


@pytest.fixture(scope="module")
def runs(smoke_files):
    """fp32 and bf16 runs of the smoke model (the delivery's loader and call), seed 42."""
    from sulphur2_npu.accuracy import run_side, tiny_request
    from sulphur2_npu.generate import pipeline_kwargs
    from sulphur2_npu.loader import load_pipeline

    sides = {}
    for dtype in (torch.float32, torch.bfloat16):
        pipe = load_pipeline(smoke_files.checkpoint, smoke_files.text_encoder, torch_dtype=dtype).pipe
        replay = None if dtype == torch.float32 else (sides["fp32"].inputs, sides["fp32"].inputs_meta)
        sides["fp32" if dtype == torch.float32 else "bf16"] = run_side(
            pipe, pipeline_kwargs(pipe, tiny_request()), seed=42, inputs=replay
        )
    return sides


def test_hooked_blocks_are_the_first_three_and_the_last():
    from sulphur2_npu.accuracy import hooked_block_names

    assert hooked_block_names(48) == [f"transformer_blocks.{i}" for i in (0, 1, 2, 47)]
    assert hooked_block_names(2) == ["transformer_blocks.0", "transformer_blocks.1"]


def test_side_run_matches_the_plain_pipeline_and_the_transformer(runs, tiny_components):
    """Frames/audio equal pipe(**TINY_CALL); the hooked output equals the transformer called directly.

    Another pipeline object and another call: equal up to float32 kernel reordering, not bit for bit.
    """
    from sulphur2_npu.tiny import TINY_CALL, tiny_pipeline

    fp32 = runs["fp32"]
    pipe = tiny_pipeline(components=tiny_components)
    expected = pipe(**TINY_CALL, generator=torch.Generator().manual_seed(42))
    assert_equal_up_to_reordering(fp32.frames, expected.frames[0], "frames")
    assert_equal_up_to_reordering(fp32.audio, expected.audio[0], "audio")
    with torch.no_grad():
        video, audio = pipe.transformer(**fp32.inputs, **{**fp32.inputs_meta, "return_dict": False})
    assert_equal_up_to_reordering(fp32.hidden["output.video"], video, "transformer video output")
    assert_equal_up_to_reordering(fp32.hidden["output.audio"], audio, "transformer audio output")
    blocks = [name for name in fp32.hidden if name.startswith("transformer_blocks.")]
    assert blocks == [f"transformer_blocks.{i}.{s}" for i in (0, 1) for s in ("video", "audio")]
    assert fp32.hidden["transformer_blocks.1.video"].shape == (*video.shape[:-1], 16)  # inner width, pre-proj_out


def test_identical_runs_pass_and_bf16_is_caught(runs):
    from sulphur2_npu.accuracy import compare_runs

    same = compare_runs(runs["fp32"], runs["fp32"])
    assert same["verdict"] == "pass" and same["frames"]["psnr_db"] == float("inf")
    assert all(row["max_abs"] == 0.0 for row in same["hidden"])

    bf16 = compare_runs(runs["fp32"], runs["bf16"])
    # bf16 keeps 8 mantissa bits (relative rounding 2^-9 ≈ 2e-3): hidden states of magnitude ~1 differ by well over
    # the 1e-3 limit, while the frames stay far above 30 dB; the tool must see the first and not the second.
    assert bf16["verdict"] != "pass"
    worst = max(row["max_abs"] for row in bf16["hidden"])
    assert 1e-3 < worst < 0.5
    assert bf16["frames"]["verdict"] == "pass" and 30 < bf16["frames"]["psnr_db"] < 80
    assert len(bf16["frames"]["per_frame"]) == runs["fp32"].frames.shape[0]
    independent_mse = np.mean((runs["bf16"].frames.astype(np.float64) - runs["fp32"].frames) ** 2)
    assert bf16["frames"]["psnr_db"] == pytest.approx(10 * np.log10(1 / independent_mse))
    assert 0 < bf16["audio"]["max_abs"] == pytest.approx(np.abs(runs["bf16"].audio - runs["fp32"].audio).max())


def test_saved_run_round_trips_and_bad_files_are_named(runs, tmp_path):
    from sulphur2_npu.accuracy import SideRun

    path = runs["bf16"].save(tmp_path / "target.safetensors")
    loaded = SideRun.load(path)
    assert (loaded.device, loaded.dtype, loaded.inputs_meta) == ("cpu", "bfloat16", runs["bf16"].inputs_meta)
    assert list(loaded.hidden) == list(runs["bf16"].hidden)  # execution order survives safetensors' sorted keys
    for name, tensor in runs["bf16"].hidden.items():
        assert torch.equal(loaded.hidden[name], tensor)
    np.testing.assert_array_equal(loaded.frames, runs["bf16"].frames)
    np.testing.assert_array_equal(loaded.audio, runs["bf16"].audio)

    not_a_run = tmp_path / "junk.safetensors"
    not_a_run.write_bytes(b"not safetensors")
    with pytest.raises(InputError, match="not a saved accuracy run"):
        SideRun.load(not_a_run)


def test_heatmap_scales_to_the_largest_difference(tmp_path):
    from PIL import Image

    from sulphur2_npu.accuracy import HEATMAP_TILE_WIDTH, write_diff_heatmap

    reference = np.zeros((3, 16, 24, 3), dtype=np.float32)
    candidate = reference.copy()
    candidate[1, 4:8, 6:12] = 0.5  # one bright patch in the middle frame
    info = write_diff_heatmap(reference, candidate, tmp_path / "diff.png")
    assert info["frames"] == [0, 1, 2] and info["scale_max_abs"] == 0.5
    sheet = np.asarray(Image.open(tmp_path / "diff.png"))
    width, gap = HEATMAP_TILE_WIDTH, 2
    assert sheet.shape == (width * 16 // 24, 3 * width + 2 * gap, 3)
    tiles = [sheet[:, k * (width + gap) : k * (width + gap) + width] for k in range(3)]
    assert tiles[0].max() == 0 and tiles[2].max() == 0  # identical frames: black
    assert tiles[1].max() == 253  # the top of the scale (pale yellow)
    assert (tiles[1].sum(axis=-1) > 0).mean() == pytest.approx(4 * 6 / (16 * 24), abs=0.01)  # just the patch
