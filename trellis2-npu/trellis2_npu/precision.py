"""The public TRELLIS.2 NPU port's two symmetric precision patches for DINOv3.

On Ascend, ``F.gelu`` runs the tanh approximation unless ``TORCH_NPU_USE_COMPATIBLE_IMPL=1`` and Conv2d may use
HF32; together they put the unpatched NPU features 0.0177 max_abs away from the CPU. The patches replace
(1) the patch-embedding Conv2d by the same product computed as an fp32 matmul over unfolded patches and
(2) the MLP activation by exact GELU written with ``erf`` (spelled out on the NPU; the CPU's ``F.gelu`` already is
that formula). They are applied to *both* sides of a comparison, and on the CPU in fp32 they change the features
by at most rounding (tested ≤ 1e-5).

The released SC-VAE and sparse-structure decoders are fp16 (upstream's ``use_fp16``). A CPU without fp16
arithmetic (``deliverykit.device.half_compute_dtype``) emulates it, so slowly that the released-size run stalls in
the sparse-structure decoder's dense Conv3d: :func:`fp32_half_models` builds them in fp32 there instead, which
rounds less than fp16, never more.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from deliverykit import ops


class MatmulPatchEmbedding(nn.Conv2d):
    """A stride = kernel Conv2d computed as ``unfold`` + fp32 matmul. Parameter names stay ``weight``/``bias``."""

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        batch, _, height, width = pixel_values.shape
        kernel_h, kernel_w = self.kernel_size
        patches = F.unfold(pixel_values.float(), kernel_size=self.kernel_size, stride=self.stride)  # [B, C*k*k, L]
        weight = self.weight.float().reshape(self.out_channels, -1)
        out = torch.matmul(weight, patches)  # [B, Co, L]
        if self.bias is not None:
            out = out + self.bias.float().view(1, -1, 1)
        out_h = (height - kernel_h) // self.stride[0] + 1
        out_w = (width - kernel_w) // self.stride[1] + 1
        return out.reshape(batch, self.out_channels, out_h, out_w).to(pixel_values.dtype)

    @classmethod
    def from_conv(cls, conv: nn.Conv2d) -> MatmulPatchEmbedding:
        if conv.stride != conv.kernel_size or conv.padding != (0, 0) or conv.dilation != (1, 1) or conv.groups != 1:
            raise ValueError("the matmul patch embedding needs a non-overlapping Conv2d (stride = kernel, no padding)")
        patched = cls(
            conv.in_channels,
            conv.out_channels,
            conv.kernel_size,
            conv.stride,
            bias=conv.bias is not None,
            device="meta",
        )
        patched.weight = conv.weight  # the same Parameters: no copy, same state_dict keys
        patched.bias = conv.bias
        return patched


class ErfGELU(nn.Module):
    """Exact GELU, ``0.5·x·(1 + erf(x/√2))``, so that no backend substitutes the tanh formula.

    On an NPU the formula is spelled out (deliverykit's ``erf_gelu`` kernel); on the CPU and CUDA, ``F.gelu`` already
    computes exactly it, and the fused kernel is several times faster than the composite.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.call("erf_gelu", x)


def apply_precision_patch(model: nn.Module) -> list[str]:
    """Patch a ``DINOv3ViTModel`` in place; return the names of the replaced modules."""
    if getattr(model.config, "hidden_act", None) != "gelu" or getattr(model.config, "use_gated_mlp", False):
        raise ValueError("the precision patch is for DINOv3's non-gated GELU MLP; this model uses another activation")
    patched = []
    embeddings = model.embeddings
    embeddings.patch_embeddings = MatmulPatchEmbedding.from_conv(embeddings.patch_embeddings)
    patched.append("embeddings.patch_embeddings")
    for name, module in model.named_modules():
        if hasattr(module, "act_fn") and hasattr(module, "up_proj"):
            module.act_fn = ErfGELU()
            patched.append(f"{name}.act_fn")
    return patched


def compute_in_fp32(model: nn.Module) -> bool:
    """Turn an upstream model built with ``use_fp16`` to fp32 in place; return whether it was fp16.

    Upstream's ``convert_to_fp32`` casts the fp16 torso back, but the SC-VAE classes leave ``self.dtype`` at fp16,
    which their ``forward`` casts the features to: both attributes are set here too.
    """
    if getattr(model, "dtype", None) != torch.float16 or not hasattr(model, "convert_to_fp32"):
        return False
    model.convert_to_fp32()
    model.dtype = torch.float32
    if hasattr(model, "use_fp16"):
        model.use_fp16 = False
    return True


@contextlib.contextmanager
def fp32_half_models(models: ModuleType) -> Iterator[None]:
    """Within: upstream's ``models.from_pretrained`` returns its fp16 models in fp32 (:func:`compute_in_fp32`),
    and so do the loaders of :mod:`.offload` captured within, whenever they build."""
    original = models.from_pretrained

    def loaded_in_fp32(path: str, **kwargs: Any) -> Any:
        model = original(path, **kwargs)
        compute_in_fp32(model)
        return model

    models.from_pretrained = loaded_in_fp32
    try:
        yield
    finally:
        models.from_pretrained = original
