#!/usr/bin/env python3
"""Sulphur-2-base (LTX-2.3) text/image → video with audio in the browser: a Gradio app over ``inference.py``'s steps.

    python sulphur2-npu/app.py --model sulphur_distil_bf16.safetensors --text-encoder gemma-3-12b   # URL=http://...
    python sulphur2-npu/app.py --smoke --device cpu                                                 # tiny random model

The model loads once, before the page is served, with the same checks, ``error:`` lines and exit codes as
``inference.py`` (2 usage, 3 text encoder / LoRA, 4 checkpoint, 5 device, 6 port in use). Gemma-3 stays loaded for
every request, so a memory plan that frees it after one prompt is replaced by ``model-offload`` under ``--memory
auto`` (and refused when asked for by name). The schedule and a LoRA are chosen at start (``--schedule``, ``--lora``):
both change the loaded model. Started with ``--pipeline keyframes``, the page takes keyframe images and their frames
(``FRAME[:STRENGTH]`` each, in upload order); with ``--pipeline a2v``, a sound track (``--smoke``: the test tone when
none is given); with ``--pipeline retake``, the video to retake and the span (``--smoke``: a made-up clip when none is
given; the size fields are the source's then). Requests run one at a time; each writes ``<--output>/<time>-<id>/`` with
``video.mp4`` (H.264 + AAC), its first and last frames and ``report.json`` together, or nothing. A bad input (a size
the VAE cannot make, an unreadable image) is a message on the page.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from deliverykit import app
from deliverykit.errors import InputError, run_main
from sulphur2_npu.options import add_load_args, check_load_args

if TYPE_CHECKING:
    import gradio as gr

    from sulphur2_npu.session import Session

DEFAULT_PRESET_CHOICE = "default"  # the tiny model's size with --smoke, else the delivery's default preset


def keyframe_specs(images: list[str] | None, frames: str) -> list[str]:
    """The page's keyframe images and its ``FRAME[:STRENGTH], ...`` field as ``--keyframe`` values, paired in order."""
    images = list(images or ())
    given = [part.strip() for part in frames.split(",") if part.strip()]
    if len(given) != len(images):
        raise InputError(
            f"{len(images)} keyframe image(s) but {len(given)} frame(s); give one FRAME[:STRENGTH] per image, in "
            "upload order (e.g. 0, 120:0.9)"
        )
    return [f"{image}:{spec}" for image, spec in zip(images, given, strict=True)]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], conflict_handler="resolve")
    add_load_args(parser)
    app.add_app_args(parser)
    args = parser.parse_args(app.app_argv(argv))
    check_load_args(parser, args, prompts=True)
    return args


