"""Grouped-query attention: the repeated-KV path equals SDPA's ``enable_gqa`` and upstream's ``repeat_kv``."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ursa_npu import attention


def _qkv(heads: int = 4, kv_heads: int = 2, length: int = 9, dim: int = 16):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, heads, length, dim, generator=g)
    k, v = (torch.randn(2, kv_heads, length, dim, generator=g) for _ in range(2))
    return q, k, v


def upstream_repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """``Qwen3Attention.repeat_kv`` from diffnext/models/text_encoders/qwen3.py at the pinned commit."""
    return x.unsqueeze(2).expand(-1, -1, groups, -1, -1).flatten(1, 2)


def test_repeat_kv_heads_is_upstreams_head_order():
    _, k, _ = _qkv()
    torch.testing.assert_close(attention.repeat_kv_heads(k, 4), upstream_repeat_kv(k, 2), rtol=0, atol=0)
    with pytest.raises(ValueError, match="cannot share 3 KV heads evenly"):
        attention.repeat_kv_heads(torch.zeros(1, 3, 2, 4), 4)


@pytest.mark.parametrize("mode", ["plain", "causal", "mask"])
def test_repeated_path_equals_native_enable_gqa(mode, monkeypatch):
    q, k, v = _qkv()
    mask = torch.rand(9, 9, generator=torch.Generator().manual_seed(1)) > 0.3 if mode == "mask" else None
    if mask is not None:
        mask.fill_diagonal_(True)  # no fully masked row
    is_causal = mode == "causal"
    native = F.scaled_dot_product_attention(q, k, v, mask, is_causal=is_causal, enable_gqa=True)
    monkeypatch.setenv(attention.GQA_ENV_VAR, "repeat")
    repeated = attention.sdpa(q, k, v, mask, is_causal=is_causal)
    torch.testing.assert_close(repeated, native, rtol=1e-6, atol=1e-6)
    # and the comparison can fail: pairing query heads with the wrong KV heads changes the result
    wrong = F.scaled_dot_product_attention(q, k.repeat(1, 2, 1, 1), v.repeat(1, 2, 1, 1), mask, is_causal=is_causal)
    assert (wrong - native).abs().max() > 1e-2


def test_native_gqa_policy_per_device_type_and_override(monkeypatch):
    monkeypatch.delenv(attention.GQA_ENV_VAR, raising=False)
    assert attention.uses_native_gqa("cpu") and attention.uses_native_gqa("cuda")
    assert not attention.uses_native_gqa("npu")  # enable_gqa on NPU is unverified: repeat KV heads
    monkeypatch.setenv(attention.GQA_ENV_VAR, "native")
    assert attention.uses_native_gqa("npu")
    monkeypatch.setenv(attention.GQA_ENV_VAR, "repeat")
    assert not attention.uses_native_gqa("cpu")
    monkeypatch.setenv(attention.GQA_ENV_VAR, "sometimes")
    with pytest.raises(ValueError, match="expected auto, native or repeat"):
        attention.uses_native_gqa("cpu")
