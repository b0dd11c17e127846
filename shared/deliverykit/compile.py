"""Which ``torch.compile`` backend a function gets, decided per device on its first call.

Upstream model code often decorates small kernels with ``torch.compile`` (inductor) at import: inductor is not an NPU
backend, and on the CPU it needs a C compiler and seconds of compile time for results that equal eager. The policy:
NPU → the ``npu`` dynamo backend that torch_npu registers (torchair underneath), else eager; CUDA → inductor;
anything else (CPU) → eager. ``DELIVERYKIT_EAGER=1`` forces eager everywhere (to rule compilation out). Runs print
the choice as ``COMPILE_BACKEND=`` (:func:`backend_name`).

How torch_npu ships torchair (read from the wheels, ``deliverykit.tools.npu_wheels``): no wheel has a top-level
``torchair`` package; it is ``torch_npu/dynamo/torchair``, reachable as ``torchair`` only through a lazy
``sys.modules`` proxy that ``import torch_npu`` installs, and whose ``__spec__`` imports torchair for real. 2.6
registers the ``npu`` backend at ``import torch_npu``; 2.9 and later register it when ``torch._dynamo`` loads and
declare it as a ``torch_dynamo_backends`` entry point. So ``find_spec("torchair")`` answers by import order (None
before ``import torch_npu``: a silent eager run that only looks slow), while dynamo's registry, asked after
``import torch_npu``, answers the same in every release.

Eager equals inductor in float32 only. For a pointwise kernel in fp16/bf16, inductor's fused code loads the inputs,
computes in float32 and rounds once at the store; eager rounds after every op (``w0·x0 + w1·x1`` three times), which
moved a third of URSA's fp16 RoPE outputs by up to 0.0078 — enough to flip sampled tokens. ``eager_float32=True``
makes the eager variant compute as inductor does, so eager on the CPU reproduces upstream's compiled rounding.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

import torch

logger = logging.getLogger(__name__)

EAGER_ENV_VAR = "DELIVERYKIT_EAGER"
EAGER = "eager"


def force_eager() -> bool:
    return os.environ.get(EAGER_ENV_VAR, "").strip().lower() in ("1", "true", "yes")


NPU_BACKEND = "npu"  # the dynamo backend name torch_npu registers (torchair's NPU compiler)


def npu_backend() -> str | None:
    """``"npu"`` when torch_npu provides its dynamo backend, else None (compiled functions then run eagerly)."""
    try:
        import torch_npu  # noqa: F401  (registers the backend, or its entry point makes it findable)
        from torch._dynamo import list_backends

        found = NPU_BACKEND in list_backends(exclude_tags=())
    except Exception as err:  # a broken torch_npu/dynamo must not stop inference: eager is always correct
        logger.warning("torch_npu's dynamo backend could not be looked up (%s); compiled functions run eagerly", err)
        return None
    if not found:
        logger.warning("torch_npu registers no %r dynamo backend; compiled functions run eagerly", NPU_BACKEND)
    return NPU_BACKEND if found else None


def compile_backend(device_type: str) -> str:
    """The ``torch.compile`` backend for ``device_type``, or ``"eager"`` for no compilation."""
    if force_eager() or sys.platform != "linux":
        return EAGER
    if device_type == "npu":
        return npu_backend() or EAGER
    if device_type == "cuda":
        return "inductor"
    return EAGER


def backend_name(device: torch.device | str) -> str:
    """What :func:`compile_per_device` uses on ``device``: the ``COMPILE_BACKEND=`` evidence value."""
    return compile_backend(device.type if isinstance(device, torch.device) else str(device).split(":")[0])


def in_float32(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` computed from float32 copies of its half-precision tensor inputs, its output rounded back once."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        half = next((t.dtype for t in tensors if t.dtype in (torch.float16, torch.bfloat16)), None)
        if half is None:
            return fn(*args, **kwargs)

        def up(a: Any) -> Any:
            return a.float() if isinstance(a, torch.Tensor) and a.dtype == half else a

        return fn(*map(up, args), **{k: up(v) for k, v in kwargs.items()}).to(half)

    return wrapper


def compile_per_device(
    eager_float32: bool = False, **compile_kwargs: Any
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: compile ``fn`` lazily with :func:`compile_backend` of its first tensor argument's device.

    One compiled function per device type (and eager switch), built on first use; ``compile_kwargs`` go to
    ``torch.compile`` (say ``fullgraph=True``, as upstream passed). ``eager_float32``: ``fn`` is a pointwise kernel
    whose eager variant computes half-precision inputs in float32 and rounds once, as inductor does (module doc).
    """

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        variants: dict[tuple[str, bool], Callable[..., Any]] = {}

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            device_type = next(a.device.type for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor))
            key = (device_type, force_eager())
            if key not in variants:
                backend = compile_backend(device_type)
                if backend != EAGER:
                    variants[key] = torch.compile(fn, backend=backend, **compile_kwargs)
                else:
                    variants[key] = in_float32(fn) if eager_float32 else fn
                logger.info("%s on %s: %s", fn.__qualname__, device_type, backend)
            return variants[key](*args, **kwargs)

        wrapper.variants = variants  # for tests and diagnostics: what was chosen per device
        return wrapper

    return decorate
