"""What one video asks for, from the command line or one line of a ``--batch`` file, checked before anything loads.

:func:`build_request` turns the fields (the flags' names: ``prompt``, ``preset``, ``width``, ``steps``, ...) into a
:class:`~sulphur2_npu.generate.GenerationRequest` and refuses, as a usage error (exit 2), what no model is needed to
refuse: steps or guidance with the distilled schedule, one dev step, a size the VAE cannot make, a request that does
not fit ``--parallel``, keyframes, a sound track or a retake span that do not fit the pipeline or the video (a retake's
source is probed for its size here: exit 3 when it cannot be retaken). The first-frame image, the keyframes', the a2v
sound track and the retake's source are read when the video is made (:func:`with_inputs`, exit 3).

:class:`BatchRequests` is a ``--batch`` file read through ``deliverykit.batch`` (JSON Lines with :data:`BATCH_FIELDS`,
or plain text, one prompt a line): every line checked as a command line would be, the flags' values under each
line's; then, per item, its request with its image read and, where the memory plan drops Gemma after encoding, its
prompt embeddings computed ahead.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from deliverykit import batch
from deliverykit.device import resolve_device
from deliverykit.distributed import DistributedContext
from deliverykit.errors import DeliveryError, ExitCode
from sulphur2_npu.audio_io import AUDIO_FLAG, read_audio
from sulphur2_npu.generate import DEFAULT_MAX_SEQUENCE_LENGTH, GenerationRequest, stage_1_guidance
from sulphur2_npu.keyframes import KEYFRAME_FLAG, KEYFRAME_METAVAR, check_keyframes, parse_keyframe, read_keyframes
from sulphur2_npu.memory import encode_prompts_then_free
from sulphur2_npu.options import A2V, KEYFRAMES, ONE_CALL, ONE_STAGE, RETAKE, TWO_STAGE_HQ
from sulphur2_npu.parallel import ParallelSpec, check_guidance_degree, check_ulysses_lengths, guidance_rows
from sulphur2_npu.presets import DEFAULT_PRESET, PRESETS, settings_for
from sulphur2_npu.retake import (
    END_FLAG,
    START_FLAG,
    VIDEO_FLAG,
    Retake,
    SourceShape,
    check_span,
    probe_video,
    read_retake,
)
from sulphur2_npu.schedules import ScheduleChoice, refuse_fixed_settings
from sulphur2_npu.sizes import validate_size
from sulphur2_npu.stages import HQ_STEPS, stage_sizes
from sulphur2_npu.tiny import TINY_CALL, TINY_PRESET, TINY_TWO_STAGE_PRESET, smoke_frames, smoke_sound
from sulphur2_npu.video_io import read_image

SIZE_FIELDS = ("width", "height", "num_frames", "steps", "guidance")
# What a --batch line may set (and ``output``, its folder name); the flags of the same names give the defaults.
BATCH_FIELDS: dict[str, type] = {
    "prompt": str,
    "negative_prompt": str,
    "image": str,
    "seed": int,
    "preset": str,
    **{name: int for name in ("width", "height", "num_frames", "steps")},
    "guidance": float,
    "fps": int,
    "pipeline": str,  # the run's pipeline (its parts are loaded) or one-stage
    "keyframes": list,  # of "IMAGE:FRAME[:STRENGTH]", as --keyframe
    "audio": str,  # the a2v pipeline's sound track, as --audio
    "video": str,  # the retake pipeline's source, as --video
    "retake_start": float,
    "retake_end": float,
}


def build_request(
    fields: Mapping[str, Any], *, smoke: bool, schedule: ScheduleChoice, spec: ParallelSpec | None = None
) -> GenerationRequest:
    """The request of ``fields`` (absent or None: the preset's value; with ``smoke``, the tiny model's call).

    Args:
        fields (`Mapping`): ``prompt``, ``negative_prompt``, ``preset``, ``width``, ``height``, ``num_frames``,
            ``steps``, ``guidance``, ``fps``, ``pipeline`` (the run's or ``one-stage``), ``image``, ``keyframes`` and
            ``audio`` (checked, not read), as the flags name them (other keys are ignored).
        smoke (`bool`): the tiny model: its size without a preset, its prompts and its text window.
        schedule (`ScheduleChoice`): the run's schedule (``schedules.choose_schedule``).
        spec (`ParallelSpec`, *optional*): ``--parallel``; the request must fit it.
    """
    preset, fps = fields.get("preset"), fields["fps"]
    if preset is not None and preset not in PRESETS:
        raise DeliveryError(f"preset {preset!r}: expected one of {', '.join(PRESETS)}", ExitCode.USAGE)
    if fps < 1:
        raise DeliveryError(f"fps {fps}: need at least 1", ExitCode.USAGE)
    refuse_fixed_settings(schedule, steps=fields.get("steps"), guidance=fields.get("guidance"))
    pipeline = fields.get("pipeline") or "auto"
    pipeline = schedule.pipeline if pipeline == "auto" else pipeline
    if pipeline not in (schedule.pipeline, ONE_STAGE):
        raise DeliveryError(
            f"pipeline {pipeline!r}: this run loaded the parts of the {schedule.pipeline} pipeline, so a request may "
            f"ask for {schedule.pipeline} or {ONE_STAGE}; start it with --pipeline {pipeline} for that one",
            ExitCode.USAGE,
        )
    keyframes = [parse_keyframe(text) for text in fields.get("keyframes") or ()]
    _check_keyframes_fit(pipeline, keyframes, fields.get("image"))
    _check_audio_fit(pipeline, fields.get("audio"), smoke=smoke)
    source = _retake_source(pipeline, fields, smoke=smoke)
    two_stage = pipeline not in ONE_CALL
    base = preset or ((TINY_TWO_STAGE_PRESET if two_stage else TINY_PRESET) if smoke else DEFAULT_PRESET)
    sizes = {name: fields.get(name) for name in SIZE_FIELDS}
    if source is not None:
        _check_no_size(fields)
        sizes |= {"width": source.width, "height": source.height, "num_frames": source.frames}
        fps = int(source.fps)  # the mp4's rate, as ltx-pipelines writes it
    if pipeline == TWO_STAGE_HQ and sizes.get("steps") is None and not smoke:
        sizes["steps"] = HQ_STEPS
    settings = settings_for(base, schedule.name, **sizes)
    validate_size(settings.width, settings.height, settings.num_frames, fps, two_stage=two_stage)
    check_keyframes(keyframes, settings.num_frames)
    text_tokens = TINY_CALL["max_sequence_length"] if smoke else DEFAULT_MAX_SEQUENCE_LENGTH
    if spec is not None:
        guidances = (settings.guidance, 1.0) if two_stage else (settings.guidance,)  # stage 2 runs unguided
        for guidance in guidances:
            check_guidance_degree(spec, len(guidance_rows(stage_1_guidance(pipeline, guidance, num_layers=1))))
        for size in stage_sizes(settings.width, settings.height) if two_stage else (settings,):
            check_ulysses_lengths(spec, size.width, size.height, settings.num_frames, text_tokens, len(keyframes))
    negative_prompt = fields.get("negative_prompt")
    if negative_prompt is None:
        negative_prompt = TINY_CALL["negative_prompt"] if smoke else ""
    return GenerationRequest.from_preset(
        settings,
        fields.get("prompt") or TINY_CALL["prompt"],
        negative_prompt=negative_prompt,
        fps=fps,
        schedule=schedule.name,
        pipeline=pipeline,
        max_sequence_length=text_tokens,
    )


def _check_keyframes_fit(pipeline: str, keyframes: list, image: str | None) -> None:
    """The keyframes pipeline needs keyframes and takes no first-frame image; no other pipeline takes keyframes."""
    if keyframes and pipeline != KEYFRAMES:
        raise DeliveryError(f"{KEYFRAME_FLAG} is for the keyframes pipeline, not {pipeline}", ExitCode.USAGE)
    if pipeline == KEYFRAMES and not keyframes:
        raise DeliveryError(
            f"the keyframes pipeline needs at least one {KEYFRAME_FLAG} {KEYFRAME_METAVAR}", ExitCode.USAGE
        )
    if keyframes and image:
        raise DeliveryError(
            f"the keyframes pipeline takes the first frame as {KEYFRAME_FLAG} IMAGE:0, not --image", ExitCode.USAGE
        )


def _check_audio_fit(pipeline: str, audio: str | None, *, smoke: bool) -> None:
    """The a2v pipeline needs a sound track (``--smoke``: a test tone); no other pipeline takes one."""
    if audio and pipeline != A2V:
        raise DeliveryError(f"{AUDIO_FLAG} is for the a2v pipeline, not {pipeline}", ExitCode.USAGE)
    if pipeline == A2V and not audio and not smoke:
        raise DeliveryError(f"the a2v pipeline needs {AUDIO_FLAG} FILE, the sound the video follows", ExitCode.USAGE)


def _retake_source(pipeline: str, fields: Mapping[str, Any], *, smoke: bool) -> SourceShape | None:
    """The retake pipeline's source, probed (exit 3), its span checked (exit 2; ``--smoke``: a made-up source and the
    middle third by default; no first-frame image); None for another pipeline, which takes no ``--video`` or span."""
    video, start, end = fields.get("video"), fields.get("retake_start"), fields.get("retake_end")
    if pipeline != RETAKE:
        given = [
            flag for flag, value in ((VIDEO_FLAG, video), (START_FLAG, start), (END_FLAG, end)) if value is not None
        ]
        if given:
            raise DeliveryError(f"{' and '.join(given)} is for the retake pipeline, not {pipeline}", ExitCode.USAGE)
        return None
    if not video and not smoke:
        raise DeliveryError(
            f"the retake pipeline needs {VIDEO_FLAG} FILE, the video to remake a span of", ExitCode.USAGE
        )
    if fields.get("image"):
        raise DeliveryError(f"the retake pipeline takes its pictures from {VIDEO_FLAG}; drop --image", ExitCode.USAGE)
    shape = probe_video(Path(video)) if video else _smoke_source_shape()
    check_span(start, end, shape, smoke=smoke)
    return shape


def _smoke_source_shape() -> SourceShape:
    """The retake smoke's made-up source: the tiny model's one-stage size at 24 fps."""
    return SourceShape(TINY_PRESET.width, TINY_PRESET.height, TINY_PRESET.num_frames, 24.0)


def _check_no_size(fields: Mapping[str, Any]) -> None:
    """A retake's size, length and rate are its source's (exit 2 for a preset or a size flag)."""
    given = [f"--{name.replace('_', '-')}" for name in ("preset", "width", "height", "num_frames") if fields.get(name)]
    if given:
        raise DeliveryError(
            f"{' and '.join(given)}: a retake keeps the size and length of its {VIDEO_FLAG}; drop them", ExitCode.USAGE
        )


def _paths_from(folder: Path, fields: Mapping[str, Any]) -> dict[str, Any]:
    """A batch line's ``keyframes``, ``audio`` and ``video`` with relative paths taken from the batch file's
    ``folder``, as ``image``."""
    paths: dict[str, Any] = {}
    if fields.get("keyframes"):
        parsed = [parse_keyframe(text) for text in fields["keyframes"]]
        paths["keyframes"] = [f"{folder / path}:{frame}:{strength}" for path, frame, strength in parsed]
    for name in ("audio", "video"):
        if fields.get(name):
            paths[name] = str(folder / fields[name])
    return paths


def with_inputs(
    request: GenerationRequest,
    image: str | None,
    keyframes: list[str] | None,
    audio: str | None = None,
    video: str | None = None,
    *,
    smoke: bool = False,
    span: tuple[float | None, float | None] = (None, None),
) -> GenerationRequest:
    """``request`` with its first-frame image, keyframe images, sound track and retake source read (exit 3 naming
    the file that fails); with ``smoke``, an a2v request without a file gets the test tone, a retake without a
    ``video`` a made-up source (:func:`_smoke_source_shape`) with that tone."""
    if image:
        request = dataclasses.replace(request, image=read_image(Path(image)))
    if keyframes:
        request = dataclasses.replace(request, keyframes=read_keyframes(keyframes))
    seconds = request.num_frames / request.fps
    if audio:
        request = dataclasses.replace(request, audio=read_audio(Path(audio), seconds))
    elif smoke and request.pipeline == A2V:
        request = dataclasses.replace(request, audio=smoke_sound(seconds))
    if request.pipeline == RETAKE:
        shape = probe_video(Path(video)) if video else _smoke_source_shape()
        start, end = check_span(*span, shape, smoke=smoke)
        if video:
            retake = read_retake(Path(video), shape, start, end)
        else:
            frames = smoke_frames(shape.width, shape.height, shape.frames)
            retake = Retake(frames, shape.fps, smoke_sound(seconds), start, end, "smoke source")
        request = dataclasses.replace(request, retake=retake)
    return request


@dataclasses.dataclass
class BatchRequests:
    """The items of a ``--batch`` file, each with every field (the line's over the flags'), where they go and which
    share this process takes (:class:`deliverykit.batch.Ranks`), and their embeddings when computed ahead."""

    items: list[batch.BatchItem]
    smoke: bool
    schedule: ScheduleChoice
    output: Path
    overwrite: bool = False
    ranks: batch.Ranks = dataclasses.field(default_factory=batch.Ranks)
    embeds: dict[str, dict[str, torch.Tensor]] = dataclasses.field(default_factory=dict)

    @classmethod
    def read(cls, flags: Mapping[str, Any], *, smoke: bool, schedule: ScheduleChoice) -> BatchRequests:
        """``flags["batch"]`` read and checked whole before anything loads; a bad line is exit 2 naming FILE:LINE.

        ``flags``: the parsed command line (``batch``, ``output``, ``overwrite`` and the defaults of the fields).
        """
        defaults = {name: flags.get(name) for name in BATCH_FIELDS}
        required = () if smoke else ("prompt",)  # the tiny model has a default prompt, the real one none

        folder = Path(flags["batch"]).parent

        def check(fields: dict[str, Any]) -> None:  # a retake's source is probed: its path as the item will have it
            build_request({**defaults, **fields, **_paths_from(folder, fields)}, smoke=smoke, schedule=schedule)

        items = batch.read_batch(flags["batch"], BATCH_FIELDS, required=required, image_field="image", check=check)
        items = [
            dataclasses.replace(item, fields={**defaults, **item.fields, **_paths_from(folder, item.fields)})
            for item in items
        ]
        return cls(items, smoke, schedule, Path(flags["output"]), flags["overwrite"], batch.Ranks.from_env())

    @property
    def image_to_video(self) -> bool:
        """Whether any item has a first frame (the loader then builds the image-to-video pipeline)."""
        return any(item.fields["image"] for item in self.items)

    def context(self, device_spec: str | None) -> DistributedContext:
        """This process on its device (``--device``, or ``<type>:LOCAL_RANK`` under several ranks), without a
        process group: ranks share a batch through its output folder alone."""
        return DistributedContext(0, 1, 0, resolve_device(batch.rank_device_spec(device_spec, self.ranks)), None)

    def encode_ahead(self, pipe: Any, *, device: Any) -> None:
        """Encode the prompts of this rank's items still to make, then drop Gemma (``memory``); the embeddings wait
        on the host. For memory plans that free the text encoder: it leaves the device before the rest arrives."""
        todo = [
            item
            for item in self.ranks.share(self.items)
            if self.overwrite or not batch.item_is_complete(self.output / item.name)
        ]
        prompts = [
            build_request(item.fields, smoke=self.smoke, schedule=self.schedule).encode_kwargs() for item in todo
        ]
        embeds = encode_prompts_then_free(pipe, prompts, device=device, to_host=True)
        self.embeds = {item.name: item_embeds for item, item_embeds in zip(todo, embeds, strict=True)}

    def request(self, item: batch.BatchItem, device: Any) -> GenerationRequest:
        """``item``'s request, its image read (a missing or bad image fails the item, exit 3) and its embeddings,
        if computed ahead, on ``device``."""
        request = build_request(item.fields, smoke=self.smoke, schedule=self.schedule)
        fields = item.fields
        request = with_inputs(
            request,
            fields["image"],
            fields["keyframes"],
            fields["audio"],
            fields["video"],
            smoke=self.smoke,
            span=(fields["retake_start"], fields["retake_end"]),
        )
        if item.name in self.embeds:
            embeds = {name: tensor.to(device) for name, tensor in self.embeds[item.name].items()}
            request = dataclasses.replace(request, prompt_embeds=embeds)
        return request

    def run(self, run_item: Callable[[batch.BatchItem, Path], Mapping[str, Any]]) -> int:
        """This rank's share, each item by ``run_item(item, OUTPUT/<name>)``; 0, or 9 when an item failed."""
        return batch.run_batch(self.items, run_item, self.output, overwrite=self.overwrite, ranks=self.ranks).exit_code
