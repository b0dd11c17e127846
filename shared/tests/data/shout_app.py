"""A tiny app on deliverykit.app, for the shared tests."""

import argparse
import sys

import gradio as gr

from deliverykit import app
from deliverykit.errors import InputError, run_main
from deliverykit.files import Outputs

PROGRESS = gr.Progress()  # gradio injects the request's progress tracker through this default


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    app.add_app_args(parser)
    args = parser.parse_args(argv)

    @app.shown_on_page
    def shout(text: str, progress=PROGRESS) -> str:
        if not text.strip():
            raise InputError("the text is empty; type something")
        update = app.step_progress(progress, 3)
        for step in range(1, 4):
            update(step)
        outputs = Outputs()
        path = outputs.add(app.request_folder(args.output) / "shout.txt")
        outputs.check()
        with outputs.commit() as temps:
            temps[path].write_text(text.upper())
        return str(path)

    with gr.Blocks(title="shout") as demo:
        text = gr.Textbox(label="Text", value="hello", elem_id="text")
        button = gr.Button("Run", elem_id="run")
        result = gr.File(label="Result", elem_id="result")
        button.click(shout, inputs=text, outputs=result)
    return app.serve(demo, args)


if __name__ == "__main__":
    sys.exit(run_main(main))
