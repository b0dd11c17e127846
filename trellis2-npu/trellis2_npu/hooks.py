"""The functions that ``trellis2-npu/patches/*.patch`` call from inside microsoft/TRELLIS.2 @ 5565d240.

Each patch is a hook: it replaces one CUDA-only import or call by one call into this module, and the substance
(the maths, the checks) lives in this package where it is tested without upstream. Nothing here imports upstream
code, so this module imports in CI. What each hook stands in for:

- :func:`default_attention_backend` — dense attention's default backend: ``flash_attn`` when installed, else
  ``sdpa`` (upstream's default ``flash_attn`` cannot run without it).
- :func:`sparse_attention_backend` / :func:`sparse_attention` — ``sparse_scaled_dot_product_attention``: our
  varlen attention (:mod:`trellis2_npu.attention`) on any non-CUDA device, or when ``SPARSE_ATTN_BACKEND`` (or
  ``ATTN_BACKEND``) is ``sdpa``/``npu``.
- :func:`rope_phases` / :func:`apply_rope_phases` — the complex RoPE, as real cos/sin tables
  (:mod:`trellis2_npu.rope`).
- :data:`flex_gemm_spconv` — ``flex_gemm.ops.spconv`` for ``conv_flex_gemm.py``: FlexGEMM on CUDA when installed,
  else :func:`trellis2_npu.sparse_conv.sparse_submanifold_conv3d` (same weight layout ``[Co, K0, K1, K2, Ci]``).
- :func:`grid_sample_3d`, :func:`flexible_dual_grid_to_mesh` — FlexGEMM's / o_voxel's, or ours.
- :func:`fill_holes` — cumesh's hole filling on CUDA when installed; elsewhere
  :mod:`trellis2_npu.geometry.mesh_repair`'s.
- :func:`mesh_to_flexible_dual_grid` — o_voxel's mesh voxelisation (texturing) or :mod:`trellis2_npu.geometry.voxelize`;
  :func:`texture_mesh` — the texturing pipeline's UV unwrap and bake (cumesh, nvdiffrast, FlexGEMM, cv2 upstream)
  as :func:`trellis2_npu.geometry.export.texture_mesh`, reported to :func:`set_export_observer`'s callback.
- :func:`imagenet_normalize`, :func:`load_dinov3_model`, :func:`dinov3_features` — DINOv3 conditioning without
  torchvision, on transformers 5.x, loaded strictly.
- :func:`load_background_removal` — BiRefNet / RMBG-2.0 from the local folder :mod:`trellis2_npu.rembg` selected,
  never the hub; :func:`birefnet_transforms` — torchvision, imported only when background removal runs.
- :func:`sparse_backends_line` — upstream's ``[SPARSE] ...`` import-time line, naming what actually runs on the
  pipeline's device (:func:`set_pipeline_device`), not the configured ``flex_gemm``/``flash_attn``.
- :func:`load_state_dict_strict`, :func:`resolve_model_path`, :class:`LazyModel`, :func:`empty_cache`.

Stage timings: :func:`.stages.timed` wraps the mesh extraction so that :mod:`trellis2_npu.generate` can report it
apart.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from .loader import load_dinov3, resolve_model_path  # resolve_model_path: the patches call it through here
from .stages import timed

SPARSE_ATTN_CHOICES = ("sdpa", "npu")  # values of SPARSE_ATTN_BACKEND / ATTN_BACKEND that select our varlen path
# Buffers the models compute themselves: ignored by the strict loader whether or not a checkpoint carries them.
DERIVED_BUFFERS = ("rope_phases",)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def is_installed(module: str) -> bool:
    """Whether ``module`` can be found, without importing it."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


# ----------------------------------------------------------------------------------------------------------------
# Attention


_pipeline_device: torch.device | None = None


def set_pipeline_device(device: torch.device | str | None) -> None:
    """The device the pipeline will run on, for :func:`sparse_backends_line` (set before upstream is imported)."""
    global _pipeline_device
    _pipeline_device = None if device is None else torch.device(device)


