"""TRELLIS.2's 3-axis rotary position embedding (RoPE) in real arithmetic, without complex dtypes.

Adapted from: microsoft/TRELLIS.2 @ 5565d240, trellis2/modules/attention/rope.py (``RotaryPositionEmbedder``,
dense SS flow) and trellis2/modules/sparse/attention/rope.py (``SparseRotaryPositionEmbedder``, SLat flows).
Upstream builds complex phases with ``torch.polar`` and multiplies ``x`` viewed as complex numbers
(``view_as_complex``); Ascend supports complex dtypes poorly (``polar`` fp32 only, no ``complex32``), so the same
rotation is written with cos/sin tables here. The maths, read from the upstream source:

- ``freq_dim = head_dim // 2 // 3`` frequencies ``f_j = 1 / 10000^(j / freq_dim)`` (21 for head_dim 128);
- a token at (x, y, z) gets the phases ``[x·f, y·f, z·f]`` (axis-major), padded with zero phases (identity
  rotations) up to ``head_dim // 2`` (63 + 1 for head_dim 128, 30 + 2 for head_dim 64);
- phase k rotates the **adjacent** channels (2k, 2k + 1) as one complex number:
  ``out[2k] = x[2k]·cos − x[2k+1]·sin``, ``out[2k+1] = x[2k]·sin + x[2k+1]·cos`` (not the half-split
  ``rotate_half`` of Llama-style RoPE);
- positions: dense = the ``'ij'`` grid of the 16³ latent, sparse = ``coords[:, 1:]``; the rotation runs in
  float32 and returns the input dtype.

Changes: cos/sin tables instead of complex phases; tables are always float32 (float64 is unsupported on Ascend) and
the frequencies are computed on the CPU, then moved, so every device rotates by the same angles.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

DEFAULT_ROPE_FREQ = (1.0, 10000.0)


def rope_frequencies(head_dim: int, dim: int = 3, rope_freq: tuple[float, float] = DEFAULT_ROPE_FREQ) -> torch.Tensor:
    """The ``head_dim // 2 // dim`` frequencies ``rope_freq[0] / rope_freq[1]^(j / freq_dim)``, float32 on CPU."""
    if head_dim % 2:
        raise ValueError(f"head_dim={head_dim} must be even: RoPE rotates channel pairs")
    freq_dim = head_dim // 2 // dim
    exponents = torch.arange(freq_dim, dtype=torch.float32) / freq_dim
    return rope_freq[0] / (rope_freq[1] ** exponents)


def grid_positions(resolution: int, dim: int = 3, device: torch.device | str | None = None) -> torch.Tensor:
    """Integer positions ``[resolution**dim, dim]`` of a dense grid in ``'ij'`` order (token = x·R² + y·R + z)."""
    axes = [torch.arange(resolution, device=device)] * dim
    return torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).reshape(-1, dim)


def rope_cos_sin(
    positions: torch.Tensor, head_dim: int, rope_freq: tuple[float, float] = DEFAULT_ROPE_FREQ
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables ``[..., head_dim // 2]`` (float32, on ``positions.device``) for ``positions [..., dim]``.

    ``positions`` are grid indices: ``grid_positions(16)`` for the dense SS flow, ``coords[:, 1:]`` of a sparse
    tensor for the SLat flows. Pairs beyond the ``dim · freq_dim`` phased ones get cos 1, sin 0 (no rotation).
    """
    dim = positions.shape[-1]
    freqs = rope_frequencies(head_dim, dim, rope_freq).to(positions.device)
    phases = (positions.to(torch.float32).unsqueeze(-1) * freqs).flatten(-2)  # [..., dim · freq_dim], axis-major
    padding = head_dim // 2 - phases.shape[-1]
    cos = F.pad(phases.cos(), (0, padding), value=1.0)
    sin = F.pad(phases.sin(), (0, padding), value=0.0)
    return cos, sin


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate adjacent channel pairs of ``x [..., tokens, heads, head_dim]`` by the tables of ``rope_cos_sin``.

    ``cos``/``sin`` are ``[..., tokens, head_dim // 2]`` and are shared by all heads: ``[T, H, D]`` sparse features
    take ``[T, D/2]`` tables, dense ``[B, L, H, D]`` features take ``[L, D/2]``. Computed in float32, returned in
    ``x.dtype``, as upstream does.
    """
    x_even, x_odd = x.to(torch.float32).unflatten(-1, (-1, 2)).unbind(-1)
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    rotated = torch.stack((x_even * cos - x_odd * sin, x_even * sin + x_odd * cos), dim=-1)
    return rotated.flatten(-2).to(x.dtype)
