"""Varlen attention (flash_attn's varlen API as TRELLIS.2 uses it) against independent references.

References: padded + key-masked dense SDPA (fp32) and an explicit per-item softmax(QKᵀ/√C)·V in float64. The "npu"
backend runs the ``fusion_attention`` kernel's CPU reference here; the kernel's own traps are pinned below.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from deliverykit import ops
from trellis2_npu.attention import (
    cu_seqlens_from_coords,
    cu_seqlens_from_lengths,
    dense_as_varlen,
    npu_varlen_attention_kwargs,
    varlen_attention,
    varlen_kvpacked_attention,
    varlen_qkvpacked_attention,
)

HEADS, CHANNELS = 3, 16
LENGTHS = {"equal": [24, 24, 24], "mixed": [5, 31, 1, 17]}
KV_LENGTHS = {"equal": [9, 9, 9], "mixed": [12, 3, 40, 7]}  # cross-attention: other lengths than the queries
FORMS = ["qkvpacked", "kvpacked", "separate", "dense_kv"]
TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-12}


def random_tokens(lengths: list[int], *shape: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(sum(lengths), *shape, generator=generator, dtype=torch.float64).to(dtype)


def padded_sdpa_reference(q, k, v, q_lengths, kv_lengths) -> torch.Tensor:
    """Pad every item to the longest, mask padded keys out (SDPA bool mask: True = attend), unpad."""
    batch, longest_q, longest_kv = len(q_lengths), max(q_lengths), max(kv_lengths)

    def pad(x, lengths, longest):
        padded = x.new_zeros(batch, longest, *x.shape[1:])
        for i, chunk in enumerate(x.split(lengths)):
            padded[i, : len(chunk)] = chunk
        return padded.transpose(1, 2)  # [B, H, L, C]

    keep = torch.arange(longest_kv)[None, :] < torch.tensor(kv_lengths)[:, None]
    out = F.scaled_dot_product_attention(
        pad(q, q_lengths, longest_q),
        pad(k, kv_lengths, longest_kv),
        pad(v, kv_lengths, longest_kv),
        keep[:, None, None],
    ).transpose(1, 2)
    return torch.cat([out[i, :length] for i, length in enumerate(q_lengths)])


def explicit_reference(q, k, v, q_lengths, kv_lengths) -> torch.Tensor:
    """softmax(Q·Kᵀ/√C)·V per item and head, spelled out."""
    outs = []
    for qi, ki, vi in zip(q.split(q_lengths), k.split(kv_lengths), v.split(kv_lengths), strict=True):
        scores = torch.einsum("qhc,khc->hqk", qi, ki) / math.sqrt(q.shape[-1])
        outs.append(torch.einsum("hqk,khc->qhc", scores.softmax(-1), vi))
    return torch.cat(outs)


def run_form(form: str, q, k, v, q_lengths, kv_lengths, backend: str) -> torch.Tensor:
    """Call our API the way upstream's ``sparse_scaled_dot_product_attention`` calls flash_attn for ``form``."""
    cu_q, cu_kv = cu_seqlens_from_lengths(q_lengths), cu_seqlens_from_lengths(kv_lengths)
    if form == "qkvpacked":
        return varlen_qkvpacked_attention(torch.stack([q, k, v], dim=1), cu_q, backend=backend)
    if form == "kvpacked":
        return varlen_kvpacked_attention(q, torch.stack([k, v], dim=1), cu_q, cu_kv, backend=backend)
    if form == "separate":
        return varlen_attention(q, k, v, cu_q, cu_kv, backend=backend)
    dense_kv = torch.stack([k, v], dim=1).unflatten(0, (len(kv_lengths), -1))  # [N, L, 2, H, C]
    kv_tokens, cu_kv = dense_as_varlen(dense_kv)
    return varlen_kvpacked_attention(q, kv_tokens, cu_q, cu_kv, backend=backend)


def cases():
    for form in FORMS:
        for lengths in ("equal", "mixed"):
            for kind in ("self", "cross"):
                if (form == "qkvpacked" and kind == "cross") or (form == "dense_kv" and kind == "self"):
                    continue
                if form == "dense_kv" and lengths == "mixed":
                    continue  # a dense context has one length
                yield form, lengths, kind


