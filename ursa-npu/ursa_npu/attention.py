"""Scaled dot-product attention with fewer KV heads than query heads (URSA-1.7B: 16 query / 8 KV heads).

Upstream calls ``scaled_dot_product_attention(..., enable_gqa=True)``. CPU and CUDA support it since torch 2.5; on
an NPU it is unverified, so there the KV heads are repeated first (what ``enable_gqa`` means: KV head i serves
query heads i·g … i·g + g − 1), at the cost of two ``[B, H, L, D]`` copies per layer.
``URSA_NPU_SDPA_GQA=native`` uses ``enable_gqa`` everywhere, ``=repeat`` repeats everywhere.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from deliverykit.device import supports_sdpa_gqa

GQA_ENV_VAR = "URSA_NPU_SDPA_GQA"


def uses_native_gqa(device_type: str) -> bool:
    """Whether SDPA gets ``enable_gqa=True`` on this device type (else KV heads are repeated)."""
    choice = os.environ.get(GQA_ENV_VAR, "auto").strip().lower()
    if choice not in ("auto", "native", "repeat"):
        raise ValueError(f"{GQA_ENV_VAR}={choice!r}; expected auto, native or repeat")
    if choice != "auto":
        return choice == "native"
    return supports_sdpa_gqa(device_type)


def repeat_kv_heads(x: torch.Tensor, num_query_heads: int) -> torch.Tensor:
    """``[B, Hkv, L, D]`` → ``[B, Hq, L, D]``, each KV head repeated for its consecutive group of query heads."""
    heads = x.shape[1]
    if num_query_heads % heads:
        raise ValueError(f"{num_query_heads} query heads cannot share {heads} KV heads evenly")
    return x.repeat_interleave(num_query_heads // heads, dim=1)


def sdpa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False
) -> torch.Tensor:
    """``scaled_dot_product_attention`` on ``[B, H, L, D]`` tensors whose K/V may have fewer heads than Q."""
    if k.shape[1] == q.shape[1] or uses_native_gqa(q.device.type):
        return F.scaled_dot_product_attention(q, k, v, attn_mask, is_causal=is_causal, enable_gqa=True)
    k, v = (repeat_kv_heads(t, q.shape[1]) for t in (k, v))
    return F.scaled_dot_product_attention(q, k, v, attn_mask, is_causal=is_causal)
