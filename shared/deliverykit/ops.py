"""One dispatch point for device-specific kernels, each with a CPU reference of the same semantics.

Model code calls ``ops.call(name, tensor, ...)``; the kernel runs its NPU implementation when the tensor lives on
an NPU and its reference everywhere else. ``DELIVERYKIT_DISABLE_KERNELS=name,other`` (or ``all``) forces the
reference on every device, to tell a kernel problem from a model problem. A kernel from an optional Ascend package
(``requires``: DrivingSDK's ``mx_driving``) is chosen only where that package is installed. Tests compare every NPU
implementation that can run on the CPU with its reference.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

DISABLE_ENV_VAR = "DELIVERYKIT_DISABLE_KERNELS"


@dataclasses.dataclass(frozen=True)
class Kernel:
    """A named kernel: its NPU implementation, a CPU reference of the same semantics, and what they compute.

    ``npu_runs_on_cpu`` says whether the NPU implementation is a composite of standard torch ops (so tests can run it
    on CPU tensors) or calls a ``torch_npu`` op that only an NPU can execute. ``requires`` names the optional package
    the NPU implementation imports (not installed by default): without it the reference runs on the NPU too.
    """

    name: str
    npu: Callable[..., Any]
    reference: Callable[..., Any]
    doc: str
    npu_runs_on_cpu: bool = True
    requires: str | None = None

    def installed(self) -> bool:
        return self.requires is None or importlib.util.find_spec(self.requires) is not None


_KERNELS: dict[str, Kernel] = {}


def register_kernel(
    name: str,
    *,
    npu: Callable[..., Any],
    reference: Callable[..., Any],
    doc: str,
    npu_runs_on_cpu: bool = True,
    requires: str | None = None,
) -> Kernel:
    kernel = Kernel(name, npu, reference, doc, npu_runs_on_cpu, requires)
    _KERNELS[name] = kernel
    return kernel


def kernels() -> dict[str, Kernel]:
    return dict(_KERNELS)


def _disabled(name: str) -> bool:
    disabled = {item.strip() for item in os.environ.get(DISABLE_ENV_VAR, "").split(",") if item.strip()}
    return name in disabled or "all" in disabled


def _kernel(name: str) -> Kernel:
    try:
        return _KERNELS[name]
    except KeyError:
        raise ValueError(f"unknown kernel {name!r}; registered: {', '.join(sorted(_KERNELS))}") from None


def uses_npu_kernel(name: str, device: torch.device | str) -> bool:
    """True when ``select(name, device)`` picks the NPU implementation: an NPU device, the kernel not disabled and
    its optional package (if any) installed.

    Model code asks this to choose between the fused kernel and its own fast path (say SDPA) on other devices,
    rather than running a reference that is written for clarity, not speed.
    """
    kernel = _kernel(name)
    device_type = device.type if isinstance(device, torch.device) else str(device).split(":")[0]
    return device_type == "npu" and not _disabled(name) and kernel.installed()


def select(name: str, device: torch.device | str) -> Callable[..., Any]:
    """The implementation of ``name`` for ``device``: NPU kernel on an NPU unless disabled, else the reference."""
    kernel = _kernel(name)
    return kernel.npu if uses_npu_kernel(name, device) else kernel.reference


def call(name: str, x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    """Run kernel ``name`` on ``x`` (and the other arguments) with the implementation for ``x``'s device."""
    return select(name, x.device)(x, *args, **kwargs)


def _erf_gelu_composite(x: torch.Tensor) -> torch.Tensor:
    # In place on the fresh erf output: one temporary instead of three (this runs on [tokens, 4096] per block).
    return torch.erf(x * (1.0 / math.sqrt(2.0))).add_(1.0).mul_(x).mul_(0.5)


register_kernel(
    "erf_gelu",
    npu=_erf_gelu_composite,
    reference=F.gelu,  # approximate="none": the erf formula on CPU and CUDA
    doc=(
        "Exact GELU 0.5·x·(1 + erf(x/√2)). On Ascend, F.gelu runs the tanh formula (aclnnGelu) unless "
        "TORCH_NPU_USE_COMPATIBLE_IMPL=1, so the NPU path spells the erf formula out; the CPU F.gelu already is it."
    ),
)


# --- swiglu: torch_npu.npu_swiglu ----------------------------------------------------------------------------------


