"""The diffusers config of every LTX-2.3 component, from ltx-core's metadata ``config`` or from tensor shapes.

Official LTX files carry ltx-core's JSON ``config`` in ``__metadata__`` (field names and defaults as ltx-core
400fd310 reads them; ``--model-config`` can stand in for it, :func:`read_model_config`). For a section it lacks, the
config comes from tensor shapes and key sets; values that shapes cannot show get ltx-core's default for an absent
field (listed as assumptions), and a field ltx-core has no default for (the BWE vocoder's rates) refuses the file.
Both paths fill the same diffusers arguments, so their results can be compared. :func:`derive_configs` is what
``checkpoint.inspect_checkpoint`` calls with the header it read.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from deliverykit.errors import InputError, WeightsError
from sulphur2_npu.keymap import COMPONENTS, KeyMapping

# ltx-core perturbs self-attention in the STG blocks of every transformer (``guidance/perturbations.py``); diffusers
# does so only with ``perturbed_attn=True`` (default False: the blocks then ignore ``spatio_temporal_guidance_blocks``
# and the STG pass equals the conditional one). diffusers' own LTX-2.3 conversion script sets it too.
STG_CONFIG = {"perturbed_attn": True}
# Without a metadata section, what shapes cannot show takes ltx-core 400fd310's default for an absent field (the
# ``.get(field, default)`` of its configurators, mirrored by the *_from_metadata functions), never a guess.
_DEFAULTS_NOTE = "{name}: no metadata section; structure from tensor shapes, ltx-core's defaults for {fields}"
_TRANSFORMER_DEFAULTED = (
    "positional_embedding_theta 10000, positional_embedding_max_pos [20, 2048, 2048] / [20], timestep_scale_multiplier "
    "1000, av_ca_timestep_scale_multiplier 1, rope_type split, frequencies_precision float32, norm_eps 1e-6"
)
_CONNECTORS_DEFAULTED = "connector_positional_embedding_max_pos [1], rope_type split, frequencies_precision float32"
_VAE_DEFAULTED = (
    "spatial_padding_mode (encoder zeros, decoder reflect), causal_decoder false, compress_all residual false, "
    "norm_layer pixel_norm"
)
_AUDIO_VAE_DEFAULTED = "resolution 256, pixel norm, causal along height, 16 kHz, hop 160, no attention resolutions"
GEMMA3_12B = {"hidden_size": 3840, "num_hidden_layers": 48}  # MODELS-LTX-2.3.md: gemma-3-12b-it-qat-q4_0-unquantized


class _Shapes:
    """Diffusers-named shapes of one component."""

    def __init__(self, shapes: dict[str, tuple[int, ...]], names: dict[str, str]):
        self.shape = {new: shapes[old] for new, old in names.items()}

    def __call__(self, key: str) -> tuple[int, ...]:
        return self.shape[key]

    def has(self, fragment: str) -> bool:
        return any(fragment in key for key in self.shape)

    def count(self, pattern: str) -> int:
        """Number of distinct indices N in keys matching ``pattern`` with ``(\\d+)`` for N."""
        return len({m[1] for key in self.shape if (m := re.match(pattern, key))})


def _text_split(shapes: _Shapes, text_encoder_config: dict[str, int] | None, assumptions: list[str]) -> tuple[int, int]:
    in_features = shapes("video_text_proj_in.weight")[1]
    gemma = text_encoder_config or GEMMA3_12B
    if text_encoder_config is None:
        assumptions.append(
            "connectors: caption_channels 3840 (Gemma-3-12B hidden size; pass the text encoder to check)"
        )
    caption_channels = gemma["hidden_size"]
    if in_features != caption_channels * (gemma["num_hidden_layers"] + 1):
        raise InputError(
            f"the text projection expects {in_features} features per token but the text encoder gives "
            f"{caption_channels} x ({gemma['num_hidden_layers']} layers + 1) = "
            f"{caption_channels * (gemma['num_hidden_layers'] + 1)}: use the Gemma-3-12B the checkpoint was trained "
            f"with (google/gemma-3-12b-it-qat-q4_0-unquantized)"
        )
    return caption_channels, gemma["num_hidden_layers"] + 1


def _heads(shapes: _Shapes, attention: str, inner: int, default_head_dim: int, assumptions: list[str]) -> int:
    """Gated attention has one gate logit per head, so its shape gives the head count; else ltx-core's default."""
    gate = f"{attention}.to_gate_logits.weight"
    if gate in shapes.shape:
        return shapes(gate)[0]
    assumptions.append(f"{attention}: head dim {default_head_dim} (ltx-core's default; not gated, not in shapes)")
    return inner // default_head_dim