def build_demo(args: argparse.Namespace, session: Session) -> gr.Blocks:
    """The page: prompt, optional first frame and settings in; the mp4 with its audio out, through the session."""
    import gradio as gr  # after the arguments are parsed: --help and a usage error answer at once

    from sulphur2_npu import tiny
    from sulphur2_npu.options import A2V, DEV, KEYFRAMES, ONE_STAGE, RETAKE
    from sulphur2_npu.presets import PRESETS
    from sulphur2_npu.request import build_request, with_inputs
    from sulphur2_npu.session import Request, video_outputs

    schedule, prepared = session.schedule, session.prepared
    smoke, dev = bool(args.smoke), schedule.name == DEV
    progress_tracker = gr.Progress(track_tqdm=True)  # gradio injects the request's tracker through this default

    @app.shown_on_page
    def run(
        prompt,
        negative,
        image,
        preset,
        width,
        height,
        frames,
        steps,
        guidance,
        seed,
        pipeline,
        keyframe_images,
        keyframe_frames,
        sound,
        source,
        span_start,
        span_end,
        progress=progress_tracker,
    ):
        if not prompt.strip():
            raise InputError("the prompt is empty; describe the video to make")
        fields = {"prompt": prompt, "negative_prompt": negative, "fps": 24, "width": width, "height": height}
        fields |= {"preset": None if preset == DEFAULT_PRESET_CHOICE else preset, "num_frames": frames}
        fields["pipeline"] = pipeline
        if dev:  # the distilled schedule has fixed sigmas and no guidance
            fields |= {"steps": steps, "guidance": guidance}
        fields = {
            name: int(value) if isinstance(value, float) and name != "guidance" else value
            for name, value in fields.items()
        }
        if pipeline == KEYFRAMES:
            fields["keyframes"] = keyframe_specs(keyframe_images, keyframe_frames)
        sound = sound if pipeline == A2V else None
        if pipeline == RETAKE:  # the source's size, length and rate
            fields |= {"preset": None, "width": None, "height": None, "num_frames": None, "video": source}
            fields |= {"retake_start": span_start, "retake_end": span_end}
        call = build_request({**fields, "audio": sound}, smoke=smoke, schedule=schedule)
        span = (fields.get("retake_start"), fields.get("retake_end"))
        call = with_inputs(call, image, fields.get("keyframes"), sound, fields.get("video"), smoke=smoke, span=span)
        files = video_outputs(app.request_folder(args.output) / "video.mp4")
        request = session.encode_ahead(Request(call, int(seed), image, preset))
        session.write(session.run(request), files)
        return str(files["video"]), str(files.reports[0])

    # the page's defaults (the keyframes pipeline checks for a keyframe, so it gets one that is never read; a retake
    # takes its size from the source, so the size fields start at one call's)
    placeholder = {"keyframes": ["first.png:0"]} if schedule.pipeline == KEYFRAMES else {}
    placeholder |= {"pipeline": ONE_STAGE} if schedule.pipeline == RETAKE else {}
    default = build_request({"fps": 24, **placeholder}, smoke=smoke, schedule=schedule)
    weights = "random weights (smoke model)" if smoke else Path(args.weights).name
    where = (
        f"Device `{prepared.device}`, {prepared.dtype_name}, {weights}; {schedule.pipeline} pipeline "
        f"({schedule.pipeline_why}), schedule {schedule.name}, "
        f"memory plan {prepared.plan.name}" + (f", LoRA {Path(args.lora).name}" if args.lora else "") + "."
    )
    with gr.Blocks(title="Sulphur-2 on Ascend NPU") as demo:
        gr.Markdown(f"## Sulphur-2-base (LTX-2.3) text/image → video + audio\n{where}")
        with gr.Row():
            with gr.Column():
                prompt = gr.Textbox(
                    label="Prompt", value=tiny.TINY_CALL["prompt"] if smoke else "", lines=3, elem_id="prompt"
                )
                negative = gr.Textbox(label="Negative prompt", value=default.negative_prompt)
                image = gr.Image(
                    label="First frame (optional: image → video)", type="filepath", height=180, elem_id="first"
                )
                preset = gr.Dropdown([DEFAULT_PRESET_CHOICE, *PRESETS], value=DEFAULT_PRESET_CHOICE, label="Preset")
                with gr.Row():
                    width = gr.Number(label="Width", value=default.width, precision=0, step=32, elem_id="width")
                    height = gr.Number(label="Height", value=default.height, precision=0, step=32)
                    frames = gr.Number(label="Frames (8k+1)", value=default.num_frames, precision=0, step=8)
                with gr.Row():
                    steps = gr.Slider(2, 60, value=default.steps, step=1, label="Steps", interactive=dev)
                    guidance = gr.Slider(1, 10, value=default.guidance, step=0.5, label="Guidance", interactive=dev)
                    seed = gr.Number(label="Seed", value=42, precision=0)
                # the loaded pipeline, or one call at full size on the same weights (ltx-pipelines' names)
                pipelines = list(dict.fromkeys([schedule.pipeline, ONE_STAGE]))
                pipeline = gr.Dropdown(pipelines, value=schedule.pipeline, label="Pipeline", elem_id="pipeline")
                with gr.Row(visible=schedule.pipeline == KEYFRAMES):
                    keyframe_images = gr.File(
                        label="Keyframe images", file_count="multiple", file_types=["image"], elem_id="keyframes"
                    )
                    keyframe_frames = gr.Textbox(
                        label="Their frames: FRAME[:STRENGTH], ...", placeholder="0, 120:0.9", elem_id="frames"
                    )
                sound = gr.Audio(
                    label="Sound track (the video follows it and keeps it)", type="filepath",
                    visible=schedule.pipeline == A2V, elem_id="sound",
                )  # fmt: skip
                with gr.Row(visible=schedule.pipeline == RETAKE):
                    source = gr.Video(label="Video to retake (8k+1 frames, sides multiples of 32)", elem_id="source")
                    span_start = gr.Number(label="Retake from (s)", value=0.1, elem_id="span-start")
                    span_end = gr.Number(label="to (s)", value=0.25, elem_id="span-end")
                button = gr.Button("Generate", variant="primary", elem_id="generate")
            with gr.Column():
                video = gr.Video(label="Video with audio", elem_id="video")
                report_file = gr.File(label="report.json", elem_id="report")
        inputs = [prompt, negative, image, preset, width, height, frames, steps, guidance, seed, pipeline]
        inputs += [keyframe_images, keyframe_frames, sound, source, span_start, span_end]
        button.click(run, inputs, [video, report_file])
    return demo


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # after the parse, so that --help and a usage error answer without importing torch and diffusers
    from deliverykit.device import resolve_device
    from deliverykit.distributed import destroy_distributed, init_distributed
    from sulphur2_npu import stages
    from sulphur2_npu.generate import ModelFiles
    from sulphur2_npu.loader import text_to_video_twin
    from sulphur2_npu.memory import plan_keeping_text_encoder
    from sulphur2_npu.parallel import parse_parallel
    from sulphur2_npu.session import Session

    schedule = stages.choose_from_args(args)
    args.memory, note = plan_keeping_text_encoder(args.memory, resolve_device(args.device), "the web demo")
    if note:
        print(note, flush=True)
    with contextlib.ExitStack() as stack:
        files = ModelFiles.from_args(args, stack)
        context = init_distributed(args.device)  # one process, one device
        stack.callback(destroy_distributed, context)
        spec = parse_parallel(None, 1)
        session = Session.load(args, files, context, stack, spec=spec, schedule=schedule, image_to_video=True)
        session.place()
        prepared = session.prepared
        prepared.text_to_video = text_to_video_twin(prepared.pipe)  # text-only requests: the same modules
        for pipe in (prepared.pipe, prepared.text_to_video):
            pipe.set_progress_bar_config(disable=False)  # gr.Progress(track_tqdm=True) follows the steps
        return app.serve(build_demo(args, session), args)


if __name__ == "__main__":
    sys.exit(run_main(main))