def npu_swiglu_reference(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """CPU reference of ``torch_npu.npu_swiglu(x, dim)`` as documented: A, B = halves of ``x`` along ``dim``
    (A = **first** half), out = A·sigmoid(A)·B, computed in float32 and cast back once."""
    if x.shape[dim] % 2:
        raise ValueError(f"npu_swiglu splits dim {dim} in two halves; its size {x.shape[dim]} is odd")
    a, b = x.float().chunk(2, dim=dim)
    return (a * torch.sigmoid(a) * b).to(x.dtype)


def swiglu_via(fused_swiglu: Callable[..., torch.Tensor], gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate)·up`` through an ``npu_swiglu``-shaped op: it gates the first half, so gate goes first."""
    return fused_swiglu(torch.cat([gate, up], dim=-1), dim=-1)


def _npu_swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    import torch_npu  # NPU-only dependency: imported on first use, never at module import

    return swiglu_via(torch_npu.npu_swiglu, gate, up)


def _swiglu_reference(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``gate·up / (1 + exp(−gate))`` in float32, cast back to ``gate``'s dtype (the CUDA jiterator SwiGLU)."""
    x, y = gate.float(), up.float()
    return (x * y / (1.0 + torch.exp(-x))).to(gate.dtype)


register_kernel(
    "swiglu",
    npu=_npu_swiglu,
    reference=_swiglu_reference,
    npu_runs_on_cpu=False,
    doc=(
        "silu(gate)·up with float32 maths and one rounding. torch_npu.npu_swiglu(x, dim) gates the first half of x, "
        "so the call is npu_swiglu(cat([gate, up], -1), dim=-1); the other order is wrong by tens, not by rounding."
    ),
)


# --- rms_norm: torch_npu.npu_rms_norm ------------------------------------------------------------------------------


def npu_rms_norm_reference(
    x: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """CPU reference of ``torch_npu.npu_rms_norm(x, gamma, epsilon)`` as documented: ``(y, rstd)`` with
    y = x·rsqrt(mean(x², −1) + eps)·gamma in float32 cast once to x's dtype, rstd float32 with the last dim kept."""
    if gamma.dtype != x.dtype:
        raise TypeError(f"npu_rms_norm needs gamma in x's dtype ({x.dtype}), got {gamma.dtype}; cast gamma first")
    xf = x.float()
    rstd = xf.square().mean(-1, keepdim=True).add(epsilon).rsqrt()
    return (xf * rstd * gamma.float()).to(x.dtype), rstd


def rms_norm_via(
    fused_rms_norm: Callable[..., tuple[torch.Tensor, ...]], x: torch.Tensor, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """RMSNorm through an ``npu_rms_norm``-shaped op: gamma cast to x's dtype, eps passed explicitly, output ``[0]``."""
    return fused_rms_norm(x, weight.to(x.dtype), epsilon=eps)[0]


def _npu_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    import torch_npu  # NPU-only dependency: imported on first use, never at module import

    return rms_norm_via(torch_npu.npu_rms_norm, x, weight, eps)


def _rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x·rsqrt(mean(x², −1) + eps) with the rsqrt in float32 **rounded to x's dtype**, then ·weight (two roundings
    in half precision; the RMSNorm fallback of flash-attn-style code such as diffnext's)."""
    return x.mul(x.float().square().mean(-1, keepdim=True).add_(eps).rsqrt().to(x.dtype)) * weight


register_kernel(
    "rms_norm",
    npu=_npu_rms_norm,
    reference=_rms_norm_reference,
    npu_runs_on_cpu=False,
    doc=(
        "RMSNorm over the last dim. torch_npu.npu_rms_norm(x, gamma, epsilon) returns (y, rstd), wants gamma in x's "
        "dtype and rounds once; the reference rounds the rsqrt to x's dtype first (half precision: ≤ 2 ulp apart)."
    ),
)

# --- fusion_attention: torch_npu.npu_fusion_attention -------------------------------------------------------------

FUSION_ATTENTION_LAYOUTS = ("BSH", "SBH", "BSND", "BNSD", "TND")
_NO_BAND = 2147483647  # the op's default pre_tockens / next_tockens: no band limit


def _npu_fusion_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *args: Any, **kwargs: Any
) -> torch.Tensor:
    import torch_npu  # NPU-only dependency: imported on first use, never at module import

    # The op returns (attention_out, softmax_max, softmax_sum, softmax_out, seed, offset, mask_length).
    return torch_npu.npu_fusion_attention(query, key, value, *args, **kwargs)[0]


def _to_bnsd(x: torch.Tensor, layout: str, head_dim: int) -> torch.Tensor:
    if layout == "BNSD":
        return x
    if layout == "BSND":
        return x.transpose(1, 2)
    if layout == "BSH":
        return x.unflatten(-1, (-1, head_dim)).transpose(1, 2)
    return x.unflatten(-1, (-1, head_dim)).permute(1, 2, 0, 3)  # SBH → B, N, S, D


def _from_bnsd(x: torch.Tensor, layout: str) -> torch.Tensor:
    if layout == "BNSD":
        return x
    if layout == "BSND":
        return x.transpose(1, 2)
    if layout == "BSH":
        return x.transpose(1, 2).flatten(-2)
    return x.permute(2, 0, 1, 3).flatten(-2)  # B, N, S, D → SBH


def _masked_softmax_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> torch.Tensor:
    """softmax(mask(scale·QKᵀ))·V on ``[B, N, S, D]`` tensors; mask True = masked out; kv heads shared in groups."""
    compute_dtype = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
    q, k, v = (t.to(compute_dtype) for t in (q, k, v))
    if k.shape[1] != q.shape[1]:  # GQA: query heads i·g … i·g + g − 1 share kv head i
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    if mask is not None:
        scores = scores.masked_fill(mask.to(device=scores.device, dtype=torch.bool), float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), v)


def _segments(ends: Sequence[int] | None, total: int, name: str) -> list[tuple[int, int]]:
    """``[(start, end)]`` per sequence from the op's cumulative ends (no leading 0, last = total tokens)."""
    if ends is None or isinstance(ends, torch.Tensor):
        raise ValueError(
            f"{name} must be a host list of cumulative sequence ends for input_layout='TND', got "
            f"{type(ends).__name__}; pass cu_seqlens[1:].tolist()"
        )
    ends = [int(end) for end in ends]
    if not ends or ends[0] == 0:
        raise ValueError(
            f"{name}={ends} must hold cumulative ends without a leading 0 (lengths 2,2,2 → [2, 4, 6]); "
            "pass cu_seqlens[1:].tolist(), not cu_seqlens.tolist()"
        )
    starts = [0, *ends[:-1]]
    if any(end < start for start, end in zip(starts, ends, strict=True)) or ends[-1] != total:
        raise ValueError(f"{name}={ends} must be non-decreasing and end at the token count {total}")
    return list(zip(starts, ends, strict=True))


def _block_diagonal_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    q_segments: list[tuple[int, int]],
    kv_segments: list[tuple[int, int]],
    scale: float,
) -> torch.Tensor:
    """TND: query sequence i attends only to kv sequence i; ``[T, N, D]`` in, ``[Tq, N, Dv]`` out."""
    if len(q_segments) != len(kv_segments):
        raise ValueError(f"actual_seq_qlen has {len(q_segments)} sequences, actual_seq_kvlen {len(kv_segments)}")
    out = query.new_empty(*query.shape[:2], value.shape[-1])
    for (q_start, q_end), (kv_start, kv_end) in zip(q_segments, kv_segments, strict=True):
        q = query[q_start:q_end].transpose(0, 1)[None]  # [1, N, S, D]
        k = key[kv_start:kv_end].transpose(0, 1)[None]
        v = value[kv_start:kv_end].transpose(0, 1)[None]
        out[q_start:q_end] = _masked_softmax_attention(q, k, v, None, scale)[0].transpose(0, 1)
    return out


