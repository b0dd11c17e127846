"""One generation on a loaded LTX-2.3 pipeline, with the timings the README reports and a NaN/Inf check.

Used by ``inference.py`` and the overhead benchmark, so that what is measured is what users run. The pipeline gets
the scheduler of the request's schedule and is called once; the timings come from a forward pre-hook on the
transformer (start of denoising) and ``callback_on_step_end`` (end of every step), each synchronized with the device:

- ``prepare_ms``: call start → first transformer call (prompt encoding unless embeddings are given, connectors,
  latents, image conditioning for I2V);
- ``step_ms``: every denoising step; the first one includes kernel compilation and allocator warm-up
  (``first_step_ms``), ``per_step_ms`` is the median of the others;
- ``decode_ms``: last step → end of the call: video VAE decode plus audio VAE decode and vocoder (both small);
- ``total_ms``: the whole call.

:func:`prepare_pipeline` makes a loaded pipeline ready first (ranks, NPU attention, RoPE precision, LoRA, memory
plan); its :class:`PreparedPipeline` generates one request after another on that one load.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import statistics
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from diffusers import LTX2ImageToVideoPipeline
from PIL import Image

from deliverykit.assets.loadcheck import smoke_weights, weights_record
from deliverykit.cli import torch_dtype
from deliverykit.device import (
    PlacementAudit,
    audit_placement,
    backend,
    make_generator,
    max_memory_allocated,
    reset_peak_memory_stats,
    synchronize,
)
from deliverykit.distributed import failure_guard
from deliverykit.errors import NumericsError
from sulphur2_npu import tiny
from sulphur2_npu.attention import enable_npu_attention
from sulphur2_npu.audio_io import AudioClip
from sulphur2_npu.audio_to_video import audio_to_video_pipeline, encode_audio
from sulphur2_npu.keyframes import Keyframe, keyframe_pipeline
from sulphur2_npu.loader import LoadedPipeline, load_pipeline, text_to_video_twin
from sulphur2_npu.lora import LoadedLora, load_lora
from sulphur2_npu.memory import (
    MemoryPlan,
    apply_memory_plan,
    check_plan_for_device,
    choose_memory_plan,
    encode_prompt,
)
from sulphur2_npu.options import A2V, KEYFRAMES, ONE_CALL, ONE_STAGE, PIPELINES, RETAKE, TWO_STAGE, TWO_STAGE_HQ
from sulphur2_npu.parallel import ParallelRun, ParallelSpec, encode_prompt_ahead, guidance_parallel, setup_parallel
from sulphur2_npu.precision import apply_rope_precision_policy
from sulphur2_npu.presets import Preset
from sulphur2_npu.retake import Retake, retake_pipeline
from sulphur2_npu.schedules import (
    DEV,
    DISTILLED,
    DISTILLED_SIGMAS,
    DISTILLED_STEPS,
    SCHEDULES,
    use_res2s,
    use_schedule,
)
from sulphur2_npu.stages import (
    STAGE_2_SIGMAS,
    TWO_STAGE_MULTIPLE,
    StageParts,
    StageSize,
    decode,
    decode_video,
    encode_first_frame,
    load_stage_parts,
    stage_sizes,
    use_adapters,
)
from sulphur2_npu.upsampler import upsample

# LTX-2.3 multi-modal guidance (ltx-pipelines LTX_2_3_PARAMS at 400fd310): besides video CFG, audio CFG 7, STG 1 on
# transformer block 28 and modality-isolation guidance 3 for both streams, guidance rescale 0.7 (pipeline default).
AUDIO_GUIDANCE_SCALE = 7.0
STG_SCALE = 1.0
STG_BLOCK = 28
MODALITY_SCALE = 3.0
# two-stage-hq's stage 1 (LTX_2_3_HQ_PARAMS): the same CFG and modality scales, no STG, rescale 0.45 (video), 1 (audio)
HQ_RESCALE = {"guidance_rescale": 0.45, "audio_guidance_rescale": 1.0}
DEFAULT_MAX_SEQUENCE_LENGTH = 1024  # diffusers' LTX2 default, the Gemma-3 window the model was trained with


@dataclasses.dataclass(frozen=True)
class GenerationRequest:
    """What to generate. ``image`` makes it image-to-video (the pipeline must be an ``LTX2ImageToVideoPipeline``).
    ``pipeline``: ``one-stage``, or a two-stage one of ``stages``, whose ``schedule``, steps and guidance are stage 1's;
    ``keyframes`` are the ``keyframes`` pipeline's images (no ``image`` then; :func:`generate` needs one or more);
    ``audio`` is the ``a2v`` pipeline's sound track (it needs one; an ``image`` is its first frame); ``retake`` the
    ``retake`` pipeline's source and span (its size, frames and rate are the source's; no ``image``).

        ``prompt_embeds`` are the keyword arguments of ``memory.encode_prompt_then_free`` (the text encoder already ran
        and was freed); the prompts are then only recorded. ``schedule`` is ``dev`` or ``distilled`` (``schedules``):
        distilled fixes the steps at 8 and needs guidance off, which is what the distilled weights were trained for.
    """

    prompt: str
    width: int
    height: int
    num_frames: int
    steps: int
    guidance: float = 3.0
    negative_prompt: str = ""
    fps: int = 24
    image: Image.Image | None = None
    max_sequence_length: int = DEFAULT_MAX_SEQUENCE_LENGTH
    prompt_embeds: Mapping[str, torch.Tensor] | None = None
    schedule: str = DEV
    pipeline: str = ONE_STAGE
    keyframes: tuple[Keyframe, ...] = ()
    audio: AudioClip | None = None
    retake: Retake | None = None

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule {self.schedule!r}; expected one of {', '.join(SCHEDULES)}")
        if self.pipeline not in PIPELINES:
            raise ValueError(f"pipeline {self.pipeline!r}; expected one of {', '.join(PIPELINES)}")
        if self.pipeline not in ONE_CALL and (self.width % TWO_STAGE_MULTIPLE or self.height % TWO_STAGE_MULTIPLE):
            raise ValueError(
                f"the {self.pipeline} pipeline needs multiples of {TWO_STAGE_MULTIPLE}, not {self.width}x{self.height}"
            )
        if self.keyframes and (self.pipeline != KEYFRAMES or self.image is not None):
            raise ValueError("keyframes go with the keyframes pipeline, which takes no first-frame image")
        if self.audio is not None and self.pipeline != A2V:
            raise ValueError("a sound track goes with the a2v pipeline")
        if self.retake is not None and (self.pipeline != RETAKE or self.image is not None):
            raise ValueError("a source video (retake) goes with the retake pipeline, which takes no image")
        if self.retake is not None and (self.num_frames, self.height, self.width) != self.retake.frames.shape[:3]:
            raise ValueError(f"a retake keeps its source's shape {tuple(self.retake.frames.shape[:3])}")
        if self.schedule == DISTILLED and (self.steps != DISTILLED_STEPS or self.guidance > 1.0):
            raise ValueError(
                f"the distilled schedule has {DISTILLED_STEPS} fixed steps and no guidance; got {self.steps} steps, "
                f"guidance {self.guidance}"
            )

    @classmethod
    def from_preset(cls, preset: Preset, prompt: str, **fields: Any) -> GenerationRequest:
        """A request with ``preset``'s size, length, steps and guidance; ``fields`` sets the rest (``fps=``, ...)."""
        return cls(prompt=prompt, **preset.as_dict(), **fields)

    @property
    def classifier_free_guidance(self) -> bool:
        """Whether the negative prompt is used (the pipeline runs CFG when any guidance scale is above 1)."""
        return self.guidance > 1.0

    def encode_kwargs(self) -> dict[str, Any]:
        """The prompt arguments of ``memory.encode_prompt_then_free`` for this request."""
        return {
            "prompt": self.prompt,
            "negative_prompt": self.negative_prompt,
            "max_sequence_length": self.max_sequence_length,
            "do_classifier_free_guidance": self.classifier_free_guidance,
        }


