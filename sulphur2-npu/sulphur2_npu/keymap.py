"""Key mapping between the original LTX-2.3 single-file layout and the diffusers 0.42.1 modules.

The single file (ComfyUI/LTX "monolithic" layout, written by ltx-core) holds five components under fixed prefixes:
``model.diffusion_model.*`` (transformer, plus the two text connectors), ``text_embedding_projection.*`` (the
per-modality text projections, owned by the connectors), ``vae.*``, ``audio_vae.*`` and ``vocoder.*``.

Original -> diffusers reuses diffusers' own converters where they are right (transformer, video VAE, audio VAE) and
adds what 0.42.1 lacks: the ``prompt_adaln_single`` rename, the 4th decoder stage of the LTX-2.3 VAE
(``up_blocks.7/8``), and tables for the connectors and the BWE vocoder. Diffusers -> original (used to write the
smoke file) is a separate table per component; tests check that both directions agree on every key of the tiny model,
and the names were cross-checked against modules built by ltx-core at commit 400fd310.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from diffusers.loaders.single_file_utils import (
    convert_ltx2_audio_vae_to_diffusers,
    convert_ltx2_transformer_to_diffusers,
    convert_ltx2_vae_to_diffusers,
)

COMPONENTS = ("transformer", "connectors", "vae", "audio_vae", "vocoder")

TRANSFORMER_PREFIX = "model.diffusion_model."
CONNECTOR_PREFIXES = {
    "model.diffusion_model.video_embeddings_connector.": "video_connector.",
    "model.diffusion_model.audio_embeddings_connector.": "audio_connector.",
    "text_embedding_projection.video_aggregate_embed.": "video_text_proj_in.",  # LTX-2.3
    "text_embedding_projection.audio_aggregate_embed.": "audio_text_proj_in.",  # LTX-2.3
    "text_embedding_projection.aggregate_embed.": "text_proj_in.",  # LTX-2.0
}
COMPONENT_PREFIXES = {"vae": "vae.", "audio_vae": "audio_vae.", "vocoder": "vocoder."}

# Dataset statistics that ltx-core and diffusers never read (diffusers' VAE converter drops the first two).
IGNORED_STATISTICS = ("channel", "mean-of-stds", "mean-of-stds_over_std-of-means", "std-of-stds")

# Whole dot-separated segments renamed one to one (original name, diffusers name).
_CONNECTOR_SEGMENTS = {"transformer_1d_blocks": "transformer_blocks", "q_norm": "norm_q", "k_norm": "norm_k"}
_VOCODER_SEGMENTS = {
    "conv_pre": "conv_in",
    "conv_post": "conv_out",
    "ups": "upsamplers",
    "resblocks": "resnets",
    "act_post": "act_out",
}
_TRANSFORMER_SEGMENTS = {
    "patchify_proj": "proj_in",
    "audio_patchify_proj": "audio_proj_in",
    "adaln_single": "time_embed",
    "audio_adaln_single": "audio_time_embed",
    "prompt_adaln_single": "prompt_adaln",
    "audio_prompt_adaln_single": "audio_prompt_adaln",
    "av_ca_video_scale_shift_adaln_single": "av_cross_attn_video_scale_shift",
    "av_ca_a2v_gate_adaln_single": "av_cross_attn_video_a2v_gate",
    "av_ca_audio_scale_shift_adaln_single": "av_cross_attn_audio_scale_shift",
    "av_ca_v2a_gate_adaln_single": "av_cross_attn_audio_v2a_gate",
    "scale_shift_table_a2v_ca_video": "video_a2v_cross_attn_scale_shift_table",
    "scale_shift_table_a2v_ca_audio": "audio_a2v_cross_attn_scale_shift_table",
    "q_norm": "norm_q",
    "k_norm": "norm_k",
}
_STATISTICS = {
    "per_channel_statistics.mean-of-means": "latents_mean",
    "per_channel_statistics.std-of-means": "latents_std",
}


@dataclass
class KeyMapping:
    """Where every key of a single file goes: ``components[name][diffusers_key] = original_key``."""

    components: dict[str, dict[str, str]] = field(default_factory=dict)
    ignored: list[str] = field(default_factory=list)  # known keys nothing reads (unused statistics)
    unknown: list[str] = field(default_factory=list)  # keys outside every known prefix


def component_of(key: str) -> str | None:
    """The diffusers component an original key belongs to, or None for a key outside the LTX-2 layout."""
    if key.startswith(tuple(CONNECTOR_PREFIXES)):
        return "connectors"
    if key.startswith(TRANSFORMER_PREFIX):
        return "transformer"
    for component, prefix in COMPONENT_PREFIXES.items():
        if key.startswith(prefix):
            return component
    return None


def _is_ignored(key: str) -> bool:
    stats = key.partition("per_channel_statistics.")[2]
    return key.startswith(("vae.per_channel_statistics.", "audio_vae.per_channel_statistics.")) and (
        stats in IGNORED_STATISTICS
    )


def _rename_segments(key: str, table: dict[str, str]) -> str:
    return ".".join(table.get(segment, segment) for segment in key.split("."))


def _run_converter(converter: Callable[[dict], dict], keys: list[str]) -> dict[str, str]:
    """Apply a diffusers converter to the key names only; a collision would silently lose a key, so it fails."""
    converted = converter({key: key for key in keys})
    if len(converted) != len(keys) or len(set(converted.values())) != len(keys):
        raise ValueError(f"{converter.__name__} merged or dropped keys ({len(keys)} in, {len(converted)} out)")
    return converted


def _transformer_to_diffusers(keys: list[str]) -> dict[str, str]:
    # diffusers 0.42.1 maps adaln_single -> time_embed but leaves (audio_)prompt_adaln_single unrenamed.
    renamed = {
        key.replace(".prompt_adaln_single.", ".prompt_adaln.").replace(
            ".audio_prompt_adaln_single.", ".audio_prompt_adaln."
        ): key
        for key in keys
    }
    converted = _run_converter(convert_ltx2_transformer_to_diffusers, list(renamed))
    return {new: renamed[old] for new, old in converted.items()}


def _vae_to_diffusers(keys: list[str]) -> dict[str, str]:
    converted = _run_converter(convert_ltx2_vae_to_diffusers, keys)
    # diffusers stops at the 3-stage LTX-2.0 decoder (up_blocks.0-6); LTX-2.3 adds a 4th stage.
    fourth_stage = {
        "decoder.up_blocks.7.": "decoder.up_blocks.3.upsamplers.0.",
        "decoder.up_blocks.8.": "decoder.up_blocks.3.",
    }
    result = {}
    for new, old in converted.items():
        for source, target in fourth_stage.items():
            if new.startswith(source):
                new = target + new[len(source) :]
                break
        result[new] = old
    return result


def _connectors_to_diffusers(keys: list[str]) -> dict[str, str]:
    result = {}
    for key in keys:
        prefix = next(p for p in CONNECTOR_PREFIXES if key.startswith(p))
        result[CONNECTOR_PREFIXES[prefix] + _rename_segments(key[len(prefix) :], _CONNECTOR_SEGMENTS)] = key
    return result


def _vocoder_to_diffusers(keys: list[str]) -> dict[str, str]:
    # ltx-core strips "vocoder." exactly once: BWE files keep vocoder.vocoder.*, vocoder.bwe_generator.*, mel_stft.*
    result = {}
    for key in keys:
        inner = key.removeprefix("vocoder.").replace(".downsample.lowpass.", ".downsample.")
        result[_rename_segments(inner, _VOCODER_SEGMENTS)] = key
    return result


_TO_DIFFUSERS: dict[str, Callable[[list[str]], dict[str, str]]] = {
    "transformer": _transformer_to_diffusers,
    "connectors": _connectors_to_diffusers,
    "vae": _vae_to_diffusers,
    "audio_vae": lambda keys: _run_converter(convert_ltx2_audio_vae_to_diffusers, keys),
    "vocoder": _vocoder_to_diffusers,
}


def map_to_diffusers(keys: Iterable[str]) -> KeyMapping:
    """Split original single-file keys by component and name each one as its diffusers module expects."""
    mapping = KeyMapping()
    grouped: dict[str, list[str]] = {}
    for key in keys:
        component = component_of(key)
        if component is None:
            mapping.unknown.append(key)
        elif _is_ignored(key):
            mapping.ignored.append(key)
        else:
            grouped.setdefault(component, []).append(key)
    for component in COMPONENTS:
        if component in grouped:
            mapping.components[component] = _TO_DIFFUSERS[component](grouped[component])
    return mapping


def _inverse(table: dict[str, str]) -> dict[str, str]:
    return {value: key for key, value in table.items()}


def _transformer_to_original(key: str) -> str:
    return TRANSFORMER_PREFIX + _rename_segments(key, _inverse(_TRANSFORMER_SEGMENTS))


def _connectors_to_original(key: str) -> str:
    for original, diffusers_prefix in CONNECTOR_PREFIXES.items():
        if key.startswith(diffusers_prefix):
            return original + _rename_segments(key[len(diffusers_prefix) :], _inverse(_CONNECTOR_SEGMENTS))
    raise KeyError(key)


def _vae_block_to_original(key: str) -> str:
    """diffusers (block, resnets|samplers) -> original flat block list: resnets at 2i (+2 decoder), sampler at 2i+1."""
    for part, offset in (("encoder.down_blocks", 0), ("decoder.up_blocks", 1)):
        match = re.match(rf"{part}\.(\d+)\.(resnets|downsamplers\.0|upsamplers\.0)\.(.*)", key)
        if match:
            index, kind, rest = int(match[1]), match[2], match[3]
            flat = 2 * index + 2 * offset if kind == "resnets" else 2 * index + 1
            return f"{part}.{flat}." + ("res_blocks." + rest if kind == "resnets" else rest)
    mid = {"encoder.mid_block.": "encoder.down_blocks.8.", "decoder.mid_block.": "decoder.up_blocks.0."}
    for source, target in mid.items():
        if key.startswith(source):
            return target + key[len(source) :].replace("resnets.", "res_blocks.", 1)
    return key


def _vae_to_original(key: str) -> str:
    return "vae." + _inverse(_STATISTICS).get(key, _vae_block_to_original(key))


def _audio_vae_to_original(key: str) -> str:
    return "audio_vae." + _inverse(_STATISTICS).get(key, key)


def _vocoder_to_original(key: str) -> str:
    return "vocoder." + _rename_segments(key, _inverse(_VOCODER_SEGMENTS)).replace(
        ".downsample.filter", ".downsample.lowpass.filter"
    )


_TO_ORIGINAL: dict[str, Callable[[str], str]] = {
    "transformer": _transformer_to_original,
    "connectors": _connectors_to_original,
    "vae": _vae_to_original,
    "audio_vae": _audio_vae_to_original,
    "vocoder": _vocoder_to_original,
}


def map_to_original(component: str, diffusers_keys: Iterable[str]) -> dict[str, str]:
    """``{diffusers_key: original_key}`` for one component, as ltx-core writes the single file."""
    return {key: _TO_ORIGINAL[component](key) for key in diffusers_keys}
