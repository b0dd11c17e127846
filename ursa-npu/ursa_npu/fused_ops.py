"""The SwiGLU and RMSNorm that the patched ``diffnext/models/flash_attention.py`` calls off CUDA (via ``hooks``).

Upstream's SwiGLU is a CUDA jiterator kernel (an AssertionError anywhere else) and its RMSNorm fallback is plain
torch. Here both go through ``deliverykit.ops``: ``torch_npu.npu_swiglu`` / ``npu_rms_norm`` on an NPU, and the
reference (upstream's own formulas) on every other device or with ``DELIVERYKIT_DISABLE_KERNELS=swiglu,rms_norm``.
"""

from __future__ import annotations

import torch

from deliverykit import ops


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate)·up`` as upstream's jiterator computes it (float32 maths, one rounding), on any device."""
    return ops.call("swiglu", gate, up)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Upstream's ``RMSNorm.forward`` (``flash_attention.py``), fused on an NPU (output in x's dtype there)."""
    return ops.call("rms_norm", x, weight, eps)
