"""Architecture-faithful models with seeded random weights, in the released on-disk formats (``--smoke``).

DINOv3 (the conditioning model, ``scripts/conditioning.py --smoke``): ``full`` is the real ViT-L/16 configuration
shipped in ``data/`` (the byte-exact ``config.json`` of facebook/dinov3-vitl16-pretrain-lvd1689m); ``tiny`` keeps
the architecture (registers, RoPE, layer scale, non-gated GELU MLP) with tiny widths. :func:`save_random_dinov3`
saves it with the hub key layout, and it is loaded back through :func:`trellis2_npu.loader.load_dinov3`, the same
code path as downloaded weights.

The whole image → 3D pipeline (``inference.py --smoke tiny``): every stage is an upstream class (the patched
upstream, :mod:`.upstream`, imported first) at tiny widths (porting notes trellis2.md §7): flows 64 channels, 2
blocks, 4 heads, MLP ratio 2, RoPE, shared modulation, qk-RMS norm; SS decoder channels [32, 16, 8]; SC-VAE decoders
[64, 32, 16, 16, 8] with blocks [1, 1, 1, 1, 0] and 4 ``SparseResBlockC2S3d``; DINOv3 hidden 64, 2 layers, 4
registers (the ``tiny`` DINOv3 above).

:func:`write_tiny_weights` writes the layout ``deliverykit weights download`` produces for the real models::

    <root>/TRELLIS.2-4B/pipeline.json                 released pipeline.json, models and samplers as released
    <root>/TRELLIS.2-4B/ckpts/<stem>.{json,safetensors}
    <root>/TRELLIS-image-large/ckpts/ss_dec_conv3d_16l8_fp16.{json,safetensors}
    <root>/dinov3-vitl16-pretrain-lvd1689m/           hub layout (config.json, model.safetensors, ...)

so the tiny run goes through upstream's own loaders (patched to load strictly). For texturing
(``inference.py --smoke tiny --mesh``), :func:`write_tiny_texturing` adds ``texturing_pipeline.json`` and the tiny
shape encoder (``ckpts/shape_enc_next_dc_f16c32_fp16``) to that folder; the released file's bytes are not known
(weights.md §8), so :func:`texturing_pipeline_config` rebuilds it from what ``Trellis2TexturingPipeline`` reads, with
pipeline.json's values. Sparse-conv weights are saved as
the modules hold them, in FlexGEMM's ``[Co, K0, K1, K2, Ci]`` layout. Every safetensors header is marked random.

Random weights decode ~50% of the grid as occupied, far beyond a CPU smoke budget. Two documented, test-only measures
keep the voxel set small and still meshable: the ``to_subdiv`` biases are set to :data:`SUBDIV_BIAS` in the saved
weights (weights are ours to choose; 0 subdivides about half the children of each voxel with the
:mod:`deliverykit.random_weights` weights, where -0.5 already leaves too few voxels for the dual grid to form a
face), and :func:`add_occupancy_prior` adds a spherical-shell prior to the sparse structure decoder's logits at run
time (a forward hook on that one instance; never used with real weights).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
import trimesh
from PIL import Image, ImageDraw
from safetensors.torch import save_file
from transformers import DINOv3ViTConfig, DINOv3ViTModel

from deliverykit.random_weights import randomize_

from .dinov3 import RANDOM_WEIGHTS_METADATA_KEY, WEIGHTS_FILE
from .hooks import DERIVED_BUFFERS

DATA = Path(__file__).with_name("data")
RELEASED_PIPELINE = DATA / "TRELLIS.2-4B.pipeline.json"
DINOV3_CONFIG = DATA / "dinov3-vitl16-pretrain-lvd1689m.config.json"
DINOV3_PREPROCESSOR = DATA / "dinov3-vitl16-pretrain-lvd1689m.preprocessor_config.json"
DINOV3_TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4}
VARIANTS = ("full", "tiny")
MAIN_DIR = "TRELLIS.2-4B"
SUBDIV_BIAS = 0.0
SHELL_RADIUS = 0.22  # of the decoder's grid side; shell logits +4 on the sphere, falling 12 per grid side

FLOW = {
    "model_channels": 64,
    "cond_channels": 64,
    "num_blocks": 2,
    "num_heads": 4,
    "mlp_ratio": 2,
    "pe_mode": "rope",
    "share_mod": True,
    "initialization": "scaled",
    "qk_rms_norm": True,
    "qk_rms_norm_cross": True,
    "dtype": "float32",
}
SC_DECODER = {
    "model_channels": [64, 32, 16, 16, 8],
    "latent_channels": 32,
    "num_blocks": [1, 1, 1, 1, 0],
    "block_type": ["SparseConvNeXtBlock3d"] * 5,
    "up_block_type": ["SparseResBlockC2S3d"] * 4,
    "block_args": [{"use_checkpoint": False}] * 5,
    "use_fp16": False,
}

# key of pipeline.json "models" → (class, constructor args)
CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "sparse_structure_flow_model": (
        "SparseStructureFlowModel",
        {"resolution": 16, "in_channels": 8, "out_channels": 8, **FLOW},
    ),
    "sparse_structure_decoder": (
        "SparseStructureDecoder",
        {
            "out_channels": 1,
            "latent_channels": 8,
            "num_res_blocks": 1,
            "num_res_blocks_middle": 1,
            "channels": [32, 16, 8],
        },
    ),
    "shape_slat_flow_model_512": ("SLatFlowModel", {"resolution": 32, "in_channels": 32, "out_channels": 32, **FLOW}),
    "shape_slat_flow_model_1024": ("SLatFlowModel", {"resolution": 64, "in_channels": 32, "out_channels": 32, **FLOW}),
    "tex_slat_flow_model_512": ("SLatFlowModel", {"resolution": 32, "in_channels": 64, "out_channels": 32, **FLOW}),
    "tex_slat_flow_model_1024": ("SLatFlowModel", {"resolution": 64, "in_channels": 64, "out_channels": 32, **FLOW}),
    "shape_slat_decoder": ("FlexiDualGridVaeDecoder", {"resolution": 256, **SC_DECODER}),
    "tex_slat_decoder": ("SparseUnetVaeDecoder", {"out_channels": 6, **SC_DECODER, "pred_subdiv": False}),
    # texturing only: the released encoder is the decoder mirrored (configs/scvae/shape_vae_next_dc_f16c32_fp16.json)
    "shape_slat_encoder": (
        "FlexiDualGridVaeEncoder",
        {
            "model_channels": SC_DECODER["model_channels"][::-1],
            "latent_channels": 32,
            "num_blocks": SC_DECODER["num_blocks"][::-1],
            "block_type": ["SparseConvNeXtBlock3d"] * 5,
            "down_block_type": ["SparseResBlockS2C3d"] * 4,
            "block_args": [{"use_checkpoint": False}] * 5,
            "use_fp16": False,
        },
    ),
}
TEXTURING_MODELS = ("shape_slat_encoder", "tex_slat_decoder", "tex_slat_flow_model_512", "tex_slat_flow_model_1024")
SHAPE_ENCODER_CHECKPOINT = "ckpts/shape_enc_next_dc_f16c32_fp16"  # weights-manifest.json, component shape_slat_encoder
TEXTURING_ARGS = ("tex_slat_sampler", "shape_slat_normalization", "tex_slat_normalization", "image_cond_model",
                  "rembg_model")  # fmt: skip


def dinov3_config(variant: str = "full") -> DINOv3ViTConfig:
    if variant not in VARIANTS:
        raise ValueError(f"unknown smoke variant {variant!r}; expected one of {', '.join(VARIANTS)}")
    values = json.loads(DINOV3_CONFIG.read_text(encoding="utf-8"))
    if variant == "tiny":
        values.update(DINOV3_TINY)
    return DINOv3ViTConfig(**values)


def build_random_dinov3(variant: str = "full", seed: int = 0) -> DINOv3ViTModel:
    """A seeded random DINOv3, bit-identical on every torch version (:func:`deliverykit.random_weights.randomize_`).

    Matrices get the config's ``initializer_range`` as std, as transformers' init; biases, norms and layer scales
    (0 and 1 there) are perturbed around those values, so a checkpoint loader that dropped them would be noticed.
    """
    config = dinov3_config(variant)
    model = DINOv3ViTModel(config).eval()
    randomize_(model, seed, std=config.initializer_range)
    return model


def checkpoint_key(name: str) -> str:
    """Hub key of a transformers ≥ 5 parameter name: the released file has ``layer.N.*``, not ``model.layer.N.*``."""
    return name.removeprefix("model.")


def save_random_dinov3(folder: str | os.PathLike, variant: str = "full", seed: int = 0) -> Path:
    """Write ``config.json``, ``preprocessor_config.json`` and ``model.safetensors`` in the hub layout.

    The safetensors header is marked random (``deliverykit_random_weights``), so every report made from the file
    says so. For ``full`` the shipped, byte-exact hub ``config.json`` is copied as is.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model = build_random_dinov3(variant, seed)
    tensors = {checkpoint_key(name): tensor.contiguous() for name, tensor in model.state_dict().items()}
    save_file(tensors, folder / WEIGHTS_FILE, metadata={"format": "pt", RANDOM_WEIGHTS_METADATA_KEY: "true"})
    if variant == "full":
        shutil.copyfile(DINOV3_CONFIG, folder / "config.json")
    else:
        model.config.to_json_file(folder / "config.json")
    shutil.copyfile(DINOV3_PREPROCESSOR, folder / "preprocessor_config.json")
    return folder


