"""What ``app.py``'s requests check and run, without Gradio: the uploads' checks both tabs share, and one "Texture a
mesh" request (an uploaded mesh + image → :func:`trellis2_npu.texturing.make_textured_asset`, as ``inference.py
--mesh`` runs it).

A bad upload is a :class:`deliverykit.errors.DeliveryError` with ``inference.py``'s own text (``app.shown_on_page``
shows it as one line), raised before anything runs or is written.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from deliverykit.app import request_folder
from deliverykit.errors import InputError, WeightsError

from . import image, loader, texturing
from .generate import declare_outputs
from .geometry import mesh_io

NO_IMAGE = "no image; upload one (RGBA with the object in alpha, or an RGB photo)"
NO_MESH = f"no mesh; upload one ({', '.join(mesh_io.MESH_FORMATS)})"
WHOLE_IMAGE = '"Use the image whole" (--no-rembg)'  # the page's name for --no-rembg


def check_image(path: str | None, whole: bool, rembg_unavailable: str | None) -> None:
    """An upload is there, and has alpha unless it can have its background removed (or ``whole``): else
    ``inference.py``'s message (``rembg_unavailable``), naming the page's checkbox beside ``--no-rembg``."""
    if not path:
        raise InputError(NO_IMAGE)
    if rembg_unavailable and not whole and image.needs_background_removal(path):
        raise InputError(rembg_unavailable.replace("--no-rembg", WHOLE_IMAGE))


def texturing_unavailable(weights: str | os.PathLike) -> str | None:
    """Why the weights folder cannot texture (no ``texturing_pipeline.json``: the message naming its download), or
    None. The tab shows it instead of refusing to start: image → 3D needs none of those files."""
    try:
        loader.texturing_folder(weights)
    except WeightsError as err:
        return str(err)
    return None


def texture_request(
    session: texturing.TexturingSession | None,
    output: str | os.PathLike,
    mesh_path: str | None,
    image_path: str | None,
    resolution: int,
    texture_size: int,
    steps: int,
    seed: int,
    whole: bool = False,
    *,
    rembg_unavailable: str | None = None,
    unavailable: str | None = None,
) -> dict[str, Path]:
    """One "Texture a mesh" request: the uploads checked as ``inference.py --mesh`` checks its files, then the mesh
    textured into a new folder under ``output`` (asset.glb, preview.png, preview.mp4, voxels.safetensors and
    report.json together, or nothing); returns the files by name.

    ``session``: None when no texturing pipeline is loaded, ``unavailable`` saying why. ``resolution``: one of
    :data:`trellis2_npu.texturing.RESOLUTIONS`, or :data:`~trellis2_npu.texturing.SMOKE_RESOLUTION` on the smoke
    models. ``rembg_unavailable``: as for :func:`check_image`.
    """
    if session is None:
        raise WeightsError(unavailable or "no texturing pipeline is loaded")
    if not mesh_path:
        raise InputError(NO_MESH)
    check_image(image_path, whole, rembg_unavailable)
    smoke = bool(session.record["model"]["smoke"])
    resolution = None if smoke and resolution == texturing.SMOKE_RESOLUTION else int(resolution)
    resolution = texturing.check_texturing_options(resolution, smoke, int(texture_size))
    mesh = mesh_io.read_mesh(mesh_path)
    picture = image.pipeline_input(image.load_image(image_path), remove_background=not whole)
    declared = declare_outputs(request_folder(output), names=texturing.FILES, video=session.preview_frames > 0)
    run = dataclasses.replace(session, resolution=resolution, texture_size=int(texture_size))
    names = {"mesh": Path(mesh_path).name, "image": Path(image_path).name}
    texturing.make_textured_asset(run, mesh, picture, names, int(seed), int(steps), declared)
    return declared[1]
