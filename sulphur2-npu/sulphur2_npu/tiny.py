"""A tiny, architecture-faithful LTX-2.3 pipeline built locally: no hub, no downloads, about two seconds on CPU.

Every component has the LTX-2.3 structure of Sulphur-2-base (gated attention, prompt AdaLN, per-modality text
projections, a 4-stage video decoder, a vocoder with bandwidth extension, a Gemma-3 text encoder) at widths of
4-32, so tests exercise the same code paths and key layouts as the 22B weights. Configs: sulphur.md §9.

Two variants (:data:`TINY_MODELS`, ``--smoke NAME``): ``tiny``, the default every result uses, with 2 attention heads
per stream, and ``tiny-heads8`` with 8 (wider heads, everything else equal), so that Ulysses sequence parallel, which
hands each of U ranks heads / U heads, runs at U = 4 and 8 too.

In memory (:func:`tiny_components`, :func:`tiny_pipeline`) or on disk (:func:`write_smoke_files`, what ``--smoke``
loads): one ``.safetensors`` in the original single-file layout (``model.diffusion_model.*``,
``text_embedding_projection.*``, ``vae.*``, ``audio_vae.*``, ``vocoder.*``), optionally with an ltx-core style JSON
``config`` in ``__metadata__`` (:func:`tiny_ltx_metadata_config`), plus a transformers Gemma-3 folder with its
tokenizer, so that ``--smoke`` takes the real loader.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from diffusers import (
    AutoencoderKLLTX2Audio,
    AutoencoderKLLTX2Video,
    LTX2ImageToVideoPipeline,
    LTX2Pipeline,
    LTX2VideoTransformer3DModel,
)
from diffusers.pipelines.ltx2.connectors import LTX2TextConnectors
from diffusers.pipelines.ltx2.latent_upsampler import LTX2LatentUpsamplerModel
from diffusers.pipelines.ltx2.vocoder import LTX2VocoderWithBWE
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import Gemma3Config, Gemma3ForConditionalGeneration, GemmaTokenizer

from deliverykit.files import atomic_path, ensure_writable_dir
from deliverykit.random_weights import fill_, randomize_
from sulphur2_npu.audio_io import AudioClip
from sulphur2_npu.keymap import COMPONENTS, map_to_original
from sulphur2_npu.presets import Preset
from sulphur2_npu.reference_fixes import (
    ReferenceImageToVideoPipeline,
    ReferenceTextToVideoPipeline,
    install_cross_timestep_fix,
)
from sulphur2_npu.schedules import DEV, make_scheduler
from sulphur2_npu.upsampler import ltx_config

TEXT_HIDDEN_SIZE = 32
TEXT_NUM_LAYERS = 2
MAX_SEQUENCE_LENGTH = 128  # a multiple of the 128 learnable registers
CHECKPOINT_NAME = "sulphur2-tiny.safetensors"
UPSAMPLER_NAME = "sulphur2-tiny-spatial-upscaler-x2.safetensors"
DISTILLED_LORA_NAME = "sulphur2-tiny-distilled-lora.safetensors"
# ltx-core LatentUpsampler arguments (mid_channels: a multiple of GroupNorm's 32 groups)
UPSAMPLER_CONFIG = {"in_channels": 8, "mid_channels": 32, "num_blocks_per_stage": 1, "dims": 3}
LORA_RANK = 4
LORA_FACTOR_STD = 0.3  # each factor's scale: B·A moves the tiny model's outputs visibly, not wildly
_LORA_TARGET = re.compile(
    r"diffusion_model\.transformer_blocks\.\d+\.\w*(attn\d|attn)\.(to_[qkv]|to_out\.0)|"
    r"diffusion_model\.transformer_blocks\.\d+\.(audio_)?ff\.net\.(0\.proj|2)"
)

TRANSFORMER_CONFIG: dict[str, Any] = {
    "in_channels": 8,
    "out_channels": 8,
    "num_attention_heads": 2,
    "attention_head_dim": 8,
    "cross_attention_dim": 16,
    "gated_attn": True,
    "cross_attn_mod": True,
    "audio_in_channels": 4,
    "audio_out_channels": 4,
    "audio_num_attention_heads": 2,
    "audio_attention_head_dim": 4,
    "audio_cross_attention_dim": 8,
    "audio_gated_attn": True,
    "audio_cross_attn_mod": True,
    "num_layers": 2,
    "caption_channels": TEXT_HIDDEN_SIZE,
    "rope_type": "split",
    "use_prompt_embeddings": False,
    "perturbed_attn": True,  # STG perturbs self-attention (as the loader configures LTX-2.3)
}

CONNECTORS_CONFIG: dict[str, Any] = {
    "caption_channels": TEXT_HIDDEN_SIZE,
    "text_proj_in_factor": TEXT_NUM_LAYERS + 1,  # every hidden state of Gemma, embeddings included
    "video_connector_num_attention_heads": 2,
    "video_connector_attention_head_dim": 8,
    "video_connector_num_layers": 1,
    "video_connector_num_learnable_registers": 128,  # fixed at 128 in ltx-core (not configurable)
    "video_gated_attn": True,
    "audio_connector_num_attention_heads": 2,
    "audio_connector_attention_head_dim": 4,
    "audio_connector_num_layers": 1,
    "audio_connector_num_learnable_registers": 128,
    "audio_gated_attn": True,
    "rope_type": "split",
    "per_modality_projections": True,
    "video_hidden_dim": 16,
    "audio_hidden_dim": 8,
    "proj_bias": True,
}


@dataclass(frozen=True)
class TinyModel:
    """One tiny LTX-2.3 variant: its transformer and connectors configs (the VAEs, vocoder and Gemma-3 are shared)."""

    name: str
    transformer: dict[str, Any]
    connectors: dict[str, Any]


TINY = TinyModel("tiny", TRANSFORMER_CONFIG, CONNECTORS_CONFIG)
# 8 heads in both streams (video 8 x 4, audio 8 x 2): Ulysses at U = 2, 4, 8. The connectors' widths follow the
# streams' (their output is the text the attention reads); the layers and every other component are TINY's.
TINY_HEADS8 = TinyModel(
    "tiny-heads8",
    TRANSFORMER_CONFIG
    | {
        "num_attention_heads": 8,
        "attention_head_dim": 4,
        "cross_attention_dim": 32,
        "audio_num_attention_heads": 8,
        "audio_attention_head_dim": 2,
        "audio_cross_attention_dim": 16,
    },
    CONNECTORS_CONFIG
    | {
        "video_connector_attention_head_dim": 16,
        "audio_connector_attention_head_dim": 8,
        "video_hidden_dim": 32,
        "audio_hidden_dim": 16,
    },
)
TINY_MODELS = {model.name: model for model in (TINY, TINY_HEADS8)}

# LTX-2.3 video VAE (ltx-core "CausalVideoAutoencoder" layout): encoder stages spatial, temporal, 2x spatiotemporal
# with channel multipliers 2, 2, 2, 1; a 4-stage decoder upsampling spatiotemporal (x2 channels), spatiotemporal (x1),
# temporal, spatial, without residual upsamplers and with zero spatial padding -> 32x spatial, 8x temporal.
VAE_CONFIG: dict[str, Any] = {
    "latent_channels": 8,
    "block_out_channels": (16, 32, 64, 64),
    "decoder_block_out_channels": (8, 16, 16, 32),
    "layers_per_block": (1, 1, 1, 1, 1),
    "decoder_layers_per_block": (1, 1, 1, 1, 1),
    "spatio_temporal_scaling": (True, True, True, True),
    "decoder_spatio_temporal_scaling": (True, True, True, True),
    "decoder_inject_noise": (False, False, False, False, False),
    "downsample_type": ("spatial", "temporal", "spatiotemporal", "spatiotemporal"),
    "upsample_type": ("spatiotemporal", "spatiotemporal", "temporal", "spatial"),
    "upsample_residual": (False, False, False, False),
    "upsample_factor": (2, 2, 1, 2),
    "patch_size": 4,
    "decoder_causal": False,
    "encoder_spatial_padding_mode": "zeros",
    "decoder_spatial_padding_mode": "zeros",
    "spatial_compression_ratio": 32,  # the default formula (patch x 2^stages = 64) is wrong for this layout
    "temporal_compression_ratio": 8,
}

AUDIO_VAE_CONFIG: dict[str, Any] = {
    "base_channels": 4,
    "output_channels": 2,
    "ch_mult": (1, 2, 4),
    "num_res_blocks": 1,
    "latent_channels": 2,
    "mel_bins": 8,
}

VOCODER_CONFIG: dict[str, Any] = {
    "in_channels": 16,  # 2 channels x 8 mel bins
    "hidden_channels": 32,
    "upsample_kernel_sizes": [20, 32],  # kernel - stride even
    "upsample_factors": [10, 16],  # 160 samples a mel frame: 16 kHz from the 10 ms hop, as the released vocoder's rate
    "final_act_fn": "clamp",  # ltx-core clamps the stage-1 waveform (use_tanh_at_final=false)
    "resnet_kernel_sizes": [3],
    "resnet_dilations": [[1, 3, 5]],  # the reference AMP block has exactly three dilated convs
    "bwe_in_channels": 16,
    "bwe_hidden_channels": 16,
    "bwe_upsample_kernel_sizes": [8, 8, 7],  # kernel - stride must be even
    "bwe_upsample_factors": [4, 4, 3],  # = hop_length x (48 kHz / 16 kHz)
    "bwe_resnet_kernel_sizes": [3],
    "bwe_resnet_dilations": [[1, 3, 5]],
    "filter_length": 64,
    "hop_length": 16,
    "window_length": 64,
    "num_mel_channels": 8,
}

TINY_HEIGHT, TINY_WIDTH, TINY_NUM_FRAMES = 64, 96, 9

TINY_CALL: dict[str, Any] = {
    "prompt": "a red fox runs through snow",
    "negative_prompt": "blurry",
    "height": TINY_HEIGHT,
    "width": TINY_WIDTH,
    "num_frames": TINY_NUM_FRAMES,
    "num_inference_steps": 2,
    "guidance_scale": 3.0,
    "stg_scale": 1.0,
    "modality_scale": 3.0,
    "audio_guidance_scale": 7.0,
    "spatio_temporal_guidance_blocks": [1],  # the default [28] needs 48 layers
    "max_sequence_length": MAX_SEQUENCE_LENGTH,
    "output_type": "np",
}
# What --smoke runs without --preset: the size, length, steps and guidance of TINY_CALL.
TINY_PRESET = Preset(
    width=TINY_WIDTH,
    height=TINY_HEIGHT,
    num_frames=TINY_NUM_FRAMES,
    steps=TINY_CALL["num_inference_steps"],
    guidance=TINY_CALL["guidance_scale"],
)
# --smoke with a two-stage pipeline: both stages' sizes multiples of 64 (stage 1: 64x32, one latent row)
TINY_TWO_STAGE_PRESET = Preset(
    width=2 * TINY_HEIGHT,
    height=TINY_HEIGHT,
    num_frames=TINY_NUM_FRAMES,
    steps=TINY_CALL["num_inference_steps"],
    guidance=TINY_CALL["guidance_scale"],
)


def tiny_tokenizer() -> GemmaTokenizer:
    """A Gemma BPE tokenizer with a character vocabulary, built in memory (no tokenizer.model download)."""
    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]
    pieces = ["▁", *"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?'-:;()"]
    vocab = {token: index for index, token in enumerate(specials + pieces)}
    tokenizer = GemmaTokenizer(vocab=vocab, merges=[])
    tokenizer.model_max_length = 1024
    return tokenizer


def tiny_text_encoder_config() -> Gemma3Config:
    """Gemma-3 (text + SigLIP vision tower) at hidden size 32; the vocabulary matches :func:`tiny_tokenizer`."""
    vocab_size = len(tiny_tokenizer())
    text_config = {
        "vocab_size": vocab_size,
        "hidden_size": TEXT_HIDDEN_SIZE,
        "intermediate_size": 64,
        "num_hidden_layers": TEXT_NUM_LAYERS,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "sliding_window": 16,
        "max_position_embeddings": 256,
        "pad_token_id": 0,
        "eos_token_id": 1,
        "bos_token_id": 2,
    }
    vision_config = {
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "image_size": 32,
        "patch_size": 8,
    }
    return Gemma3Config(
        text_config=text_config,
        vision_config=vision_config,
        mm_tokens_per_image=4,
        image_token_index=vocab_size - 1,
        boi_token_index=vocab_size - 2,
        eoi_token_index=vocab_size - 3,
    )


def _fill_stft_buffers(vocoder: LTX2VocoderWithBWE, seed: int) -> None:
    """Give the zero-initialised STFT/mel buffers (placeholders for checkpoint values) random values.

    Zeros would feed a constant log-mel to the BWE stage. The mel filterbank is kept non-negative like a real one, and
    the BWE output layer is scaled down so the waveform stays mostly inside the +-1 clamp and every tensor still
    shapes the output.
    """
    stft = vocoder.mel_stft.stft_fn
    fill_(stft.forward_basis, seed, "mel_stft.stft_fn.forward_basis", scale=0.3)
    fill_(stft.inverse_basis, seed, "mel_stft.stft_fn.inverse_basis", scale=0.3)
    mel_basis = vocoder.mel_stft.mel_basis
    fill_(mel_basis, seed, "mel_stft.mel_basis")
    mel_basis.abs_()
    vocoder.bwe_generator.conv_out.weight.mul_(0.1)


def tiny_components(seed: int = 0, model: TinyModel = TINY) -> dict[str, Any]:
    """All eight LTX2Pipeline components of ``model``, fp32, eval mode; the same seed gives bit-identical weights on
    every torch version (:func:`deliverykit.random_weights.randomize_`, whatever the state of torch's random stream)."""
    transformer = LTX2VideoTransformer3DModel(**model.transformer)
    connectors = LTX2TextConnectors(**model.connectors)
    vae = AutoencoderKLLTX2Video(**VAE_CONFIG)
    audio_vae = AutoencoderKLLTX2Audio(**AUDIO_VAE_CONFIG)
    vocoder = LTX2VocoderWithBWE(**VOCODER_CONFIG)
    text_encoder = Gemma3ForConditionalGeneration(tiny_text_encoder_config())
    # Parameters that start at exactly 0 or 1 (gates, norms, scale-shift tables) are perturbed around that value, so
    # every tensor carries information and a wrong key mapping changes the output. Gemma keeps its init's std.
    for module in (transformer, connectors, vae, audio_vae, vocoder):
        randomize_(module, seed)
    randomize_(text_encoder, seed, std=text_encoder.config.text_config.initializer_range)
    with torch.no_grad():
        _fill_stft_buffers(vocoder, seed)
    components = {
        "transformer": transformer,
        "connectors": connectors,
        "vae": vae,
        "audio_vae": audio_vae,
        "vocoder": vocoder,
        "text_encoder": text_encoder,
    }
    for module in components.values():
        module.eval()
    components["tokenizer"] = tiny_tokenizer()
    components["scheduler"] = make_scheduler(DEV)  # LTX-2.3 dev sampling, as the loader builds it
    return components


def tiny_pipeline(
    seed: int = 0, *, image_to_video: bool = False, components: dict[str, Any] | None = None
) -> LTX2Pipeline | LTX2ImageToVideoPipeline:
    """The tiny LTX-2.3 pipeline (T2V, or I2V with ``image_to_video``); call it with ``**TINY_CALL``.

    With the loader's ``reference_fixes`` (installed on ``components["transformer"]``), so it runs what a loaded
    pipeline runs.
    """
    components = components if components is not None else tiny_components(seed)
    install_cross_timestep_fix(components["transformer"])
    pipeline_class = ReferenceImageToVideoPipeline if image_to_video else ReferenceTextToVideoPipeline
    pipe = pipeline_class(**components)
    pipe.set_progress_bar_config(disable=True)
    return pipe


@dataclass(frozen=True)
class SmokeFiles:
    """Where :func:`write_smoke_files` put the single file, the text encoder folder and the two-stage pipelines'
    parts (the ×2 upsampler and the distilled LoRA, in their released layouts)."""

    checkpoint: Path
    text_encoder: Path
    upsampler: Path | None = None
    distilled_lora: Path | None = None


def write_upsampler(path: Path, seed: int = 0) -> Path:
    """A tiny ×2 spatial upsampler for the tiny VAE's latents in the released file's layout: ltx-core's names and
    its constructor arguments as the ``config`` metadata (``upsampler.ltx_config``); a rational resampler, as
    diffusers' default, so the blur path runs too."""
    module = LTX2LatentUpsamplerModel(**UPSAMPLER_CONFIG)
    randomize_(module, seed)
    tensors = {key: value.detach().contiguous() for key, value in module.state_dict().items()}
    with atomic_path(path) as temporary:
        save_file(tensors, str(temporary), metadata={"config": json.dumps(ltx_config(module))})
    return path


def write_distilled_lora(path: Path, checkpoint: Path, seed: int = 0) -> Path:
    """A rank-:data:`LORA_RANK` LoRA on every attention and feed-forward projection of the transformer blocks in
    ``checkpoint``, saved as the released distilled LoRA is: original (ComfyUI / ltx-core) names,
    ``diffusion_model.<layer>.lora_A/lora_B.weight``. Both factors are non-zero, so the LoRA changes the output."""
    tensors = {}
    with safe_open(str(checkpoint), framework="pt") as handle:
        for key in handle.keys():  # noqa: SIM118 - not a Mapping
            layer = key.removeprefix("model.").removesuffix(".weight")
            if not _LORA_TARGET.fullmatch(layer):
                continue
            out_features, in_features = handle.get_slice(key).get_shape()
            for side, shape in (("A", (LORA_RANK, in_features)), ("B", (out_features, LORA_RANK))):
                tensor = torch.empty(shape)
                fill_(tensor, seed, f"{layer}.lora_{side}", scale=LORA_FACTOR_STD)
                tensors[f"{layer}.lora_{side}.weight"] = tensor
    with atomic_path(path) as temporary:
        save_file(tensors, str(temporary))
    return path


def _vae_blocks(layers: tuple[int, ...], samplers: list[tuple[str, dict[str, Any]]]) -> list[list[Any]]:
    blocks: list[list[Any]] = []
    for index, count in enumerate(layers):
        blocks.append(["res_x", {"num_layers": count}])
        if index < len(samplers):
            blocks.append(list(samplers[index]))
    return blocks


def tiny_ltx_metadata_config(model: TinyModel = TINY) -> dict[str, Any]:
    """``model``'s config in the ltx-core metadata format (field names of the official LTX-2.3 files)."""
    t, c, v, a, voc = model.transformer, model.connectors, VAE_CONFIG, AUDIO_VAE_CONFIG, VOCODER_CONFIG
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


SMOKE_SOUND_RATE = 22_050  # not the encoder's 16 kHz, so that the smoke resamples as a real file would be
SMOKE_SOUND_HZ = (220.0, 330.0)  # left, right


def smoke_sound(seconds: float) -> AudioClip:
    """The a2v smoke's sound track: a fifth (two sines, one a channel) swelling over ``seconds``, at 22.05 kHz."""
    time = torch.arange(round(seconds * SMOKE_SOUND_RATE), dtype=torch.float32) / SMOKE_SOUND_RATE
    swell = 0.5 * time / max(seconds, 1e-6)
    waveform = torch.stack([swell * torch.sin(2 * torch.pi * hz * time) for hz in SMOKE_SOUND_HZ])
    return AudioClip(waveform, SMOKE_SOUND_RATE, "smoke tone")


def smoke_frames(width: int, height: int, frames: int) -> torch.Tensor:
    """The retake smoke's source picture: a colour ramp sliding right one pixel a frame, uint8 ``[F, H, W, 3]``."""
    shift = torch.arange(frames, dtype=torch.float32)[:, None, None]
    x = (torch.arange(width, dtype=torch.float32)[None, None, :] - shift).remainder(width).expand(frames, height, width)
    y = torch.arange(height, dtype=torch.float32)[None, :, None].expand(frames, height, width)
    ramp = torch.stack([x / width, y / height, 1 - x / width], dim=-1)
    return (ramp * 255).round().to(torch.uint8)


def write_smoke_files(
    folder: Path,
    seed: int = 0,
    *,
    with_metadata: bool = True,
    omit_sections: tuple[str, ...] = (),
    tokenizer_subfolder: bool = False,
    model: TinyModel = TINY,
) -> SmokeFiles:
    """Write the tiny ``model`` (seed ``seed``) as one original-layout single file plus a Gemma-3 folder.

    Args:
        folder (`Path`): created if needed; gets ``sulphur2-tiny.safetensors`` and ``text_encoder/``.
        with_metadata (`bool`, defaults to `True`): store the ltx-core JSON ``config`` in ``__metadata__`` like the
            official files; without it the loader must derive every config from tensor shapes.
        omit_sections (`tuple[str, ...]`, defaults to `()`): metadata ``config`` sections to leave out (e.g.
            ``"vae"``): the loader then derives those components from shapes and ltx-core's defaults.
        tokenizer_subfolder (`bool`, defaults to `False`): put the tokenizer in ``text_encoder/tokenizer/``.
        model (`TinyModel`, defaults to `TINY`): which variant (:data:`TINY_MODELS`).
    """
    folder = ensure_writable_dir(folder)
    components = tiny_components(seed, model)
    tensors = {}
    for name in COMPONENTS:
        state = components[name].state_dict()
        for diffusers_key, original_key in map_to_original(name, state).items():
            tensors[original_key] = state[diffusers_key].detach().clone().contiguous()
    config = {name: section for name, section in tiny_ltx_metadata_config(model).items() if name not in omit_sections}
    metadata = {"config": json.dumps(config)} if with_metadata else None
    checkpoint = folder / CHECKPOINT_NAME
    with atomic_path(checkpoint) as temporary:
        save_file(tensors, str(temporary), metadata=metadata)
    text_encoder = folder / "text_encoder"
    components["text_encoder"].save_pretrained(text_encoder)
    components["tokenizer"].save_pretrained(text_encoder / "tokenizer" if tokenizer_subfolder else text_encoder)
    upsampler = write_upsampler(folder / UPSAMPLER_NAME, seed)
    distilled_lora = write_distilled_lora(folder / DISTILLED_LORA_NAME, checkpoint, seed)
    return SmokeFiles(checkpoint, text_encoder, upsampler, distilled_lora)