def released_pipeline_config() -> dict[str, Any]:
    """The released ``pipeline.json`` of microsoft/TRELLIS.2-4B (byte-exact copy, sha256 222c359a...)."""
    return json.loads(RELEASED_PIPELINE.read_text(encoding="utf-8"))


def checkpoint_path(root: Path, reference: str) -> Path:
    """Where ``pipeline.json``'s reference goes under ``root``: ``ckpts/x`` in the main folder, a hub id
    ``org/repo/rest`` in ``<root>/repo/rest``."""
    parts = reference.split("/")
    if parts[0] == "ckpts":
        return root / MAIN_DIR / reference
    return root.joinpath(*parts[1:])


def build_tiny_model(key: str, seed: int = 0) -> torch.nn.Module:
    """The tiny upstream model of pipeline key ``key``, seeded, bit-identical on every torch version
    (:func:`deliverykit.random_weights.randomize_`: biases, norms and zero-initialised output layers perturbed
    around their init), with the ``to_subdiv`` biases at :data:`SUBDIV_BIAS`."""
    from trellis2 import models  # the patched upstream

    name, args = CONFIGS[key]
    model = getattr(models, name)(**args)
    randomize_(model, seed)
    with torch.no_grad():
        for param_name, param in model.named_parameters():
            if param_name.endswith("to_subdiv.bias"):
                param.fill_(SUBDIV_BIAS)
    return model.eval()


