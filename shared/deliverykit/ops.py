"""One dispatch point for device-specific kernels, each with a CPU reference of the same semantics.

Model code calls ``ops.call(name, tensor, ...)``; the kernel runs its NPU implementation when the tensor lives on
an NPU and its reference everywhere else. ``DELIVERYKIT_DISABLE_KERNELS=name,other`` (or ``all``) forces the
reference on every device, to tell a kernel problem from a model problem. Tests compare every NPU implementation
that can run on the CPU with its reference.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

DISABLE_ENV_VAR = "DELIVERYKIT_DISABLE_KERNELS"


@dataclasses.dataclass(frozen=True)
class Kernel:
    name: str
    npu: Callable[..., Any]
    reference: Callable[..., Any]
    doc: str


_KERNELS: dict[str, Kernel] = {}


def register_kernel(name: str, *, npu: Callable[..., Any], reference: Callable[..., Any], doc: str) -> Kernel:
    kernel = Kernel(name, npu, reference, doc)
    _KERNELS[name] = kernel
    return kernel


def kernels() -> dict[str, Kernel]:
    return dict(_KERNELS)


def _disabled(name: str) -> bool:
    disabled = {item.strip() for item in os.environ.get(DISABLE_ENV_VAR, "").split(",") if item.strip()}
    return name in disabled or "all" in disabled


def select(name: str, device: torch.device | str) -> Callable[..., Any]:
    """The implementation of ``name`` for ``device``: NPU kernel on an NPU unless disabled, else the reference."""
    try:
        kernel = _KERNELS[name]
    except KeyError:
        raise ValueError(f"unknown kernel {name!r}; registered: {', '.join(sorted(_KERNELS))}") from None
    device_type = device.type if isinstance(device, torch.device) else str(device).split(":")[0]
    return kernel.npu if device_type == "npu" and not _disabled(name) else kernel.reference


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
