"""Real-valued RoPE against TRELLIS.2's complex formulation, for dense (SS flow) and sparse (SLat) positions."""

from __future__ import annotations

import pytest
import torch

from trellis2_npu.rope import apply_rope, grid_positions, rope_cos_sin, rope_frequencies

HEADS = 3


def upstream_phases(positions: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Complex phases as microsoft/TRELLIS.2 @ 5565d240 ``RotaryPositionEmbedder`` builds them (transcribed).

    ``torch.outer`` of the flattened positions with the float32 frequencies, ``torch.polar`` to unit complex
    numbers, reshaped per token (axis-major), then padded with ``polar(1, 0)`` up to ``head_dim // 2`` phases.
    """
    dim = positions.shape[-1]
    freq_dim = head_dim // 2 // dim
    freqs = 1.0 / (10000.0 ** (torch.arange(freq_dim, dtype=torch.float32) / freq_dim))
    angles = torch.outer(positions.reshape(-1), freqs)
    phases = torch.polar(torch.ones_like(angles), angles).reshape(*positions.shape[:-1], -1)
    missing = head_dim // 2 - phases.shape[-1]
    identity = torch.polar(torch.ones(*phases.shape[:-1], missing), torch.zeros(*phases.shape[:-1], missing))
    return torch.cat([phases, identity], dim=-1)


def upstream_rotate(x: torch.Tensor, phases: torch.Tensor) -> torch.Tensor:
    """Upstream ``apply_rotary_embedding``: adjacent channel pairs as complex numbers, times the phase, in fp32."""
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(pairs * phases.unsqueeze(-2)).reshape(x.shape).to(x.dtype)


def half_split_rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Llama-style RoPE: channel k pairs with k + D/2 (``rotate_half``). The wrong pairing for TRELLIS.2."""
    first, second = x.chunk(2, dim=-1)
    cos, sin = torch.cat([cos, cos], -1).unsqueeze(-2), torch.cat([sin, sin], -1).unsqueeze(-2)
    return x * cos + torch.cat([-second, first], dim=-1) * sin


def sparse_coords(num_tokens: int, resolution: int, generator: torch.Generator) -> torch.Tensor:
    """``[N, 4]`` int32 coords (batch id, x, y, z) as TRELLIS.2's sparse tensors hold them, two items."""
    xyz = torch.randint(0, resolution, (num_tokens, 3), generator=generator, dtype=torch.int32)
    batch = (torch.arange(num_tokens) >= num_tokens // 2).to(torch.int32)
    return torch.cat([batch[:, None], xyz], dim=1)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_dense_grid_matches_upstream_complex_rope(head_dim):
    generator = torch.Generator().manual_seed(head_dim)
    positions = grid_positions(16)  # the SS flow's 16³ latent, 'ij'
    x = torch.randn(2, positions.shape[0], HEADS, head_dim, generator=generator)
    cos, sin = rope_cos_sin(positions, head_dim)
    expected = upstream_rotate(x, upstream_phases(positions, head_dim))
    torch.testing.assert_close(apply_rope(x, cos, sin), expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_sparse_coords_match_upstream_complex_rope(head_dim):
    generator = torch.Generator().manual_seed(head_dim + 1)
    coords = sparse_coords(3000, resolution=64, generator=generator)
    q, k = torch.randn(2, coords.shape[0], HEADS, head_dim, generator=generator)
    cos, sin = rope_cos_sin(coords[:, 1:], head_dim)
    phases = upstream_phases(coords[:, 1:], head_dim)
    for x in (q, k):
        torch.testing.assert_close(apply_rope(x, cos, sin), upstream_rotate(x, phases), atol=1e-6, rtol=0)


def test_grid_positions_are_ij_ordered():
    positions = grid_positions(16)
    assert positions.shape == (4096, 3)
    index = 5 * 256 + 7 * 16 + 9  # token x·256 + y·16 + z
    assert positions[index].tolist() == [5, 7, 9]


def test_tables_are_float32_with_identity_padding():
    positions = torch.tensor([[63, 2, 17]], dtype=torch.float64)
    cos, sin = rope_cos_sin(positions, 128)
    assert cos.dtype == sin.dtype == torch.float32 and cos.shape == (1, 64)
    freqs = rope_frequencies(128)
    assert freqs.shape == (21,) and freqs[0] == 1.0
    torch.testing.assert_close(freqs[20], torch.tensor(10000.0 ** (-20 / 21)), atol=0, rtol=1e-6)
    torch.testing.assert_close(cos[0, 21:42], torch.cos(2 * freqs))  # y phases follow the 21 x phases
    assert cos[0, 63] == 1.0 and sin[0, 63] == 0.0  # the 64th pair is not rotated
    x = torch.randn(1, 2, 128)
    torch.testing.assert_close(apply_rope(x, cos, sin)[..., 126:], x[..., 126:], atol=0, rtol=0)


def test_low_precision_input_keeps_its_dtype_and_rotates_in_float32():
    generator = torch.Generator().manual_seed(7)
    coords = sparse_coords(256, resolution=64, generator=generator)
    x = torch.randn(coords.shape[0], HEADS, 128, generator=generator).to(torch.bfloat16)
    out = apply_rope(x, *rope_cos_sin(coords[:, 1:], 128))
    assert out.dtype == torch.bfloat16
    expected = upstream_rotate(x, upstream_phases(coords[:, 1:], 128))
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=2**-7)  # at most one bf16 rounding step apart


def test_half_split_pairing_does_not_match_upstream():
    generator = torch.Generator().manual_seed(3)
    positions = grid_positions(16)
    x = torch.randn(1, positions.shape[0], HEADS, 128, generator=generator)
    cos, sin = rope_cos_sin(positions, 128)
    expected = upstream_rotate(x, upstream_phases(positions, 128))
    assert (half_split_rotate(x, cos, sin) - expected).abs().max() > 0.5