@dataclasses.dataclass(frozen=True)
class GenerationTimings:
    """Milliseconds of one call, synchronized with the device (see the module docstring)."""

    prepare_ms: float
    step_ms: list[float]
    decode_ms: float
    total_ms: float

    @property
    def first_step_ms(self) -> float:
        return self.step_ms[0]

    @property
    def per_step_ms(self) -> float:
        """Median of the steps after the first (warm-up); the first step itself when there is only one."""
        return statistics.median(self.step_ms[1:] or self.step_ms)

    @property
    def denoise_ms(self) -> float:
        return sum(self.step_ms)

    def as_dict(self) -> dict[str, Any]:
        return {
            **dataclasses.asdict(self),
            "first_step_ms": self.first_step_ms,
            "per_step_ms": self.per_step_ms,
            "denoise_ms": self.denoise_ms,
        }


@dataclasses.dataclass(frozen=True)
class GenerationResult:
    """``video``: float32 ``[frames, height, width, 3]`` in [0, 1]; ``audio``: float32 ``[channels, samples]`` (CPU)."""

    video: np.ndarray
    audio: torch.Tensor
    sample_rate: int
    timings: GenerationTimings
    peak_memory_bytes: int | None  # device allocator peak; None on the CPU (no such counter)
    sigmas: list[float]  # the scheduler's σ after the (first stage's) call, terminal 0 included: what ran
    comm_bytes_per_step: int = 0  # received by this rank from the other cards per denoising step (multi-card runs)
    stages: dict[str, Any] | None = None  # two-stage pipelines: stage_1, upsample, stage_2, decode (sizes, ms, σ)


