"""The image → 3D pipeline at the released sizes with seeded random weights (``inference.py --smoke full``).

Every model is the upstream class with the released configuration: the five flows from their byte-exact released
JSONs in ``data/`` (1.3 B parameters each), the SC-VAE decoders and the v1 sparse-structure decoder with the
arguments of upstream's training configs (``configs/scvae/*``, TRELLIS ``ss_dec_conv3d_16l8_fp16``), and the full
DINOv3 ViT-L/16. Their safetensors sizes, computed from the architectures and the released dtypes
(:func:`safetensors_bytes`), equal the manifest's bytes exactly (``tests/test_full_size.py``, on the meta device).

:func:`write_full_weights` saves them in the released layout and dtypes (flows bf16, SC-VAE decoders fp16, the v1
decoder fp16 blocks with fp32 norms and ends: as built with ``use_fp16``), so the run loads them through upstream's
``from_pretrained``, the code path of downloaded weights. The 1024 flows are the same architectures as the 512 ones
(the resolution only sizes the RoPE tables, which are not saved): their safetensors are hard links to the 512 ones,
saving 5 GB and minutes of writing; their JSONs are the released ones.

Random weights decode an arbitrary sparse structure (about half the 64³ grid). :func:`pin_occupancy` replaces the
sparse-structure decoder's logits by a spherical shell of :data:`SHELL_VOXELS` voxels at 64³: the ~9.6 K tokens per
1024³ asset of the TRELLIS.2 paper (arXiv 2512.14692, SC-VAE at 16× downsampling), so the flows and decoders see the
token and voxel counts of a real asset (the 512 pipeline max-pools it to 32³: about a quarter of the tokens).
"""

from __future__ import annotations

import gc
import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from deliverykit.random_weights import randomize_

from .dinov3 import RANDOM_WEIGHTS_METADATA_KEY
from .hooks import DERIVED_BUFFERS
from .tiny import DATA, MAIN_DIR, SUBDIV_BIAS, checkpoint_path, released_pipeline_config, save_random_dinov3

SHELL_VOXELS = 9_600  # occupied voxels of the pinned sparse structure at 64³ (the paper's ~9.6 K tokens at 1024³)
SHELL_RADIUS = 0.35  # of the grid side

SC_DECODER = {
    "model_channels": [1024, 512, 256, 128, 64],
    "latent_channels": 32,
    "num_blocks": [4, 16, 8, 4, 0],
    "block_type": ["SparseConvNeXtBlock3d"] * 5,
    "up_block_type": ["SparseResBlockC2S3d"] * 4,
    "block_args": [{"use_checkpoint": False}] * 5,
    "use_fp16": True,
}
SC_ENCODER = {
    "model_channels": [64, 128, 256, 512, 1024],
    "latent_channels": 32,
    "num_blocks": [0, 4, 8, 16, 4],
    "block_type": ["SparseConvNeXtBlock3d"] * 5,
    "down_block_type": ["SparseResBlockS2C3d"] * 4,
    "block_args": [{"use_checkpoint": False}] * 5,
    "use_fp16": True,
}

# pipeline.json key (and the two encoders the manifest lists) → (class, args, dtype of every saved tensor; None:
# as the model holds them). Flows come from data/<released JSON>.
DECODERS: dict[str, tuple[str, dict[str, Any], torch.dtype | None]] = {
    "sparse_structure_decoder": (
        "SparseStructureDecoder",
        {
            "out_channels": 1,
            "latent_channels": 8,
            "num_res_blocks": 2,
            "num_res_blocks_middle": 2,
            "channels": [512, 128, 32],
            "use_fp16": True,
        },
        None,
    ),
    "shape_slat_decoder": ("FlexiDualGridVaeDecoder", {"resolution": 256, **SC_DECODER}, torch.float16),
    "tex_slat_decoder": (
        "SparseUnetVaeDecoder",
        {"out_channels": 6, **SC_DECODER, "pred_subdiv": False},
        torch.float16,
    ),
    "shape_slat_encoder": ("FlexiDualGridVaeEncoder", SC_ENCODER, torch.float16),
    "tex_slat_encoder": ("SparseUnetVaeEncoder", {"in_channels": 6, **SC_ENCODER}, torch.float16),
}
ENCODER_STEMS = {
    "shape_slat_encoder": "shape_enc_next_dc_f16c32_fp16",
    "tex_slat_encoder": "tex_enc_next_dc_f16c32_fp16",
}
SAFETENSORS_DTYPES = {torch.float32: ("F32", 4), torch.float16: ("F16", 2), torch.bfloat16: ("BF16", 2)}


def released_json(reference: str) -> Path | None:
    """The byte-exact released JSON of ``pipeline.json``'s ``ckpts/<stem>`` in ``data/``, if shipped (the flows)."""
    path = DATA / f"{MAIN_DIR}.{reference.replace('/', '.')}.json"
    return path if path.is_file() else None


def model_config(key: str) -> tuple[str, dict[str, Any], torch.dtype | None]:
    """``(class name, constructor args, saved dtype)`` of the released model ``key``."""
    if key in DECODERS:
        return DECODERS[key]
    reference = key_reference(key)
    config = json.loads(released_json(reference).read_text(encoding="utf-8"))
    return config["name"], config["args"], torch.bfloat16


def key_reference(key: str) -> str:
    """``pipeline.json``'s reference of ``key`` (``ckpts/<stem>`` for the encoders, which it does not list)."""
    if key in ENCODER_STEMS:
        return f"ckpts/{ENCODER_STEMS[key]}"
    return released_pipeline_config()["args"]["models"][key]


