"""ltx-core's tiled video encode (``VideoEncoder.tiled_encode`` with ``TileSizeConfig.default()``) on diffusers' VAE.

Source: Lightricks/LTX-2 at 400fd310, ``packages/ltx-core/src/ltx_core/model/video_vae/video_vae.py``
(``tiled_encode``, ``prepare_tiles_for_encoding``, ``map_temporal_slice``, ``map_spatial_slice``) and
``packages/ltx-core/src/ltx_core/tiling.py`` (``split_by_size``, ``split_temporal_causal``,
``compute_trapezoidal_mask_1d``). ltx-pipelines encodes a video it conditions on (retake's source) this way: tiles of
10 latent frames (80 pixel frames) overlapping by 3, and of 24 latent rows / columns (768 px) overlapping by 2; a
temporal tile after the first starts one latent frame earlier (the causal first frame) with a ramp one longer; each
tile is encoded alone and the tiles' latents are summed under linear ramps that add up to 1 where they overlap. Below
one tile it is the plain encode. Besides equality, it bounds the encoder's activations by one tile.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from typing import Any

import torch
from diffusers.pipelines.ltx2.pipeline_ltx2_condition import retrieve_latents

TEMPORAL_TILE = (80, 24)  # frames: tile size, overlap (TileSizeConfig.default())
SPATIAL_TILE = (768, 64)  # pixels: tile size, overlap

Interval = tuple[int, int, int, int]  # start, end, left ramp, right ramp (latent units)


def intervals(length: int, size: int, overlap: int, *, causal: bool = False) -> list[Interval]:
    """``split_by_size(size, overlap)`` of a latent axis of ``length``, or ``split_temporal_causal``."""
    if length <= size:
        return [(0, length, 0, 0)]
    stride = size - overlap
    amount = (length + size - 2 * overlap - 1) // stride
    split = [(0, size, 0, overlap)]
    split += [(i * stride, i * stride + size, overlap, overlap) for i in range(1, amount - 1)]
    split.append(((amount - 1) * stride, length, overlap, 0))
    if causal:
        split = split[:1] + [(start - 1, end, left + 1, right) for start, end, left, right in split[1:]]
    return split


def ramp_mask(length: int, left: int, right: int, *, from_zero: bool) -> torch.Tensor:
    """``compute_trapezoidal_mask_1d``: linear ramps in and out (``from_zero``: the ramp in starts at 0)."""
    mask = torch.ones(length)
    left, right = max(0, min(left, length)), max(0, min(right, length))
    if left > 0:
        fade_in = torch.linspace(0.0, 1.0, left + 1 if from_zero else left + 2)[:-1]
        mask[:left] *= fade_in if from_zero else fade_in[1:]
    if right > 0:
        mask[-right:] *= torch.linspace(1.0, 0.0, steps=right + 2)[1:-1]
    return mask.clamp_(0, 1)


def _axis_tiles(length: int, scale: int, tile: tuple[int, int], *, temporal: bool) -> list[tuple[slice, slice, Any]]:
    """(pixel slice, latent slice, latent mask) of each tile along one axis of ``length`` latents."""
    size, overlap = tile[0] // scale, tile[1] // scale
    tiles = []
    for start, end, left, right in intervals(length, max(2, overlap + 1, size), overlap, causal=temporal):
        pixels = slice(start * scale, 1 + (end - 1) * scale) if temporal else slice(start * scale, end * scale)
        tiles.append((pixels, slice(start, end), ramp_mask(end - start, left, right, from_zero=temporal)))
    return tiles


@contextlib.contextmanager
def _whole_encode(vae: Any) -> Iterator[None]:
    """diffusers' own tiling off for the tiles (a memory plan may have turned it on for the decode)."""
    saved = vae.use_tiling, vae.use_framewise_decoding
    vae.use_tiling = vae.use_framewise_decoding = False
    try:
        yield
    finally:
        vae.use_tiling, vae.use_framewise_decoding = saved


def tiled_encode(vae: Any, pixels: torch.Tensor) -> torch.Tensor:
    """The un-normalised latent means ``[B, C, f, h, w]`` of ``pixels`` ``[B, 3, F, H, W]`` in [-1, 1] (F = 8k + 1,
    H and W multiples of 32), accumulated in the VAE's dtype as ltx-core accumulates them. ltx-core's encoder
    normalises each tile; the ramps sum to 1, so normalising the sum is the same."""
    time, space = vae.config.temporal_compression_ratio, vae.config.spatial_compression_ratio
    frames, height, width = pixels.shape[2:]
    axes = (
        _axis_tiles((frames - 1) // time + 1, time, TEMPORAL_TILE, temporal=True),
        _axis_tiles(height // space, space, SPATIAL_TILE, temporal=False),
        _axis_tiles(width // space, space, SPATIAL_TILE, temporal=False),
    )
    latent = None
    with torch.no_grad(), _whole_encode(vae):
        for tile in itertools.product(*axes):
            source = pixels[(slice(None), slice(None), *(pixel for pixel, _, _ in tile))]
            encoded = retrieve_latents(vae.encode(source.to(vae.device, vae.dtype)), sample_mode="argmax")
            if latent is None:
                shape = (*encoded.shape[:2], *(axis[-1][1].stop for axis in axes))
                latent = torch.zeros(shape, device=encoded.device, dtype=encoded.dtype)
            time_mask, height_mask, width_mask = (mask.to(encoded.device) for _, _, mask in tile)
            weighted = encoded * time_mask[:, None, None] * height_mask[:, None] * width_mask
            latent[(slice(None), slice(None), *(out for _, out, _ in tile))] += weighted
    return latent.float()