def _check_reference_support(
    input_layout: str,
    *,
    pse: torch.Tensor | None,
    padding_mask: torch.Tensor | None,
    atten_mask: torch.Tensor | None,
    keep_prob: float,
    prefix: Sequence[int] | None,
    sparse_mode: int,
) -> None:
    if input_layout not in FUSION_ATTENTION_LAYOUTS:
        raise ValueError(f"input_layout={input_layout!r}; expected one of {', '.join(FUSION_ATTENTION_LAYOUTS)}")
    unsupported = {
        "pse": pse is not None,
        "padding_mask": padding_mask is not None,
        "prefix": prefix is not None,
        "keep_prob (dropout)": keep_prob != 1.0,
        "sparse_mode": sparse_mode != 0,
        "atten_mask with input_layout='TND'": input_layout == "TND" and atten_mask is not None,
    }
    named = [name for name, present in unsupported.items() if present]
    if named:
        raise NotImplementedError(
            f"the fusion_attention CPU reference models sparse_mode=0, no pse/prefix/padding_mask, keep_prob=1 "
            f"and (for TND) no atten_mask; got {', '.join(named)}. Run on an NPU or extend the reference."
        )


def _check_no_band(pre_tockens: int, next_tockens: int, longest: int) -> None:
    if min(pre_tockens, next_tockens) < longest:
        raise NotImplementedError(
            f"pre_tockens={pre_tockens}, next_tockens={next_tockens} would cut a band out of sequences of "
            f"{longest} tokens; the CPU reference models only the full (unbanded) case"
        )


