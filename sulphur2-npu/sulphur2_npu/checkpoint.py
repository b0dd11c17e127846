"""Open an LTX-2.x single-file checkpoint by its header only and say what it is.

Reading the header (key names, shapes, dtypes, ``__metadata__``) costs milliseconds even for the 46 GB Sulphur file,
so every check here runs before a byte of weights is read: corrupt or truncated file, fp8-mixed precision, a file of
another model family, LTX-2.0 vs LTX-2.3. For an LTX-2.3 file the diffusers config of every component comes from
``configs.derive_configs`` (the metadata ``config`` or tensor shapes).

CLI: ``python sulphur2-npu/scripts/inspect_checkpoint.py FILE [--text-encoder DIR] [--model-config JSON]`` prints
the detection.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from safetensors import safe_open

from deliverykit.errors import InputError, WeightsError
from sulphur2_npu.configs import audio_stft_size, derive_configs
from sulphur2_npu.keymap import COMPONENTS, KeyMapping, map_to_diffusers

LTX23_MARKERS = {
    "prompt_adaln_single": "model.diffusion_model.prompt_adaln_single.",
    "to_gate_logits": ".to_gate_logits.",
    "video_aggregate_embed": "text_embedding_projection.video_aggregate_embed.",
    "audio_aggregate_embed": "text_embedding_projection.audio_aggregate_embed.",
    "bwe_generator": "vocoder.bwe_generator.",
}
LTX20_MARKERS = {
    "caption_projection": "model.diffusion_model.caption_projection.",
    "aggregate_embed": "text_embedding_projection.aggregate_embed.",
}
LTX2_MARKERS = ("model.diffusion_model.audio_adaln_single.", "model.diffusion_model.av_ca_a2v_gate_adaln_single.")
# What other files look like: (name, every one of these substrings occurs in some key).
OTHER_FAMILIES = (
    ("a LoRA adapter (apply it to a base checkpoint instead)", ("lora_",)),
    ("Flux (double_blocks/single_blocks)", ("double_blocks.", "single_blocks.")),
    ("Stable Diffusion XL (conditioner.embedders)", ("model.diffusion_model.input_blocks.", "conditioner.embedders.")),
    ("Stable Diffusion 1.x/2.x (cond_stage_model)", ("model.diffusion_model.input_blocks.", "cond_stage_model.")),
    ("a Stable Diffusion UNet", ("model.diffusion_model.input_blocks.",)),
    ("LTX-Video 0.9.x (video-only, T5 text encoder)", ("patchify_proj.", "transformer_blocks.")),
    ("a diffusers-format LTX-2 transformer, not the single file", ("proj_in.", "audio_proj_in.", "audio_attn1.")),
    ("a Gemma text encoder", ("language_model.",)),
)
SCALE_SUFFIXES = ("weight_scale", "scale_weight", "input_scale", "scale_input")


@dataclass(frozen=True)
class Header:
    """What a safetensors header says, without the data: shapes, dtype names and the parsed ``__metadata__``."""

    path: Path
    shapes: dict[str, tuple[int, ...]]
    dtypes: dict[str, str]
    metadata: dict[str, Any]

    def has(self, fragment: str) -> bool:
        return any(fragment in key for key in self.shapes)


@dataclass
class CheckpointInfo:
    """Detection result and the diffusers config of every component."""

    path: Path
    family: str  # "LTX-2.3" or "LTX-2.0"
    evidence: list[str]
    dtypes: dict[str, int]
    configs: dict[str, dict[str, Any]] = field(default_factory=dict)
    config_sources: dict[str, str] = field(default_factory=dict)  # component -> "metadata" | "model-config" | "shapes"
    assumptions: list[str] = field(default_factory=list)
    ignored_keys: list[str] = field(default_factory=list)
    tensor_counts: dict[str, int] = field(default_factory=dict)
    mapping: KeyMapping | None = None
    audio_stft_size: int = 1024  # the audio encoder's front end (configs.audio_stft_size): a2v

    @property
    def config_source(self) -> str:
        """ "metadata", "model-config" or "shapes" when every component agrees, else e.g. "metadata+shapes"."""
        return "+".join(sorted(set(self.config_sources.values())))

    def summary(self) -> str:
        lines = [
            f"file: {self.path}",
            f"family: {self.family} ({'; '.join(self.evidence)})",
            f"dtypes: {dict(sorted(self.dtypes.items()))}",
            f"config source: {self.config_source} {self.config_sources}",
            f"tensors per component: {self.tensor_counts}",
        ]
        lines += [f"ignored: {key}" for key in self.ignored_keys]
        lines += [f"assumed: {text}" for text in self.assumptions]
        lines += [f"{name}: {json.dumps(config, sort_keys=True)}" for name, config in self.configs.items()]
        return "\n".join(lines)


def read_header(path: Path) -> Header:
    """Parse the header only; a missing, truncated or corrupt file raises a one-line error naming it."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"checkpoint {path} does not exist or is not a file: pass the .safetensors single file")
    try:
        with safe_open(str(path), framework="pt") as handle:
            shapes, dtypes = {}, {}
            for key in handle.keys():  # noqa: SIM118 - safe_open is not a Mapping
                tensor_slice = handle.get_slice(key)
                shapes[key] = tuple(tensor_slice.get_shape())
                dtypes[key] = tensor_slice.get_dtype()
            raw_metadata = handle.metadata() or {}
    except Exception as err:  # safetensors raises its own SafetensorError (and OSError for unreadable files)
        raise WeightsError(
            f"{path} is not a readable safetensors file ({err}); it is probably truncated or corrupt: "
            f"re-download it and compare its size and sha256 with the weights manifest"
        ) from err
    metadata = {}
    for key, value in raw_metadata.items():
        try:
            metadata[key] = json.loads(value)
        except json.JSONDecodeError:
            metadata[key] = value
    return Header(path=path, shapes=shapes, dtypes=dtypes, metadata=metadata)