def guidance_kwargs(guidance: float, num_layers: int) -> dict[str, Any]:
    """The pipeline's guidance arguments for a video CFG scale ``guidance``.

    ``guidance <= 1`` turns every guidance term off (one transformer pass per step: distilled weights or the distill
    LoRA). Above 1, LTX-2.3's multi-modal guidance: CFG ``guidance`` on video and 7 on audio, STG 1 on block 28 (the
    last block of a shallower model: the pipeline default 28 breaks tiny models), modality isolation 3: three
    transformer passes per step (one of them at batch 2).
    """
    if guidance <= 1.0:
        return {
            "guidance_scale": 1.0,
            "audio_guidance_scale": 1.0,
            "stg_scale": 0.0,
            "audio_stg_scale": 0.0,
            "modality_scale": 1.0,
            "audio_modality_scale": 1.0,
            "spatio_temporal_guidance_blocks": None,
        }
    return {
        "guidance_scale": guidance,
        "audio_guidance_scale": AUDIO_GUIDANCE_SCALE,
        "stg_scale": STG_SCALE,
        "audio_stg_scale": STG_SCALE,
        "modality_scale": MODALITY_SCALE,
        "audio_modality_scale": MODALITY_SCALE,
        "spatio_temporal_guidance_blocks": [min(STG_BLOCK, num_layers - 1)],
    }


def stage_1_guidance(pipeline: str, guidance: float, num_layers: int) -> dict[str, Any]:
    """:func:`guidance_kwargs` as ``pipeline`` guides its (first) stage: ``two-stage-hq`` without STG and with its
    own rescale (:data:`HQ_RESCALE`)."""
    kwargs = guidance_kwargs(guidance, num_layers)
    if pipeline != TWO_STAGE_HQ or guidance <= 1.0:
        return kwargs
    return kwargs | HQ_RESCALE | {"stg_scale": 0.0, "audio_stg_scale": 0.0, "spatio_temporal_guidance_blocks": None}


