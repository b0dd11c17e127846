"""Variable-length (block-diagonal) attention for TRELLIS.2's sparse transformers, without flash_attn.

Adapted from: microsoft/TRELLIS.2 @ 5565d240, trellis2/modules/sparse/attention/full_attn.py
(``sparse_scaled_dot_product_attention``, its ``flash_attn`` branch). Upstream concatenates the tokens of every
batch item on dim 0 and calls ``flash_attn_varlen_{qkvpacked,kvpacked,}_func`` with ``cu_seqlens = [0, cumsum]``
(int32): item i's queries attend only to item i's keys, non-causal, scale 1/√C. That backend needs flash_attn
even when ``ATTN_BACKEND=sdpa`` is set, so every SLat flow depends on CUDA. Here the same semantics run on:

- ``sdpa``: one batched ``F.scaled_dot_product_attention`` when all items have the same length (the inference
  case: one item per sample), else one SDPA call per item, so no padded ``[N, Lmax, Lmax]`` problem is ever
  built (padding to the longest item would multiply the work by up to N·Lmax/ΣL);
- ``npu``: ``torch_npu.npu_fusion_attention`` in the ``TND`` layout through ``deliverykit.ops`` (kernel
  ``fusion_attention``), whose CPU reference runs this path off the NPU in tests.

Changes from upstream: flash_attn-style functions on plain tensors (no ``VarLenTensor``); ``cu_seqlens`` may be a
tensor or a host list (a list avoids a device sync per call, which the NPU op needs anyway).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any, Literal

import torch
import torch.nn.functional as F

from deliverykit import ops

Backend = Literal["auto", "sdpa", "npu"]
BACKENDS = ("auto", "sdpa", "npu")
CuSeqlens = torch.Tensor | Sequence[int]


def cu_seqlens_from_lengths(lengths: Sequence[int], device: torch.device | str | None = None) -> torch.Tensor:
    """``[0, l0, l0 + l1, …]`` as int32, flash-attn's ``cu_seqlens`` for items of ``lengths`` tokens."""
    counts = torch.tensor(list(lengths), dtype=torch.int64, device=device)
    return F.pad(counts.cumsum(0), (1, 0)).to(torch.int32)


def cu_seqlens_from_coords(coords: torch.Tensor, batch_size: int | None = None) -> torch.Tensor:
    """``cu_seqlens`` (int32, on ``coords.device``) of a TRELLIS.2 sparse tensor's ``coords`` ``[N, 1 + dim]``.

    Column 0 is the batch id; upstream's ``SparseTensor.layout`` counts it with ``bincount`` (``batch_size``
    entries, trailing items may be empty) and assumes the rows are grouped by item in ascending order.
    """
    batch_ids = coords[:, 0]
    if batch_ids.numel() > 1 and bool((batch_ids[1:] < batch_ids[:-1]).any()):
        raise ValueError(
            "coords[:, 0] (batch ids) must be non-decreasing: TRELLIS.2's layout takes item i as one contiguous "
            "block of rows; sort the sparse tensor by batch id first"
        )
    counts = torch.bincount(batch_ids.long(), minlength=batch_size or 0)
    return F.pad(counts.cumsum(0), (1, 0)).to(torch.int32)