def build_model(key: str, seed: int | None = None, device: torch.device | str = "cpu") -> torch.nn.Module:
    """The upstream model ``key`` at its released size; seeded random weights (as :func:`.tiny.build_tiny_model`)
    unless ``seed`` is None (``device="meta"``: the architecture alone, for counting)."""
    from trellis2 import models  # the patched upstream

    name, args, _ = model_config(key)
    with torch.device(device):
        model = getattr(models, name)(**args)
    if seed is not None:
        randomize_(model, seed)
        with torch.no_grad():
            for param_name, param in model.named_parameters():
                if param_name.endswith("to_subdiv.bias"):
                    param.fill_(SUBDIV_BIAS)
    return model.eval()


def saved_tensors(model: torch.nn.Module, key: str) -> dict[str, torch.Tensor]:
    """The state dict as the released file holds it: derived buffers left out, cast to the released dtype."""
    dtype = model_config(key)[2]
    return {
        name: (tensor if dtype is None else tensor.to(dtype)).detach().contiguous()
        for name, tensor in model.state_dict().items()
        if name.rsplit(".", 1)[-1] not in DERIVED_BUFFERS
    }


def safetensors_bytes(tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> int:
    """The size of the safetensors file of ``tensors`` (any device, meta too): 8-byte length, the JSON header padded
    to 8 bytes, the data; tensors ordered by alignment then name, as the safetensors writer does."""
    order = sorted(tensors, key=lambda name: (-SAFETENSORS_DTYPES[tensors[name].dtype][1], name))
    header: dict[str, Any] = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for name in order:
        tensor = tensors[name]
        code, size = SAFETENSORS_DTYPES[tensor.dtype]
        header[name] = {
            "dtype": code,
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + size * tensor.numel()],
        }
        offset += size * tensor.numel()
    header_length = len(json.dumps(header, separators=(",", ":")).encode("utf-8"))
    return 8 + (header_length + 7) // 8 * 8 + offset


def meta_tensors(key: str) -> dict[str, torch.Tensor]:
    """:func:`saved_tensors` of ``key`` built on the meta device: shapes and dtypes without memory."""
    return saved_tensors(build_model(key, device="meta"), key)


def write_full_weights(root: str | os.PathLike, seed: int = 0) -> Path:
    """Write every model of ``pipeline.json`` at its released size under ``root`` in the released layout (see
    :mod:`.tiny`), one model in memory at a time; returns the pipeline folder. About 11 GB on disk
    (10 min on 2 shared cores, peak RSS 6 GB)."""
    root = Path(root)
    config = released_pipeline_config()
    written: dict[str, Path] = {}  # architecture (released JSON args less resolution) → its safetensors
    for index, (key, reference) in enumerate(config["args"]["models"].items()):
        stem = checkpoint_path(root, reference)
        stem.parent.mkdir(parents=True, exist_ok=True)
        name, args, _ = model_config(key)
        source = released_json(reference)
        if source is not None:
            shutil.copyfile(source, f"{stem}.json")
        else:
            Path(f"{stem}.json").write_text(json.dumps({"name": name, "args": args}, indent=4), encoding="utf-8")
        same_architecture = json.dumps([name, {k: v for k, v in args.items() if k != "resolution"}], sort_keys=True)
        if same_architecture in written:
            os.link(written[same_architecture], f"{stem}.safetensors")
            continue
        model = build_model(key, seed + 10 * index)
        save_file(
            saved_tensors(model, key),
            f"{stem}.safetensors",
            metadata={"format": "pt", RANDOM_WEIGHTS_METADATA_KEY: "true"},
        )
        written[same_architecture] = Path(f"{stem}.safetensors")
        del model
        gc.collect()
    dinov3_id = config["args"]["image_cond_model"]["args"]["model_name"]
    save_random_dinov3(root / dinov3_id.split("/", 1)[1], variant="full", seed=seed)
    main = root / MAIN_DIR
    shutil.copyfile(DATA / f"{MAIN_DIR}.pipeline.json", main / "pipeline.json")
    return main


def shell_logits(resolution: int, voxels: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """``[1, 1, R, R, R]`` logits: +1 on the ``voxels`` cells closest to a sphere of radius ``SHELL_RADIUS·R``
    (ties by index), −1 elsewhere."""
    axis = (torch.arange(resolution, device=device, dtype=torch.float32) + 0.5) / resolution - 0.5
    x, y, z = torch.meshgrid(axis, axis, axis, indexing="ij")
    distance = (torch.sqrt(x**2 + y**2 + z**2) - SHELL_RADIUS).abs().reshape(-1)
    logits = torch.full_like(distance, -1.0)
    logits[torch.sort(distance, stable=True).indices[:voxels]] = 1.0
    return logits.reshape(1, 1, resolution, resolution, resolution)


def pin_occupancy(decoder: torch.nn.Module, voxels: int = SHELL_VOXELS) -> torch.utils.hooks.RemovableHandle:
    """Test only: the sparse-structure decoder's output replaced by :func:`shell_logits` (one per sample), so that
    random weights give a real asset's token count instead of half the grid. Never used with real weights."""

    def hook(module, inputs, output):
        shell = shell_logits(output.shape[-1], voxels, output.device).to(output.dtype)
        return shell.expand(output.shape[0], *shell.shape[1:]).contiguous()

    return decoder.register_forward_hook(hook)