def _transformer_from_shapes(s: _Shapes, assumptions: list[str]) -> dict[str, Any]:
    """What shapes and key sets prove, over ltx-core's defaults for an absent ``transformer`` metadata section."""
    config = _transformer_from_metadata({})
    for prefix in ("", "audio_"):  # the video and audio streams
        block = f"transformer_blocks.0.{prefix}"
        inner = s(f"{prefix}proj_in.weight")[0]
        heads = _heads(s, f"{block}attn1", inner, config[f"{prefix}attention_head_dim"], assumptions)
        config |= {
            f"{prefix}in_channels": s(f"{prefix}proj_in.weight")[1],
            f"{prefix}out_channels": s(f"{prefix}proj_out.weight")[0],
            f"{prefix}num_attention_heads": heads,
            f"{prefix}attention_head_dim": inner // heads,
            f"{prefix}cross_attention_dim": s(f"{block}attn2.to_k.weight")[1],
            f"{prefix}gated_attn": s.has(f"{block}attn1.to_gate_logits."),
            f"{prefix}cross_attn_mod": s.has(f"{block}prompt_scale_shift_table"),
            f"{prefix}ff_bias": f"{block}ff.net.0.proj.bias" in s.shape,
        }
    assumptions.append(_DEFAULTS_NOTE.format(name="transformer", fields=_TRANSFORMER_DEFAULTED))
    return config | {
        "num_layers": s.count(r"transformer_blocks\.(\d+)\."),
        "use_prompt_embeddings": s.has("caption_projection."),
        "use_prompt_adaln_single": s.has("prompt_adaln."),
        "use_keyframes_abs_pos_embedding": "keyframes_abs_pos_embedding" in s.shape,
    }


def _transformer_from_metadata(t: dict[str, Any]) -> dict[str, Any]:
    heads, audio_heads = t.get("num_attention_heads", 32), t.get("audio_num_attention_heads", 32)
    max_pos = t.get("positional_embedding_max_pos", [20, 2048, 2048])
    return {
        "in_channels": t.get("in_channels", 128),
        "out_channels": t.get("out_channels", 128),
        "num_attention_heads": heads,
        "attention_head_dim": t.get("attention_head_dim", 128),
        "cross_attention_dim": t.get("cross_attention_dim", 4096),
        "pos_embed_max_pos": max_pos[0],
        "base_height": max_pos[1],
        "base_width": max_pos[2],
        "gated_attn": t.get("apply_gated_attention", False),
        "cross_attn_mod": t.get("cross_attention_adaln", False),
        "audio_in_channels": t.get("audio_in_channels", 128),
        "audio_out_channels": t.get("audio_out_channels", 128),
        "audio_num_attention_heads": audio_heads,
        "audio_attention_head_dim": t.get("audio_attention_head_dim", 64),
        "audio_cross_attention_dim": t.get("audio_cross_attention_dim", 2048),
        "audio_pos_embed_max_pos": t.get("audio_positional_embedding_max_pos", [20])[0],
        "audio_gated_attn": t.get("apply_gated_attention", False),
        "audio_cross_attn_mod": t.get("cross_attention_adaln", False),
        "num_layers": t.get("num_layers", 48),
        "norm_eps": t.get("norm_eps", 1e-6),
        "rope_theta": float(t.get("positional_embedding_theta", 10000.0)),
        "rope_double_precision": t.get("frequencies_precision") == "float64",
        "timestep_scale_multiplier": t.get("timestep_scale_multiplier", 1000),
        "cross_attn_timestep_scale_multiplier": t.get("av_ca_timestep_scale_multiplier", 1),
        "rope_type": t.get("rope_type", "split"),
        "use_prompt_embeddings": not t.get("caption_proj_before_connector", False),
        "use_prompt_adaln_single": t.get("use_prompt_adaln_single", True),
        "ff_bias": t.get("ff_bias", True),
        "audio_ff_bias": t.get("audio_ff_bias", True),
        "use_keyframes_abs_pos_embedding": t.get("use_keyframes_abs_pos_embedding", False),
        **STG_CONFIG,
    }


