"""Sulphur-2 behind OpenAI's videos API (``/v1/videos`` jobs, as sglang-diffusion and vLLM-Omni serve it), through
``deliverykit.server``.

A request is checked as a ``--batch`` line is (:func:`~sulphur2_npu.request.build_request`: a size the VAE cannot make
is a 400 naming the nearest valid values; the ``input_reference`` image read now, so a bomb or a non-image is a 400),
queued as a job, and made by a worker's :class:`~sulphur2_npu.session.Session` as ``inference.py --output video.mp4``
makes it: the mp4 with its audio, the first and last frames and ``report.json`` together. ``seconds`` with ``fps`` gives
the frame count (``seconds * fps + 1``; ``num_frames`` wins when both are given). A server started with ``--pipeline
keyframes`` takes ``keyframes``, the ``--keyframe`` values with each image inline as a data URL
(``data:image/png;base64,...:FRAME[:STRENGTH]``: the server reads no file a client names), one started with ``--pipeline
a2v`` the sound track as ``audio`` (``data:audio/wav;base64,...``), one started with ``--pipeline retake`` the source as
``video`` (``data:video/mp4;base64,...``) with ``retake_start`` and ``retake_end``; they are checked when the job is
accepted and kept in its folder. FastAPI is imported with this module: ``serve.py`` imports it once its flags are
checked.
"""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path
from typing import Any

from deliverykit.distributed import DistributedContext
from deliverykit.errors import DeliveryError
from deliverykit.jobs import Job
from deliverykit.server import ApiError, JobRoutes, Service, base64_bytes, form_value, parse_size, read_upload

from . import MODEL_ID
from .keyframes import KEYFRAME_FLAG, parse_keyframe
from .request import BATCH_FIELDS, build_request
from .schedules import ScheduleChoice

KIND = "video"
DEFAULT_FPS, DEFAULT_SEED = 24, 42  # inference.py's --fps and --seed defaults
IMAGE_INPUT = "input_reference"  # the job folder's copy of the uploaded first frame
VIDEO = "video/video.mp4"
FIRST_FRAME = "video/video_first.png"
# Fields of OpenAI's body (``input_reference`` is the file) and the delivery's own, as extra body fields.
OPENAI_FIELDS = ("prompt", "model", "seconds", "size")
KEYFRAME_INPUT = "keyframe_{}"  # the job folder's copy of keyframe i
KEYFRAME_FORM = "data:image/png;base64,...:FRAME[:STRENGTH]"
AUDIO_INPUT = "audio"  # the job folder's copy of the a2v sound track
AUDIO_FORM = "data:audio/wav;base64,..."
VIDEO_INPUT = "source_video"  # the job folder's copy of the retake's source
VIDEO_FORM = "data:video/mp4;base64,..."
EXTRA_FIELDS = tuple(name for name in BATCH_FIELDS if name not in ("prompt", "image", "width", "height"))


def service(args: argparse.Namespace, schedule: ScheduleChoice) -> Service:
    """The videos API over the model of ``args`` (checked by ``serve.py``); each device loads its own session."""
    smoke, files = bool(args.smoke), []

    def load(device_spec: str | None, stack: contextlib.ExitStack) -> Any:
        from deliverykit.device import resolve_device

        from .generate import ModelFiles
        from .memory import plan_keeping_text_encoder
        from .parallel import parse_parallel
        from .session import Session

        device = resolve_device(device_spec)
        args.memory, note = plan_keeping_text_encoder(args.memory, device, "the server")
        if note:
            print(note, flush=True)
        if not files:  # written (--smoke) or named once, shared by every device's session
            files.append(ModelFiles.from_args(args, stack))
        context = DistributedContext(0, 1, 0, device, None)
        spec = parse_parallel(None, 1)  # one card per session: the server's parallelism is one job per device
        session = Session.load(args, files[0], context, stack, spec=spec, schedule=schedule, image_to_video=True)
        session.place()
        return session

    def run(session: Any, job: Job, folder: Path) -> dict[str, Any]:
        from .request import with_inputs
        from .session import Request, video_outputs

        fields = job.request["fields"]
        if fields.get("video"):  # the retake's source, probed again where the job keeps it
            fields = {**fields, "video": str(folder / VIDEO_INPUT)}
        call = build_request(fields, smoke=smoke, schedule=schedule)
        image = job.request["image"]
        # the inputs kept in the job's folder: "keyframe_<i>:FRAME:STRENGTH" and the sound track's "audio"
        keyframes = [str(folder / spec) for spec in fields.get("keyframes") or ()]
        audio = str(folder / AUDIO_INPUT) if fields.get("audio") else None
        image_file = str(folder / IMAGE_INPUT) if image is not None else None
        span = (fields["retake_start"], fields["retake_end"])
        call = with_inputs(call, image_file, keyframes, audio, fields.get("video"), smoke=smoke, span=span)
        request = session.encode_ahead(Request(call, fields["seed"], image, fields["preset"]))
        result = session.run(request)
        session.write(result, video_outputs(folder / VIDEO))
        timings = result.last.timings
        stages_ms = {"prepare": timings.prepare_ms, "denoise": timings.denoise_ms, "decode": timings.decode_ms}
        return {"stages_s": {stage: ms / 1000.0 for stage, ms in stages_ms.items()}}

    def accept(fields: dict[str, Any], files_in: dict[str, bytes]) -> tuple[dict[str, Any], dict[str, bytes]]:
        return video_job(fields, files_in, smoke=smoke, schedule=schedule)

    def describe(job: Job) -> dict[str, Any]:
        shown = job.request["shown"]
        return {"prompt": job.request["fields"]["prompt"], "size": shown["size"], "seconds": shown["seconds"]}

    def routes(api: Any) -> None:
        variants = {"video": (VIDEO, "video/mp4"), "thumbnail": (FIRST_FRAME, "image/png")}
        JobRoutes("/v1/videos", KIND, accept, describe, variants).add_to(api)

    return Service(MODEL_ID, (KIND,), load, run, routes)