@pytest.mark.parametrize("backend", ["sdpa", "npu"])
@pytest.mark.parametrize(("form", "lengths", "kind"), list(cases()))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_varlen_attention_matches_references(form, lengths, kind, dtype, backend):
    q_lengths = LENGTHS[lengths]
    kv_lengths = q_lengths if kind == "self" else KV_LENGTHS[lengths]
    q = random_tokens(q_lengths, HEADS, CHANNELS, dtype=dtype, seed=0)
    k = random_tokens(kv_lengths, HEADS, CHANNELS, dtype=dtype, seed=1)
    v = random_tokens(kv_lengths, HEADS, CHANNELS, dtype=dtype, seed=2)

    out = run_form(form, q, k, v, q_lengths, kv_lengths, backend)

    assert out.shape == q.shape and out.dtype == dtype
    if dtype == torch.float32:
        expected = padded_sdpa_reference(q, k, v, q_lengths, kv_lengths)
    else:
        expected = explicit_reference(q, k, v, q_lengths, kv_lengths)
    torch.testing.assert_close(out, expected, atol=TOLERANCE[dtype], rtol=0)


@pytest.mark.parametrize(("lengths", "calls"), [([16, 16, 16], 1), ([4, 30, 11], 3)])
def test_sdpa_path_is_batched_or_per_item_never_padded(monkeypatch, lengths, calls):
    seen = []
    sdpa = F.scaled_dot_product_attention

    def counting_sdpa(q, k, v, *args, **kwargs):
        seen.append((q.shape, k.shape))
        return sdpa(q, k, v, *args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", counting_sdpa)
    qkv = random_tokens(lengths, 3, HEADS, CHANNELS, dtype=torch.float32, seed=3)
    varlen_qkvpacked_attention(qkv, cu_seqlens_from_lengths(lengths), backend="sdpa")
    assert len(seen) == calls
    if calls > 1:  # one item per call, each at its own length
        assert [q_shape[2] for q_shape, _ in seen] == lengths and all(s[0][0] == 1 for s in seen)


def test_npu_kwargs_pin_the_fusion_attention_traps():
    lengths, kv_lengths = [2, 5, 3], [4, 1, 6]
    q = random_tokens(lengths, HEADS, CHANNELS, dtype=torch.float32, seed=4)
    k = v = random_tokens(kv_lengths, HEADS, CHANNELS, dtype=torch.float32, seed=5)
    kwargs = npu_varlen_attention_kwargs(q, k, v, cu_seqlens_from_lengths(lengths), cu_seqlens_from_lengths(kv_lengths))
    assert kwargs["input_layout"] == "TND" and kwargs["head_num"] == HEADS
    assert kwargs["actual_seq_qlen"] == [2, 7, 10] and kwargs["actual_seq_kvlen"] == [4, 5, 11]  # no leading 0
    assert all(type(end) is int for end in kwargs["actual_seq_qlen"] + kwargs["actual_seq_kvlen"])
    assert kwargs["scale"] == 1 / math.sqrt(CHANNELS)  # explicit: the op defaults to 1.0


def test_npu_backend_calls_the_fusion_attention_kernel_selected_for_the_device(monkeypatch):
    reference = ops.kernels()["fusion_attention"].reference
    selected = []

    def spy_select(name, device):
        selected.append((name, str(device)))
        return reference

    monkeypatch.setattr(ops, "select", spy_select)
    q = random_tokens([4, 6], HEADS, CHANNELS, dtype=torch.float32, seed=8)
    varlen_attention(q, q, q, [0, 4, 10], [0, 4, 10], backend="npu")
    assert selected == [("fusion_attention", "cpu")]  # on an NPU this returns torch_npu's op


def test_auto_backend_is_sdpa_off_npu_and_npu_on_npu(monkeypatch):
    q = random_tokens([4, 6], HEADS, CHANNELS, dtype=torch.float32, seed=6)
    cu = cu_seqlens_from_lengths([4, 6])
    torch.testing.assert_close(varlen_attention(q, q, q, cu, cu), varlen_attention(q, q, q, cu, cu, backend="sdpa"))
    assert ops.uses_npu_kernel("fusion_attention", "npu:0")
    monkeypatch.setenv(ops.DISABLE_ENV_VAR, "fusion_attention")
    assert not ops.uses_npu_kernel("fusion_attention", "npu:0")  # disabled on NPU: auto falls back to SDPA
    with pytest.raises(ValueError, match="backend='flash'"):
        varlen_attention(q, q, q, cu, cu, backend="flash")


def test_bad_cu_seqlens_are_rejected():
    q = random_tokens([4, 6], HEADS, CHANNELS, dtype=torch.float32, seed=7)
    with pytest.raises(ValueError, match="must start at 0"):
        varlen_attention(q, q, q, [4, 10], [4, 10])  # cumulative ends without the 0: the NPU form, not flash-attn's
    with pytest.raises(ValueError, match="end at the token count 10"):
        varlen_attention(q, q, q, [0, 4, 9], [0, 4, 9])


def test_cu_seqlens_from_trellis2_sparse_coords():
    batch_ids = torch.tensor([0, 0, 0, 1, 1, 3, 3, 3, 3], dtype=torch.int32)  # item 2 empty
    coords = torch.cat([batch_ids[:, None], torch.zeros(9, 3, dtype=torch.int32)], dim=1)
    cu = cu_seqlens_from_coords(coords, batch_size=5)  # item 4 empty too
    assert cu.dtype == torch.int32 and cu.tolist() == [0, 3, 5, 5, 9, 9]
    assert cu_seqlens_from_lengths([3, 2, 0, 4]).tolist() == [0, 3, 5, 5, 9]
    with pytest.raises(ValueError, match="non-decreasing"):
        cu_seqlens_from_coords(coords.flip(0))


# --- the fusion_attention kernel's CPU reference ----------------------------------------------------------------


def bsnd(batch: int, seq: int, heads: int, seed: int, dtype=torch.float64) -> torch.Tensor:
    return torch.randn(batch, seq, heads, CHANNELS, generator=torch.Generator().manual_seed(seed), dtype=dtype)


@pytest.mark.parametrize("mask_shape", ["BNSS", "B1SS", "SS"])
def test_reference_kernel_bool_mask_true_means_masked_out(mask_shape):
    reference = ops.kernels()["fusion_attention"].reference
    q, k, v = bsnd(2, 7, HEADS, 10), bsnd(2, 9, HEADS, 11), bsnd(2, 9, HEADS, 12)
    shape = {"BNSS": (2, HEADS, 7, 9), "B1SS": (2, 1, 7, 9), "SS": (7, 9)}[mask_shape]
    masked = torch.rand(shape, generator=torch.Generator().manual_seed(13)) < 0.4
    masked[..., 0] = False  # no fully masked row
    scale = 1 / math.sqrt(CHANNELS)
    out = reference(q, k, v, HEADS, "BSND", atten_mask=masked, scale=scale)
    keep = ~masked  # SDPA's bool mask is the opposite polarity
    expected = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), keep)
    torch.testing.assert_close(out, expected.transpose(1, 2), atol=1e-12, rtol=0)


