#!/usr/bin/env python3
"""URSA-1.7B-IBQ512 text → image in the browser: a Gradio app over the same steps as ``inference.py``.

    python ursa-npu/app.py --upstream ~/src/URSA --weights ~/weights/URSA-1.7B-IBQ512     # prints URL=http://...
    python ursa-npu/app.py --upstream ~/src/URSA --smoke --device cpu                 # tiny random model
    python ursa-npu/app.py ... --host 0.0.0.0 --port 7860                               # reachable from elsewhere

The model loads once, before the page is served, with the same checks, ``error:`` lines and exit codes as
``inference.py`` (3 upstream checkout, 4 weights, 5 device, 6 port in use). Requests run one at a time; each writes
``<--output>/<time>-<id>/image.jpg`` and its ``report.json`` together, or nothing. A bad input (a size the VQ model
cannot make, an empty prompt) is a message on the page.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import TYPE_CHECKING

from deliverykit import app
from deliverykit.errors import InputError, run_main
from ursa_npu import options
from ursa_npu.generate import ImageRequest
from ursa_npu.loader import ModelSource
from ursa_npu.options import SMOKE_PROMPT
from ursa_npu.session import Session, image_outputs

if TYPE_CHECKING:
    import gradio as gr


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    options.add_model_args(parser)
    app.add_app_args(parser)
    args = parser.parse_args(app.app_argv(argv))
    options.check_model_args(parser, args)
    return args


def build_demo(session: Session, output_root: str) -> gr.Blocks:
    """The page: prompt and settings in, the image out; every request through the session."""
    import gradio as gr  # after the arguments are parsed: --help and a usage error answer at once

    model = session.source
    default = session.default_request(SMOKE_PROMPT if model.args.smoke else "")
    session.pipe.set_progress_bar_config(disable=False)  # gr.Progress(track_tqdm=True) follows the steps
    progress_tracker = gr.Progress(track_tqdm=True)  # gradio injects the request's tracker through this default

    @app.shown_on_page
    def run(prompt, negative_prompt, width, height, steps, guidance, seed, progress=progress_tracker):
        if not prompt.strip():
            raise InputError("the prompt is empty; describe the image to make")
        request = ImageRequest(prompt, negative_prompt, int(seed), int(steps), float(guidance), int(height), int(width))
        session.check(request)
        files = image_outputs(app.request_folder(output_root) / "image.jpg")
        session.write(session.run(request), files)
        return str(files["image"]), str(files.reports[0])

    weights = "random weights (smoke model)" if session.random_weights else model.args.weights
    with gr.Blocks(title="URSA-1.7B-IBQ512 on Ascend NPU") as demo:
        gr.Markdown(f"## URSA-1.7B-IBQ512 text → image\nDevice `{session.device}`, {session.dtype_name}, {weights}.")
        with gr.Row():
            with gr.Column():
                prompt = gr.Textbox(label="Prompt", value=default.prompt, lines=2, elem_id="prompt")
                negative = gr.Textbox(label="Negative prompt", value=default.negative_prompt, elem_id="negative")
                with gr.Row():
                    width = gr.Number(
                        label="Width", value=default.width, precision=0, step=model.stride, elem_id="width"
                    )
                    height = gr.Number(label="Height", value=default.height, precision=0, step=model.stride)
                with gr.Row():
                    steps = gr.Slider(1, 100, value=default.steps, step=1, label="Steps")
                    guidance = gr.Slider(0, 15, value=default.guidance, step=0.5, label="Guidance")
                    seed = gr.Number(label="Seed", value=default.seed, precision=0)
                button = gr.Button("Generate", variant="primary", elem_id="generate")
            with gr.Column():
                image = gr.Image(label="Image", type="filepath", format="jpeg", height=384, elem_id="image")
                report = gr.File(label="report.json", elem_id="report")
        button.click(run, [prompt, negative, width, height, steps, guidance, seed], [image, report])
    return demo


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    model = ModelSource.check(args)
    with contextlib.ExitStack() as stack:
        session = Session.load(model, stack, args.device)
        return app.serve(build_demo(session, args.output), args)


if __name__ == "__main__":
    sys.exit(run_main(main))