def _check_not_fp8(header: Header) -> None:
    float8 = [key for key, dtype in header.dtypes.items() if dtype.startswith("F8")]
    scales = [key for key in header.shapes if key.endswith(SCALE_SUFFIXES)]
    if float8 or scales:
        example = (float8 or scales)[0]
        raise WeightsError(
            f"{header.path} is an fp8-mixed checkpoint ({len(float8)} float8 tensors, {len(scales)} scale tensors, "
            f"e.g. {example} {header.dtypes[example]}): diffusers 0.42.1 cannot load scaled float8 weights and the "
            f"Ascend 910B has no FP8 compute; use the bf16 checkpoint (e.g. sulphur_distil_bf16.safetensors)"
        )


def detect_family(header: Header) -> tuple[str, list[str]]:
    """("LTX-2.3" | "LTX-2.0", evidence); any other file raises WeightsError saying what it looks like."""
    if not any(header.has(marker) for marker in LTX2_MARKERS):
        for name, fragments in OTHER_FAMILIES:
            if all(header.has(fragment) for fragment in fragments):
                raise WeightsError(
                    f"{header.path} is not an LTX-2.x checkpoint: it looks like {name} (keys contain "
                    f"{', '.join(fragments)}; no {LTX2_MARKERS[0]}*); pass the Sulphur-2 / LTX-2.3 single file"
                )
        prefixes = Counter(key.split(".")[0] for key in header.shapes).most_common(5)
        raise WeightsError(
            f"{header.path} is not an LTX-2.x checkpoint and matches no known family ({len(header.shapes)} tensors, "
            f"top-level prefixes {dict(prefixes)}; no {LTX2_MARKERS[0]}*); pass the Sulphur-2 / LTX-2.3 single file"
        )
    found23 = [name for name, fragment in LTX23_MARKERS.items() if header.has(fragment)]
    found20 = [name for name, fragment in LTX20_MARKERS.items() if header.has(fragment)]
    if found23 and not found20:
        return "LTX-2.3", [f"LTX-2.3-only keys: {', '.join(found23)}"]
    if found20 and not found23:
        return "LTX-2.0", [f"LTX-2.0-only keys: {', '.join(found20)}", "no LTX-2.3 keys (gated attention, BWE)"]
    raise WeightsError(
        f"{header.path} mixes LTX-2.3 keys ({', '.join(found23) or 'none'}) and LTX-2.0 keys "
        f"({', '.join(found20) or 'none'}): it is neither layout; check that it was not merged from two models"
    )


def inspect_checkpoint(
    path: Path, *, text_encoder_config: dict[str, int] | None = None, model_config: dict[str, Any] | None = None
) -> CheckpointInfo:
    """Header-only inspection: family, dtypes, key mapping and (for LTX-2.3) the diffusers config per component.

    ``text_encoder_config`` (``hidden_size``, ``num_hidden_layers`` of the Gemma that will be used) fixes the text
    projection split; without it Gemma-3-12B is assumed. ``model_config`` (ltx-core's metadata ``config``, see
    :func:`configs.read_model_config`) replaces the file's ``__metadata__`` config, for files that lost it.
    """
    header = read_header(path)
    _check_not_fp8(header)
    family, evidence = detect_family(header)
    mapping = map_to_diffusers(header.shapes)
    if mapping.unknown:
        raise WeightsError(
            f"{header.path} has {len(mapping.unknown)} keys outside the LTX-2 single-file layout (e.g. "
            f"{', '.join(mapping.unknown[:3])}): it is not a plain LTX-2.3 checkpoint; pass the unmodified file"
        )
    missing = [name for name in COMPONENTS if name not in mapping.components]
    if missing:
        raise WeightsError(
            f"{header.path} lacks the {', '.join(missing)} weights (the single file must bundle transformer, "
            f"connectors, vae, audio_vae and vocoder): pass the full LTX-2.3 checkpoint, not a split component"
        )
    info = CheckpointInfo(
        path=header.path,
        family=family,
        evidence=evidence,
        dtypes=dict(Counter(header.dtypes.values())),
        ignored_keys=sorted(mapping.ignored),
        tensor_counts={name: len(keys) for name, keys in mapping.components.items()},
        mapping=mapping,
    )
    if family == "LTX-2.3":
        info.configs, info.config_sources, info.assumptions = derive_configs(
            header.path,
            header.shapes,
            header.metadata,
            mapping,
            text_encoder_config=text_encoder_config,
            model_config=model_config,
        )
        ltx_config = model_config if model_config is not None else header.metadata.get("config")
        info.audio_stft_size = audio_stft_size(ltx_config)
    return info