def sparse_backends_line(conv: str, attn: str) -> str:
    """Upstream's ``[SPARSE] Conv backend: ...; Attention backend: ...`` line, naming what runs.

    ``conv``/``attn`` are upstream's configured ``config.CONV``/``config.ATTN``; the device is the one given to
    :func:`set_pipeline_device` (else CUDA when available, else the CPU).
    """
    device = _pipeline_device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    from deliverykit import ops

    if conv == "flex_gemm" and not _use_cuda_extension("flex_gemm", device):
        conv = "trellis2_npu.sparse_conv (FlexGEMM weight layout)"
        if ops.uses_npu_kernel("subm_conv3d", device):
            conv = "trellis2_npu.sparse_conv (FlexGEMM weight layout; mx_driving SubMConv3d for 3x3x3 fp32/fp16)"
    backend = sparse_attention_backend(attn, device)
    if backend is not None:
        on_npu = ops.uses_npu_kernel("fusion_attention", device)
        if backend == "auto":
            backend = "npu" if on_npu else "sdpa"
        kernel = "torch SDPA"
        if backend == "npu":
            kernel = "npu_fusion_attention TND" if on_npu else "npu_fusion_attention's CPU reference"
        attn = f"trellis2_npu.attention varlen, {kernel}"
    return f"[SPARSE] Conv backend: {conv}; Attention backend: {attn} (pipeline device: {device.type})"


def default_attention_backend() -> str:
    """Dense attention's default when ``ATTN_BACKEND`` is unset: ``flash_attn`` if installed, else ``sdpa``."""
    return "flash_attn" if is_installed("flash_attn") else "sdpa"


def sparse_attention_backend(configured: str, device: torch.device) -> str | None:
    """Our varlen backend for upstream's sparse ``config.ATTN`` on ``device``; None keeps upstream's branch.

    ``sdpa``/``npu`` (set through ``SPARSE_ATTN_BACKEND`` or ``ATTN_BACKEND``) are explicit choices; any other
    value on a non-CUDA device (upstream's default ``flash_attn`` included) takes ``auto`` (the NPU kernel on an
    NPU, SDPA elsewhere), and so does ``flash_attn`` on CUDA when flash_attn is not installed.
    """
    if configured in SPARSE_ATTN_CHOICES:
        return configured
    if torch.device(device).type != "cuda":
        return "auto"
    if configured == "flash_attn" and not is_installed("flash_attn"):
        return "auto"
    return None


def sparse_attention(
    num_args: int, tensors: Sequence[torch.Tensor], q_seqlen: Sequence[int], kv_seqlen: Sequence[int], backend: str
) -> torch.Tensor:
    """Upstream's flash_attn varlen call, on :mod:`trellis2_npu.attention`.

    ``tensors`` are upstream's flattened operands: ``(qkv [T, 3, H, C],)``, ``(q [T, H, C], kv [Tk, 2, H, C])``
    or ``(q, k, v)``; returns ``[T, H, C]`` as flash_attn does.
    """
    from .attention import cu_seqlens_from_lengths, varlen_attention

    if num_args == 1:
        q, k, v = tensors[0].unbind(dim=1)
    elif num_args == 2:
        q, (k, v) = tensors[0], tensors[1].unbind(dim=1)
    else:
        q, k, v = tensors
    cu_q = cu_seqlens_from_lengths(q_seqlen).tolist()
    cu_kv = cu_seqlens_from_lengths(kv_seqlen).tolist()
    return varlen_attention(q, k, v, cu_q, cu_kv, backend=backend)


# ----------------------------------------------------------------------------------------------------------------
# RoPE