def _connectors_from_shapes(s: _Shapes, text: tuple[int, int], assumptions: list[str]) -> dict[str, Any]:
    """What shapes prove, over ltx-core's defaults for absent connector fields of the ``transformer`` section."""
    config = _connectors_from_metadata({}, text)
    for modality in ("video", "audio"):
        block = f"{modality}_connector.transformer_blocks.0.attn1"
        inner = s(f"{block}.to_q.weight")[0]
        heads = _heads(s, block, inner, config[f"{modality}_connector_attention_head_dim"], assumptions)
        registers = f"{modality}_connector.learnable_registers"
        config |= {
            f"{modality}_connector_num_attention_heads": heads,
            f"{modality}_connector_attention_head_dim": inner // heads,
            f"{modality}_connector_num_layers": s.count(rf"{modality}_connector\.transformer_blocks\.(\d+)\."),
            f"{modality}_connector_num_learnable_registers": s(registers)[0] if registers in s.shape else None,
            f"{modality}_gated_attn": s.has(f"{block}.to_gate_logits."),
            f"{modality}_hidden_dim": s(f"{modality}_text_proj_in.weight")[0],
        }
    assumptions.append(_DEFAULTS_NOTE.format(name="connectors", fields=_CONNECTORS_DEFAULTED))
    return config | {
        "per_modality_projections": "video_text_proj_in.weight" in s.shape,
        "proj_bias": "video_text_proj_in.bias" in s.shape,
    }


def _connectors_from_metadata(t: dict[str, Any], text: tuple[int, int]) -> dict[str, Any]:
    """ltx-core Embeddings1DConnectorConfigurator / AudioEmbeddings1DConnectorConfigurator semantics."""
    heads, head_dim = t.get("connector_num_attention_heads", 30), t.get("connector_attention_head_dim", 128)
    layers = t.get("connector_num_layers", 2)
    audio_heads = t.get("audio_connector_num_attention_heads", heads)
    audio_head_dim = t.get("audio_connector_attention_head_dim", head_dim)
    registers = t.get("connector_num_learnable_registers", 128)
    gated = t.get("connector_apply_gated_attention", False)
    return {
        "caption_channels": text[0],
        "text_proj_in_factor": text[1],
        "video_connector_num_attention_heads": heads,
        "video_connector_attention_head_dim": head_dim,
        "video_connector_num_layers": layers,
        "video_connector_num_learnable_registers": registers,
        "video_gated_attn": gated,
        "video_hidden_dim": t.get("num_attention_heads", 32) * t.get("attention_head_dim", 128),
        "audio_connector_num_attention_heads": audio_heads,
        "audio_connector_attention_head_dim": audio_head_dim,
        "audio_connector_num_layers": t.get("audio_connector_num_layers", layers),
        "audio_connector_num_learnable_registers": registers,
        "audio_gated_attn": gated,
        "audio_hidden_dim": t.get("audio_num_attention_heads", 32) * t.get("audio_attention_head_dim", 64),
        "connector_rope_base_seq_len": t.get("connector_positional_embedding_max_pos", [1])[0],
        "rope_theta": 10000.0,  # ltx-core does not pass positional_embedding_theta to the connectors
        "rope_double_precision": t.get("frequencies_precision") == "float64",
        "causal_temporal_positioning": False,  # nor causal_temporal_positioning
        "rope_type": t.get("rope_type", "split"),
        "per_modality_projections": t.get("caption_proj_before_connector", False),
        "proj_bias": t.get("caption_proj_before_connector", False),  # FeatureExtractorV2 linears have a bias
    }


