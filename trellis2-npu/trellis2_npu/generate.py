"""One run of the TRELLIS.2 image → mesh pipeline (upstream's ``run()``), with per-stage timings and token counts.

:func:`run_pipeline` calls the patched upstream pipeline built by :func:`trellis2_npu.loader.load_pipeline` and
times its stages with :class:`deliverykit.timing.Stopwatch`. Nothing here does model maths: that is upstream's code
and this package's hooks (:mod:`.hooks`). :func:`load_session` (load once) and :func:`make_asset` (one image → its
five files) are the steps ``inference.py`` and ``app.py`` share.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from deliverykit import device as devices
from deliverykit.assets.loadcheck import smoke_weights, weights_record
from deliverykit.errors import DeliveryError, ExitCode, NumericsError
from deliverykit.files import Outputs, json_text
from deliverykit.timing import Stopwatch

from . import full_size, hooks, loader, rembg, report, tiny, upstream
from .geometry import export, glb, mesh_io, render_preview, turntable
from .stages import set_stage_timer

PIPELINE_TYPES = ("512", "1024", "1024_cascade", "1536_cascade")
SAMPLERS = ("sparse_structure", "shape_slat", "tex_slat")


@dataclasses.dataclass
class PipelineResult:
    mesh: Any  # upstream MeshWithVoxel
    pipeline_type: str
    resolution: int
    stages_ms: dict[str, float]
    tokens: dict[str, int]
    total_ms: float


def _wrap(obj: Any, name: str, wrapper: Callable[[Callable], Callable]) -> None:
    """Shadow ``obj.name`` by ``wrapper(original)`` on this instance only (removed by :func:`_unwrap`)."""
    setattr(obj, name, wrapper(getattr(obj, name)))


def run_pipeline(
    pipeline: Any,
    image: Image.Image,
    pipeline_type: str,
    seed: int,
    steps: int | None,
    device: torch.device,
    preprocess: bool = True,
    watch: Stopwatch | None = None,
    tokens: dict[str, int] | None = None,
) -> PipelineResult:
    """``pipeline.run(image, pipeline_type=..., seed=...)`` with stage timings and token counts.

    Stages (exclusive, milliseconds): ``conditioning_<px>``, ``flow:<model key>`` (one per flow model run),
    ``decoder:<model key>`` (``.upsample`` for the cascade's coordinate upsampling) and ``mesh_extraction``
    (taken out of the shape decoder's time). Tokens: the flow input sizes (dense 16³ for the sparse structure),
    then ``voxels`` (decoded voxels carrying PBR attributes). Models loaded per stage (:mod:`.offload`) add a
    ``load:<checkpoint>`` stage each. ``watch``: a Stopwatch (subclass) of the caller's, e.g. one that also records
    memory per stage; ``tokens``: a dict of the caller's, filled as each flow starts (kept if a later stage fails).
    """
    if pipeline_type not in PIPELINE_TYPES:
        raise DeliveryError(
            f"--pipeline {pipeline_type!r} is not supported; pick one of {', '.join(PIPELINE_TYPES)}", ExitCode.USAGE
        )
    watch = Stopwatch(device) if watch is None else watch
    tokens = {} if tokens is None else tokens
    names = {id(model): key for key, model in pipeline.models.items()}

    def sampler_wrapper(original):
        def sample(model, noise, *args, **kwargs):
            key = names.get(id(model), type(model).__name__)
            feats = getattr(noise, "feats", None)
            tokens[key] = int(feats.shape[0]) if feats is not None else int(noise[0, 0].numel())
            with watch.stage(f"flow:{key}"):
                return original(model, noise, *args, **kwargs)

        return sample

    def cond_wrapper(original):
        def get_cond(image, resolution, *args, **kwargs):
            with watch.stage(f"conditioning_{resolution}"):
                return original(image, resolution, *args, **kwargs)

        return get_cond

    def stage_wrapper(stage):
        def wrapper(original):
            def call(*args, **kwargs):
                with watch.stage(stage):
                    return original(*args, **kwargs)

            return call

        return wrapper

    wrapped: list[tuple[Any, str]] = []
    for sampler in {
        id(getattr(pipeline, f"{s}_sampler")): getattr(pipeline, f"{s}_sampler") for s in SAMPLERS
    }.values():
        _wrap(sampler, "sample", sampler_wrapper)
        wrapped.append((sampler, "sample"))
    _wrap(pipeline, "get_cond", cond_wrapper)
    wrapped.append((pipeline, "get_cond"))
    for key in ("sparse_structure_decoder", "shape_slat_decoder", "tex_slat_decoder"):
        _wrap(pipeline.models[key], "forward", stage_wrapper(f"decoder:{key}"))
        wrapped.append((pipeline.models[key], "forward"))
    _wrap(pipeline.models["shape_slat_decoder"], "upsample", stage_wrapper("decoder:shape_slat_decoder.upsample"))
    wrapped.append((pipeline.models["shape_slat_decoder"], "upsample"))

    params = {"steps": steps} if steps is not None else {}
    set_stage_timer(watch.stage)
    try:
        meshes, (_, _, resolution) = pipeline.run(
            image,
            seed=seed,
            pipeline_type=pipeline_type,
            preprocess_image=preprocess,
            sparse_structure_sampler_params=params,
            shape_slat_sampler_params=params,
            tex_slat_sampler_params=params,
            return_latent=True,
        )
    finally:
        set_stage_timer(None)
        for obj, name in wrapped:
            delattr(obj, name)
    mesh = meshes[0]
    tokens["voxels"] = int(mesh.attrs.shape[0])
    stages = watch.stages
    if "mesh_extraction" in stages and "decoder:shape_slat_decoder" in stages:
        stages["decoder:shape_slat_decoder"] -= stages["mesh_extraction"]
    return PipelineResult(mesh, pipeline_type, int(resolution), stages, tokens, sum(stages.values()))


def check_mesh(result: PipelineResult, device: torch.device) -> Any:
    """``result.mesh``, unless it has no face or a NaN/Inf (:class:`deliverykit.errors.NumericsError`, exit 7)."""
    mesh = result.mesh
    if mesh.faces.shape[0] == 0:
        raise NumericsError(
            f"the {result.pipeline_type} pipeline produced a mesh without faces ({mesh.vertices.shape[0]} vertices)"
        )
    for name, tensor in {"vertices": mesh.vertices, "attrs": mesh.attrs}.items():
        if not torch.isfinite(tensor).all():
            raise NumericsError(f"NaN/Inf in the mesh {name} on {device}")
    return mesh


ASSET_FILES = ("asset.glb", "preview.png", "mesh.ply", "voxels.safetensors")
PREVIEW_VIDEO = turntable.PREVIEW_VIDEO  # the turntable (--preview-frames, 0: none)
DELIVERY_DIR = Path(__file__).resolve().parents[1]


def declare_outputs(
    folder: str | Path, report_path: str | None = None, names: tuple[str, ...] = ASSET_FILES, video: bool = True
) -> tuple[Outputs, dict[str, Path], list[Path]]:
    """The asset files (``names``, and ``preview.mp4`` with ``video``), report.json and ``--report`` in ``folder``,
    checked now (exit 6); created only at the end."""
    outputs = Outputs()
    names = (*names, PREVIEW_VIDEO) if video else names
    files = {name: outputs.add(Path(folder) / name) for name in names}
    reports = outputs.add_reports(folder, report_path)
    outputs.check()
    return outputs, files, reports


@dataclasses.dataclass
class AssetSession:
    """A loaded pipeline and what every asset of the process shares: its export options and report records."""

    loaded: Any  # loader.LoadedPipeline
    device: torch.device
    pipeline_type: str
    default_steps: int | None
    export_options: dict[str, Any]
    remesh: bool
    preview_frames: int  # turntable frames in preview.mp4; 0: no video
    record: dict[str, Any]  # model, upstream, weights, random_weights: what every report says


def load_session(
    args: argparse.Namespace,
    stack: contextlib.ExitStack,
    device: torch.device,
    checkout: Path,
    weights_files: list,
    default_steps: int | None = None,
    rembg_model: rembg.RembgModel | None = None,
) -> AssetSession:
    """Steps 2 and 3: the downloaded folders (already checked), or tiny random models written in the released layout
    into a temporary folder that ``stack`` removes, loaded once on ``device``. ``rembg_model`` (checked by
    :func:`trellis2_npu.rembg.check_rembg_model`, its records in ``weights_files``) is what upstream's BiRefNet loads
    for an image without alpha; None: no background removal in this session."""
    hooks.set_pipeline_device(device)  # upstream names its sparse backends at import: the ones that run on device
    rembg.select_rembg_model(rembg_model)
    pipeline_class = upstream.import_pipeline_class(checkout)  # the tiny models are upstream classes too
    weights_dir = args.weights
    if args.smoke:
        root = stack.enter_context(tempfile.TemporaryDirectory(prefix=f"trellis2-{args.smoke}-"))
        write = full_size.write_full_weights if args.smoke == "full" else tiny.write_tiny_weights
        weights_dir = write(root, seed=0)
        weights_files = smoke_weights(root) + list(weights_files)
    # on a CPU host every model would sit in host memory at once (≈ 17 GB at the released sizes): load per stage
    loaded = loader.load_pipeline(weights_dir, device, pipeline_class, offload=device.type == "cpu")
    if args.smoke == "full":
        full_size.pin_occupancy(loaded.models["sparse_structure_decoder"])
    elif args.smoke:
        tiny.add_occupancy_prior(loaded.models["sparse_structure_decoder"])
    return AssetSession(
        loaded=loaded,
        device=device,
        pipeline_type=args.pipeline or loaded.default_pipeline_type,
        default_steps=default_steps,
        export_options=export_options(args),
        remesh=args.remesh,
        preview_frames=args.preview_frames,
        record={
            "model": {"smoke": args.smoke, "weights": None if args.smoke else str(args.weights)},
            "upstream": checkout,
            "weights": weights_record(weights_files),
            "random_weights": bool(args.smoke),
        },
    )


def export_options(args: argparse.Namespace) -> dict[str, Any]:
    names = ("decimation_target", "texture_size", "remesh_band", "remesh_project")
    return {name: getattr(args, name) for name in names}


def make_asset(session: AssetSession, picture: tuple, image_name: str | None, seed: int, steps: int | None,
               declared: tuple, start: float | None = None) -> dict:  # fmt: skip
    """4. Generate one asset, then 5. write its files and report(s) together (``declared``, from
    :func:`declare_outputs`; ``preview.mp4`` when declared and ``session.preview_frames``), or none; returns the
    evidence."""
    outputs, files, reports = declared
    start = time.perf_counter() if start is None else start
    device = session.device
    devices.reset_peak_memory_stats(device)
    pil, preprocess = picture
    result = run_pipeline(session.loaded, pil, session.pipeline_type, seed, steps, device, preprocess=preprocess)
    peak, mesh = devices.max_memory_allocated(device), check_mesh(result, device)
    exported = export.to_glb(mesh.vertices, mesh.faces, mesh.attrs, mesh.coords, result.resolution,
                             **session.export_options, remesh=session.remesh)  # fmt: skip
    watch = Stopwatch()
    with watch.stage("preview"):
        scene = render_preview.prepare_scene(exported.mesh)  # shared with the turntable
        preview = render_preview.render_preview(scene)
    video = None
    if session.preview_frames and PREVIEW_VIDEO in files:
        with watch.stage("preview_video"):
            video = turntable.render_turntable(scene, session.preview_frames)
    with watch.stage("encode_glb"):
        glb_bytes = glb.encode_glb(exported.mesh)
    with outputs.commit() as temps:
        temps[files["asset.glb"]].write_bytes(glb_bytes)
        preview.save(temps[files["preview.png"]], format="PNG")
        mesh_io.write_ply(temps[files["mesh.ply"]], mesh.vertices, mesh.faces)
        mesh_io.save_voxels(temps[files["voxels.safetensors"]], mesh.coords, mesh.attrs, result.resolution)
        if video is not None:
            with watch.stage("encode_mp4"):
                turntable.write_turntable(temps[files[PREVIEW_VIDEO]], video)
        evidence, run_report = report.asset_report(
            result, exported, glb_bytes, {**exported.stages_ms, **watch.stages},
            inputs={"image": image_name or "tiny RGBA test image", "seed": seed, "steps": steps},
            device=device, model_device=session.loaded.device, pipeline_type=session.pipeline_type,
            export=session.export_options, peak=peak, wall_s=round(time.perf_counter() - start, 1),
            remesh=session.remesh, source=DELIVERY_DIR, preview_video=turntable.video_record(video),
            **session.record,
        )  # fmt: skip
        for path in reports:
            temps[path].write_text(json_text(run_report), encoding="utf-8")
    return evidence
