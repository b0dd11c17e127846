"""Strict, offline loader: one LTX-2.3 single file + a Gemma-3 folder -> a diffusers LTX2 pipeline.

Every component is built from the file itself (configs from its metadata or shapes, see ``checkpoint``), never from a
base-model config folder or the network. Modules are created with their parameters on the meta device and receive
the file's tensors with ``load_state_dict(strict=True, assign=True)``, streamed per component from ``safe_open``, so
the weights are in memory once; a missing, unexpected or mis-shaped key fails with the component and key names
instead of diffusers' silent random init or "Cannot copy out of meta tensor".
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from accelerate import init_empty_weights
from diffusers import (
    AutoencoderKLLTX2Audio,
    AutoencoderKLLTX2Video,
    LTX2ImageToVideoPipeline,
    LTX2Pipeline,
    LTX2VideoTransformer3DModel,
)
from diffusers.pipelines.ltx2.connectors import LTX2TextConnectors
from diffusers.pipelines.ltx2.vocoder import LTX2VocoderWithBWE
from safetensors import safe_open
from transformers import AutoTokenizer, Gemma3ForConditionalGeneration

from deliverykit.assets.loadcheck import LoadedFile, check_file_for_loading
from deliverykit.errors import InputError, WeightsError
from sulphur2_npu import MODEL_ID
from sulphur2_npu.checkpoint import CheckpointInfo, inspect_checkpoint
from sulphur2_npu.configs import read_model_config
from sulphur2_npu.reference_fixes import (
    ReferenceImageToVideoPipeline,
    ReferenceTextToVideoPipeline,
    install_cross_timestep_fix,
)
from sulphur2_npu.schedules import DEV, make_scheduler

MODEL_CLASSES = {
    "transformer": LTX2VideoTransformer3DModel,
    "connectors": LTX2TextConnectors,
    "vae": AutoencoderKLLTX2Video,
    "audio_vae": AutoencoderKLLTX2Audio,
    "vocoder": LTX2VocoderWithBWE,
}
# ltx-core runs the BWE vocoder in float32 whatever the pipeline dtype (``VocoderWithBWE.forward`` autocasts: bf16
# "degrades spectral metrics by 40-90%" through its ~108 convolutions). Its weights are 0.13B parameters (0.5 GB).
VOCODER_DTYPE = torch.float32
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")
SHOWN_KEYS = 5


@dataclass(frozen=True)
class LoadInfo:
    """What was loaded: detection and configs (``checkpoint``), the parameter count of every module and, when checked
    against a weights manifest, the checkpoint file's record (:mod:`deliverykit.assets.loadcheck`)."""

    checkpoint: CheckpointInfo
    parameter_counts: dict[str, int]
    weights_file: LoadedFile | None = None

    @property
    def version(self) -> str:
        return self.checkpoint.family

    @property
    def config_source(self) -> str:
        return self.checkpoint.config_source


@dataclass(frozen=True)
class LoadedPipeline:
    pipe: LTX2Pipeline | LTX2ImageToVideoPipeline
    info: LoadInfo
    load_seconds: float


def _mel_to_vocoder_dtype(module: torch.nn.Module, args: tuple) -> tuple:
    """The pipeline hands the vocoder the audio VAE's mel spectrogram in the pipeline dtype."""
    return (args[0].to(VOCODER_DTYPE), *args[1:])


def _tokenizer_dir(text_encoder: Path) -> Path:
    for folder in (text_encoder, text_encoder / "tokenizer"):
        if any((folder / name).is_file() for name in TOKENIZER_FILES):
            return folder
    raise InputError(
        f"no tokenizer in {text_encoder} or {text_encoder / 'tokenizer'} (looked for {', '.join(TOKENIZER_FILES)}): "
        f"download the Gemma-3 tokenizer files next to the text encoder"
    )


