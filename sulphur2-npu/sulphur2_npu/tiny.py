"""A tiny, architecture-faithful LTX-2.3 pipeline built locally: no hub, no downloads, about two seconds on CPU.

Every component has the LTX-2.3 structure of Sulphur-2-base (gated attention, prompt AdaLN, per-modality text
projections, a 4-stage video decoder, a vocoder with bandwidth extension, a Gemma-3 text encoder) at widths of
4-32, so tests exercise the same code paths and key layouts as the 22B weights. Configs: sulphur.md §9.
"""

from __future__ import annotations

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
from diffusers.pipelines.ltx2.vocoder import LTX2VocoderWithBWE
from transformers import Gemma3Config, Gemma3ForConditionalGeneration, GemmaTokenizer

from deliverykit.random_weights import fill_, randomize_
from sulphur2_npu.reference_fixes import ReferenceImageToVideoPipeline, install_cross_timestep_fix
from sulphur2_npu.schedules import DEV, make_scheduler

TEXT_HIDDEN_SIZE = 32
TEXT_NUM_LAYERS = 2
MAX_SEQUENCE_LENGTH = 128  # a multiple of the 128 learnable registers

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
    "upsample_kernel_sizes": [4, 4],
    "upsample_factors": [2, 2],
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


def tiny_components(seed: int = 0) -> dict[str, Any]:
    """All eight LTX2Pipeline components, fp32, eval mode; the same seed gives bit-identical weights on every torch
    version (:func:`deliverykit.random_weights.randomize_`, whatever the state of torch's random stream)."""
    transformer = LTX2VideoTransformer3DModel(**TRANSFORMER_CONFIG)
    connectors = LTX2TextConnectors(**CONNECTORS_CONFIG)
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
    pipeline_class = ReferenceImageToVideoPipeline if image_to_video else LTX2Pipeline
    pipe = pipeline_class(**components)
    pipe.set_progress_bar_config(disable=True)
    return pipe