def pipeline_kwargs(pipe: Any, request: GenerationRequest) -> dict[str, Any]:
    """Every keyword argument :func:`generate` passes to ``pipe(...)`` (not the generator or callback).

    ``pipe`` must have the scheduler of ``request.schedule`` (``schedules.use_schedule``; :func:`generate` sets it).
    """
    if request.image is not None and not isinstance(pipe, LTX2ImageToVideoPipeline):
        raise ValueError(f"an image was given but {type(pipe).__name__} is text-to-video; load with image_to_video")
    kwargs: dict[str, Any] = {
        "height": request.height,
        "width": request.width,
        "num_frames": request.num_frames,
        "frame_rate": float(request.fps),
        "num_inference_steps": request.steps,
        "max_sequence_length": request.max_sequence_length,
        "output_type": "np",
        **guidance_kwargs(request.guidance, pipe.transformer.config.num_layers),
    }
    if request.schedule == DISTILLED:
        kwargs["sigmas"] = list(DISTILLED_SIGMAS)
    if request.prompt_embeds is not None:
        kwargs.update(request.prompt_embeds)
    else:
        kwargs.update(prompt=request.prompt, negative_prompt=request.negative_prompt)
    if request.image is not None:
        kwargs["image"] = request.image
    return kwargs


class _StepClock:
    """Device-synchronized clock reads at the first transformer call and at the end of every step."""

    def __init__(self, device: torch.device | str):
        self.device = device
        self.denoise_start: float | None = None
        self.step_ends: list[float] = []

    def now(self) -> float:
        synchronize(self.device)
        return time.perf_counter()

    def on_transformer_call(self, module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        if self.denoise_start is None:
            self.denoise_start = self.now()

    def on_step_end(self, pipe: Any, step: int, timestep: Any, callback_kwargs: dict[str, Any]) -> dict[str, Any]:
        self.step_ends.append(self.now())
        return {}


def check_finite(video: np.ndarray, audio: torch.Tensor) -> None:
    """Raise :class:`NumericsError` when the frames or the waveform hold NaN or Inf."""
    bad = [
        f"{name} ({count} of {size} values)"
        for name, count, size in (
            ("video frames", int(np.size(video) - np.isfinite(video).sum()), np.size(video)),
            ("audio", int(audio.numel() - torch.isfinite(audio).sum()), audio.numel()),
        )
        if count
    ]
    if bad:
        raise NumericsError(
            f"NaN/Inf in the generated {' and '.join(bad)}: nothing was written; fp16 overflows in this model, use "
            f"--dtype bf16 (or fp32), and check the weights with python sulphur2-npu/scripts/inspect_checkpoint.py"
        )


def _timed_call(
    pipe: Any, kwargs: dict[str, Any], steps: int, *, device: Any, generator: Any, parallel: ParallelRun | None
) -> tuple[Any, GenerationTimings, int]:
    """One pipeline call with its timings and the bytes this rank received per step (multi-card runs)."""
    clock = _StepClock(device)
    handle = pipe.transformer.register_forward_pre_hook(clock.on_transformer_call, with_kwargs=True)
    try:
        with guidance_parallel(pipe, kwargs, parallel) as split:
            start = clock.now()
            output = pipe(**kwargs, generator=generator, callback_on_step_end=clock.on_step_end)
            end = clock.now()
    finally:
        handle.remove()
    if clock.denoise_start is None or len(clock.step_ends) != steps:
        raise RuntimeError(f"expected {steps} denoising steps, the pipeline reported {len(clock.step_ends)}")
    marks = [clock.denoise_start, *clock.step_ends]
    timings = GenerationTimings(
        prepare_ms=(clock.denoise_start - start) * 1e3,
        step_ms=[(b - a) * 1e3 for a, b in itertools.pairwise(marks)],
        decode_ms=(end - clock.step_ends[-1]) * 1e3,
        total_ms=(end - start) * 1e3,
    )
    return output, timings, 0 if split is None else split.bytes_received // steps


def _use_sampler(pipe: Any, pipeline: str, schedule: str, steps: int) -> int:
    """Give ``pipe`` the scheduler ``pipeline`` samples ``schedule`` with; the step callbacks ``steps`` make (res_2s:
    two evaluations a step and a last one)."""
    if pipeline == TWO_STAGE_HQ:
        use_res2s(pipe, schedule)
        return 2 * steps + 1
    use_schedule(pipe, schedule)
    return steps


def _stage_record(timings: GenerationTimings, size: StageSize, latents: torch.Tensor, sigmas: list[float]) -> dict:
    return {
        "width": size.width,
        "height": size.height,
        "video_tokens": int(np.prod(latents.shape[2:])),
        "sigmas": sigmas,
        **timings.as_dict(),
    }


def _two_stages(
    pipe: Any, request: GenerationRequest, parts: StageParts, *, device: Any, generator: Any, parallel: Any
) -> tuple[np.ndarray, torch.Tensor, GenerationTimings, int, dict[str, Any]]:
    """``stages``' two-stage pipelines: stage 1 at half size, the ×2 upsampler, stage 2 from its latents, decode."""
    clock = _StepClock(device)
    start = clock.now()
    if request.prompt_embeds is None:  # Gemma once for both stages, as ltx-pipelines
        request = dataclasses.replace(
            request, prompt_embeds=encode_prompt(pipe, request.encode_kwargs(), device=device)
        )
    encoded = clock.now()
    first, second = stage_sizes(request.width, request.height)
    options = {"device": device, "generator": generator, "parallel": parallel}
    conditions = {"conditions": list(request.keyframes)} if request.keyframes else {}
    if request.keyframes:  # the same modules, prepared by the keyframe conditioning
        pipe = keyframe_pipeline(pipe)
    sound = {}  # a2v: the encoded sound track, frozen in both stages
    if request.audio is not None:
        pipe = audio_to_video_pipeline(pipe)
        sound = {"audio_latents": encode_audio(pipe, request.audio, request.num_frames / request.fps)}
    use_adapters(pipe, parts.stage_1_adapters)
    calls = _use_sampler(pipe, request.pipeline, request.schedule, request.steps)
    half = dataclasses.replace(
        request, width=first.width, height=first.height, pipeline=ONE_STAGE, keyframes=(), audio=None
    )
    kwargs = pipeline_kwargs(pipe, half) | conditions | sound
    kwargs |= stage_1_guidance(request.pipeline, request.guidance, pipe.transformer.config.num_layers)
    stage_1, timings_1, comm = _timed_call(pipe, kwargs | {"output_type": "latent"}, calls, **options)
    sigmas_1 = pipe.scheduler.sigmas.tolist()
    upsample_start = clock.now()
    upsampled = upsample(parts.upsampler, stage_1.frames).to(stage_1.frames.device)
    if request.image is not None:  # stage 2 conditions on the image at full size, not on the upsampled frame
        upsampled[:, :, :1] = encode_first_frame(pipe, request.image, second).to(upsampled.device)
    upsample_end = clock.now()
    use_adapters(pipe, parts.stage_2_adapters)
    calls = _use_sampler(pipe, request.pipeline, DISTILLED, len(STAGE_2_SIGMAS))
    positive = {key: value for key, value in request.prompt_embeds.items() if not key.startswith("negative")}
    kwargs = {
        key: value
        for key, value in kwargs.items()
        if key not in ("negative_prompt_embeds", "negative_prompt_attention_mask")
    }
    kwargs |= {
        **positive,
        **guidance_kwargs(1.0, pipe.transformer.config.num_layers),
        "width": second.width,
        "height": second.height,
        "num_inference_steps": len(STAGE_2_SIGMAS),
        "sigmas": list(STAGE_2_SIGMAS),
        "latents": upsampled,
        "audio_latents": sound.get("audio_latents", stage_1.audio),
        "noise_scale": STAGE_2_SIGMAS[0],
        "output_type": "latent",
    }
    stage_2, timings_2, _ = _timed_call(pipe, kwargs, calls, **options)
    decode_start = clock.now()
    if request.audio is not None:  # a2v: the file's own sound, as ltx-pipelines returns it
        audio_from = "input"
        video, waveform = decode_video(pipe, stage_2.frames), request.audio.waveform
    else:
        # two-stage and its HQ variant "refine video only"
        audio_from = "stage_1" if request.pipeline in (TWO_STAGE, TWO_STAGE_HQ) else "stage_2"
        video, waveform = decode(pipe, stage_2.frames, stage_1.audio if audio_from == "stage_1" else stage_2.audio)
    end = clock.now()
    timings = GenerationTimings(
        prepare_ms=(encoded - start) * 1e3 + timings_1.prepare_ms,
        step_ms=timings_1.step_ms + timings_2.step_ms,
        decode_ms=(end - decode_start) * 1e3,
        total_ms=(end - start) * 1e3,
    )
    stages = {
        "stage_1": _stage_record(timings_1, first, stage_1.frames, sigmas_1),
        "upsample": {"ms": (upsample_end - upsample_start) * 1e3, "latent_shape": list(upsampled.shape)},
        "stage_2": _stage_record(timings_2, second, stage_2.frames, pipe.scheduler.sigmas.tolist()),
        "decode": {"ms": timings.decode_ms, "audio_from": audio_from},
        "sampler": "res_2s" if request.pipeline == TWO_STAGE_HQ else "euler",
    }
    if request.keyframes:
        stages["keyframes"] = [{"frame": key.frame, "strength": key.strength} for key in request.keyframes]
    if sound:
        stages["audio_latent_shape"] = list(sound["audio_latents"].shape)
    return video, waveform, timings, comm, stages


def generate(
    pipe: Any,
    request: GenerationRequest,
    *,
    device: torch.device | str,
    generator: torch.Generator | None = None,
    parallel: ParallelRun | None = None,
    parts: StageParts | None = None,
) -> GenerationResult:
    """Run ``request`` on ``pipe`` (already placed by its memory plan) once; time it and check the outputs.

    Args:
        pipe: an ``LTX2Pipeline`` or ``LTX2ImageToVideoPipeline``.
        request (`GenerationRequest`): sizes, steps, guidance, schedule, pipeline, prompt (or its embeddings), image.
        device (`torch.device`): where it runs, for synchronized timing and the peak memory counter.
        generator (`torch.Generator`, *optional*): use a CPU generator for noise that is identical on every device.
        parallel (`ParallelRun`, *optional*): this rank's part of a multi-card run (``parallel.setup_parallel``);
            every rank calls ``generate`` with the same request and gets the same result.
        parts (`StageParts`, *optional*): the upsampler and LoRA adapters of a two-stage ``request.pipeline``.

    Raises :class:`~deliverykit.errors.NumericsError` on NaN/Inf in the frames or the audio.
    """
    reset_peak_memory_stats(device)
    stages = None
    if request.pipeline in ONE_CALL:
        use_schedule(pipe, request.schedule)
        if parts is not None:
            use_adapters(pipe, parts.stage_1_adapters)
        options = {"device": device, "generator": generator, "parallel": parallel}
        kwargs = pipeline_kwargs(pipe, request)
        if request.pipeline == RETAKE and request.retake is None:
            raise ValueError("the retake pipeline needs its source (GenerationRequest.retake)")
        if request.retake is not None:  # the same modules, given the source and holding what lies outside the span
            pipe, source = retake_pipeline(pipe, request.retake)
            kwargs |= source | {"frame_rate": request.retake.fps}
        output, timings, comm = _timed_call(pipe, kwargs, request.steps, **options)
        video = np.asarray(output.frames[0], dtype=np.float32)
        audio = output.audio[0].detach().float().cpu()
        sigmas = pipe.scheduler.sigmas.tolist()
    else:
        if parts is None:
            raise ValueError(f"the {request.pipeline} pipeline needs its upsampler (StageParts)")
        if request.pipeline == KEYFRAMES and not request.keyframes:
            raise ValueError("the keyframes pipeline needs at least one keyframe")
        if request.pipeline == A2V and request.audio is None:
            raise ValueError("the a2v pipeline needs a sound track (GenerationRequest.audio)")
        options = {"device": device, "generator": generator, "parallel": parallel}
        video, audio, timings, comm, stages = _two_stages(pipe, request, parts, **options)
        sigmas = stages["stage_1"]["sigmas"]
    check_finite(video, audio)
    return GenerationResult(
        video=video,
        audio=audio,
        sample_rate=request.audio.sample_rate if request.audio else int(pipe.vocoder.config.output_sampling_rate),
        timings=timings,
        peak_memory_bytes=max_memory_allocated(device),
        sigmas=sigmas,
        comm_bytes_per_step=comm,
        stages=stages,
    )


@dataclasses.dataclass
class PreparedPipeline:
    """A loaded pipeline made ready to generate (:func:`prepare_pipeline`), and what the run report says about it."""

    loaded: LoadedPipeline
    context: Any  # this process's deliverykit.distributed.DistributedContext: device, rank, world size
    dtype_name: str
    spec: ParallelSpec
    parallel: ParallelRun | None
    plan: MemoryPlan
    attention_processors: int
    rope_precision: str
    lora: LoadedLora | None
    placement: PlacementAudit | None = None  # where the transformer is, once placed
    text_to_video: Any = None  # the text-to-video twin of an image-to-video pipeline, once needed
    parts: StageParts = dataclasses.field(default_factory=StageParts)  # the two-stage pipelines' upsampler, LoRAs

    @property
    def pipe(self) -> Any:
        return self.loaded.pipe

    @property
    def device(self) -> torch.device:
        return self.context.device

    def encode_ahead(self, request: GenerationRequest) -> tuple[GenerationRequest, float | None]:
        """``parallel.encode_prompt_ahead`` for this run: the prompt encoded before the call where the ranks or the
        memory plan need it (``(request with prompt_embeds, encode ms)``), else ``(request, None)``."""
        return encode_prompt_ahead(self.pipe, request, self.context, free_text_encoder=self.plan.free_text_encoder)

    def place(self) -> None:
        """Apply the memory plan (after any prompt encoding that needed Gemma on the device) and audit placement."""
        apply_memory_plan(self.pipe, self.plan, self.device)
        if self.parts.upsampler is not None and not self.plan.offloads:
            self.parts.upsampler.to(self.device)
        self.placement = audit_placement(self.pipe.transformer, self.device)

    def generate(self, request: GenerationRequest, seed: int) -> GenerationResult:
        """:func:`generate` on the pipeline of the request's mode, with a fresh CPU-seeded generator (same noise on
        every device and every run)."""
        pipe = self.pipe
        if request.image is None and isinstance(pipe, LTX2ImageToVideoPipeline):
            if self.text_to_video is None:  # made after the memory plan placed the modules it shares
                self.text_to_video = text_to_video_twin(pipe)
            pipe = self.text_to_video
        options = {"generator": make_generator(seed), "parallel": self.parallel, "parts": self.parts}
        return generate(pipe, request, device=self.device, **options)


def prepare_pipeline(
    loaded: LoadedPipeline,
    context: Any,
    spec: ParallelSpec,
    *,
    dtype_name: str,
    memory: str = "auto",
    lora: str | None = None,
    lora_scale: float = 1.0,
    two_stage: bool = False,
) -> PreparedPipeline:
    """Ranks (``parallel.setup_parallel``), NPU attention, the float32 RoPE policy, a LoRA and the memory plan
    (``two_stage``: with the two-stage pipelines' parts).

    ``context`` is this process's ``deliverykit.distributed.DistributedContext``. The plan is chosen, not applied:
    :meth:`PreparedPipeline.place` applies it once the prompts that need Gemma on the device are encoded.
    """
    pipe, device = loaded.pipe, context.device
    return PreparedPipeline(
        loaded=loaded,
        context=context,
        dtype_name=dtype_name,
        spec=spec,
        parallel=setup_parallel(spec, context.rank, transformer=pipe.transformer, device=device, vae=pipe.vae),
        attention_processors=enable_npu_attention(pipe),
        rope_precision=apply_rope_precision_policy(pipe, device),
        lora=load_lora(pipe, Path(lora), lora_scale) if lora else None,
        plan=choose_memory_plan(device, memory, two_stage=two_stage),
    )


@dataclasses.dataclass(frozen=True)
class ModelFiles:
    """The single file and the Gemma-3 folder a process loads; ``smoke_home`` holds them with ``--smoke``."""

    checkpoint: Path
    text_encoder: Path
    smoke_home: Path | None = None
    upsampler: Path | None = None  # --spatial-upsampler
    distilled_lora: tuple[Path, float] | None = None  # --distilled-lora FILE [STRENGTH]

    @classmethod
    def from_args(cls, args: argparse.Namespace, stack: contextlib.ExitStack) -> ModelFiles:
        """``--model`` / ``--text-encoder``, or with ``--smoke`` the tiny random model written in their layout into a
        temporary folder that ``stack`` removes. Call it before the process group exists: transformers then saves on
        global rank 0 only."""
        if not args.smoke:
            lora = (Path(args.distilled_lora[0]), args.distilled_lora[1]) if args.distilled_lora else None
            upsampler = Path(args.spatial_upsampler) if args.spatial_upsampler else None
            return cls(Path(args.weights), Path(args.text_encoder), None, upsampler, lora)
        home = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="sulphur2-smoke-")))
        files = tiny.write_smoke_files(home, seed=0, model=tiny.TINY_MODELS[args.smoke])
        return cls(files.checkpoint, files.text_encoder, home, files.upsampler, (files.distilled_lora, 1.0))