def read_text_encoder_config(text_encoder: Path) -> dict[str, int]:
    """Hidden size and layer count of the Gemma-3 text model in ``text_encoder/config.json``."""
    config_file = Path(text_encoder) / "config.json"
    if not config_file.is_file():
        raise InputError(
            f"text encoder folder {text_encoder} has no config.json: pass a transformers Gemma-3 folder "
            f"(google/gemma-3-12b-it-qat-q4_0-unquantized) with its tokenizer"
        )
    config = json.loads(config_file.read_text())
    text_config = config.get("text_config", config)
    try:
        return {"hidden_size": text_config["hidden_size"], "num_hidden_layers": text_config["num_hidden_layers"]}
    except KeyError as err:
        raise InputError(f"{config_file} has no {err.args[0]}: it is not a Gemma-3 config") from err


def _key_error(component: str, checkpoint: Path, missing: list[str], unexpected: list[str]) -> WeightsError:
    parts = []
    if missing:
        parts.append(f"{len(missing)} missing (e.g. {', '.join(missing[:SHOWN_KEYS])})")
    if unexpected:
        parts.append(f"{len(unexpected)} unexpected (e.g. {', '.join(unexpected[:SHOWN_KEYS])})")
    return WeightsError(
        f"{checkpoint}: the {component} weights do not match its LTX-2.3 module: {'; '.join(parts)} "
        f"(diffusers names); the file is incomplete or of another variant: re-download it or check its sha256"
    )


def _load_component(
    name: str, config: dict[str, Any], names: dict[str, str], handle: Any, checkpoint: Path, dtype: torch.dtype
) -> torch.nn.Module:
    """Build on meta, check keys and shapes against the header, then stream the tensors in (one copy in RAM)."""
    with init_empty_weights(include_buffers=False):  # non-persistent buffers (filters, RoPE) are computed for real
        module = MODEL_CLASSES[name].from_config(config)
    expected = module.state_dict()
    missing = sorted(set(expected) - set(names))
    unexpected = sorted(set(names) - set(expected))
    if missing or unexpected:
        raise _key_error(name, checkpoint, missing, unexpected)
    wrong = [
        f"{key} {tuple(handle.get_slice(names[key]).get_shape())} != {tuple(tensor.shape)}"
        for key, tensor in expected.items()
        if tuple(handle.get_slice(names[key]).get_shape()) != tuple(tensor.shape)
    ]
    if wrong:
        raise WeightsError(
            f"{checkpoint}: {len(wrong)} {name} tensors have the wrong shape (file != module), e.g. "
            f"{'; '.join(wrong[:SHOWN_KEYS])}: the derived config does not fit this file; report it with the output "
            f"of python sulphur2-npu/scripts/inspect_checkpoint.py {checkpoint}"
        )
    state = {}
    for key, original in names.items():
        tensor = handle.get_tensor(original)
        state[key] = tensor.to(dtype) if tensor.is_floating_point() else tensor
    module.load_state_dict(state, strict=True, assign=True)
    del state
    # Casts the non-persistent buffers like diffusers' from_pretrained(torch_dtype=...); loaded tensors already have
    # this dtype. nn.Module.to skips ModelMixin.to, which only adds a warning here.
    torch.nn.Module.to(module, dtype)
    tensors = {**dict(module.named_parameters()), **dict(module.named_buffers())}
    on_meta = [key for key, tensor in tensors.items() if tensor.is_meta]
    if on_meta:
        raise WeightsError(f"{checkpoint}: {name} still has {len(on_meta)} unloaded tensors, e.g. {on_meta[:3]}")
    return module.eval()


