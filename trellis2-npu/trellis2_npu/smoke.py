"""Architecture-faithful random DINOv3 weights, written in the real folder layout for ``--smoke``.

``full`` is the real ViT-L/16 configuration shipped in ``data/`` (the byte-exact ``config.json`` of
facebook/dinov3-vitl16-pretrain-lvd1689m); ``tiny`` keeps the architecture (registers, RoPE, layer scale,
non-gated GELU MLP) with tiny widths for tests. The model is saved with ``save_pretrained`` and then loaded back
through :func:`trellis2_npu.dinov3.load_dinov3`, the same code path as downloaded weights.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from safetensors.torch import save_file
from transformers import DINOv3ViTConfig, DINOv3ViTModel

from deliverykit.random_weights import randomize_

from .dinov3 import RANDOM_WEIGHTS_METADATA_KEY, WEIGHTS_FILE

DATA_DIR = Path(__file__).with_name("data")
CONFIG_FILE = DATA_DIR / "dinov3-vitl16-pretrain-lvd1689m.config.json"
PREPROCESSOR_FILE = DATA_DIR / "dinov3-vitl16-pretrain-lvd1689m.preprocessor_config.json"

TINY_OVERRIDES = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4}
VARIANTS = ("full", "tiny")


def dinov3_config(variant: str = "full") -> DINOv3ViTConfig:
    if variant not in VARIANTS:
        raise ValueError(f"unknown smoke variant {variant!r}; expected one of {', '.join(VARIANTS)}")
    values = json.loads(CONFIG_FILE.read_text(encoding="utf-8"))
    if variant == "tiny":
        values.update(TINY_OVERRIDES)
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
        shutil.copyfile(CONFIG_FILE, folder / "config.json")
    else:
        model.config.to_json_file(folder / "config.json")
    shutil.copyfile(PREPROCESSOR_FILE, folder / "preprocessor_config.json")
    return folder
