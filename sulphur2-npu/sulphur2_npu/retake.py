"""ltx-pipelines' ``RetakePipeline``: a time span of a given video made anew, the rest of its picture and sound kept.

ltx-pipelines @ 400fd310 (``retake.py``) takes the source's own size, frame count and rate
(``get_videostream_metadata``; its CLI asks 8k+1 frames and sides that are multiples of 32), encodes its frames
(``video_latent_from_file``: every frame whose time lies in the video's duration, ``x / 127.5 - 1``, the video VAE
encoder's mean, tiled as ltx-core tiles it: :mod:`.tiled_encode`) and its sound (``audio_latent_from_file``: read as
:mod:`.audio_io` reads it, ``encode_audio``, then cut or zero-padded to the video's audio length), and runs one stage at
that size with ``TemporalRegionMask(start, end)`` on both modalities: a token whose time span meets ``[start, end)`` is
noised and generated, the others keep their latent (denoise mask 0). A source without sound gets its sound generated
whole. :class:`RetakePipeline` is the keyframe pipeline's preparation (:mod:`.keyframes`) with the kept video tokens as
full-strength conditions, holding the sound outside the span (:class:`~sulphur2_npu.audio_to_video.HeldSound`).
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from pathlib import Path
from typing import Any

import av
import numpy as np
import torch

from deliverykit.errors import DeliveryError, ExitCode, InputError

from .audio_io import AudioClip, read_audio
from .audio_to_video import HeldSound, audio_latent_frames, encode_audio, in_region
from .keyframes import KeyframePipeline
from .tiled_encode import tiled_encode

VIDEO_FLAG, START_FLAG, END_FLAG = "--video", "--retake-start", "--retake-end"
SIDE_MULTIPLE, FRAME_MULTIPLE = 32, 8  # what ltx-pipelines' retake CLI asks of the source
WHOLE = (-math.inf, math.inf)  # the region of a source without sound: all of it generated


@dataclasses.dataclass(frozen=True)
class SourceShape:
    """The source video's stream: its size, frame count and rate, as ltx-pipelines' ``get_videostream_metadata``."""

    width: int
    height: int
    frames: int
    fps: float


@dataclasses.dataclass(frozen=True)
class Retake:
    """What a retake keeps and remakes: the source's ``frames`` (uint8 ``[F, H, W, 3]``), its ``sound`` (None: it
    has none) and the span ``[start, end)`` in seconds."""

    frames: torch.Tensor
    fps: float
    sound: AudioClip | None
    start: float
    end: float
    source: str

    @property
    def region(self) -> tuple[float, float]:
        return self.start, self.end


def probe_video(path: Path) -> SourceShape:
    """The shape of ``path``'s video stream, checked as ltx-pipelines' retake checks it (exit 3 naming the fix)."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{VIDEO_FLAG} {path} does not exist; pass the video to retake (mp4, mov, webm, ...)")
    try:
        with av.open(str(path)) as container:
            stream = next((stream for stream in container.streams if stream.type == "video"), None)
            if stream is None:
                raise InputError(f"{VIDEO_FLAG} {path} has no video stream; pass a video file")
            frames = stream.frames or sum(1 for _ in container.decode(stream))
            shape = SourceShape(
                stream.codec_context.width, stream.codec_context.height, frames, float(stream.average_rate)
            )
    except av.error.FFmpegError as err:
        raise InputError(f"{VIDEO_FLAG} {path} is not a readable video ({err}); pass an mp4, mov or webm") from None
    if (shape.frames - 1) % FRAME_MULTIPLE or shape.width % SIDE_MULTIPLE or shape.height % SIDE_MULTIPLE:
        frames = (shape.frames - 1) // FRAME_MULTIPLE * FRAME_MULTIPLE + 1
        width, height = (side // SIDE_MULTIPLE * SIDE_MULTIPLE for side in (shape.width, shape.height))
        raise InputError(
            f"{VIDEO_FLAG} {path} is {shape.width}x{shape.height}, {shape.frames} frames: a retake needs sides that "
            f"are multiples of {SIDE_MULTIPLE} and {FRAME_MULTIPLE}k+1 frames; cut it to {frames} frames and crop or "
            f"scale it to {width}x{height} first"
        )
    return shape


def check_span(start: float | None, end: float | None, shape: SourceShape, *, smoke: bool) -> tuple[float, float]:
    """``--retake-start`` and ``--retake-end`` (seconds): both given (``smoke``: the middle third by default), start
    before end, the span starting inside the video (exit 2)."""
    seconds = shape.frames / shape.fps
    if smoke and start is None and end is None:
        start, end = seconds / 3, 2 * seconds / 3
    if start is None or end is None:
        raise DeliveryError(f"the retake pipeline needs {START_FLAG} S and {END_FLAG} E (seconds)", ExitCode.USAGE)
    if not 0 <= start < end:
        raise DeliveryError(f"{START_FLAG} {start} {END_FLAG} {end}: need 0 <= start < end", ExitCode.USAGE)
    if start >= seconds:
        raise DeliveryError(
            f"{START_FLAG} {start}: the video lasts {seconds:.3f} s; start the retake before its end", ExitCode.USAGE
        )
    return start, end


def read_retake(path: Path, shape: SourceShape, start: float, end: float) -> Retake:
    """The source's frames and sound read as ltx-pipelines reads them (``decode_video_from_file`` and
    ``decode_audio_from_file`` from 0 for the video's duration); exit 3 naming the file when it fails."""
    seconds, frames = shape.frames / shape.fps, []
    try:
        with av.open(str(path)) as container:
            stream = next(stream for stream in container.streams if stream.type == "video")
            for index, frame in enumerate(container.decode(stream)):
                time = index / shape.fps if frame.pts is None else float(frame.pts * stream.time_base)
                if time >= seconds:
                    break
                if time >= 0:
                    frames.append(frame.to_rgb().to_ndarray())
    except av.error.FFmpegError as err:
        raise InputError(f"{VIDEO_FLAG} {path} could not be decoded ({err}); re-encode it (H.264 mp4)") from None
    if len(frames) != shape.frames:
        raise InputError(
            f"{VIDEO_FLAG} {path}: {len(frames)} of its {shape.frames} frames lie in its first {seconds:.3f} s; "
            "re-encode it with constant frame timing"
        )
    sound = read_audio(path, seconds, flag=VIDEO_FLAG, required=False)
    return Retake(torch.from_numpy(np.stack(frames)), shape.fps, sound, start, end, str(path))


class RetakePipeline(HeldSound, KeyframePipeline):
    """The keyframe pipeline given the source's latents, holding its video tokens outside ``video_region`` and its
    sound outside ``region`` (:class:`~sulphur2_npu.audio_to_video.HeldSound`)."""

    video_region: tuple[float, float] = WHOLE

    def _held_video_tokens(self, shape: tuple[int, ...], frame_rate: float, device: Any) -> torch.Tensor:
        coords = self.transformer.rope.prepare_video_coords(1, *shape[2:], device, fps=frame_rate)
        return 1.0 - in_region(coords[:, 0], self.video_region)[..., None]


def retake_pipeline(pipe: Any, retake: Retake) -> tuple[RetakePipeline, dict[str, torch.Tensor]]:
    """A :class:`RetakePipeline` on ``pipe``'s modules (no copy, its scheduler included) remaking ``retake``'s span,
    and its source arguments: ``latents`` (the frames encoded, un-normalised ``[1, C, f, h, w]``) and
    ``audio_latents`` (the sound encoded, cut or zero-padded to the video's audio length; zeros, all of them
    generated, for a source without sound)."""
    accepted = inspect.signature(RetakePipeline.__init__).parameters
    remake = RetakePipeline(**{name: part for name, part in pipe.components.items() if name in accepted})
    remake.set_progress_bar_config(**getattr(pipe, "_progress_bar_config", {}))
    vae, audio_vae = pipe.vae, pipe.audio_vae
    pixels = retake.frames.permute(3, 0, 1, 2).unsqueeze(0).float() / 127.5 - 1.0
    video = tiled_encode(vae, pixels)
    seconds = retake.frames.shape[0] / retake.fps
    length = audio_latent_frames(audio_vae, seconds)
    if retake.sound is None:
        bins = audio_vae.config.mel_bins // pipe.audio_vae_mel_compression_ratio
        audio = torch.zeros(1, audio_vae.config.latent_channels, length, bins, device=audio_vae.device)
    else:
        audio = encode_audio(pipe, retake.sound, seconds)
        audio = torch.nn.functional.pad(audio, (0, 0, 0, length - audio.shape[2]))
    remake.video_region = retake.region
    remake.region = retake.region if retake.sound is not None else WHOLE
    return remake, {"latents": video, "audio_latents": audio}
