"""LTX-2.3's ×2 spatial latent upsampler (the two-stage pipelines' middle step), loaded from its released single file.

The file (``ltx-2.3-spatial-upscaler-x2-1.1.safetensors``, Lightricks/LTX-2.3) holds ltx-core's ``LatentUpsampler``
state dict under its own names and its constructor arguments as JSON in ``__metadata__["config"]``
(``ltx_core/model/upsampler/model_configurator.py`` at 400fd310, whose defaults apply to absent keys). diffusers'
``LTX2LatentUpsamplerModel`` has the same modules under the same names; two arguments are renamed
(``rational_resampler`` → ``use_rational_resampler``, ``spatial_scale`` → ``rational_spatial_scale``) and
diffusers' defaults differ from ltx-core's, so every argument is passed.

ltx-core upsamples a normalised latent between the video encoder's statistics (``upsample_video``: un-normalise,
upsample, normalise); diffusers' pipelines hand over latents already un-normalised (``output_type="latent"``) and
normalise what they are given, so :func:`upsample` applies the module alone, which computes the same.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from diffusers.pipelines.ltx2.latent_upsampler import LTX2LatentUpsamplerModel
from safetensors import SafetensorError, safe_open

from deliverykit.assets.loadcheck import LoadedFile, check_file_for_loading
from deliverykit.errors import WeightsError

FILE_NAME = "ltx-2.3-spatial-upscaler-x2-1.1.safetensors"
MODEL_ID = "Lightricks/LTX-2.3"
# ltx-core's LatentUpsamplerConfigurator: metadata key → (diffusers argument, ltx-core default)
CONFIG_KEYS: dict[str, tuple[str, Any]] = {
    "in_channels": ("in_channels", 128),
    "mid_channels": ("mid_channels", 512),
    "num_blocks_per_stage": ("num_blocks_per_stage", 4),
    "dims": ("dims", 3),
    "spatial_upsample": ("spatial_upsample", True),
    "temporal_upsample": ("temporal_upsample", False),
    "spatial_scale": ("rational_spatial_scale", 2.0),
    "rational_resampler": ("use_rational_resampler", False),
}
DOWNLOAD = f"download {FILE_NAME} from {MODEL_ID} (huggingface-cli download {MODEL_ID} {FILE_NAME})"


def diffusers_config(ltx_config: dict[str, Any]) -> dict[str, Any]:
    """diffusers' constructor arguments for ltx-core's metadata ``config`` (unknown keys are refused)."""
    unknown = sorted(set(ltx_config) - set(CONFIG_KEYS))
    if unknown:
        raise ValueError(f"unknown latent upsampler config keys {unknown}")
    return {name: ltx_config.get(key, default) for key, (name, default) in CONFIG_KEYS.items()}


def ltx_config(module: LTX2LatentUpsamplerModel) -> dict[str, Any]:
    """The metadata ``config`` ltx-core reads to rebuild ``module`` (the inverse of :func:`diffusers_config`)."""
    return {key: module.config[name] for key, (name, _) in CONFIG_KEYS.items()}


def load_upsampler(
    path: Path,
    *,
    latent_channels: int,
    torch_dtype: torch.dtype,
    manifest: Path | None = None,
    strict_manifest: bool = False,
) -> tuple[LTX2LatentUpsamplerModel, LoadedFile | None]:
    """The upsampler of ``path``, every tensor loaded (no missing, unexpected or misshapen one), in ``torch_dtype``.

    ``latent_channels``: the video VAE's, which the upsampler must take. ``manifest``: compared with the release as
    the checkpoint is (None: random smoke weights). Raises :class:`WeightsError` (exit 4) naming the file and the fix.
    """
    path = Path(path)
    if not path.is_file():
        raise WeightsError(f"spatial upsampler {path} does not exist; {DOWNLOAD} and pass --spatial-upsampler FILE")
    record = check_file_for_loading(manifest, path, MODEL_ID, strict=strict_manifest) if manifest else None
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
            tensors = {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118 - not a Mapping
        config = diffusers_config(json.loads(metadata.get("config", "{}")))
    except (SafetensorError, OSError, ValueError) as err:
        raise WeightsError(
            f"spatial upsampler {path} is not a readable LTX upsampler file ({err}); {DOWNLOAD}"
        ) from None
    if config["in_channels"] != latent_channels:
        raise WeightsError(
            f"spatial upsampler {path} takes {config['in_channels']}-channel latents, the model's VAE makes "
            f"{latent_channels}: it is for another model; {DOWNLOAD}"
        )
    with torch.device("meta"):
        module = LTX2LatentUpsamplerModel(**config)
    expected = module.state_dict()
    missing, unexpected = sorted(set(expected) - set(tensors)), sorted(set(tensors) - set(expected))
    misshapen = [key for key in set(expected) & set(tensors) if expected[key].shape != tensors[key].shape]
    if missing or unexpected or misshapen:
        raise WeightsError(
            f"spatial upsampler {path} does not fit its own config {config}: missing {missing[:3]}, unexpected "
            f"{unexpected[:3]}, misshapen {sorted(misshapen)[:3]}; {DOWNLOAD}"
        )
    module.load_state_dict({key: value.to(torch_dtype) for key, value in tensors.items()}, assign=True, strict=True)
    return module.eval(), record


def upsample(module: LTX2LatentUpsamplerModel, latents: torch.Tensor) -> torch.Tensor:
    """Un-normalised ``[B, C, F, H, W]`` video latents at twice the height and width, in float32 (see the module
    docstring); the module runs in its own dtype on its own device."""
    parameter = next(module.parameters())
    with torch.no_grad():
        return module(latents.to(parameter.device, parameter.dtype)).float()
