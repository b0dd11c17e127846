"""Fused NPU attention for LTX-2.x with correct masks, and the one call that installs it.

Why: diffusers 0.42.1's ``_native_npu`` backend turns any mask into ``~mask.bool()``. LTX-2 passes *additive* float
masks (transformer text mask 0 keep / -10000 masked, connectors 0 / -finfo.max, and an all-zero mask once learnable
registers replace the padding), so every kept token becomes "masked out" and the padding is attended
(huggingface/diffusers issue #14397, PR #14396). Here the mask is converted by meaning: a float value at or below
``MASKED_AT_OR_BELOW`` is masked, 0 is kept, an all-kept mask is dropped; an SDPA bool mask (True = attend) is
inverted. The result is the Ascend ``atten_mask`` (bool, True = masked out, ``[B, 1|N, Sq, Skv]``) of
``npu_fusion_attention``, called through deliverykit's ``fusion_attention`` kernel in the ``BSND`` layout with the
scale given explicitly (the op's default is 1.0, not 1/√D).

How it is installed: LTX-2's two processors (``LTX2AudioVideoAttnProcessor``, ``LTX2PerturbedAttnProcessor``) call
the module-global ``dispatch_attention_fn``. Our processors are those classes with exactly that one global rebound
to :func:`dispatch_ltx2_attention`, so the upstream projections, RoPE, gating and perturbation code runs unchanged
and is not copied. A registered diffusers backend is not an option: ``AttentionBackendName`` is a closed Enum that
``dispatch_attention_fn`` validates every name against, and overwriting ``_native_npu`` in the registry would change
every model in the process.

Anything the fused kernel cannot express exactly goes to diffusers' own dispatcher (SDPA unless another backend was
set): a float mask holding other values than 0 and "masked" (a bias, not a mask), a row whose keys are all masked
(SDPA averages over them, the kernel would not), dropout, ``is_causal``, context parallelism, and fp32 tensors on an
NPU (the kernel computes fp16/bf16).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import types
from collections.abc import Iterator
from typing import Any, Literal

import torch
from diffusers.models import attention_dispatch
from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry, dispatch_attention_fn
from diffusers.models.transformers.transformer_ltx2 import LTX2AudioVideoAttnProcessor, LTX2PerturbedAttnProcessor

from deliverykit import ops

logger = logging.getLogger(__name__)

KERNEL = "fusion_attention"
Mode = Literal["auto", "npu"]
MODES = ("auto", "npu")

# exp(x) underflows to exactly 0 in float32 below about -104, so any additive value at or below -1000 removes its key
# from the softmax whatever the scores are (|scores| < 900): it is a boolean "masked". LTX-2 writes -10000 (-9984 in
# bf16) or -finfo.max; a value strictly between this threshold and 0 is a bias and is left to SDPA.
MASKED_AT_OR_BELOW = -1000.0
_KERNEL_DTYPES = (torch.float16, torch.bfloat16)


class UnsupportedMaskError(ValueError):
    """A mask the fused kernel cannot express exactly; the caller falls back to SDPA."""


def _as_4d(attn_mask: torch.Tensor) -> torch.Tensor:
    """``[B, Skv]`` → ``[B, 1, 1, Skv]``, ``[B, Sq|1, Skv]`` → ``[B, 1, Sq|1, Skv]``, 4-D unchanged."""
    if attn_mask.ndim == 2:
        return attn_mask[:, None, None, :]
    if attn_mask.ndim == 3:
        return attn_mask[:, None]
    if attn_mask.ndim == 4:
        return attn_mask
    raise UnsupportedMaskError(f"attention mask of shape {tuple(attn_mask.shape)}; expected 2-D, 3-D or 4-D")


def to_npu_attention_mask(
    attn_mask: torch.Tensor | None, query: torch.Tensor, key: torch.Tensor
) -> torch.Tensor | None:
    """The ``npu_fusion_attention`` mask for an SDPA-style mask: bool, True = masked out, ``[B, 1|N, Sq, Skv]``.

    ``query``/``key`` are ``[B, S, N, D]``. A float mask is additive (0 keep, ≤ ``MASKED_AT_OR_BELOW`` masked); a
    bool mask is SDPA's (True = attend). Returns None when nothing is masked (the kernel is faster without a mask).
    A head axis that only repeats one mask (LTX-2's processors repeat it per head) is reduced to 1. Costs one host
    sync, as diffusers' own NPU mask check does. Raises :class:`UnsupportedMaskError` when the kernel cannot compute
    what SDPA would.
    """
    if attn_mask is None:
        return None
    batch, q_len, heads = query.shape[:3]
    kv_len = key.shape[1]
    mask = _as_4d(attn_mask)
    if mask.shape[0] not in (1, batch) or mask.shape[1] not in (1, heads) or mask.shape[2] not in (1, q_len):
        raise UnsupportedMaskError(f"mask shape {tuple(attn_mask.shape)} for B={batch}, N={heads}, Sq={q_len}")
    if mask.shape[3] != kv_len:
        raise UnsupportedMaskError(f"mask of {mask.shape[3]} keys for {kv_len} keys")
    if mask.dtype == torch.bool:
        masked, not_binary = ~mask, torch.zeros((), dtype=torch.bool, device=mask.device)
    else:
        masked = mask <= MASKED_AT_OR_BELOW
        not_binary = ((mask != 0) & ~masked).any()
    flags = torch.stack([masked.any(), not_binary, masked.all(dim=-1).any(), (masked != masked[:, :1]).any()]).tolist()
    any_masked, is_bias, row_fully_masked, heads_differ = flags
    if is_bias:
        raise UnsupportedMaskError("float mask holds values other than 0 and masked (an additive bias)")
    if row_fully_masked:
        raise UnsupportedMaskError("a query row has every key masked")
    if not any_masked:
        return None
    if not heads_differ:
        masked = masked[:, :1]
    return masked.expand(batch, -1, q_len, kv_len).contiguous()


def fused_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """Attention through the ``fusion_attention`` kernel (NPU op on an NPU, its CPU reference elsewhere).

    ``[B, S, N, D]`` in and out, as diffusers' dispatcher. Raises :class:`UnsupportedMaskError` (before any kernel
    runs) for a mask the kernel cannot express.
    """
    npu_mask = to_npu_attention_mask(attn_mask, query, key)
    return ops.select(KERNEL, query.device)(
        query,
        key,
        value,
        head_num=query.shape[2],
        input_layout="BSND",
        atten_mask=npu_mask,
        scale=1.0 / math.sqrt(query.shape[-1]) if scale is None else scale,
    )


def dispatch_ltx2_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    attention_kwargs: dict[str, Any] | None = None,
    *,
    backend: Any = None,
    parallel_config: Any = None,
    mode: Mode = "auto",
) -> torch.Tensor:
    """Drop-in for diffusers' ``dispatch_attention_fn``: the fused kernel where it applies, diffusers' otherwise.

    The fallback never uses diffusers' ``_native_npu`` (even when it was selected): SDPA takes its place.

    ``mode="auto"`` uses the kernel for fp16/bf16 tensors on an NPU (unless deliverykit's kernel switch disables
    it); ``mode="npu"`` uses the kernel path on every device, its CPU reference off an NPU (tests, mask debugging).
    """
    active = backend if backend is not None else _AttentionBackendRegistry.get_active_backend()[0]
    if active == AttentionBackendName._NATIVE_NPU:  # the broken mask handling this module exists to avoid
        backend = AttentionBackendName.NATIVE
    fallback = functools.partial(
        dispatch_attention_fn,
        query,
        key,
        value,
        attn_mask=attn_mask,
        dropout_p=dropout_p,
        is_causal=is_causal,
        scale=scale,
        enable_gqa=enable_gqa,
        attention_kwargs=attention_kwargs,
        backend=backend,
        parallel_config=parallel_config,
    )
    if parallel_config is not None and attn_mask is not None:
        fallback.keywords["attn_mask"] = _one_head_mask(attn_mask)
    on_npu = ops.uses_npu_kernel(KERNEL, query.device) and query.dtype in _KERNEL_DTYPES
    plain = dropout_p == 0.0 and not is_causal and parallel_config is None and not attention_kwargs
    if not plain or not (mode == "npu" or on_npu):
        return fallback()
    try:
        return fused_attention(query, key, value, attn_mask, scale)
    except UnsupportedMaskError as err:
        logger.debug("fused attention not applicable (%s); using diffusers' dispatcher", err)
        return fallback()


def _one_head_mask(attn_mask: torch.Tensor) -> torch.Tensor:
    """A ``[B, H, Sq, Skv]`` mask repeated over H as ``[B, 1, Sq, Skv]``, for context parallel.

    Ulysses hands a rank H/U heads after its all-to-all but leaves the mask with all H (diffusers 0.42.1); LTX-2's
    processors only repeat one mask per head, so one head is exact. A mask that differs per head cannot be split
    here and raises.
    """
    if attn_mask.ndim != 4 or attn_mask.shape[1] == 1:
        return attn_mask
    first = attn_mask[:, :1]
    if not torch.equal(attn_mask, first.expand_as(attn_mask)):
        raise ValueError("context parallel attention got a mask that differs per head; it cannot be split by head")
    return first


def _with_dispatch(processor_cls: type, mode: Mode) -> type:
    """``processor_cls`` whose ``__call__`` runs unchanged except that ``dispatch_attention_fn`` is ours."""
    call = processor_cls.__call__
    dispatch = functools.partial(dispatch_ltx2_attention, mode=mode)
    rebound = types.FunctionType(
        call.__code__,
        {**call.__globals__, "dispatch_attention_fn": dispatch},
        call.__name__,
        call.__defaults__,
        call.__closure__,
    )
    rebound.__kwdefaults__ = call.__kwdefaults__
    rebound.__doc__ = call.__doc__
    name = f"NPU{processor_cls.__name__}" if mode == "auto" else f"Fused{processor_cls.__name__}"
    return type(name, (processor_cls,), {"__call__": rebound, "__module__": __name__, "mode": mode})


_UPSTREAM_PROCESSORS = (LTX2AudioVideoAttnProcessor, LTX2PerturbedAttnProcessor)
PROCESSORS: dict[tuple[type, str], type] = {
    (base, mode): _with_dispatch(base, mode) for base in _UPSTREAM_PROCESSORS for mode in MODES
}
_UPSTREAM_OF = {base: base for base in _UPSTREAM_PROCESSORS} | {ours: base for (base, _), ours in PROCESSORS.items()}


def install_npu_attention(module: torch.nn.Module, *, mode: Mode = "auto") -> int:
    """Swap every LTX-2 attention processor under ``module`` for ours; return how many were swapped.

    The processor's backend and parallel config are kept, so ``set_attention_backend`` still picks the fallback.
    Idempotent: an installed processor is swapped again only to change its mode.
    """
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}; expected one of {', '.join(MODES)}")
    swapped = 0
    for submodule in module.modules():
        processor = getattr(submodule, "processor", None)
        base = _UPSTREAM_OF.get(type(processor))
        if base is None:
            continue
        replacement = PROCESSORS[(base, mode)]()
        replacement.__dict__.update(processor.__dict__)  # instance _attention_backend / _parallel_config
        submodule.set_processor(replacement)
        swapped += 1
    return swapped


def enable_npu_attention(pipe: Any, *, mode: Mode = "auto") -> int:
    """Install the fused NPU attention on the pipeline's transformer and text connectors; return the count swapped.

    Call it instead of ``set_attention_backend("_native_npu")`` (which inverts LTX-2's masks). Off an NPU,
    ``mode="auto"`` leaves the numerics to diffusers' dispatcher (SDPA), so it is safe to call everywhere.
    """
    swapped = 0
    for name in ("transformer", "connectors"):
        component = getattr(pipe, name, None)
        if component is not None:
            swapped += install_npu_attention(component, mode=mode)
    if swapped == 0:
        raise ValueError("no LTX-2 attention processor found on pipe.transformer / pipe.connectors")
    return swapped


@contextlib.contextmanager
def stock_native_npu_on_cpu() -> Iterator[None]:
    """diffusers' own ``_native_npu`` backend, with deliverykit's CPU reference standing in for the NPU op.

    Reproduces diffusers issue #14397 without an NPU (for tests and ``benchmarks/attention_parity.py``): the stock
    mask conversion runs unchanged and only ``npu_fusion_attention`` is replaced, for the duration of the block.
    """
    reference = ops.kernels()[KERNEL].reference

    def npu_fusion_attention(*args: Any, sync: bool = False, **kwargs: Any) -> tuple[torch.Tensor]:
        return (reference(*args, **kwargs),)  # the op returns a 7-tuple, output first

    saved = dict(vars(attention_dispatch))
    attention_dispatch._CAN_USE_NPU_ATTN = True
    attention_dispatch.npu_fusion_attention = npu_fusion_attention
    try:
        with attention_dispatch.attention_backend("_native_npu"):
            yield
    finally:
        attention_dispatch._CAN_USE_NPU_ATTN = saved["_CAN_USE_NPU_ATTN"]
        if "npu_fusion_attention" in saved:
            attention_dispatch.npu_fusion_attention = saved["npu_fusion_attention"]
        else:
            del attention_dispatch.npu_fusion_attention
