"""LTX-2.3's pipelines as ltx-pipelines (Lightricks/LTX-2 at 400fd310) names them, on diffusers' components.

- ``distilled`` (``DistilledPipeline``, ltx-pipelines' recommended default): stage 1 at half width and height with the
  8 distilled σ, the video latent upsampled ×2 (``upsampler``), stage 2 at full size from that latent and stage 1's
  audio, both re-noised to σ = 0.909375 and denoised with ``STAGE_2_DISTILLED_SIGMA_VALUES``; stage 2's audio is
  decoded.
- ``two-stage`` (``TI2VidTwoStagesPipeline``): stage 1 with the dev model, the dev schedule and full multimodal
  guidance; stage 2 as above with the distilled LoRA added to the model (``--distilled-lora``); stage 2 "refines
  video only": stage 1's audio is decoded.
- ``two-stage-hq`` (``TI2VidTwoStagesHQPipeline``): ``two-stage`` sampled with res_2s (:mod:`.res2s`) in both
  stages, stage 1's σ shifted by its token count, its guidance ltx-pipelines' ``LTX_2_3_HQ_PARAMS`` (no STG), the
  distilled LoRA in both stages at :data:`HQ_LORA_STRENGTHS`; stage 1's audio is decoded.
- ``keyframes`` (``KeyframeInterpolationPipeline``): ``two-stage`` conditioned on images at chosen frames, each
  appended as a guiding latent at both stages' sizes (:mod:`.keyframes`); stage 2's audio is decoded.
- ``retake`` (``RetakePipeline``): one call at the ``--video`` source's size remaking a time span of it
  (:mod:`.retake`).
- ``one-stage`` (``TI2VidOneStagePipeline``, "primarily for educational purposes"): one call at full size.

A stage is one call of the diffusers pipeline (``output_type="latent"``); diffusers normalises the latents it is
given and re-noises them with ``noise_scale``, as ltx-core's ``GaussianNoiser`` does, and :func:`decode` finishes as
the pipeline's own tail does. Image-to-video conditions stage 2 on the image encoded at full size
(``reference_fixes``). Both stages need sizes that are multiples of 64 (``assert_resolution(is_two_stage=True)``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import PIL.Image
import torch
from diffusers.pipelines.ltx2.pipeline_ltx2_image2video import retrieve_latents
from diffusers.pipelines.ltx2.utils import apply_image_conditioning_crf, resolve_default_image_crf

from deliverykit.assets.loadcheck import check_file_for_loading
from deliverykit.errors import DeliveryError, ExitCode, WeightsError

from . import MODEL_ID
from .options import DISTILLED, LORA_STAGE_2, ONE_CALL, ONE_STAGE, PIPELINES, RETAKE, TWO_STAGE, TWO_STAGE_HQ
from .schedules import DEV, ScheduleChoice, choose_schedule
from .upsampler import DOWNLOAD as UPSAMPLER_DOWNLOAD
from .upsampler import load_upsampler

# ltx-pipelines utils/constants.py STAGE_2_DISTILLED_SIGMA_VALUES without its terminal 0 (the scheduler appends it)
STAGE_2_SIGMAS: tuple[float, ...] = (0.909375, 0.725, 0.421875)
TWO_STAGE_MULTIPLE = 64  # both stages' sizes are multiples of the VAE's 32
DISTILLED_LORA_FILE = "distill_loras/ltx-2.3-22b-distilled-lora-1.1_fro90_ceil72_condsafe.safetensors"
DISTILLED_LORA_ADAPTER = "distilled"
LORA_DOWNLOAD = f"download {DISTILLED_LORA_FILE} from {MODEL_ID}"
HQ_STEPS = 15  # LTX_2_3_HQ_PARAMS.num_inference_steps: two-stage-hq's stage-1 steps without --steps
HQ_LORA_STRENGTHS = (0.25, 0.5)  # ltx-pipelines' --distilled-lora-strength-stage-1 / -stage-2 defaults for HQ


@dataclasses.dataclass(frozen=True)
class StageSize:
    """One stage's frame size."""

    width: int
    height: int