def save_model(model: torch.nn.Module, key: str, stem: Path) -> None:
    """``<stem>.json`` (``{"name", "args"}``) and ``<stem>.safetensors``, as upstream's ``models.from_pretrained``
    reads them; derived buffers (RoPE tables) are left out, like any buffer the model rebuilds itself."""
    name, args = CONFIGS[key]
    stem.parent.mkdir(parents=True, exist_ok=True)
    tensors = {
        k: v.detach().contiguous() for k, v in model.state_dict().items() if k.rsplit(".", 1)[-1] not in DERIVED_BUFFERS
    }
    save_file(tensors, f"{stem}.safetensors", metadata={"format": "pt", RANDOM_WEIGHTS_METADATA_KEY: "true"})
    Path(f"{stem}.json").write_text(json.dumps({"name": name, "args": args}, indent=4), encoding="utf-8")


def write_tiny_weights(root: str | os.PathLike, seed: int = 0) -> Path:
    """Write every tiny model under ``root`` (layout in the module docstring); returns the pipeline folder."""
    root = Path(root)
    config = released_pipeline_config()
    for index, (key, reference) in enumerate(config["args"]["models"].items()):
        save_model(build_tiny_model(key, seed + 10 * index), key, checkpoint_path(root, reference))
    dinov3_id = config["args"]["image_cond_model"]["args"]["model_name"]
    save_random_dinov3(root / dinov3_id.split("/", 1)[1], variant="tiny", seed=seed)
    main = root / MAIN_DIR
    (main / "pipeline.json").write_text(json.dumps(config, indent=4), encoding="utf-8")
    return main