def video_job(
    fields: dict[str, Any], files: dict[str, bytes], *, smoke: bool, schedule: ScheduleChoice
) -> tuple[dict[str, Any], dict[str, bytes]]:
    """``(stored request, input files)`` of a body, refused (400, the CLI's message) before it is queued."""
    unknown = sorted(set(fields) - set(OPENAI_FIELDS) - set(EXTRA_FIELDS))
    if unknown:
        accepted = ", ".join((*OPENAI_FIELDS, IMAGE_INPUT, *EXTRA_FIELDS))
        raise ApiError(400, f"unknown field {unknown[0]!r}; accepted: {accepted}", param=unknown[0])
    prompt = fields.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise ApiError(400, "prompt is required: describe the video to make", param="prompt")
    inline = ("keyframes", "audio", "video")
    typed = {name: form_value(fields, name, BATCH_FIELDS[name]) for name in EXTRA_FIELDS if name not in inline}
    typed["keyframes"], keyframes = _inline_keyframes(fields.get("keyframes"))
    sound, video = (
        _inline_file(fields.get("audio"), "audio", AUDIO_FORM),
        _inline_file(fields.get("video"), "video", VIDEO_FORM),
    )
    typed["audio"] = AUDIO_INPUT if sound is not None else None
    typed["video"] = VIDEO_INPUT if video is not None else None
    image = files.get(IMAGE_INPUT)
    if keyframes and image is not None:
        raise ApiError(
            400, f"{IMAGE_INPUT} is image → video's first frame; with keyframes give it as a keyframe at frame 0",
            param=IMAGE_INPUT,
        )  # fmt: skip
    typed |= {"prompt": prompt, "fps": typed["fps"] or DEFAULT_FPS}
    typed["seed"] = DEFAULT_SEED if typed["seed"] is None else typed["seed"]
    size = parse_size(fields.get("size"))
    if size is not None:
        typed["width"], typed["height"] = size
    seconds = form_value(fields, "seconds", float)
    if seconds is not None and typed["num_frames"] is None:
        typed["num_frames"] = round(seconds * typed["fps"]) + 1
    if video is None:
        call = build_request(typed, smoke=smoke, schedule=schedule)
    else:  # the retake's size and span checks read the source
        call = read_upload(
            video, "video", lambda path: build_request({**typed, "video": str(path)}, smoke=smoke, schedule=schedule)
        )
    from .video_io import read_image

    if image is not None:
        read_upload(image, IMAGE_INPUT, read_image)
    for index, data in enumerate(keyframes.values()):
        read_upload(data, f"keyframes[{index}]", lambda path: read_image(path, flag=KEYFRAME_FLAG))
    inputs = keyframes | ({IMAGE_INPUT: image} if image is not None else {})
    if sound is not None:
        from .audio_io import read_audio

        read_upload(sound, "audio", lambda path: read_audio(path, call.num_frames / call.fps))
        inputs[AUDIO_INPUT] = sound
    if video is not None:
        inputs[VIDEO_INPUT] = video
    shown = {"size": f"{call.width}x{call.height}", "seconds": f"{(call.num_frames - 1) / call.fps:g}"}
    request = {"fields": typed, "image": None if image is None else "input_reference (upload)", "shown": shown}
    return request, inputs


def _inline_keyframes(value: Any) -> tuple[list[str], dict[str, bytes]]:
    """``keyframes`` given as ``--keyframe`` values with data-URL images: the values naming the job folder's copies
    (``keyframe_<i>:FRAME:STRENGTH``) and those copies' bytes; a 400 naming the entry otherwise."""
    if value is None or value == "":
        return [], {}
    specs = [value] if isinstance(value, str) else value
    if not isinstance(specs, list) or not all(isinstance(spec, str) for spec in specs):
        raise ApiError(400, f"keyframes must be a list of {KEYFRAME_FORM} strings", param="keyframes")
    named, images = [], {}
    for index, spec in enumerate(specs):
        try:
            url, frame, strength = parse_keyframe(spec)
        except DeliveryError:
            raise ApiError(400, f"keyframes[{index}]: expected {KEYFRAME_FORM}", param="keyframes") from None
        name = KEYFRAME_INPUT.format(index)
        named.append(f"{name}:{frame}:{strength}")
        images[name] = base64_bytes(url, f"keyframes[{index}]", data_url=KEYFRAME_FORM, param="keyframes")
    return named, images


def _inline_file(value: Any, name: str, form: str) -> bytes | None:
    """Field ``name`` given as a data URL (``form``): the file's bytes; a 400 otherwise."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ApiError(400, f"{name} must be a {form} string", param=name)
    return base64_bytes(value, name, data_url=form)
