"""What ``app.py``'s requests check and run, without Gradio: the uploads' checks both tabs share, one "Texture a
mesh" request (an uploaded mesh + image → :class:`trellis2_npu.session.TexturingSession`, as ``inference.py
--mesh`` runs it), and the mesh QA panel both tabs show beside the GLB (:func:`qa_panel`).

A bad upload is a :class:`deliverykit.errors.DeliveryError` with ``inference.py``'s own text (``app.shown_on_page``
shows it as one line), raised before anything runs or is written.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from deliverykit.app import request_folder
from deliverykit.errors import InputError, WeightsError

from . import generate, image, loader
from .geometry import mesh_io
from .session import TexturingSession, asset_outputs

NO_IMAGE = "no image; upload one (RGBA with the object in alpha, or an RGB photo)"
NO_MESH = f"no mesh; upload one ({', '.join(mesh_io.MESH_FORMATS)})"
WHOLE_IMAGE = '"Use the image whole" (--no-rembg)'  # the page's name for --no-rembg
# the QA panel's rows: label, key in the export's stats (report.json results.glb) or, failing that, in its mesh_qa
QA_ROWS = (
    ("faces", "faces"),
    ("budget (--faces)", "decimation_target"),  # image → 3D only: texturing keeps the given mesh
    ("boundary edges", "boundary_edges"),
    ("non-manifold edges", "non_manifold_edges"),
    ("components", "components"),
    ("watertight", "watertight"),
    ("consistently wound", "consistently_wound"),
    ("genus", "genus"),  # None unless watertight and consistently wound
    ("texture coverage", "texel_coverage"),  # the fraction of the atlas' texels a face covers
    ("charts", "charts"),
    ("charts under 8 texels", "small_chart_share"),
    ("texel density (per unit)", "texels_per_unit"),  # texels per unit of surface length, the model in the unit box
)


def check_image(path: str | None, whole: bool, rembg_unavailable: str | None) -> None:
    """An upload is there, and has alpha unless it can have its background removed (or ``whole``): else
    ``inference.py``'s message (``rembg_unavailable``), naming the page's checkbox beside ``--no-rembg``."""
    if not path:
        raise InputError(NO_IMAGE)
    if rembg_unavailable and not whole and image.needs_background_removal(path):
        raise InputError(rembg_unavailable.replace("--no-rembg", WHOLE_IMAGE))


def qa_panel(stats: Mapping[str, Any]) -> str:
    """The mesh QA panel (Markdown) of one exported GLB, from the figures its export measured (``stats``: report.json's
    ``results.glb``), so that the page and the report agree; a figure the export did not give is "n/a"."""
    figures = {**(stats.get("mesh_qa") or {}), **stats}  # "faces": the GLB's, not mesh_qa's (before UV unwrapping)
    rows = [f"- {label}: {_qa_figure(key, figures.get(key))}" for label, key in QA_ROWS]  # a list fits beside the GLB
    return "\n".join(["**Mesh QA** (report.json: results.glb)", "", *rows])


def _qa_figure(key: str, value: Any) -> str:
    """One figure as the panel shows it: "n/a" where the export gave none, shares in %, the density in whole texels,
    a check as yes/no."""
    if value is None:
        return "n/a"
    if key in ("texel_coverage", "small_chart_share"):
        return f"{100 * value:.1f} %"
    if isinstance(value, float):
        return f"{value:.0f}"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def texturing_unavailable(weights: str | os.PathLike) -> str | None:
    """Why the weights folder cannot texture (no ``texturing_pipeline.json``: the message naming its download), or
    None. The tab shows it instead of refusing to start: image → 3D needs none of those files."""
    try:
        loader.texturing_folder(weights)
    except WeightsError as err:
        return str(err)
    return None


@dataclasses.dataclass(frozen=True)
class TextureUpload:
    """One "Texture a mesh" request as the page's fields give it."""

    mesh_path: str | None
    image_path: str | None
    resolution: int  # one of generate.RESOLUTIONS, or generate.SMOKE_RESOLUTION on the smoke models
    texture_size: int
    steps: int
    seed: int
    whole: bool = False  # "Use the image whole" (--no-rembg)


def texture_request(
    session: TexturingSession | None,
    output: str | os.PathLike,
    upload: TextureUpload,
    *,
    rembg_unavailable: str | None = None,
    unavailable: str | None = None,
) -> tuple[dict[str, Path], dict[str, Any]]:
    """One "Texture a mesh" request: the uploads checked as ``inference.py --mesh`` checks its files, then the mesh
    textured into a new folder under ``output`` (asset.glb, preview.png, preview.mp4, voxels.safetensors and
    report.json together, or nothing); returns the files by name and the export's stats (for :func:`qa_panel`).

    ``session``: None when no texturing pipeline is loaded, ``unavailable`` saying why. ``rembg_unavailable``: as
    for :func:`check_image`.
    """
    if session is None:
        raise WeightsError(unavailable or "no texturing pipeline is loaded")
    if not upload.mesh_path:
        raise InputError(NO_MESH)
    check_image(upload.image_path, upload.whole, rembg_unavailable)
    smoke = session.smoke
    resolution = None if smoke and upload.resolution == generate.SMOKE_RESOLUTION else upload.resolution
    resolution = generate.check_texturing_options(resolution, smoke, upload.texture_size)
    mesh = mesh_io.read_mesh(upload.mesh_path)
    picture = image.pipeline_input(image.load_image(upload.image_path), remove_background=not upload.whole)
    files = asset_outputs(request_folder(output), names=session.FILES, video=session.preview_frames > 0)
    names = (Path(upload.mesh_path).name, Path(upload.image_path).name)
    request = session.request(mesh, picture, names, upload.seed, upload.steps)
    request = dataclasses.replace(request, resolution=resolution, texture_size=upload.texture_size)
    asset = session.run(request)
    session.write(asset, files)
    return files.files, asset.exported.stats