def test_reference_kernel_scale_defaults_to_one_not_inverse_sqrt_d():
    reference = ops.kernels()["fusion_attention"].reference
    q, k, v = bsnd(1, 8, HEADS, 20), bsnd(1, 8, HEADS, 21), bsnd(1, 8, HEADS, 22)
    out = reference(q, k, v, HEADS, "BSND")
    sdpa = lambda **kw: F.scaled_dot_product_attention(  # noqa: E731
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), **kw
    ).transpose(1, 2)
    torch.testing.assert_close(out, sdpa(scale=1.0), atol=1e-12, rtol=0)
    assert (out - sdpa()).abs().max() > 1e-2  # SDPA's default 1/√D is not the op's default


@pytest.mark.parametrize("layout", ["BNSD", "BSH", "SBH"])
def test_reference_kernel_layouts_and_gqa(layout):
    reference = ops.kernels()["fusion_attention"].reference
    q, k, v = bsnd(2, 5, 4, 30), bsnd(2, 6, 2, 31), bsnd(2, 6, 2, 32)  # 4 query heads share 2 kv heads
    expected = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale=0.3, enable_gqa=True
    )
    to_layout = {
        "BNSD": lambda x: x.transpose(1, 2),
        "BSH": lambda x: x.flatten(2),
        "SBH": lambda x: x.transpose(0, 1).flatten(2),
    }[layout]
    out = reference(*(to_layout(t) for t in (q, k, v)), 4, layout, scale=0.3)
    torch.testing.assert_close(out, to_layout(expected.transpose(1, 2)), atol=1e-12, rtol=0)


def test_reference_kernel_rejects_what_it_does_not_model():
    reference = ops.kernels()["fusion_attention"].reference
    q = random_tokens([3, 4], HEADS, CHANNELS, dtype=torch.float64, seed=40)
    with pytest.raises(ValueError, match="without a leading 0"):
        reference(q, q, q, HEADS, "TND", actual_seq_qlen=[0, 3, 7], actual_seq_kvlen=[0, 3, 7])
    with pytest.raises(ValueError, match="host list"):
        reference(q, q, q, HEADS, "TND", actual_seq_qlen=torch.tensor([3, 7]), actual_seq_kvlen=[3, 7])
    with pytest.raises(NotImplementedError, match="keep_prob"):
        reference(q, q, q, HEADS, "TND", keep_prob=0.9, actual_seq_qlen=[3, 7], actual_seq_kvlen=[3, 7])
    with pytest.raises(NotImplementedError, match="band"):
        reference(q, q, q, HEADS, "TND", next_tockens=2, actual_seq_qlen=[3, 7], actual_seq_kvlen=[3, 7])