def texturing_pipeline_config() -> dict[str, Any]:
    """A ``texturing_pipeline.json`` for the tiny models: ``Trellis2TexturingPipeline``'s keys, pipeline.json's values
    (samplers, normalisations, conditioning and background-removal models) and checkpoints. Not the released file."""
    released = released_pipeline_config()["args"]
    models = {key: released["models"].get(key, SHAPE_ENCODER_CHECKPOINT) for key in TEXTURING_MODELS}
    return {"name": "Trellis2TexturingPipeline", "args": {"models": models, **{k: released[k] for k in TEXTURING_ARGS}}}


def write_tiny_texturing(main: str | os.PathLike, seed: int = 0) -> Path:
    """Add the texturing files to a folder of :func:`write_tiny_weights` (same ``seed``): the tiny shape encoder
    and ``texturing_pipeline.json``; the other texturing models are that folder's. Returns ``main``."""
    main = Path(main)
    config = texturing_pipeline_config()
    reference = config["args"]["models"]["shape_slat_encoder"]
    save_model(build_tiny_model("shape_slat_encoder", seed + 1000), "shape_slat_encoder", main / reference)
    (main / "texturing_pipeline.json").write_text(json.dumps(config, indent=4), encoding="utf-8")
    return main


def tiny_mesh() -> trimesh.Trimesh:
    """The smoke run's built-in mesh (``--smoke tiny --mesh`` without a file): a closed, slightly squashed
    icosphere (320 faces) with a dent, so that it has an up direction and no symmetry that hides an axis swap."""
    mesh = trimesh.creation.icosphere(subdivisions=2, radius=0.5)
    vertices = mesh.vertices * np.array([1.0, 0.8, 1.2])
    vertices[:, 2] -= 0.15 * np.exp(-8 * ((vertices[:, 0] - 0.3) ** 2 + vertices[:, 1] ** 2))
    return trimesh.Trimesh(vertices=vertices, faces=mesh.faces, process=False)


def shell_prior(resolution: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """``[1, 1, R, R, R]`` logits offset: +4 on a sphere of radius ``SHELL_RADIUS·R``, −12 per grid side away."""
    axis = (torch.arange(resolution, device=device, dtype=torch.float32) + 0.5) / resolution - 0.5
    x, y, z = torch.meshgrid(axis, axis, axis, indexing="ij")
    radius = torch.sqrt(x**2 + y**2 + z**2)
    return (4.0 - 12.0 * resolution / 8 * (radius - SHELL_RADIUS).abs())[None, None]


def add_occupancy_prior(decoder: torch.nn.Module) -> torch.utils.hooks.RemovableHandle:
    """Test only: scale the random sparse-structure logits down and add :func:`shell_prior`, so that random weights
    decode a thin spherical shell (a few thousand tokens at 32³) instead of half the grid."""

    def hook(module, inputs, output):
        return 0.1 * output + shell_prior(output.shape[-1], output.device).to(output.dtype)

    return decoder.register_forward_hook(hook)


def tiny_image(size: int = 256) -> Image.Image:
    """An RGBA test image: a coloured disc on a transparent background (real alpha, so no background removal)."""
    image = Image.new("RGBA", (size, size), (0, 0, 0, 0))
    draw = ImageDraw.Draw(image)
    margin = size // 6
    draw.ellipse((margin, margin, size - margin, size - margin), fill=(200, 120, 40, 255))
    draw.ellipse((size // 3, size // 3, size // 2, size // 2), fill=(40, 90, 210, 255))
    return image