def load_prepared(
    args: argparse.Namespace,
    files: ModelFiles,
    context: Any,
    spec: ParallelSpec,
    stack: contextlib.ExitStack,
    *,
    image_to_video: bool,
    manifest: Path,
    pipeline: str = ONE_STAGE,
) -> tuple[PreparedPipeline, list[dict[str, Any]]]:
    """Steps 2 and 3 of ``inference.py`` and ``app.py``: load strictly and offline, then prepare (ranks, NPU attention,
    RoPE precision, LoRA, memory plan; not yet placed) and load the parts ``pipeline`` needs. Returns the prepared
    pipeline and its weights record."""
    check_plan_for_device(args.memory, context.device)
    dtype_name = args.dtype or backend(context.device).default_dtype("bf16")
    stack.enter_context(failure_guard(context))
    loaded = load_pipeline(
        files.checkpoint,
        files.text_encoder,
        image_to_video=image_to_video,
        torch_dtype=torch_dtype(dtype_name),
        manifest=None if args.smoke else manifest,
        strict_manifest=args.strict_manifest,
        model_config=Path(args.model_config) if args.model_config else None,
        load_text_encoder=context.is_main,  # the other ranks get the embeddings from rank 0
    )
    options = {"memory": args.memory, "lora": args.lora, "lora_scale": args.lora_scale}
    options["two_stage"] = pipeline not in ONE_CALL
    prepared = prepare_pipeline(loaded, context, spec, dtype_name=dtype_name, **options)
    print(f"memory plan: {prepared.plan.name} ({prepared.plan.why})", flush=True)
    parts = {"upsampler": files.upsampler, "distilled_lora": files.distilled_lora}
    check = {"manifest": None if args.smoke else manifest, "strict_manifest": args.strict_manifest}
    prepared.parts = load_stage_parts(prepared.pipe, pipeline, lora=prepared.lora, **parts, **check)
    weights = (
        smoke_weights(files.smoke_home) if files.smoke_home else [loaded.info.weights_file, *prepared.parts.records]
    )
    return prepared, weights_record(weights)
