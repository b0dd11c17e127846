"""ltx-core's tiled video encode on diffusers' VAE (retake's source). Equality with ltx-core's own ``tiled_encode``
across temporal and spatial seams is ``test_reference_ltx.py::test_tiled_video_encode_matches_ltx_core`` (needs
``LTX2_SRC``)."""

from __future__ import annotations

import pytest
import torch

from sulphur2_npu.loader import load_pipeline
from sulphur2_npu.tiled_encode import intervals, ramp_mask, tiled_encode


@pytest.mark.parametrize(("size", "overlap", "causal"), [(10, 3, True), (24, 2, False)], ids=["frames", "pixels"])
def test_tiles_cover_each_axis_and_their_ramps_sum_to_one(size, overlap, causal):
    """The default layout (latent units) at every length up to several tiles: the tiles cover the axis, stay within
    the tile size (one more for a causal tile's early frame), and the blend weights add up to 1 everywhere, which is
    why the tiles' latents are summed without a denominator (as ltx-core does when ``masks_are_complementary``)."""
    for length in range(1, 6 * size):
        split = intervals(length, size, overlap, causal=causal)
        total = torch.zeros(length)
        for start, end, left, right in split:
            assert 0 <= start < end <= length and end - start <= size + causal
            total[start:end] += ramp_mask(end - start, left, right, from_zero=causal)
        assert (split[0][0], split[-1][1]) == (0, length)
        torch.testing.assert_close(total, torch.ones(length), atol=1e-6, rtol=0)  # float32 linspace steps


def test_a_source_within_one_tile_is_the_plain_encode(smoke_files):
    """One tile, weight 1 everywhere: the same encoder call on the same pixels, so the same latent up to float32
    round-off between two calls (none expected; a misplaced tile or a ramp below 1 would be far off)."""
    vae = load_pipeline(smoke_files.checkpoint, smoke_files.text_encoder, torch_dtype=torch.float32).pipe.vae
    pixels = torch.rand(1, 3, 17, 64, 96, generator=torch.Generator().manual_seed(0)) * 2 - 1
    with torch.no_grad():
        plain = vae.encode(pixels).latent_dist.mode()
    torch.testing.assert_close(tiled_encode(vae, pixels), plain, rtol=0, atol=4 * torch.finfo(torch.float32).eps)