def _fusion_attention_reference(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    head_num: int,
    input_layout: str,
    pse: torch.Tensor | None = None,
    padding_mask: torch.Tensor | None = None,
    atten_mask: torch.Tensor | None = None,
    scale: float = 1.0,
    keep_prob: float = 1.0,
    pre_tockens: int = _NO_BAND,
    next_tockens: int = _NO_BAND,
    inner_precise: int = 0,
    prefix: Sequence[int] | None = None,
    actual_seq_qlen: Sequence[int] | None = None,
    actual_seq_kvlen: Sequence[int] | None = None,
    sparse_mode: int = 0,
) -> torch.Tensor:
    """CPU reference of ``torch_npu.npu_fusion_attention(...)[0]``, written from the op's documentation.

    out = softmax(mask(scale·QKᵀ))·V per batch item and head, returned in ``input_layout``:

    - ``scale`` defaults to **1.0** like the op (pass 1/√D for standard attention);
    - ``atten_mask`` bool/uint8, **True/1 = masked out** (SDPA's bool mask is the opposite: pass ``~mask``),
      shaped BNSS, B1SS, 11SS or SS; a fully masked row gives NaN here (the op needs ``inner_precise=2`` there);
    - ``TND``: tokens of all sequences concatenated, ``actual_seq_qlen``/``actual_seq_kvlen`` are host lists of
      cumulative ends **without a leading 0** (flash-attn's ``cu_seqlens[1:].tolist()``), attention is
      block-diagonal;
    - fewer kv heads than query heads (GQA): each kv head serves consecutive query heads, as SDPA's
      ``enable_gqa`` does (the op's grouping order is assumed, not documented).

    Computes in float32 for float16/bfloat16 inputs (the op accumulates in float32) and in the input dtype
    otherwise; ``inner_precise`` (a precision/performance mode) is accepted and ignored. Anything not modelled
    (pse, dropout, prefix, sparse modes, bands) raises ``NotImplementedError`` instead of being silently ignored.
    """
    _check_reference_support(
        input_layout,
        pse=pse,
        padding_mask=padding_mask,
        atten_mask=atten_mask,
        keep_prob=keep_prob,
        prefix=prefix,
        sparse_mode=sparse_mode,
    )
    if input_layout == "TND":
        q_segments = _segments(actual_seq_qlen, query.shape[0], "actual_seq_qlen")
        kv_segments = _segments(actual_seq_kvlen, key.shape[0], "actual_seq_kvlen")
        longest = max(end - start for start, end in q_segments + kv_segments)
        _check_no_band(pre_tockens, next_tockens, longest)
        return _block_diagonal_attention(query, key, value, q_segments, kv_segments, scale)
    head_dim = query.shape[-1] // head_num if input_layout in ("BSH", "SBH") else query.shape[-1]
    q, k, v = (_to_bnsd(t, input_layout, head_dim) for t in (query, key, value))
    _check_no_band(pre_tockens, next_tockens, max(q.shape[2], k.shape[2]))
    return _from_bnsd(_masked_softmax_attention(q, k, v, atten_mask, scale), input_layout).to(query.dtype)


register_kernel(
    "fusion_attention",
    npu=_npu_fusion_attention,
    reference=_fusion_attention_reference,
    npu_runs_on_cpu=False,
    doc=(
        "torch_npu.npu_fusion_attention(q, k, v, head_num, input_layout, ...)[0]: softmax(mask(scale·QKᵀ))·V. "
        "Traps: atten_mask True = masked out (SDPA bool mask inverted), scale defaults to 1.0 (not 1/√D), TND "
        "actual_seq_qlen/kvlen are cumulative ends without a leading 0, the op returns a 7-tuple (output first)."
    ),
)


# DrivingSDK's submanifold convolution, called through its autograd function (the module, ``mx_driving.SubMConv3d``,
# would allocate and initialise a weight on every call). ``Function.apply`` takes positional arguments only: they are
# passed in this order, which shared/tests/test_npu_conformance.py checks against ``forward`` in each checked wheel.
MX_DRIVING_SUBM_CONV_ARGS = ("features", "indices", "weight", "indices_offset", "out_spatial_shape", "out_channels",
    "batch_size", "kernel_size", "stride", "padding", "dilation", "groups", "bias")  # fmt: skip
