"""DINOv3 ViT-L/16, TRELLIS.2's image-conditioning model: the feature path (loading: :mod:`.loader`).

The feature path is adapted from microsoft/TRELLIS.2 @ 5565d240,
``trellis2/modules/image_feature_extractor.py::DinoV3FeatureExtractor.extract_features``: embeddings → RoPE →
every block → ``layer_norm`` *without* affine (the model's own final ``norm`` is not used), keeping CLS + 4
registers + patches. Change: the blocks are found at ``model.model.layer`` (transformers ≥ 5) as well as
``model.layer`` (older), where upstream raises ``AttributeError`` on transformers 5.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import DINOv3ViTModel

MODEL_ID = "facebook/dinov3-vitl16-pretrain-lvd1689m"
MODEL_TYPE = "dinov3_vit"
WEIGHTS_FILE = "model.safetensors"
RANDOM_WEIGHTS_METADATA_KEY = "deliverykit_random_weights"


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
