"""LoRA files for the LTX-2.3 pipeline: diffusers, original (``diffusion_model.``) and Kohya-style keys, checked first.

diffusers' ``LTX2LoraLoaderMixin.load_lora_weights`` (peft) converts original/ComfyUI names itself, but it rejects
Kohya-style ``lora_down``/``lora_up``/``.alpha`` files ("Invalid LoRA checkpoint", or an IndexError without alpha)
and loads a LoRA made for another model with at most a warning. Here a Kohya pair becomes ``lora_A = down``,
``lora_B = up · alpha / rank`` (the scale Kohya applies at run time, folded in), and every key must name an existing
linear layer of the transformer or connectors with matching shapes, or the load fails naming the keys.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from deliverykit.errors import InputError

_KOHYA_PAIR = re.compile(r"^(?P<module>.+)\.lora_(?P<side>down|up)\.weight$")
_PEFT_KEY = re.compile(r"^(?P<component>transformer|connectors)\.(?P<module>.+)\.lora_(?P<side>A|B)\.weight$")
_SHOWN = 5


@dataclasses.dataclass(frozen=True)
class LoadedLora:
    """What :func:`load_lora` did, for the run report."""

    path: str
    adapter_name: str
    scale: float
    key_format: str  # "diffusers", "original" or "kohya"
    layers: int  # LoRA-adapted linear layers
    components: tuple[str, ...]
    fused: bool


def _read(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise InputError(f"LoRA file {path} does not exist; pass --lora PATH to a .safetensors LoRA")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as err:
        raise InputError(f"LoRA file {path} is not a readable safetensors file ({err}); re-download it") from None


def convert_kohya_lora(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``<m>.lora_down/lora_up.weight`` (+ ``<m>.alpha``) → ``<m>.lora_A/lora_B.weight`` with alpha/rank in B.

    Keys that are not Kohya pairs pass through unchanged; a pair with a missing half raises :class:`InputError`.
    """
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    converted = {}
    for key, value in state_dict.items():
        match = _KOHYA_PAIR.match(key)
        if match:
            pairs.setdefault(match["module"], {})[match["side"]] = value
        elif not key.endswith(".alpha"):
            converted[key] = value
    for module, pair in pairs.items():
        if set(pair) != {"down", "up"}:
            raise InputError(f"LoRA key {module}.lora_{next(iter(pair))}.weight has no matching half; file is damaged")
        down, up = pair["down"], pair["up"]
        rank = down.shape[0]
        alpha = state_dict.get(f"{module}.alpha")
        factor = float(alpha) / rank if alpha is not None else 1.0
        converted[f"{module}.lora_A.weight"] = down
        converted[f"{module}.lora_B.weight"] = (up.float() * factor).to(up.dtype)
    orphans = [key for key in state_dict if key.endswith(".alpha") and key.removesuffix(".alpha") not in pairs]
    converted.update({key: state_dict[key] for key in orphans})  # left for the architecture check to name
    return converted


def _key_format(state_dict: dict[str, torch.Tensor]) -> str:
    if any(_KOHYA_PAIR.match(key) for key in state_dict):
        return "kohya"
    if any(key.startswith(("diffusion_model.", "text_embedding_projection.")) for key in state_dict):
        return "original"
    return "diffusers"


def _mismatches(pipe: Any, state_dict: dict[str, torch.Tensor]) -> list[str]:
    """Keys that do not name a linear layer of the pipeline with fitting LoRA shapes, each with the reason."""
    problems = []
    for key, value in state_dict.items():
        match = _PEFT_KEY.match(key)
        if not match:
            problems.append(f"{key} (not a LoRA weight of the transformer or connectors)")
            continue
        component = getattr(pipe, match["component"])
        try:
            layer = component.get_submodule(match["module"])
        except AttributeError:
            problems.append(f"{key} (no layer {match['module']} in {match['component']})")
            continue
        if not isinstance(layer, torch.nn.Linear):
            problems.append(f"{key} ({match['module']} is a {type(layer).__name__}, not a Linear)")
            continue
        expected_dim = layer.in_features if match["side"] == "A" else layer.out_features
        axis = 1 if match["side"] == "A" else 0
        if value.ndim != 2 or value.shape[axis] != expected_dim:
            problems.append(f"{key} (shape {tuple(value.shape)}, layer is {layer.out_features}x{layer.in_features})")
    return problems


def lora_state_dict(pipe: Any, path: Path) -> tuple[dict[str, torch.Tensor], str]:
    """The file's LoRA in diffusers naming (``transformer.…``/``connectors.…``), checked against ``pipe``.

    Returns ``(state_dict, key_format)``. Raises :class:`InputError` naming the first keys (and the count) that do not
    fit this pipeline, e.g. a LoRA for another architecture.
    """
    raw = _read(path)
    key_format = _key_format(raw)
    state_dict = convert_kohya_lora(raw) if key_format == "kohya" else raw
    state_dict = type(pipe).lora_state_dict(state_dict)  # diffusers' original → diffusers renames
    if not state_dict:
        raise InputError(f"LoRA file {path} holds no LTX-2 LoRA keys ({len(raw)} keys, e.g. {next(iter(raw), '-')})")
    problems = _mismatches(pipe, state_dict)
    if problems:
        shown = "; ".join(problems[:_SHOWN])
        raise InputError(
            f"LoRA file {path} does not fit this LTX-2.3 model: {len(problems)} of {len(state_dict)} keys do not match "
            f"({shown}{'; ...' if len(problems) > _SHOWN else ''}); use a LoRA trained for LTX-2.3 / Sulphur-2"
        )
    return state_dict, key_format


def load_lora(
    pipe: Any, path: Path, scale: float = 1.0, *, adapter_name: str = "lora", fuse: bool = False
) -> LoadedLora:
    """Load a LoRA file into the pipeline's transformer (and connectors) with peft, at ``scale``.

    ``fuse=True`` merges ``scale · B·A`` into the weights and drops the LoRA layers: no per-step LoRA cost, but the
    adapter can no longer be switched off.
    """
    state_dict, key_format = lora_state_dict(pipe, Path(path))
    components = tuple(sorted({key.split(".", 1)[0] for key in state_dict}))
    pipe.load_lora_weights(state_dict, adapter_name=adapter_name)
    pipe.set_adapters([adapter_name], [scale])
    if fuse:
        pipe.fuse_lora(components=list(components), adapter_names=[adapter_name])
        pipe.unload_lora_weights()
    layers = sum(key.endswith(".lora_A.weight") for key in state_dict)
    return LoadedLora(str(path), adapter_name, scale, key_format, layers, components, fuse)
