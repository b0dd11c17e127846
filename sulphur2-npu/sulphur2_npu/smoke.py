"""Smoke weights: the tiny LTX-2.3 model written exactly like the real release, so ``--smoke`` takes the real loader.

One ``.safetensors`` in the original single-file layout (``model.diffusion_model.*``, ``text_embedding_projection.*``,
``vae.*``, ``audio_vae.*``, ``vocoder.*``), optionally with an ltx-core style JSON ``config`` in ``__metadata__``, plus
a transformers Gemma-3 folder with its tokenizer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from safetensors.torch import save_file

from deliverykit.files import atomic_path, ensure_writable_dir
from sulphur2_npu.keymap import COMPONENTS, map_to_original
from sulphur2_npu.tiny import (
    AUDIO_VAE_CONFIG,
    CONNECTORS_CONFIG,
    TRANSFORMER_CONFIG,
    VAE_CONFIG,
    VOCODER_CONFIG,
    tiny_components,
)

CHECKPOINT_NAME = "sulphur2-tiny.safetensors"


@dataclass(frozen=True)
class SmokeFiles:
    """Where :func:`write_smoke_files` put the single file and the text encoder folder."""

    checkpoint: Path
    text_encoder: Path


def _vae_blocks(layers: tuple[int, ...], samplers: list[tuple[str, dict[str, Any]]]) -> list[list[Any]]:
    blocks: list[list[Any]] = []
    for index, count in enumerate(layers):
        blocks.append(["res_x", {"num_layers": count}])
        if index < len(samplers):
            blocks.append(list(samplers[index]))
    return blocks


def tiny_ltx_metadata_config() -> dict[str, Any]:
    """The tiny model's config in the ltx-core metadata format (field names of the official LTX-2.3 files)."""
    t, c, v, a, voc = TRANSFORMER_CONFIG, CONNECTORS_CONFIG, VAE_CONFIG, AUDIO_VAE_CONFIG, VOCODER_CONFIG
    down_names = {
        "spatial": "compress_space_res",
        "temporal": "compress_time_res",
        "spatiotemporal": "compress_all_res",
    }
    up_names = {"spatial": "compress_space", "temporal": "compress_time", "spatiotemporal": "compress_all"}
    widths = (v["latent_channels"], *v["block_out_channels"])
    down = [
        (down_names[kind], {"multiplier": widths[i + 1] // widths[i]}) for i, kind in enumerate(v["downsample_type"])
    ]
    up_factors = tuple(reversed(v["upsample_factor"]))  # decoder order
    up = [(up_names[kind], {"multiplier": up_factors[i]}) for i, kind in enumerate(v["upsample_type"])]
    decoder_layers = tuple(reversed(v["decoder_layers_per_block"]))  # decoder order: mid first
    decoder_base = v["decoder_block_out_channels"][0] // v["upsample_factor"][0]
    transformer = {
        "_class_name": "AVTransformer3DModel",
        "num_attention_heads": t["num_attention_heads"],
        "attention_head_dim": t["attention_head_dim"],
        "in_channels": t["in_channels"],
        "out_channels": t["out_channels"],
        "num_layers": t["num_layers"],
        "cross_attention_dim": t["cross_attention_dim"],
        "caption_channels": t["caption_channels"],
        "audio_num_attention_heads": t["audio_num_attention_heads"],
        "audio_attention_head_dim": t["audio_attention_head_dim"],
        "audio_in_channels": t["audio_in_channels"],
        "audio_out_channels": t["audio_out_channels"],
        "audio_cross_attention_dim": t["audio_cross_attention_dim"],
        "positional_embedding_max_pos": [20, 2048, 2048],
        "audio_positional_embedding_max_pos": [20],
        "positional_embedding_theta": 10000.0,
        "timestep_scale_multiplier": 1000,
        "av_ca_timestep_scale_multiplier": 1000,
        "norm_eps": 1e-6,
        "apply_gated_attention": True,
        "cross_attention_adaln": True,
        "caption_proj_before_connector": True,
        "caption_projection_first_linear": False,
        "caption_projection_second_linear": False,
        "caption_proj_input_norm": False,
        "connector_num_attention_heads": c["video_connector_num_attention_heads"],
        "connector_attention_head_dim": c["video_connector_attention_head_dim"],
        "connector_num_layers": c["video_connector_num_layers"],
        "audio_connector_num_attention_heads": c["audio_connector_num_attention_heads"],
        "audio_connector_attention_head_dim": c["audio_connector_attention_head_dim"],
        "connector_num_learnable_registers": c["video_connector_num_learnable_registers"],
        "connector_positional_embedding_max_pos": [4096],
        "connector_apply_gated_attention": True,
        "rope_type": "split",
        "frequencies_precision": "float64",
        # fixed values ltx-core's LTXModelConfigurator checks
        "dropout": 0.0,
        "attention_bias": True,
        "activation_fn": "gelu-approximate",
        "num_embeds_ada_norm": 1000,
        "use_linear_projection": False,
        "only_cross_attention": False,
        "cross_attention_norm": True,
        "double_self_attention": False,
        "upcast_attention": False,
        "standardization_norm": "rms_norm",
        "norm_elementwise_affine": False,
        "qk_norm": "rms_norm",
        "positional_embedding_type": "rope",
        "use_audio_video_cross_attention": True,
        "share_ff": False,
        "av_cross_ada_norm": True,
        "use_middle_indices_grid": True,
    }
    vae = {
        "_class_name": "CausalVideoAutoencoder",
        "dims": 3,
        "in_channels": 3,
        "out_channels": 3,
        "latent_channels": v["latent_channels"],
        "encoder_blocks": _vae_blocks(v["layers_per_block"], down),
        "decoder_blocks": list(reversed(_vae_blocks(decoder_layers, up))),
        "norm_layer": "pixel_norm",
        "patch_size": v["patch_size"],
        "latent_log_var": "uniform",
        "causal_decoder": v["decoder_causal"],
        "timestep_conditioning": False,
        "decoder_base_channels": decoder_base,
        "spatial_padding_mode": v["decoder_spatial_padding_mode"],
    }
    audio_vae = {
        "model": {
            "params": {
                "ddconfig": {
                    "double_z": True,
                    "mel_bins": a["mel_bins"],
                    "z_channels": a["latent_channels"],
                    "resolution": 256,
                    "in_channels": 2,
                    "out_ch": a["output_channels"],
                    "ch": a["base_channels"],
                    "ch_mult": list(a["ch_mult"]),
                    "num_res_blocks": a["num_res_blocks"],
                    "attn_resolutions": [],
                    "dropout": 0.0,
                    "mid_block_add_attention": False,
                    "norm_type": "pixel",
                    "causality_axis": "height",
                },
                "sampling_rate": 16000,
            }
        },
        "preprocessing": {"stft": {"filter_length": 1024, "hop_length": 160, "causal": True}},
    }

    def generator(prefix: str) -> dict[str, Any]:
        return {
            "upsample_initial_channel": voc[f"{prefix}hidden_channels"],
            "resblock": "AMP1",
            "upsample_rates": voc[f"{prefix}upsample_factors"],
            "upsample_kernel_sizes": voc[f"{prefix}upsample_kernel_sizes"],
            "resblock_kernel_sizes": voc[f"{prefix}resnet_kernel_sizes"],
            "resblock_dilation_sizes": voc[f"{prefix}resnet_dilations"],
            "stereo": True,
            "use_tanh_at_final": False,
            "activation": "snakebeta",
            "use_bias_at_final": False,
        }

    bwe = generator("bwe_") | {
        "apply_final_activation": False,
        "input_sampling_rate": 16000,
        "output_sampling_rate": 48000,
        "hop_length": voc["hop_length"],
        "n_fft": voc["filter_length"],
        "win_size": voc["window_length"],
        "num_mels": voc["num_mel_channels"],
    }
    return {
        "transformer": transformer,
        "vae": vae,
        "audio_vae": audio_vae,
        "vocoder": {"vocoder": generator(""), "bwe": bwe},
    }


def write_smoke_files(
    folder: Path,
    seed: int = 0,
    *,
    with_metadata: bool = True,
    omit_sections: tuple[str, ...] = (),
    tokenizer_subfolder: bool = False,
) -> SmokeFiles:
    """Write the tiny model (seed ``seed``) as one original-layout single file plus a Gemma-3 folder.

    Args:
        folder (`Path`): created if needed; gets ``sulphur2-tiny.safetensors`` and ``text_encoder/``.
        with_metadata (`bool`, defaults to `True`): store the ltx-core JSON ``config`` in ``__metadata__`` like the
            official files; without it the loader must derive every config from tensor shapes.
        omit_sections (`tuple[str, ...]`, defaults to `()`): metadata ``config`` sections to leave out (e.g.
            ``"vae"``): the loader then derives those components from shapes and ltx-core's defaults.
        tokenizer_subfolder (`bool`, defaults to `False`): put the tokenizer in ``text_encoder/tokenizer/``.
    """
    folder = ensure_writable_dir(folder)
    components = tiny_components(seed)
    tensors = {}
    for name in COMPONENTS:
        state = components[name].state_dict()
        for diffusers_key, original_key in map_to_original(name, state).items():
            tensors[original_key] = state[diffusers_key].detach().clone().contiguous()
    config = {name: section for name, section in tiny_ltx_metadata_config().items() if name not in omit_sections}
    metadata = {"config": json.dumps(config)} if with_metadata else None
    checkpoint = folder / CHECKPOINT_NAME
    with atomic_path(checkpoint) as temporary:
        save_file(tensors, str(temporary), metadata=metadata)
    text_encoder = folder / "text_encoder"
    components["text_encoder"].save_pretrained(text_encoder)
    components["tokenizer"].save_pretrained(text_encoder / "tokenizer" if tokenizer_subfolder else text_encoder)
    return SmokeFiles(checkpoint=checkpoint, text_encoder=text_encoder)