def load_pipeline(
    checkpoint: Path,
    text_encoder: Path,
    *,
    image_to_video: bool = False,
    torch_dtype: torch.dtype = torch.bfloat16,
    manifest: Path | None = None,
    strict_manifest: bool = False,
    load_text_encoder: bool = True,
    model_config: Path | None = None,
) -> LoadedPipeline:
    """Build an ``LTX2Pipeline`` (or ``LTX2ImageToVideoPipeline``) from an LTX-2.3 single file, offline and strictly.

    Args:
        checkpoint (`Path`): the single ``.safetensors`` (transformer, connectors, VAEs, vocoder).
        text_encoder (`Path`): a transformers Gemma-3 folder; the tokenizer may sit in it or in ``tokenizer/``.
        image_to_video (`bool`, defaults to `False`): build the image-to-video pipeline.
        torch_dtype (`torch.dtype`, defaults to `torch.bfloat16`): dtype of every module but the vocoder (float32,
            as ltx-core runs it).
        manifest (`Path`, *optional*): the delivery's weights manifest; once the file is known to be LTX-2.3, it is
            compared with the release (a fine-tune or a file of another size loads with a warning; refused when
            `strict_manifest`). None: not compared (random smoke weights).
        model_config (`Path`, *optional*): ltx-core config JSON used instead of the file's ``__metadata__`` config
            (for a file that lost it; ``configs.read_model_config``).
        load_text_encoder (`bool`, defaults to `True`): False leaves ``text_encoder`` None (its config is still
            read and checked): the ranks of a multi-card run that receive the embeddings from rank 0.
    """
    start = time.perf_counter()
    checkpoint, text_encoder = Path(checkpoint), Path(text_encoder)
    if not text_encoder.is_dir():
        raise InputError(
            f"text encoder folder {text_encoder} does not exist: download Gemma-3-12B "
            f"(google/gemma-3-12b-it-qat-q4_0-unquantized) with its tokenizer and pass that folder"
        )
    tokenizer_dir = _tokenizer_dir(text_encoder)
    info = inspect_checkpoint(
        checkpoint,
        text_encoder_config=read_text_encoder_config(text_encoder),
        model_config=read_model_config(model_config) if model_config is not None else None,
    )
    if info.family != "LTX-2.3":
        raise WeightsError(
            f"{checkpoint} is an {info.family} checkpoint ({'; '.join(info.evidence)}); Sulphur-2 is an LTX-2.3 "
            f"fine-tune and this loader builds LTX-2.3 modules only: pass the Sulphur-2 / LTX-2.3 file"
        )
    weights_file = None
    if manifest is not None:
        weights_file = check_file_for_loading(manifest, checkpoint, MODEL_ID, strict=strict_manifest)
    components: dict[str, Any] = {}
    with safe_open(str(checkpoint), framework="pt") as handle:
        for name, names in info.mapping.components.items():
            dtype = VOCODER_DTYPE if name == "vocoder" else torch_dtype
            components[name] = _load_component(name, info.configs[name], names, handle, checkpoint, dtype)
    components["vocoder"].register_forward_pre_hook(_mel_to_vocoder_dtype)
    # ltx-core's audio encoder keeps its front end's STFT size; diffusers' config has no field for it (a2v reads it)
    components["audio_vae"].register_to_config(n_fft=info.audio_stft_size)
    components["text_encoder"] = (
        Gemma3ForConditionalGeneration.from_pretrained(text_encoder, dtype=torch_dtype, local_files_only=True).eval()
        if load_text_encoder
        else None
    )
    components["tokenizer"] = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
    # data/scheduler_config.json: LTX-2.3 dev sampling, ltx-core schedulers.py:LTX2Scheduler.execute at 400fd310
    # (shift 2.05 at every size, stretched to 0.1; see schedules.py); generate() swaps in the distilled one.
    components["scheduler"] = make_scheduler(DEV)
    # Two diffusers code paths that differ from ltx-core in image-to-video (reference_fixes)
    install_cross_timestep_fix(components["transformer"])
    pipeline_class = ReferenceImageToVideoPipeline if image_to_video else ReferenceTextToVideoPipeline
    pipe = pipeline_class(**components)
    pipe.set_progress_bar_config(disable=True)
    counts = {
        name: sum(p.numel() for p in module.parameters())
        for name, module in components.items()
        if isinstance(module, torch.nn.Module)
    }
    return LoadedPipeline(
        pipe=pipe,
        info=LoadInfo(checkpoint=info, parameter_counts=counts, weights_file=weights_file),
        load_seconds=time.perf_counter() - start,
    )


def text_to_video_twin(pipe: LTX2Pipeline | LTX2ImageToVideoPipeline) -> LTX2Pipeline:
    """``pipe`` when it is text-to-video, else an ``LTX2Pipeline`` on the same modules (and memory plan): a
    ``--batch`` that mixes text→video and image→video lines runs both from one load."""
    if not isinstance(pipe, LTX2ImageToVideoPipeline):
        return pipe
    twin = ReferenceTextToVideoPipeline(**pipe.components)
    twin.set_progress_bar_config(disable=True)
    return twin
