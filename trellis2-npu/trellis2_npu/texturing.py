"""One run of TRELLIS.2's texturing pipeline (an existing mesh + an image → a PBR-textured GLB), timed by stage.

``inference.py --mesh`` calls upstream's ``Trellis2TexturingPipeline.run`` (patch 0007: the mesh voxelisation is
:mod:`.voxelize`, the unwrap and bake :func:`trellis2_npu.geometry.export.texture_mesh`). Nothing here does model maths.
:func:`load_texturing_session` (load once) and :func:`make_textured_asset` (one mesh + image → its files) are the
steps ``inference.py`` runs; :func:`check_texturing_options` holds the checks that need no model.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import trimesh
from PIL import Image

from deliverykit import device as devices
from deliverykit.assets.loadcheck import smoke_weights, weights_record
from deliverykit.errors import ExitCode, InputError, NumericsError
from deliverykit.files import json_text
from deliverykit.timing import Stopwatch

from . import hooks, loader, rembg, report, tiny, upstream
from .geometry import export, glb, mesh_io, render_preview, turntable
from .stages import set_stage_timer

RESOLUTIONS = (512, 1024, 1536)  # upstream's app_texturing.py choices; 512 takes the 512 flow, others the 1024 one
DEFAULT_RESOLUTION = 1024  # upstream's run() default
SMOKE_RESOLUTION = 64  # --smoke: the tiny models on a 64³ grid (4³ latent), seconds on a CPU
FILES = ("asset.glb", "preview.png", "voxels.safetensors")
DELIVERY_DIR = Path(__file__).resolve().parents[1]


def check_texturing_options(resolution: int | None, smoke: bool, texture_size: int) -> int:
    """The grid resolution to run at (``--resolution``, else upstream's 1024, or :data:`SMOKE_RESOLUTION` with
    ``--smoke``); exit 2 for
    one upstream does not offer or a bad ``--texture-size``."""
    export.check_export_options(export.MIN_DECIMATION_TARGET, texture_size, remesh=False)
    if resolution is None:
        return SMOKE_RESOLUTION if smoke else DEFAULT_RESOLUTION
    if resolution not in RESOLUTIONS:
        raise InputError(
            f"--resolution {resolution}: pick one of {', '.join(map(str, RESOLUTIONS))} (upstream's texturing app)",
            ExitCode.USAGE,
        )
    return resolution


@dataclasses.dataclass
class TexturingResult:
    textured: trimesh.Trimesh  # what upstream's run() returned: the glTF-frame mesh of ``exported``
    exported: export.GlbExport
    coords: torch.Tensor  # [N, 3] decoded PBR voxels at ``resolution``
    attrs: torch.Tensor  # [N, 6]
    resolution: int
    stages_ms: dict[str, float]
    tokens: dict[str, int]
    total_ms: float


@contextlib.contextmanager
def _timed_calls(watch: Stopwatch, calls: dict[tuple[Any, str], str], record: dict[str, Any]) -> Iterator[None]:
    """Shadow each ``obj.name`` by a call timed as its stage; its last result kept in ``record[stage]``."""

    def timed(original, stage):
        def call(*args, **kwargs):
            with watch.stage(stage):
                record[stage] = original(*args, **kwargs)
            return record[stage]

        return call

    for (obj, name), stage in calls.items():
        setattr(obj, name, timed(getattr(obj, name), stage))
    try:
        yield
    finally:
        for obj, name in calls:
            delattr(obj, name)


def run_texturing(
    pipeline: Any,
    mesh: trimesh.Trimesh,
    image: Image.Image,
    seed: int,
    steps: int | None,
    resolution: int,
    texture_size: int,
    device: torch.device,
    preprocess: bool = True,
) -> TexturingResult:
    """``pipeline.run(mesh, image, seed=..., resolution=..., texture_size=...)`` with stage timings and token counts.

    Stages (exclusive, ms): ``conditioning_<px>``, ``mesh_voxelization``, ``encoder:shape_slat_encoder``,
    ``flow:<flow key>`` and ``decoder:tex_slat_decoder``; upstream's ``postprocess_mesh`` (unwrap, bake, assemble)
    is timed by the export itself (:attr:`TexturingResult.exported`). Tokens: ``shape_slat`` (the latent the flow
    samples) and ``pbr_voxels`` (decoded).
    """
    watch = Stopwatch(device)
    record: dict[str, Any] = {}
    flow_key = "tex_slat_flow_model_512" if resolution == 512 else "tex_slat_flow_model_1024"
    exports: list[export.GlbExport] = []
    calls = {
        (pipeline, "get_cond"): f"conditioning_{512 if resolution == 512 else 1024}",
        (pipeline, "encode_shape_slat"): "encoder:shape_slat_encoder",
        (pipeline.tex_slat_sampler, "sample"): f"flow:{flow_key}",
        (pipeline, "decode_tex_slat"): "decoder:tex_slat_decoder",
        (pipeline, "postprocess_mesh"): "export",
    }
    params = {"steps": steps} if steps is not None else {}
    set_stage_timer(watch.stage)
    hooks.set_export_observer(exports.append)
    try:
        with _timed_calls(watch, calls, record):
            textured = pipeline.run(
                mesh, image, seed=seed, tex_slat_sampler_params=params, preprocess_image=preprocess,
                resolution=resolution, texture_size=texture_size,
            )  # fmt: skip
    finally:
        set_stage_timer(None)
        hooks.set_export_observer(None)
    stages = watch.stages
    stages["encoder:shape_slat_encoder"] -= stages.get("mesh_voxelization", 0.0)
    del stages["export"]  # its steps are the export's (exported.stages_ms)
    pbr = record["decoder:tex_slat_decoder"]
    tokens = {
        "shape_slat": int(record["encoder:shape_slat_encoder"].feats.shape[0]),
        "pbr_voxels": int(pbr.feats.shape[0]),
    }
    return TexturingResult(
        textured=textured,
        exported=exports[-1],
        coords=pbr.coords[:, 1:].detach(),
        attrs=pbr.feats.detach(),
        resolution=resolution,
        stages_ms=stages,
        tokens=tokens,
        total_ms=sum(stages.values()),
    )


@dataclasses.dataclass
class TexturingSession:
    """A loaded texturing pipeline and what every run of the process shares."""

    loaded: Any  # upstream Trellis2TexturingPipeline
    device: torch.device
    resolution: int
    texture_size: int
    default_steps: int | None
    preview_frames: int  # turntable frames in preview.mp4; 0: no video
    record: dict[str, Any]  # model, upstream, weights, random_weights: what every report says


def load_texturing_session(
    args: argparse.Namespace,
    stack: contextlib.ExitStack,
    device: torch.device,
    checkout: Path,
    weights_files: list,
    resolution: int,
    default_steps: int | None = None,
    rembg_model: rembg.RembgModel | None = None,
) -> TexturingSession:
    """Steps 2 and 3: ``texturing_pipeline.json``'s models from the downloaded folder (checked), or the tiny random
    ones written in the released layout into a temporary folder that ``stack`` removes, loaded once on ``device``."""
    hooks.set_pipeline_device(device)
    rembg.select_rembg_model(rembg_model)
    pipeline_class = upstream.import_texturing_pipeline_class(checkout)
    weights_dir = args.weights
    if args.smoke:
        root = stack.enter_context(tempfile.TemporaryDirectory(prefix="trellis2-tiny-texturing-"))
        weights_dir = tiny.write_tiny_texturing(tiny.write_tiny_weights(root, seed=0), seed=0)
        weights_files = smoke_weights(root) + list(weights_files)
    loaded = loader.load_pipeline(weights_dir, device, pipeline_class, config_file=loader.TEXTURING_CONFIG)
    return TexturingSession(
        loaded=loaded,
        device=device,
        resolution=resolution,
        texture_size=args.texture_size,
        default_steps=default_steps,
        preview_frames=args.preview_frames,
        record={
            "model": {"smoke": args.smoke, "weights": None if args.smoke else str(args.weights)},
            "upstream": checkout,
            "weights": weights_record(weights_files),
            "random_weights": bool(args.smoke),
        },
    )


def make_textured_asset(session: TexturingSession, mesh: trimesh.Trimesh, picture: tuple, names: dict[str, str],
                        seed: int, steps: int | None, declared: tuple, start: float | None = None) -> dict:  # fmt: skip
    """4. Texture one mesh, then 5. write asset.glb, preview.png, voxels.safetensors, preview.mp4 (when declared and
    ``session.preview_frames``) and report(s) together (``declared``: :func:`trellis2_npu.generate.declare_outputs`
    with :data:`FILES`), or none; returns the evidence.
    ``names``: the ``mesh`` and ``image`` inputs as the report names them."""
    outputs, files, reports = declared
    start = time.perf_counter() if start is None else start
    device = session.device
    devices.reset_peak_memory_stats(device)
    pil, preprocess = picture
    result = run_texturing(session.loaded, mesh, pil, seed, steps, session.resolution, session.texture_size, device,
                           preprocess=preprocess)  # fmt: skip
    peak = devices.max_memory_allocated(device)
    if not torch.isfinite(result.attrs).all():
        raise NumericsError(f"NaN/Inf in the decoded texture voxels on {device}")
    watch = Stopwatch()
    with watch.stage("preview"):
        scene = render_preview.prepare_scene(result.textured)  # shared with the turntable
        preview = render_preview.render_preview(scene)
    video = None
    if session.preview_frames and turntable.PREVIEW_VIDEO in files:
        with watch.stage("preview_video"):
            video = turntable.render_turntable(scene, session.preview_frames)
    with watch.stage("encode_glb"):
        glb_bytes = glb.encode_glb(result.textured)
    export_ms = {**result.exported.stages_ms, **watch.stages}
    evidence, run_report = report.texturing_report(
        result, glb_bytes, export_ms, inputs={**names, "seed": seed, "steps": steps}, device=device,
        model_device=session.loaded.device, peak=peak, wall_s=round(time.perf_counter() - start, 1),
        preview_video=turntable.video_record(video), source=DELIVERY_DIR, **session.record,
    )  # fmt: skip
    with outputs.commit() as temps:
        temps[files["asset.glb"]].write_bytes(glb_bytes)
        preview.save(temps[files["preview.png"]], format="PNG")
        mesh_io.save_voxels(temps[files["voxels.safetensors"]], result.coords, result.attrs, result.resolution)
        if video is not None:
            turntable.write_turntable(temps[files[turntable.PREVIEW_VIDEO]], video)
        for path in reports:
            temps[path].write_text(json_text(run_report), encoding="utf-8")
    return evidence
