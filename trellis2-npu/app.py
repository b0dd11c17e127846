#!/usr/bin/env python3
"""TRELLIS.2-4B in the browser: a Gradio app over the same steps as ``inference.py``, on two tabs, "Image to 3D"
(image → textured asset) and "Texture a mesh" (``inference.py --mesh``: an existing mesh + an image → PBR GLB).

    python trellis2-npu/app.py --upstream ~/src/TRELLIS.2 --weights ~/weights/TRELLIS.2-4B      # prints URL=http://...
    python trellis2-npu/app.py --upstream ~/src/TRELLIS.2 --smoke --device cpu              # tiny random models

Both pipelines load once, before the page is served, with the same checks, ``error:`` lines and exit codes as
``inference.py`` (2 usage, 3 upstream checkout, 4 weights, 5 device, 6 port in use); the texturing one when the
weights folder has ``texturing_pipeline.json`` (with ``--smoke``, the tiny texturing models). Without it the tab says
so, naming the download, and image → 3D serves alone. ``--memory`` places the image → 3D models (every model on the
device, or only the running stage's), the texturing ones keep upstream's ``low_vram`` (only the model in use on the
device), and both tabs' requests queue as one, one at a time (README, "Web demo": memory). Each request writes
``<--output>/<time>-<id>/``: image → 3D ``asset.glb``, ``preview.png``, ``preview.mp4`` (``--preview-frames``, 0:
none), ``mesh.ply``, ``voxels.safetensors`` and ``report.json``; texturing the same without ``mesh.ply``; together,
or nothing. The GLB is shown in a 3D viewer, beside it the mesh QA panel of its export (faces and the face budget,
boundary and non-manifold edges, components, watertight, genus, texture coverage: ``report.json``'s
``results.glb``, :func:`trellis2_npu.page.qa_panel`), below it its preview and turntable video. The export flags
(``--faces``, ``--texture-size``, ``--remesh``/``--no-remesh``, on as in ``inference.py``, ``--preview-frames``...)
set the page's defaults; the texturing tab has no face budget (it keeps the given mesh). A bad input (no image or
mesh; an image whose alpha is empty; an unreadable mesh; an RGB photo when no background-removal model is available,
unless "Use the image whole" (``--no-rembg``) is ticked) is a one-line message on the page, with ``inference.py``'s
text (:mod:`trellis2_npu.page`). ``--rembg-model`` as in ``inference.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from deliverykit import app
from deliverykit.cli import add_model_args
from deliverykit.errors import run_main
from trellis2_npu.options import add_export_args, add_memory_args, add_rembg_args

if TYPE_CHECKING:
    import gradio as gr

    from trellis2_npu.session import Session, TexturingSession

TEXTURE_SIZES = (512, 1024, 2048, 4096)
DEVICE_QUEUE = "device"  # both tabs' requests: one concurrency group, so one request at a time on the card


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_args(parser, smoke_choices=("tiny",))
    parser.add_argument("--upstream", help="patched TRELLIS.2 checkout (default: $TRELLIS2_SRC)")
    add_memory_args(parser)
    add_rembg_args(parser)  # --no-rembg: the page's "use the image whole" checkbox starts ticked
    add_export_args(parser)
    app.add_app_args(parser)
    args = parser.parse_args(app.app_argv(argv))
    if not args.weights and not args.smoke:
        parser.error("pass --weights DIR (downloaded TRELLIS.2-4B folder) or --smoke tiny")
    if args.weights and args.smoke:
        parser.error("--weights and --smoke exclude each other")
    if args.no_rembg and args.rembg_model:
        parser.error("--no-rembg and --rembg-model exclude each other")
    if args.dtype != "fp32":
        parser.error("--dtype: the full pipeline runs in the checkpoints' own dtypes; pass --dtype fp32")
    args.pipeline, args.steps = None, None  # chosen on the page, per request
    return args


def build_demo(
    args: argparse.Namespace,
    session: Session,
    example: str | None,
    rembg_unavailable: str | None = None,
    textures: TexturingSession | None = None,
    texturing_unavailable: str | None = None,
    example_mesh: str | None = None,
) -> gr.Blocks:
    """The page, two tabs. "Image to 3D": an image and settings in; the GLB in a 3D viewer, its preview (picture and
    video) and the files out. "Texture a mesh": a mesh, an image and settings in; the same out.

    ``rembg_unavailable``: why an image without alpha cannot have its background removed (None: it can), shown on
    the page for such an upload unless "use the image whole" is ticked. ``textures``: the texturing pipeline, or None
    with ``texturing_unavailable`` saying why (shown on its tab). Both tabs' requests queue as one: one at a time on
    the device."""
    import gradio as gr  # after the arguments are parsed: --help and a usage error answer at once

    from trellis2_npu import generate, image, page
    from trellis2_npu.geometry import mesh_io
    from trellis2_npu.geometry.mesh_repair import FACE_BUDGET_TOLERANCE
    from trellis2_npu.session import PREVIEW_VIDEO, asset_outputs

    tracker = gr.Progress(track_tqdm=True)  # gradio injects the request's tracker through this default

    def shown(files: dict, stats: dict) -> tuple:
        """The outputs of either tab: the GLB, its previews, the downloads and the QA panel of its export's stats."""
        video = str(files[PREVIEW_VIDEO]) if PREVIEW_VIDEO in files else None
        downloads = [str(files[name]) for name in ("asset.glb", "mesh.ply") if name in files]
        return str(files["asset.glb"]), page.qa_panel(stats), str(files["preview.png"]), video, downloads

    @app.shown_on_page
    def run(path, pipeline_type, steps, seed, decimation_target, texture_size, remesh, whole, progress=tracker):
        page.check_image(path, whole, rembg_unavailable)
        options = dataclasses.replace(session.export_options, decimation_target=int(decimation_target),
                                      texture_size=int(texture_size), remesh=bool(remesh))  # fmt: skip
        options.check()
        picture = image.pipeline_input(image.load_image(path), remove_background=not whole)
        request = session.request(picture, Path(path).name, int(seed), int(steps), pipeline_type=pipeline_type,
                                  options=options)  # fmt: skip
        progress(0, desc="image → mesh → GLB")
        files = asset_outputs(app.request_folder(args.output), video=session.preview_frames > 0)
        asset = session.run(request)
        session.write(asset, files)
        return shown(files.files, asset.exported.stats)

    @app.shown_on_page
    def texture_mesh(mesh, path, resolution, steps, seed, texture_size, whole, progress=tracker):
        progress(0, desc="mesh + image → textured GLB")
        upload = page.TextureUpload(mesh, path, int(resolution), int(texture_size), int(steps), int(seed), whole)
        return shown(*page.texture_request(textures, args.output, upload, rembg_unavailable=rembg_unavailable,
                                           unavailable=texturing_unavailable))  # fmt: skip

    def outputs(prefix: str) -> list:
        with gr.Row():  # the GLB and, beside it, the QA figures its export measured
            model = gr.Model3D(label="asset.glb", elem_id=f"{prefix}model", height=360, scale=2)
            qa = gr.Markdown(elem_id=f"{prefix}qa")
        with gr.Row():
            preview = gr.Image(label="preview.png", type="filepath", height=300, elem_id=f"{prefix}preview")
            video = gr.Video(label="preview.mp4", height=300, autoplay=True, loop=True, elem_id=f"{prefix}video")
        return [model, qa, preview, video, gr.File(label="Downloads", file_count="multiple", elem_id=f"{prefix}files")]

    weights = "random weights (tiny smoke models)" if args.smoke else args.weights
    steps_default = session.default_steps or 12
    whole_label = "Use the image whole (no background removal)"
    faces_label = f"Faces (--faces; ±{100 * FACE_BUDGET_TOLERANCE:g} % with remesh)"
    with gr.Blocks(title="TRELLIS.2-4B on Ascend NPU") as demo:
        gr.Markdown(f"## TRELLIS.2-4B on Ascend NPU\nDevice `{session.device}`, {weights}.")
        with gr.Tabs():
            with gr.Tab("Image to 3D", elem_id="image-to-3d"), gr.Row():
                with gr.Column():
                    picture = gr.Image(label="Image", type="filepath", image_mode=None, value=example, height=280,
                                       elem_id="image")  # fmt: skip
                    pipeline_type = gr.Dropdown(list(generate.PIPELINE_TYPES), value=session.pipeline_type,
                                                label="Pipeline")  # fmt: skip
                    with gr.Row():
                        steps = gr.Slider(1, 50, value=steps_default, step=1, label="Steps per flow stage")
                        seed = gr.Number(label="Seed", value=42, precision=0)
                    with gr.Row():
                        decimation = gr.Number(label=faces_label, precision=0, elem_id="decimation",
                                               value=session.export_options.decimation_target)  # fmt: skip
                        texture = gr.Dropdown(list(TEXTURE_SIZES), value=session.export_options.texture_size,
                                              label="Texture size")  # fmt: skip
                        remesh = gr.Checkbox(value=session.export_options.remesh, elem_id="remesh",
                                             label="Remesh (--remesh; closed, single-sided)")  # fmt: skip
                    whole = gr.Checkbox(value=args.no_rembg, label=whole_label, elem_id="whole")
                    button = gr.Button("Generate", variant="primary", elem_id="generate")
                with gr.Column():
                    shown_image = outputs("")
            with gr.Tab("Texture a mesh", elem_id="texture-a-mesh"), gr.Row():
                with gr.Column():
                    if texturing_unavailable:
                        gr.Markdown(f"**No texturing pipeline loaded.** {texturing_unavailable}", elem_id="tex-note")
                    mesh = gr.File(label="Mesh (.glb, .gltf, .obj, .ply)", file_types=list(mesh_io.MESH_FORMATS),
                                   type="filepath", value=example_mesh, elem_id="tex-mesh")  # fmt: skip
                    tex_picture = gr.Image(label="Image", type="filepath", image_mode=None, value=example, height=280,
                                           elem_id="tex-image")  # fmt: skip
                    grids = [generate.SMOKE_RESOLUTION] * bool(args.smoke) + list(generate.RESOLUTIONS)
                    grid = textures.resolution if textures else generate.DEFAULT_RESOLUTION
                    resolution = gr.Radio(grids, value=grid, label="Resolution (voxel grid)", elem_id="tex-grid")
                    with gr.Row():
                        tex_steps = gr.Slider(1, 50, value=steps_default, step=1, label="Steps (texture flow)")
                        tex_seed = gr.Number(label="Seed", value=42, precision=0)
                        tex_size = gr.Dropdown(list(TEXTURE_SIZES), value=args.texture_size, label="Texture size",
                                               elem_id="tex-size")  # fmt: skip
                    tex_whole = gr.Checkbox(value=args.no_rembg, label=whole_label, elem_id="tex-whole")
                    tex_button = gr.Button("Texture", variant="primary", elem_id="tex-generate",
                                           interactive=textures is not None)  # fmt: skip
                with gr.Column():
                    shown_texture = outputs("tex-")
        inputs = [picture, pipeline_type, steps, seed, decimation, texture, remesh, whole]
        button.click(run, inputs, shown_image, concurrency_id=DEVICE_QUEUE)
        tex_inputs = [mesh, tex_picture, resolution, tex_steps, tex_seed, tex_size, tex_whole]
        tex_button.click(texture_mesh, tex_inputs, shown_texture, concurrency_id=DEVICE_QUEUE)
    return demo


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # after the parse, so that --help and a usage error answer without importing torch
    from deliverykit.device import resolve_device
    from trellis2_npu import generate, page, tiny
    from trellis2_npu.geometry import turntable
    from trellis2_npu.options import export_options
    from trellis2_npu.session import Checked, Session, TexturingSession

    export_options(args).check()
    turntable.check_preview_frames(args.preview_frames)
    device = resolve_device(args.device)
    # inference.py's checks, before serving; no background-removal model is the message an RGB upload gets on the page
    checked = Checked.before_serving(args)
    # No texturing_pipeline.json: the "Texture a mesh" tab says so (naming the download); image → 3D still serves.
    texturing_unavailable = None if args.smoke else page.texturing_unavailable(args.weights)
    with contextlib.ExitStack() as stack:
        session = Session.load(args, stack, device, checked)
        # Both pipelines load at start-up, as inference.py loads each; the texturing one keeps upstream's low_vram
        # (only the model in use on the device), and the page runs one request at a time (README, "Web demo": memory).
        textures = None
        if texturing_unavailable is None:
            resolution = generate.check_texturing_options(None, bool(args.smoke), args.texture_size)
            textures = TexturingSession.load(args, stack, device, checked, resolution)
        examples = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="trellis2-app-")))
        example, example_mesh = (
            (str(examples / "example.png"), str(examples / "example.ply")) if args.smoke else (None, None)
        )
        if args.smoke:
            tiny.tiny_image().save(example)
            tiny.tiny_mesh().export(example_mesh)
        unavailable = checked.rembg_unavailable
        demo = build_demo(args, session, example, unavailable, textures, texturing_unavailable, example_mesh)
        return app.serve(demo, args)


if __name__ == "__main__":
    sys.exit(run_main(main))