_DOWNSAMPLE_BY_STRIDE = {4: "spatial", 2: "temporal", 8: "spatiotemporal"}
_DOWNSAMPLE_BY_BLOCK = {
    "compress_space_res": "spatial",
    "compress_time_res": "temporal",
    "compress_all_res": "spatiotemporal",
}
_UPSAMPLE_BY_BLOCK = {"compress_space": "spatial", "compress_time": "temporal", "compress_all": "spatiotemporal"}
_DOWN_BLOCK_BY_TYPE = {kind: name for name, kind in _DOWNSAMPLE_BY_BLOCK.items()}
_UP_BLOCK_BY_TYPE = {kind: name for name, kind in _UPSAMPLE_BY_BLOCK.items()}


def _compression(patch_size: int, downsample_types: list[str]) -> dict[str, int]:
    spatial = sum(kind in ("spatial", "spatiotemporal") for kind in downsample_types)
    temporal = sum(kind in ("temporal", "spatiotemporal") for kind in downsample_types)
    return {"spatial_compression_ratio": patch_size * 2**spatial, "temporal_compression_ratio": 2**temporal}


def _vae_from_shapes(s: _Shapes, path: Path, assumptions: list[str]) -> dict[str, Any]:
    """The ltx-core ``vae`` section that shapes prove (blocks, widths, patch size, timestep conditioning), read by
    :func:`_vae_from_metadata` like a real one, so every field shapes cannot show gets ltx-core's default."""
    latent = s("decoder.conv_in.conv.weight")[1]
    stages = s.count(r"encoder\.down_blocks\.(\d+)\.")
    encoder_blocks, width = [], latent  # the ltx-core encoder widens from the latent width
    for i in range(stages):
        encoder_blocks.append(["res_x", {"num_layers": s.count(rf"encoder\.down_blocks\.{i}\.resnets\.(\d+)\.")}])
        after = f"encoder.down_blocks.{i + 1}.resnets.0" if i + 1 < stages else "encoder.mid_block.resnets.0"
        out = s(f"{after}.conv1.conv.weight")[0]
        kind = _DOWNSAMPLE_BY_STRIDE[out // s(f"encoder.down_blocks.{i}.downsamplers.0.conv.conv.weight")[0]]
        encoder_blocks.append([_DOWN_BLOCK_BY_TYPE[kind], {"multiplier": out // width}])
        width = out
    encoder_blocks.append(["res_x", {"num_layers": s.count(r"encoder\.mid_block\.resnets\.(\d+)\.")}])
    # decoder order: mid resnets, then per stage an upsampler (conv -> stride x channels / factor) and resnets
    decoder_order = [["res_x", {"num_layers": s.count(r"decoder\.mid_block\.resnets\.(\d+)\.")}]]
    width = top = s("decoder.conv_in.conv.weight")[0]
    for i in range(s.count(r"decoder\.up_blocks\.(\d+)\.")):
        conv = s(f"decoder.up_blocks.{i}.upsamplers.0.conv.conv.weight")[0]
        res = s(f"decoder.up_blocks.{i}.resnets.0.conv1.conv.weight")[0]
        decoder_order.append([_UP_BLOCK_BY_TYPE[_DOWNSAMPLE_BY_STRIDE[conv // res]], {"multiplier": width // res}])
        decoder_order.append(["res_x", {"num_layers": s.count(rf"decoder\.up_blocks\.{i}\.resnets\.(\d+)\.")}])
        width = res
    assumptions.append(_DEFAULTS_NOTE.format(name="vae", fields=_VAE_DEFAULTED))
    section = {
        "latent_channels": latent,
        "patch_size": int((s("encoder.conv_in.conv.weight")[1] // 3) ** 0.5),
        "encoder_blocks": encoder_blocks,
        "decoder_blocks": list(reversed(decoder_order)),  # ltx-core lists them from the output side
        "decoder_base_channels": top // math.prod(block[1]["multiplier"] for block in decoder_order[1::2]),
        "timestep_conditioning": s.has("decoder.time_embedder."),
    }
    return _vae_from_metadata(section, path)


def _blocks(blocks: list[Any], path: Path, allowed: dict[str, str]) -> list[tuple[str, dict[str, Any]]]:
    parsed = []
    for name, params in blocks:
        if name != "res_x" and name not in allowed:
            raise WeightsError(
                f"{path}: the VAE block {name!r} in the metadata config has no diffusers 0.42.1 equivalent "
                f"(AutoencoderKLLTX2Video supports res_x and {', '.join(allowed)}); this VAE cannot be loaded"
            )
        parsed.append((name, {"num_layers": params} if isinstance(params, int) else dict(params)))
    return parsed


def _stages(blocks: list[tuple[str, dict[str, Any]]]) -> tuple[list[int], list[tuple[str, dict[str, Any]]]]:
    """res_x layer counts before, between and after the (de)compression blocks, and those blocks."""
    layers, samplers = [0], []
    for name, params in blocks:
        if name == "res_x":
            layers[-1] += params["num_layers"]
        else:
            samplers.append((name, params))
            layers.append(0)
    return layers, samplers


def _vae_from_metadata(v: dict[str, Any], path: Path) -> dict[str, Any]:
    """ltx-core CausalVideoAutoencoder semantics (VideoEncoderConfigurator / _build_conv_video_decoder)."""
    if (
        v.get("_class_name", "CausalVideoAutoencoder") != "CausalVideoAutoencoder"
        or v.get("norm_layer", "pixel_norm") != "pixel_norm"
    ):
        raise WeightsError(
            f"{path}: the video VAE is {v.get('_class_name')} with {v.get('norm_layer')}; diffusers 0.42.1 only "
            f"has the convolutional pixel-norm LTX-2 VAE (CausalVideoAutoencoder), so this file cannot be loaded"
        )
    latent, patch_size = v.get("latent_channels", 128), v.get("patch_size", 4)
    layers, down = _stages(_blocks(v.get("encoder_blocks", []), path, _DOWNSAMPLE_BY_BLOCK))
    width, block_out = latent, []  # the ltx-core encoder widens from the latent width, like diffusers
    for _, params in down:
        width *= params.get("multiplier", 2)
        block_out.append(width)
    dec_layers, up = _stages(_blocks(list(reversed(v.get("decoder_blocks", []))), path, _UPSAMPLE_BY_BLOCK))
    multipliers = [params.get("multiplier", 1) for _, params in up]
    width, dec_out = v.get("decoder_base_channels", 128), []
    for multiplier in multipliers:
        width *= multiplier
    for multiplier in multipliers:
        dec_out.append(width)
        width //= multiplier
    down_types = [_DOWNSAMPLE_BY_BLOCK[name] for name, _ in down]
    padding = v.get("spatial_padding_mode")
    return {
        "latent_channels": latent,
        "block_out_channels": tuple(block_out),
        "decoder_block_out_channels": tuple(reversed(dec_out)),
        "layers_per_block": tuple(layers),
        "decoder_layers_per_block": tuple(reversed(dec_layers)),
        "spatio_temporal_scaling": (True,) * len(down),
        "decoder_spatio_temporal_scaling": (True,) * len(up),
        "decoder_inject_noise": (False,) * len(dec_layers),
        "downsample_type": tuple(down_types),
        "upsample_type": tuple(_UPSAMPLE_BY_BLOCK[name] for name, _ in up),
        # ltx-core: only compress_all honours "residual" (default False)
        "upsample_residual": tuple(reversed([name == "compress_all" and p.get("residual", False) for name, p in up])),
        "upsample_factor": tuple(reversed(multipliers)),
        "timestep_conditioning": v.get("timestep_conditioning", True),
        "patch_size": patch_size,
        "encoder_causal": True,
        "decoder_causal": v.get("causal_decoder", False),
        "encoder_spatial_padding_mode": padding or v.get("encoder_spatial_padding_mode", "zeros"),
        "decoder_spatial_padding_mode": padding or "reflect",
        **_compression(patch_size, down_types),
    }


def _audio_vae_from_shapes(s: _Shapes, assumptions: list[str]) -> dict[str, Any]:
    """What shapes prove, over ltx-core's defaults for an absent ``audio_vae`` metadata section."""
    base = s("encoder.conv_in.conv.weight")[0]
    levels = s.count(r"encoder\.down\.(\d+)\.")
    latent = s("decoder.conv_in.conv.weight")[1]
    assumptions.append(_DEFAULTS_NOTE.format(name="audio_vae", fields=_AUDIO_VAE_DEFAULTED))
    return _audio_vae_from_metadata({}) | {
        "base_channels": base,
        "output_channels": s("decoder.conv_out.conv.weight")[0],
        "ch_mult": tuple(s(f"encoder.down.{i}.block.0.conv1.conv.weight")[0] // base for i in range(levels)),
        "num_res_blocks": s.count(r"encoder\.down\.0\.block\.(\d+)\."),
        "in_channels": s("encoder.conv_in.conv.weight")[1],
        "latent_channels": latent,
        "mid_block_add_attention": s.has("encoder.mid.attn_1."),
        "mel_bins": s("latents_mean")[0] // latent * 2 ** (levels - 1),
        "double_z": s("encoder.conv_out.conv.weight")[0] == 2 * latent,
    }


def _audio_vae_from_metadata(a: dict[str, Any]) -> dict[str, Any]:
    """ltx-core AudioDecoderConfigurator / AudioEncoderConfigurator semantics."""
    params = a.get("model", {}).get("params", {})
    ddconfig, preprocessing = params.get("ddconfig", {}), a.get("preprocessing", {})
    stft = preprocessing.get("stft", {})
    mel_bins = (
        ddconfig.get("mel_bins")
        or preprocessing.get("mel", {}).get("n_mel_channels")
        or a.get("variables", {}).get("mel_bins")
    )
    return {
        "base_channels": ddconfig.get("ch", 128),
        "output_channels": ddconfig.get("out_ch", 2),
        "ch_mult": tuple(ddconfig.get("ch_mult", (1, 2, 4))),
        "num_res_blocks": ddconfig.get("num_res_blocks", 2),
        "attn_resolutions": tuple(ddconfig["attn_resolutions"]) if ddconfig.get("attn_resolutions") else None,
        "in_channels": ddconfig.get("in_channels", 2),
        "resolution": ddconfig.get("resolution", 256),
        "latent_channels": ddconfig.get("z_channels", 8),
        "norm_type": ddconfig.get("norm_type", "pixel"),
        "causality_axis": ddconfig.get("causality_axis", "height"),
        "dropout": ddconfig.get("dropout", 0.0),
        "mid_block_add_attention": ddconfig.get("mid_block_add_attention", True),
        "sample_rate": params.get("sampling_rate", 16000),
        "mel_hop_length": stft.get("hop_length", 160),
        "is_causal": stft.get("causal", True),
        "mel_bins": mel_bins,
        "double_z": ddconfig.get("double_z", True),
    }


def audio_stft_size(config: Any) -> int:
    """The STFT size of ltx-core's audio front end (``AudioEncoderConfigurator``: the ``config`` entry's
    ``audio_vae.preprocessing.stft.filter_length``, default 1024), a field diffusers' audio VAE config lacks."""
    section = config.get("audio_vae") if isinstance(config, dict) else None
    stft = section.get("preprocessing", {}).get("stft", {}) if isinstance(section, dict) else {}
    return int(stft.get("filter_length", 1024))


def _generator_from_metadata(g: dict[str, Any], in_channels: int, *, final_activation: bool) -> dict[str, Any]:
    """ltx-core _vocoder_from_config semantics; ``in_channels`` comes from the file (ltx-core hard-codes 128)."""
    amp = g.get("resblock", "1") == "AMP1"
    return {
        "in_channels": in_channels,
        "hidden_channels": g.get("upsample_initial_channel", 1024),
        "out_channels": 2,
        "upsample_kernel_sizes": list(g.get("upsample_kernel_sizes", [16, 15, 8, 4, 4])),
        "upsample_factors": list(g.get("upsample_rates", [6, 5, 2, 2, 2])),
        "resnet_kernel_sizes": list(g.get("resblock_kernel_sizes", [3, 7, 11])),
        "resnet_dilations": [list(d) for d in g.get("resblock_dilation_sizes", [[1, 3, 5]] * 3)],
        "act_fn": g.get("activation", "snake") if amp else "leaky_relu",
        "antialias": amp,
        "antialias_kernel_size": 12,  # ltx-core Activation1d
        "final_bias": g.get("use_bias_at_final", True),
        "final_act_fn": ("tanh" if g.get("use_tanh_at_final", True) else "clamp") if final_activation else None,
    }


def _vocoder_from_metadata(cfg: dict[str, Any], s: _Shapes) -> dict[str, Any]:
    """ltx-core VocoderConfigurator semantics for the LTX-2.3 vocoder + BWE."""
    stage1_cfg, bwe_cfg = cfg.get("vocoder", {}), cfg["bwe"]
    stage1 = _generator_from_metadata(stage1_cfg, s("vocoder.conv_in.weight")[1], final_activation=True)
    bwe = _generator_from_metadata(bwe_cfg, s("bwe_generator.conv_in.weight")[1], final_activation=False)
    return (
        stage1
        | {f"bwe_{key}": value for key, value in bwe.items()}
        | {
            "filter_length": bwe_cfg["n_fft"],
            "hop_length": bwe_cfg["hop_length"],
            "window_length": bwe_cfg["n_fft"],
            "num_mel_channels": bwe_cfg["num_mels"],
            "input_sampling_rate": bwe_cfg["input_sampling_rate"],
            "output_sampling_rate": bwe_cfg["output_sampling_rate"],
        }
    )


def _refuse_vocoder_from_shapes(s: _Shapes, path: Path) -> dict[str, Any]:
    """ltx-core reads the BWE vocoder's rates and STFT from ``vocoder.bwe`` with no default (``cfg["bwe"][...]``)."""
    raise WeightsError(
        f"{path}: the file's __metadata__ has no vocoder.bwe config (input_sampling_rate, output_sampling_rate, "
        f"hop_length, n_fft, num_mels), for which ltx-core has no default and tensor shapes give no proof: pass the "
        f"LTX-2.3 config with --model-config FILE (a JSON file holding the `config` entry of an official LTX-2.3 "
        f"checkpoint's __metadata__)"
    )


def derive_configs(
    path: Path,
    tensor_shapes: dict[str, tuple[int, ...]],
    metadata: dict[str, Any],
    mapping: KeyMapping,
    *,
    text_encoder_config: dict[str, int] | None = None,
    model_config: dict[str, Any] | None = None,
) -> tuple[dict[str, dict[str, Any]], dict[str, str], list[str]]:
    """``(configs, sources, assumptions)`` of every component of an LTX-2.3 file, from its header.

    Args:
        path (`Path`): the file, for messages.
        tensor_shapes (`dict`): original key -> shape; ``mapping`` (``keymap.map_to_diffusers``) names them.
        metadata (`dict`): the parsed ``__metadata__``; its ``config`` entry is ltx-core's model config.
        text_encoder_config (`dict`, *optional*): ``hidden_size`` and ``num_hidden_layers`` of the Gemma that will be
            used (the text projection split); without it Gemma-3-12B is assumed.
        model_config (`dict`, *optional*): replaces ``metadata["config"]`` (:func:`read_model_config`).

    ``sources`` maps each component to "metadata", "model-config" or "shapes"; ``assumptions`` lists the ltx-core
    defaults that shapes could not confirm.
    """
    configs: dict[str, dict[str, Any]] = {}
    sources: dict[str, str] = {}
    assumptions: list[str] = []
    shapes = {name: _Shapes(tensor_shapes, names) for name, names in mapping.components.items()}
    metadata = model_config if model_config is not None else metadata.get("config")
    metadata = metadata if isinstance(metadata, dict) else {}
    origin = "model-config" if model_config is not None else "metadata"
    text = _text_split(shapes["connectors"], text_encoder_config, assumptions)
    from_metadata = {
        "transformer": lambda t: _transformer_from_metadata(t),
        "connectors": lambda t: _connectors_from_metadata(t, text),
        "vae": lambda v: _vae_from_metadata(v, path),
        "audio_vae": _audio_vae_from_metadata,
        "vocoder": lambda cfg: _vocoder_from_metadata(cfg, shapes["vocoder"]) if "bwe" in cfg else None,
    }
    from_shapes = {
        "transformer": lambda s: _transformer_from_shapes(s, assumptions),
        "connectors": lambda s: _connectors_from_shapes(s, text, assumptions),
        "vae": lambda s: _vae_from_shapes(s, path, assumptions),
        "audio_vae": lambda s: _audio_vae_from_shapes(s, assumptions),
        "vocoder": lambda s: _refuse_vocoder_from_shapes(s, path),
    }
    section = {"connectors": "transformer"}  # ltx-core keeps the connector fields in the transformer section
    for name in COMPONENTS:
        section_config = metadata.get(section.get(name, name))
        config = from_metadata[name](section_config) if isinstance(section_config, dict) else None
        if config is None:
            try:
                config, source = from_shapes[name](shapes[name]), "shapes"
            except (KeyError, ZeroDivisionError) as err:
                raise WeightsError(
                    f"{path}: cannot derive the {name} config from tensor shapes (no {err}); the file lacks "
                    f"LTX-2.3 {name} tensors: pass the complete checkpoint"
                ) from err
        else:
            source = origin
        configs[name], sources[name] = config, source
    audio_vae = configs["audio_vae"]  # the transformer's audio positions use the audio VAE's frame rate
    configs["transformer"] |= {
        "audio_sampling_rate": audio_vae["sample_rate"],
        "audio_hop_length": audio_vae["mel_hop_length"],
    }
    return configs, sources, assumptions


def read_model_config(path: Path) -> dict[str, Any]:
    """The ltx-core ``config`` JSON in ``path`` (what official LTX-2.3 files store in ``__metadata__["config"]``)."""
    path = Path(path)
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise InputError(
            f"--model-config {path} is not a readable JSON file ({err}): pass the `config` JSON of an official "
            f"LTX-2.3 checkpoint's __metadata__"
        ) from err
    if isinstance(config, dict) and "config" in config:  # the whole __metadata__ dict, its config a JSON string
        config = json.loads(config["config"]) if isinstance(config["config"], str) else config["config"]
    if not isinstance(config, dict) or not any(name in config for name in (*COMPONENTS, "transformer")):
        raise InputError(
            f"--model-config {path} holds no transformer/vae/audio_vae/vocoder sections: pass the `config` JSON of an "
            f"official LTX-2.3 checkpoint's __metadata__"
        )
    return config
