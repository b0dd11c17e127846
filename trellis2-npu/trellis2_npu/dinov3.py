"""DINOv3 ViT-L/16, TRELLIS.2's image-conditioning model: strict local loading and the feature path.

The feature path is adapted from microsoft/TRELLIS.2 @ 5565d240,
``trellis2/modules/image_feature_extractor.py::DinoV3FeatureExtractor.extract_features``: embeddings → RoPE →
every block → ``layer_norm`` *without* affine (the model's own final ``norm`` is not used), keeping CLS + 4
registers + patches. Change: the blocks are found at ``model.model.layer`` (transformers ≥ 5) as well as
``model.layer`` (older), where upstream raises ``AttributeError`` on transformers 5.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import SafetensorError, safe_open
from transformers import DINOv3ViTModel

from deliverykit.errors import WeightsError

MODEL_ID = "facebook/dinov3-vitl16-pretrain-lvd1689m"
MODEL_TYPE = "dinov3_vit"
WEIGHTS_FILE = "model.safetensors"
RANDOM_WEIGHTS_METADATA_KEY = "deliverykit_random_weights"


def download_hint(weights_dir: str | os.PathLike) -> str:
    return (
        f"download {MODEL_ID} into it (deliverykit weights download --manifest trellis2-npu/weights-manifest.json "
        f"--root <weights root>) or run with --smoke"
    )


def check_weights_folder(weights_dir: str | os.PathLike) -> Path:
    """Fail fast, with one line, on a folder that cannot hold DINOv3 weights: missing, wrong model, bad file.

    ``safe_open`` parses the safetensors header and checks it against the file length, so a truncated or
    corrupt file is caught here instead of as a cryptic error (or silently random weights) later.
    """
    folder = Path(weights_dir)
    if not folder.is_dir():
        raise WeightsError(f"weights folder {folder} does not exist; {download_hint(folder)}")
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise WeightsError(f"{config_path} is missing; {download_hint(folder)}")
    try:
        model_type = json.loads(config_path.read_text(encoding="utf-8")).get("model_type")
    except (ValueError, AttributeError) as err:
        raise WeightsError(f"{config_path} is not a valid JSON config ({err}); {download_hint(folder)}") from err
    if model_type != MODEL_TYPE:
        raise WeightsError(
            f"{config_path} describes model_type {model_type!r}, expected {MODEL_TYPE!r} ({MODEL_ID}); "
            "point --weights at the DINOv3 folder"
        )
    weights_path = folder / WEIGHTS_FILE
    if not weights_path.is_file():
        raise WeightsError(f"{weights_path} is missing; {download_hint(folder)}")
    try:
        with safe_open(weights_path, framework="pt") as handle:
            handle.keys()
    except (SafetensorError, OSError, ValueError) as err:
        raise WeightsError(f"{weights_path} is truncated or corrupt ({err}); {download_hint(folder)}") from err
    return folder


def weights_are_random(weights_dir: str | os.PathLike) -> bool:
    """True when the file was written by :func:`trellis2_npu.smoke.save_random_dinov3` (it says so in its header)."""
    with safe_open(Path(weights_dir) / WEIGHTS_FILE, framework="pt") as handle:
        return (handle.metadata() or {}).get(RANDOM_WEIGHTS_METADATA_KEY) == "true"


def load_dinov3(
    weights_dir: str | os.PathLike, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
) -> DINOv3ViTModel:
    """Load DINOv3 from a local folder, strictly: any missing, unexpected or mis-shaped key fails the load.

    transformers only warns about missing keys and leaves them randomly initialised; for a delivery that would
    be a silently wrong model, so the loading info is checked here.
    """
    folder = check_weights_folder(weights_dir)
    try:
        model, info = DINOv3ViTModel.from_pretrained(
            folder, local_files_only=True, output_loading_info=True, dtype=dtype
        )
    except (OSError, ValueError, RuntimeError) as err:
        raise WeightsError(f"cannot load {folder} as {MODEL_ID} ({err}); {download_hint(folder)}") from err
    problems = {
        kind: sorted(info.get(kind) or [])
        for kind in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs")
    }
    problems = {kind: keys for kind, keys in problems.items() if keys}
    if problems:
        summary = "; ".join(f"{kind}: {', '.join(map(str, keys[:3]))}" for kind, keys in problems.items())
        raise WeightsError(
            f"{folder}/{WEIGHTS_FILE} does not match the DINOv3 architecture ({summary}): it holds another model's "
            f"tensors or an incomplete file; {download_hint(folder)}"
        )
    return model.to(device).eval()


def transformer_blocks(model: DINOv3ViTModel) -> torch.nn.ModuleList:
    """The ViT blocks: ``model.model.layer`` on transformers ≥ 5, ``model.layer`` before."""
    encoder = getattr(model, "model", None)
    return encoder.layer if encoder is not None else model.layer


def extract_features(model: DINOv3ViTModel, pixel_values: torch.Tensor) -> torch.Tensor:
    """TRELLIS.2's conditioning features ``[B, 1 + registers + patches, hidden]`` (``[1, 1029, 1024]`` at 512)."""
    pixel_values = pixel_values.to(model.embeddings.patch_embeddings.weight.dtype)
    hidden_states = model.embeddings(pixel_values, bool_masked_pos=None)
    position_embeddings = model.rope_embeddings(pixel_values)
    for block in transformer_blocks(model):
        hidden_states = block(hidden_states, position_embeddings=position_embeddings)
    return F.layer_norm(hidden_states, hidden_states.shape[-1:])


def feature_shape(config, resolution: int, batch: int = 1) -> list[int]:
    """Expected feature shape for a square input of ``resolution`` pixels."""
    patches = (resolution // config.patch_size) ** 2
    return [batch, 1 + config.num_register_tokens + patches, config.hidden_size]