MX_DRIVING_SUBM_CONV = ("mx_driving/ops/sparse_functional.py", "SubMConvFunction", "indice_subm_conv")
SUBM_CONV_DTYPES = (torch.float32, torch.float16)  # SubmSparseConv3dV3's on Ascend 910B (its ops-info.json)


def _mx_driving_subm_conv3d(
    feats: torch.Tensor,
    coords: torch.Tensor,
    spatial_shape: Sequence[int],
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    cache: dict | None = None,
) -> torch.Tensor:
    # mx_driving imports torch_npu and its transfer_to_npu at import: imported on first use, on an NPU only
    from mx_driving.ops.sparse_functional import indice_subm_conv

    kernel_size = list(weight.shape[1:4])
    arguments = {
        "features": feats,
        "indices": coords.int().contiguous(),
        "weight": weight.permute(1, 2, 3, 4, 0).contiguous(),  # [Co, K0, K1, K2, Ci] -> spconv 1.x [K0, K1, K2, Ci, Co]
        "indices_offset": None if cache is None else cache.get("indices_offset"),
        "out_spatial_shape": [int(side) for side in spatial_shape],
        "out_channels": weight.shape[0],
        "batch_size": int(coords[:, 0].max()) + 1 if coords.shape[0] else 1,
        "kernel_size": kernel_size,
        "stride": [1, 1, 1],
        "padding": [k // 2 for k in kernel_size],
        "dilation": [1, 1, 1],
        "groups": 1,
        "bias": None,  # the function leaves the bias to its module: added below
    }
    out, _, offsets = indice_subm_conv(*(arguments[name] for name in MX_DRIVING_SUBM_CONV_ARGS))
    if cache is not None:
        cache["indices_offset"] = offsets
    return out if bias is None else out + bias


def _subm_conv3d_reference(
    feats: torch.Tensor,
    coords: torch.Tensor,
    spatial_shape: Sequence[int],
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    cache: dict | None = None,
) -> torch.Tensor:
    """CPU reference of a submanifold 3D convolution, stride 1, dilation 1, odd kernel: densify, ``F.conv3d``, read
    back at the sites. A dense ``[B, Ci, X, Y, Z]`` grid: for the small grids of tests, not for a model's.

    ``out[p] = bias + Σ_v W[:, v] · feats[p + shift_v]`` over the shifts whose neighbour is an active site of the same
    batch item; rows follow ``coords`` (``[N, 4]``: batch, x, y, z). ``weight`` is ``[Co, K0, K1, K2, Ci]`` (TRELLIS.2
    / FlexGEMM / spconv 2.x), K0 ↔ x; ``cache`` is the NPU implementation's (ignored here).
    """
    del cache
    index = coords.long()
    batch = int(index[:, 0].max()) + 1 if index.shape[0] else 1
    volume = feats.new_zeros(batch, *[int(side) for side in spatial_shape], feats.shape[1])
    volume[index[:, 0], index[:, 1], index[:, 2], index[:, 3]] = feats
    kernel = weight.permute(0, 4, 1, 2, 3)
    dense = F.conv3d(volume.permute(0, 4, 1, 2, 3), kernel, bias, padding=[k // 2 for k in kernel.shape[2:]])
    return dense.permute(0, 2, 3, 4, 1)[index[:, 0], index[:, 1], index[:, 2], index[:, 3]]


register_kernel(
    "subm_conv3d",
    npu=_mx_driving_subm_conv3d,
    reference=_subm_conv3d_reference,
    npu_runs_on_cpu=False,
    requires="mx_driving",
    doc=(
        "DrivingSDK mx_driving's submanifold conv (SubMConv3d, stride 1, dilation 1, float32/float16 on 910B): output "
        "sites = input sites, in order. Traps: its weight is [K0, K1, K2, Ci, Co] (ours [Co, K0, K1, K2, Ci]), the "
        "autograd function leaves the bias to the module, and importing mx_driving imports torch_npu's "
        "transfer_to_npu (torch.cuda calls go to the NPU)."
    ),
)


# The torch_npu ops the NPU implementations call, each with its CPU reference of the op's documented signature and
# semantics. Callers' arguments meet these references in the CPU tests; shared/tests/test_npu_conformance.py checks
# each reference's signature against the op's schema in every checked torch-npu wheel, and the NPU probe refuses a
# torch_npu that lacks one of them (deliverykit.device.torch_npu_problem).
NPU_OPS: dict[str, Callable[..., Any]] = {
    "npu_swiglu": npu_swiglu_reference,
    "npu_rms_norm": npu_rms_norm_reference,
    "npu_fusion_attention": _fusion_attention_reference,
}