def stage_sizes(width: int, height: int) -> tuple[StageSize, StageSize]:
    """Stage 1 at half the width and height, stage 2 at the full size."""
    return StageSize(width // 2, height // 2), StageSize(width, height)


@dataclasses.dataclass(frozen=True)
class StageParts:
    """What a pipeline needs besides the diffusers pipeline: the upsampler and each stage's LoRA adapters (name →
    strength: ``--lora`` in both stages, the distilled LoRA in stage 2 of ``two-stage`` and in both of
    ``two-stage-hq``)."""

    upsampler: Any = None  # LTX2LatentUpsamplerModel
    stage_1_adapters: dict[str, float] = dataclasses.field(default_factory=dict)
    stage_2_adapters: dict[str, float] = dataclasses.field(default_factory=dict)
    records: tuple[Any, ...] = ()  # deliverykit LoadedFile of each part loaded (the report's weights)


def choose_pipeline(
    requested: str, schedule: str, checkpoint: Path, *, upsampler: bool, distilled_lora: bool, smoke: bool
) -> ScheduleChoice:
    """The pipeline and its stage-1 schedule for ``--pipeline requested --schedule schedule``.

    ``auto``: ``distilled`` for a distilled checkpoint (and ``--smoke``), ``two-stage`` for a dev one with
    ``--distilled-lora``, else ``one-stage``. ``upsampler`` / ``distilled_lora``: whether the flags were given
    (``--smoke`` writes both parts). A missing part is exit 4 naming the file; a flag or schedule the pipeline does
    not use is exit 2.
    """
    if requested not in ("auto", *PIPELINES):
        raise ValueError(f"pipeline {requested!r}; expected auto, {', '.join(PIPELINES)}")
    sampling = choose_schedule(schedule, checkpoint)
    if requested != "auto":
        name, why = requested, f"--pipeline {requested}"
    elif smoke and schedule != DEV:
        name, why = DISTILLED, "auto: --smoke runs ltx-pipelines' default two-stage distilled pipeline"
    elif smoke or sampling.name == DISTILLED or distilled_lora:
        name = DISTILLED if sampling.name == DISTILLED else TWO_STAGE
        why = f"auto: {sampling.why}" + ("" if name == DISTILLED else ", with the distilled LoRA for stage 2")
    else:
        name, why = ONE_STAGE, f"auto: {sampling.why} and no --distilled-lora for a two-stage run"
    wanted = DISTILLED if name == DISTILLED else DEV if name in LORA_STAGE_2 else None
    if name == RETAKE and smoke and schedule == "auto":
        sampling = ScheduleChoice(
            DISTILLED, "auto: --smoke retakes with the distilled schedule, as ltx-pipelines' retake"
        )
    if wanted is not None and schedule not in ("auto", wanted):
        raise DeliveryError(
            f"--pipeline {name} samples stage 1 with the {wanted} schedule; drop --schedule {schedule}", ExitCode.USAGE
        )
    if wanted is not None:
        sampling = ScheduleChoice(wanted, f"stage 1 of the {name} pipeline")
    unused = [
        flag
        for flag, given, users in (
            ("--spatial-upsampler", upsampler, (DISTILLED, *LORA_STAGE_2)),
            ("--distilled-lora", distilled_lora, LORA_STAGE_2),
        )
        if given and name not in users
    ]
    if unused:
        raise DeliveryError(
            f"{' and '.join(unused)} is not used by the {name} pipeline ({why}); drop it or pick another --pipeline",
            ExitCode.USAGE,
        )
    if not smoke and name not in ONE_CALL and not upsampler:
        raise WeightsError(
            f"the {name} pipeline needs the ×2 spatial upsampler: {UPSAMPLER_DOWNLOAD} and pass "
            "--spatial-upsampler FILE (or --pipeline one-stage)"
        )
    if not smoke and name in LORA_STAGE_2 and not distilled_lora:
        raise WeightsError(
            f"the {name} pipeline needs the distilled LoRA: {LORA_DOWNLOAD} and pass "
            "--distilled-lora FILE [STRENGTH] (or --pipeline one-stage)"
        )
    return dataclasses.replace(sampling, pipeline=name, pipeline_why=why)


def choose_from_args(args: Any) -> ScheduleChoice:
    """:func:`choose_pipeline` for a front end's parsed flags (``options.add_load_args``), with the given parts'
    files checked before anything loads (exit 4 naming the file and how to get it)."""
    from .tiny import CHECKPOINT_NAME

    given = [(args.spatial_upsampler, "--spatial-upsampler", UPSAMPLER_DOWNLOAD)]
    given.append((args.distilled_lora[0] if args.distilled_lora else None, "--distilled-lora", LORA_DOWNLOAD))
    for path, flag, download in given:
        if path is not None and not Path(path).is_file():
            raise WeightsError(f"{flag} {path} does not exist; {download} and pass its path")
    return choose_pipeline(
        args.pipeline,
        args.schedule,
        Path(args.weights or CHECKPOINT_NAME),
        upsampler=bool(args.spatial_upsampler),
        distilled_lora=bool(args.distilled_lora),
        smoke=bool(args.smoke),
    )


def load_stage_parts(
    pipe: Any,
    pipeline: str,
    *,
    upsampler: Path | None,
    distilled_lora: tuple[Path, float] | None,
    lora: Any = None,
    manifest: Path | None = None,
    strict_manifest: bool = False,
) -> StageParts:
    """The upsampler (``upsampler.load_upsampler``) and adapters ``pipeline`` uses, checked as the checkpoint is.

    ``lora``: the ``lora.LoadedLora`` of ``--lora`` (both stages); the distilled LoRA is loaded as adapter
    :data:`DISTILLED_LORA_ADAPTER` for stage 2 of ``two-stage``, ``keyframes`` and ``a2v``, and for both stages of
    ``two-stage-hq`` at :data:`HQ_LORA_STRENGTHS` (its ``distilled_lora`` strength unused).
    """
    user = {lora.adapter_name: lora.scale} if lora is not None and not lora.fused else {}
    if pipeline in ONE_CALL:
        return StageParts(stage_1_adapters=user, stage_2_adapters=user)
    from .lora import load_lora

    module, record = load_upsampler(
        upsampler,
        latent_channels=pipe.vae.config.latent_channels,
        torch_dtype=pipe.transformer.dtype,
        manifest=manifest,
        strict_manifest=strict_manifest,
    )
    records = (record,) if record is not None else ()
    stage_1, stage_2 = dict(user), dict(user)
    if pipeline in LORA_STAGE_2:
        path, strength = distilled_lora
        if manifest is not None:
            records += (check_file_for_loading(manifest, path, MODEL_ID, strict=strict_manifest),)
        load_lora(pipe, path, strength, adapter_name=DISTILLED_LORA_ADAPTER)
        stage_2[DISTILLED_LORA_ADAPTER] = strength
        if pipeline == TWO_STAGE_HQ:
            stage_1[DISTILLED_LORA_ADAPTER], stage_2[DISTILLED_LORA_ADAPTER] = HQ_LORA_STRENGTHS
    return StageParts(module, stage_1, stage_2, records)


def use_adapters(pipe: Any, weights: dict[str, float]) -> None:
    """Make exactly the LoRA adapters of ``weights`` (name → strength) active; none: every LoRA off."""
    if not getattr(pipe.transformer, "peft_config", None):
        if weights:
            raise ValueError(f"LoRA adapters {sorted(weights)} are not loaded")
        return
    if not weights:
        pipe.disable_lora()
        return
    pipe.enable_lora()
    pipe.set_adapters(list(weights), list(weights.values()))


def encode_first_frame(pipe: Any, image: Any, size: StageSize) -> torch.Tensor:
    """The un-normalised latent of ``image`` at ``size``, as diffusers' image-to-video pipeline makes its
    conditioning frame (H.264 re-compression at the pipeline's default CRF, resize, VAE encode, mode).

    Stage 2 conditions on this (ltx-pipelines' ``combined_image_conditionings`` at full size); given 5-D latents,
    diffusers would keep the upsampled stage-1 frame there instead and only stop denoising it.
    """
    crf = resolve_default_image_crf(pipe.text_encoder)
    if crf:
        image = PIL.Image.fromarray(apply_image_conditioning_crf(np.array(image.convert("RGB")), crf))
    vae = pipe.vae
    pixels = pipe.video_processor.preprocess(image, height=size.height, width=size.width)
    with torch.no_grad():
        encoded = vae.encode(pixels.to(vae.device, vae.dtype).unsqueeze(2))
    return retrieve_latents(encoded, sample_mode="argmax").float()


def decode(pipe: Any, video: torch.Tensor, audio: torch.Tensor) -> tuple[np.ndarray, torch.Tensor]:
    """Frames ``[F, H, W, 3]`` in [0, 1] and the waveform of un-normalised latents (``output_type="latent"``), as
    the end of diffusers' ``LTX2Pipeline.__call__`` computes them at its default decode timestep 0."""
    with torch.no_grad():
        mel = pipe.audio_vae.decode(audio.to(pipe.audio_vae.dtype), return_dict=False)[0]
        waveform = pipe.vocoder(mel)
    return decode_video(pipe, video), waveform[0].detach().float().cpu()


def decode_video(pipe: Any, video: torch.Tensor) -> np.ndarray:
    """The frames of :func:`decode` alone (a2v keeps the file's sound)."""
    vae = pipe.vae
    timestep = torch.zeros(video.shape[0], device=video.device) if vae.config.timestep_conditioning else None
    with torch.no_grad():
        frames = vae.decode(video.to(vae.dtype), timestep, return_dict=False)[0]
        frames = pipe.video_processor.postprocess_video(frames, output_type="np")
    return np.asarray(frames[0], dtype=np.float32)