def dense_as_varlen(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A dense ``[N, L, …]`` batch as varlen tokens ``[N·L, …]`` and its ``cu_seqlens`` (lengths ``[L]*N``).

    This is how upstream passes dense operands, e.g. the DINOv3 context ``kv [N, L, 2, H, C]`` of cross-attention.
    """
    batch, length = x.shape[:2]
    return x.flatten(0, 1), cu_seqlens_from_lengths([length] * batch)


def _host_offsets(cu_seqlens: CuSeqlens, total: int, name: str) -> list[int]:
    offsets = cu_seqlens.tolist() if isinstance(cu_seqlens, torch.Tensor) else [int(o) for o in cu_seqlens]
    starts_ok = len(offsets) >= 1 and offsets[0] == 0
    if not starts_ok or offsets[-1] != total or any(b < a for a, b in itertools.pairwise(offsets)):
        raise ValueError(
            f"{name}={offsets} must start at 0, be non-decreasing and end at the token count {total} "
            "(flash-attn's [0, cumsum(lengths)])"
        )
    return offsets


def _item_offsets(
    q: torch.Tensor, k: torch.Tensor, cu_seqlens_q: CuSeqlens, cu_seqlens_kv: CuSeqlens
) -> tuple[list[int], list[int]]:
    """Host offsets of the query and kv items, checked against the token counts and each other."""
    q_offsets = _host_offsets(cu_seqlens_q, q.shape[0], "cu_seqlens_q")
    kv_offsets = _host_offsets(cu_seqlens_kv, k.shape[0], "cu_seqlens_kv")
    if len(q_offsets) != len(kv_offsets):
        raise ValueError(f"cu_seqlens_q has {len(q_offsets) - 1} items, cu_seqlens_kv {len(kv_offsets) - 1}")
    return q_offsets, kv_offsets


def _check_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ValueError(f"q, k, v must be [T, H, C]; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if k.shape[:2] != v.shape[:2] or q.shape[1] != k.shape[1] or q.shape[2] != k.shape[2]:
        raise ValueError(
            f"q [Tq, H, C], k [Tk, H, C], v [Tk, H, Cv] expected; got {tuple(q.shape)}, {tuple(k.shape)}, "
            f"{tuple(v.shape)}"
        )


def npu_varlen_attention_kwargs(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: CuSeqlens, cu_seqlens_kv: CuSeqlens
) -> dict[str, Any]:
    """Keyword arguments of the ``fusion_attention`` kernel (``npu_fusion_attention``) for varlen attention.

    The op's traps are handled here: ``TND`` lengths are cumulative ends **without the leading 0**
    (``cu_seqlens[1:]``) as host lists, and ``scale`` is passed explicitly (the op's default is 1.0, not 1/√C).
    """
    _check_shapes(q, k, v)
    q_offsets, kv_offsets = _item_offsets(q, k, cu_seqlens_q, cu_seqlens_kv)
    return {
        "query": q,
        "key": k,
        "value": v,
        "head_num": q.shape[1],
        "input_layout": "TND",
        "scale": 1.0 / math.sqrt(q.shape[-1]),
        "actual_seq_qlen": q_offsets[1:],
        "actual_seq_kvlen": kv_offsets[1:],
    }


def _sdpa_bshc(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """SDPA on ``[B, S, H, C]`` tensors (SDPA wants heads before tokens), scale 1/√C."""
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale=1.0 / math.sqrt(q.shape[-1])
    )
    return out.transpose(1, 2)


def _sdpa_varlen(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_offsets: list[int], kv_offsets: list[int]
) -> torch.Tensor:
    q_spans, kv_spans = list(itertools.pairwise(q_offsets)), list(itertools.pairwise(kv_offsets))
    equal_q = len({end - start for start, end in q_spans}) == 1
    equal_kv = len({end - start for start, end in kv_spans}) == 1
    if equal_q and equal_kv and q.shape[0] and k.shape[0]:  # the inference case: one batched call
        batched = (t.unflatten(0, (len(q_spans), -1)) for t in (q, k, v))
        return _sdpa_bshc(*batched).reshape(q.shape[0], q.shape[1], v.shape[-1])
    out = q.new_empty(q.shape[0], q.shape[1], v.shape[-1])
    for (q_start, q_end), (kv_start, kv_end) in zip(q_spans, kv_spans, strict=True):
        if q_end > q_start:
            item = (q[None, q_start:q_end], k[None, kv_start:kv_end], v[None, kv_start:kv_end])
            out[q_start:q_end] = _sdpa_bshc(*item)[0]
    return out


def _resolve_backend(backend: str, device: torch.device) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r}; expected one of {', '.join(BACKENDS)}")
    if backend == "auto":
        return "npu" if ops.uses_npu_kernel("fusion_attention", device) else "sdpa"
    return backend


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: CuSeqlens,
    cu_seqlens_kv: CuSeqlens,
    *,
    backend: Backend = "auto",
) -> torch.Tensor:
    """Block-diagonal attention over concatenated sequences, like ``flash_attn_varlen_func`` (non-causal, 1/√C).

    Args:
        q (`torch.Tensor`): ``[Tq, H, C]`` queries of all items, concatenated.
        k (`torch.Tensor`): ``[Tk, H, C]`` keys.
        v (`torch.Tensor`): ``[Tk, H, Cv]`` values (``Cv == C`` on the NPU: the op wants value shaped as key).
        cu_seqlens_q (`torch.Tensor` or `Sequence[int]`): ``[0, cumsum(query lengths)]``; item i is
            ``q[cu_seqlens_q[i]:cu_seqlens_q[i + 1]]``.
        cu_seqlens_kv (`torch.Tensor` or `Sequence[int]`): the same for ``k`` and ``v``.
        backend (`str`, *optional*, defaults to ``"auto"``): ``"sdpa"`` (batched or per-item SDPA), ``"npu"``
            (the ``fusion_attention`` kernel on an NPU, its CPU reference elsewhere) or ``"auto"`` (``npu`` on an
            NPU unless the kernel is disabled, else ``sdpa``).

    Returns:
        `torch.Tensor`: ``[Tq, H, Cv]``, item i's queries attending to item i's keys only.
    """
    _check_shapes(q, k, v)
    backend = _resolve_backend(backend, q.device)
    if backend == "npu":
        kwargs = npu_varlen_attention_kwargs(q, k, v, cu_seqlens_q, cu_seqlens_kv)
        return ops.select("fusion_attention", q.device)(**kwargs)
    return _sdpa_varlen(q, k, v, *_item_offsets(q, k, cu_seqlens_q, cu_seqlens_kv))


def varlen_qkvpacked_attention(qkv: torch.Tensor, cu_seqlens: CuSeqlens, *, backend: Backend = "auto") -> torch.Tensor:
    """Self-attention on packed ``qkv [T, 3, H, C]``, like ``flash_attn_varlen_qkvpacked_func``; ``[T, H, C]``."""
    q, k, v = qkv.unbind(1)
    return varlen_attention(q, k, v, cu_seqlens, cu_seqlens, backend=backend)


def varlen_kvpacked_attention(
    q: torch.Tensor,
    kv: torch.Tensor,
    cu_seqlens_q: CuSeqlens,
    cu_seqlens_kv: CuSeqlens,
    *,
    backend: Backend = "auto",
) -> torch.Tensor:
    """``q [Tq, H, C]`` attending to packed ``kv [Tk, 2, H, C]``, like ``flash_attn_varlen_kvpacked_func``.

    For upstream's dense context ``kv [N, L, 2, H, C]``, ``kv, cu_seqlens_kv = dense_as_varlen(kv)`` first.
    """
    k, v = kv.unbind(1)
    return varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_kv, backend=backend)