def rope_phases(indices: torch.Tensor, head_dim: int, rope_freq: Sequence[float]) -> torch.Tensor:
    """Real stand-in for upstream's complex phases: ``[..., head_dim // 2, 2]`` float32 (cos, sin).

    ``indices`` are ``[..., dim]`` integer positions (dense grid or ``coords[:, 1:]``); padded pairs get
    cos 1, sin 0, as upstream's ``polar(1, 0)``.
    """
    from .rope import rope_cos_sin

    cos, sin = rope_cos_sin(indices, head_dim, tuple(rope_freq))
    return torch.stack((cos, sin), dim=-1)


def apply_rope_phases(x: torch.Tensor, phases: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [..., L, H, D]`` by :func:`rope_phases` tables ``[L, D/2, 2]`` (upstream's complex product)."""
    from .rope import apply_rope

    return apply_rope(x, phases[..., 0], phases[..., 1])


# ----------------------------------------------------------------------------------------------------------------
# Sparse convolution, grid sampling, mesh extraction, hole filling, mesh voxelisation, texturing


def _use_cuda_extension(module: str, device: torch.device) -> bool:
    return torch.device(device).type == "cuda" and is_installed(module)


class _FlexGemmSpconv:
    """``flex_gemm.ops.spconv`` as ``conv_flex_gemm.py`` uses it: FlexGEMM on CUDA when installed, else ours."""

    def __init__(self) -> None:
        self.algorithm: str | None = None
        self.hashmap_ratio: float | None = None

    def set_algorithm(self, algorithm: str) -> None:
        self.algorithm = algorithm

    def set_hashmap_ratio(self, ratio: float) -> None:
        self.hashmap_ratio = ratio

    def sparse_submanifold_conv3d(
        self,
        feats: torch.Tensor,
        coords: torch.Tensor,
        shape: Sequence[int],
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        neighbor_cache: Any = None,
        dilation: Sequence[int] = (1, 1, 1),
    ) -> tuple[torch.Tensor, Any]:
        from .sparse_conv import NeighborMap, sparse_submanifold_conv3d

        if _use_cuda_extension("flex_gemm", feats.device) and not isinstance(neighbor_cache, NeighborMap):
            spconv = importlib.import_module("flex_gemm.ops.spconv")
            if self.algorithm is not None:
                spconv.set_algorithm(self.algorithm)
            if self.hashmap_ratio is not None:
                spconv.set_hashmap_ratio(self.hashmap_ratio)
            return spconv.sparse_submanifold_conv3d(feats, coords, shape, weight, bias, neighbor_cache, dilation)
        return sparse_submanifold_conv3d(feats, coords, shape, weight, bias, neighbor_cache, dilation)


flex_gemm_spconv = _FlexGemmSpconv()


def grid_sample_3d(
    feats: torch.Tensor, coords: torch.Tensor, shape: Sequence[int], grid: torch.Tensor, mode="trilinear"
):
    """``flex_gemm.ops.grid_sample.grid_sample_3d`` on CUDA when installed, else :mod:`trellis2_npu.grid_sample`."""
    if _use_cuda_extension("flex_gemm", feats.device):
        return importlib.import_module("flex_gemm.ops.grid_sample").grid_sample_3d(
            feats, coords, shape, grid, mode=mode
        )
    from .grid_sample import grid_sample_3d as ours

    return ours(feats, coords, shape, grid, mode=mode)


def flexible_dual_grid_to_mesh(coords: torch.Tensor, *args: Any, train: bool = False, **kwargs: Any):
    """``o_voxel.convert.flexible_dual_grid_to_mesh`` (CUDA, installed, or ``train=True``) or ours; timed."""
    with timed("mesh_extraction"):
        if train or _use_cuda_extension("o_voxel", coords.device):
            convert = importlib.import_module("o_voxel.convert")
            return convert.flexible_dual_grid_to_mesh(coords, *args, train=train, **kwargs)
        from .geometry.dual_grid import flexible_dual_grid_to_mesh as ours

        return ours(coords, *args, train=False, **kwargs)


def fill_holes(mesh: Any, max_hole_perimeter: float) -> bool:
    """Whether upstream's cumesh ``fill_holes`` should run on ``mesh``; elsewhere fill the holes here, return False.

    With cumesh on a CUDA device upstream's code runs unchanged. Otherwise :func:`trellis2_npu.geometry.mesh_repair.
    fill_holes` closes the boundary loops shorter than ``max_hole_perimeter`` on the host (the same operation) and
    puts the new vertices and faces on ``mesh``, in its device and dtypes.
    """
    if _use_cuda_extension("cumesh", mesh.vertices.device):
        return True
    from .geometry.mesh_repair import fill_holes as fill_holes_on_host

    mesh.vertices, mesh.faces = fill_holes_on_host(mesh.vertices, mesh.faces, max_hole_perimeter)
    return False


_export_observer: Callable[[Any], None] | None = None


def mesh_to_flexible_dual_grid(vertices: torch.Tensor, faces: torch.Tensor, **kwargs: Any):
    """``o_voxel.convert.mesh_to_flexible_dual_grid`` (CUDA pipeline, installed) or ours; timed."""
    with timed("mesh_voxelization"):
        if _use_cuda_extension("o_voxel", _pipeline_device or vertices.device):
            convert = importlib.import_module("o_voxel.convert")
            return convert.mesh_to_flexible_dual_grid(vertices, faces, **kwargs)
        from .geometry.voxelize import mesh_to_flexible_dual_grid as ours

        return ours(vertices, faces, **kwargs)


def set_export_observer(observer: Callable[[Any], None] | None) -> None:
    """Called with each :class:`trellis2_npu.geometry.export.GlbExport` :func:`texture_mesh` makes (its timings,
    figures)."""
    global _export_observer
    _export_observer = observer


def texture_mesh(mesh: Any, pbr_voxel: Any, resolution: int, texture_size: int, layout: Mapping[str, slice]):
    """The texturing pipeline's ``postprocess_mesh``: ``mesh`` (trimesh, the ``[-0.5, 0.5]³`` frame, z up) unwrapped
    and baked from the decoded voxels (``pbr_voxel``, a SparseTensor at ``resolution``) by
    :func:`trellis2_npu.geometry.export.texture_mesh`; returns the textured ``trimesh.Trimesh`` in the glTF frame."""
    from .geometry.export import texture_mesh as export_textured

    exported = export_textured(
        torch.as_tensor(mesh.vertices, dtype=torch.float32),
        torch.as_tensor(mesh.faces, dtype=torch.long),
        attrs=pbr_voxel.feats,
        coords=pbr_voxel.coords[:, 1:],
        resolution=resolution,
        texture_size=texture_size,
        layout={name: [part.start, part.stop] for name, part in layout.items()},
    )
    if _export_observer is not None:
        _export_observer(exported)
    return exported.mesh


# ----------------------------------------------------------------------------------------------------------------
# DINOv3 conditioning, background removal


def imagenet_normalize(image: torch.Tensor) -> torch.Tensor:
    """torchvision's ``Normalize(IMAGENET_MEAN, IMAGENET_STD)`` on ``[B, 3, H, W]`` (or ``[3, H, W]``)."""
    mean = torch.tensor(IMAGENET_MEAN, dtype=image.dtype, device=image.device).view(3, 1, 1)
    std = torch.tensor(IMAGENET_STD, dtype=image.dtype, device=image.device).view(3, 1, 1)
    return (image - mean) / std


def load_dinov3_model(model_name: str):
    """DINOv3 for ``DinoV3FeatureExtractor``: a local folder (resolved by :func:`resolve_model_path`) strictly,
    else transformers' hub loading as upstream does."""
    local = resolve_model_path(model_name)
    if local is not None and Path(local).is_dir():
        return load_dinov3(local)
    from transformers import DINOv3ViTModel

    return DINOv3ViTModel.from_pretrained(model_name)


def dinov3_features(model, pixel_values: torch.Tensor) -> torch.Tensor:
    """TRELLIS.2's feature path on transformers 4.x and 5.x (:func:`trellis2_npu.dinov3.extract_features`)."""
    from .dinov3 import extract_features

    return extract_features(model, pixel_values)


def model_device(model: torch.nn.Module) -> torch.device:
    """Where ``model``'s first parameter lives (what upstream's hard-coded CUDA placement meant)."""
    return next(model.parameters()).device


def load_background_removal(model_name: str):
    """BiRefNet's ``AutoModelForImageSegmentation``: from the folder :mod:`trellis2_npu.rembg` selected for this run
    (``--rembg-model``, ``<root>/RMBG-2.0`` or ``<root>/BiRefNet``), remote code from that folder only, licence
    printed; no folder is the one-line error, never a hub request."""
    from .rembg import load_rembg_model

    return load_rembg_model(model_name)


def birefnet_transforms():
    """BiRefNet's torchvision transforms, imported only when background removal actually runs."""
    try:
        from torchvision import transforms
    except (ImportError, RuntimeError) as err:
        raise ImportError(
            "background removal (BiRefNet) needs torchvision matching your torch; install it, or pass an RGBA image "
            f"whose alpha marks the object ({err})"
        ) from err
    return transforms


class LazyModel:
    """Builds a model on first use (``__call__``); ``to``/``cpu``/``cuda`` before that only record the device.

    Upstream builds BiRefNet (hub download, remote code) in ``from_pretrained`` although only images without
    alpha need it.
    """

    def __init__(self, factory: Callable[[], Any]):
        self._factory = factory
        self._model = None
        self._device: torch.device | str = "cpu"

    def _built(self):
        if self._model is None:
            self._model = self._factory()
            self._model.to(self._device)
        return self._model

    def to(self, device):
        self._device = device
        if self._model is not None:
            self._model.to(device)

    def cpu(self):
        self.to("cpu")

    def cuda(self):
        self.to("cuda")

    def __call__(self, *args, **kwargs):
        return self._built()(*args, **kwargs)


# ----------------------------------------------------------------------------------------------------------------
# Loading


def load_state_dict_strict(model: torch.nn.Module, state_dict: Mapping[str, torch.Tensor], source: str) -> None:
    """``load_state_dict`` that fails naming every missing, unexpected or mis-shaped tensor.

    Upstream loads with ``strict=False``, which silently keeps random weights for absent tensors (e.g. a
    flex_gemm checkpoint in a spconv-backend model). Buffers the model derives itself (:data:`DERIVED_BUFFERS`)
    are skipped both ways.
    """
    from deliverykit.errors import WeightsError

    def derived(key: str) -> bool:
        return key.rsplit(".", 1)[-1] in DERIVED_BUFFERS

    expected = {key: value for key, value in model.state_dict().items() if not derived(key)}
    given = {key: value for key, value in state_dict.items() if not derived(key)}
    missing = sorted(set(expected) - set(given))
    unexpected = sorted(set(given) - set(expected))
    mismatched = sorted(
        f"{key} {list(given[key].shape)} vs model {list(expected[key].shape)}"
        for key in set(expected) & set(given)
        if given[key].shape != expected[key].shape
    )
    problems = {"missing": missing, "unexpected": unexpected, "mis-shaped": mismatched}
    problems = {kind: keys for kind, keys in problems.items() if keys}
    if problems:
        summary = "; ".join(
            f"{len(keys)} {kind}: {', '.join(keys[:5])}{', ...' if len(keys) > 5 else ''}"
            for kind, keys in problems.items()
        )
        raise WeightsError(f"checkpoint {source} does not match {type(model).__name__} ({summary})")
    model.load_state_dict(given, strict=False)


def empty_cache(device: torch.device | str) -> None:
    """Upstream's CUDA cache release, done on the pipeline's device, whatever it is."""
    from deliverykit.device import empty_cache as empty

    empty(torch.device(device))
