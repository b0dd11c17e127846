"""The image → 3D and texturing sessions every front end drives: ``inference.py`` (one image, ``--batch``,
``--mesh``), ``app.py`` (both tabs) and ``serve.py`` (image → 3D jobs).

Each is built once from the checked flags (``load``: the downloaded folders, or tiny random models written in the
released layout, on the device), runs typed requests (``run`` → :class:`Asset`, in memory) and writes an asset's
files together or not at all (``write``, into :func:`asset_outputs`), as a diffusers script builds a pipeline and
calls it. Both share :class:`PipelineSession`: what was loaded, the previews, the GLB and the writing.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from deliverykit import device as devices
from deliverykit.assets.loadcheck import smoke_weights, weights_record
from deliverykit.errors import InputError, NumericsError
from deliverykit.files import RunOutputs
from deliverykit.timing import Stopwatch

from . import full_size, generate, hooks, loader, memory, rembg, report, tiny, upstream
from .generate import AssetRequest, PipelineResult, TexturingRequest, TexturingResult
from .geometry import export, glb, mesh_io, render_preview, turntable
from .options import PIPELINE_TYPES, SMOKE_STEPS, export_options

if TYPE_CHECKING:
    import numpy as np
    import trimesh
    from PIL import Image

ASSET_FILES = ("asset.glb", "preview.png", "mesh.ply", "voxels.safetensors")
TEXTURING_FILES = ("asset.glb", "preview.png", "voxels.safetensors")
PREVIEW_VIDEO = turntable.PREVIEW_VIDEO  # the turntable (--preview-frames, 0: none)


def asset_outputs(
    folder: str | Path, report: str | None = None, names: tuple[str, ...] = ASSET_FILES, video: bool = True
) -> RunOutputs:
    """One request's files in ``folder`` (``names``, and ``preview.mp4`` with ``video``) and its report(s)
    (``report.json`` there, ``--report``): checked now (exit 6), written by :meth:`PipelineSession.write`."""
    names = (*names, PREVIEW_VIDEO) if video else names
    return RunOutputs.declare({name: Path(folder) / name for name in names}, report, folder=folder)


@dataclasses.dataclass(frozen=True)
class Checked:
    """What the checks before loading found, that loading takes: the patched checkout, the weights' records, the
    background-removal model an image without alpha needs (None: no background removal in this session; a server's
    ``rembg_unavailable`` then says why, to the requests that would need it), and the pipeline types the requests
    may ask for (the memory plan covers the largest)."""

    checkout: Path
    weights_files: list
    rembg_model: rembg.RembgModel | None = None
    rembg_unavailable: str | None = None
    pipeline_types: tuple[str, ...] = PIPELINE_TYPES

    @classmethod
    def before_serving(cls, args: argparse.Namespace) -> Checked:
        """The checks a process serving many requests (``app.py``, ``serve.py``) makes before loading, with
        ``inference.py``'s errors: the checkout (exit 3), the weights, a ``--rembg-model`` folder that is not there
        and a background-removal folder that is broken (exit 4). No background-removal model, or packages its code
        needs missing, is no exit: only a request of an image without alpha is refused, with the message kept here
        (none with ``--no-rembg``)."""
        checkout = upstream.find_patched_upstream(args.upstream)
        weights_files = [] if args.smoke else loader.check_weights(args.weights, strict=args.strict_manifest)
        if args.no_rembg:
            return cls(checkout, weights_files)
        root = None if args.smoke else loader.main_folder(args.weights).parent
        model = rembg.find_rembg_model(args.rembg_model, root)
        if model is None:
            return cls(checkout, weights_files, rembg_unavailable=rembg.no_model_message(root))
        try:
            rembg_files = rembg.check_rembg_model(model, strict=args.strict_manifest)
        except InputError as err:  # a package its code imports is missing (a broken folder: WeightsError, exit 4)
            return cls(checkout, weights_files, rembg_unavailable=str(err))
        return cls(checkout, [*weights_files, *rembg_files], model)


@dataclasses.dataclass(frozen=True)
class Asset:
    """One request's outputs in memory, and how they were made."""

    request: AssetRequest | TexturingRequest
    run: PipelineResult | TexturingResult  # the pipeline's stages and tokens
    exported: export.GlbExport
    glb_bytes: bytes
    preview: Image.Image
    video: np.ndarray | None  # the turntable's frames; None: no preview.mp4
    export_ms: dict[str, float]  # the export's steps, then the previews' and the GLB encoding
    peak_memory_bytes: int | None
    started: float  # time.perf_counter() when the request (a single run: the process) started
    voxels: tuple[torch.Tensor, torch.Tensor, int]  # voxels.safetensors: coords, attrs, resolution
    mesh: tuple[torch.Tensor, torch.Tensor] | None = None  # mesh.ply: vertices, faces (image → 3D only)


@dataclasses.dataclass(frozen=True)
class PipelineSession:
    """A loaded upstream pipeline on its device and what every report of this process records."""

    loaded: Any  # the upstream pipeline (loader.LoadedPipeline)
    device: torch.device
    default_steps: int | None  # --steps, or SMOKE_STEPS with --smoke; None: the pipeline's own
    preview_frames: int  # turntable frames in preview.mp4; 0: no video
    model: dict[str, Any]  # smoke and weights, as the flags named them
    checkout: Path
    weights: list[dict[str, Any]]
    random_weights: bool

    FILES: ClassVar[tuple[str, ...]] = ASSET_FILES

    @staticmethod
    def _loaded_fields(args: argparse.Namespace, checked: Checked, weights_files: list) -> dict[str, Any]:
        """The fields both sessions take from the flags and the checks."""
        return {
            "default_steps": args.steps or (SMOKE_STEPS if args.smoke else None),
            "preview_frames": args.preview_frames,
            "model": {"smoke": args.smoke, "weights": None if args.smoke else str(args.weights)},
            "checkout": checked.checkout,
            "weights": weights_record(weights_files),
            "random_weights": bool(args.smoke),
        }

    @property
    def smoke(self) -> bool:
        return bool(self.model["smoke"])

    def _views(self, textured: trimesh.Trimesh) -> tuple[Image.Image, np.ndarray | None, bytes, dict[str, float]]:
        """``preview.png``, the turntable's frames (with :attr:`preview_frames`) and the GLB bytes, each timed."""
        watch = Stopwatch()
        with watch.stage("preview"):
            scene = render_preview.prepare_scene(textured)  # shared with the turntable
            preview = render_preview.render_preview(scene)
        video = None
        if self.preview_frames:
            with watch.stage("preview_video"):
                video = turntable.render_turntable(scene, self.preview_frames)
        with watch.stage("encode_glb"):
            glb_bytes = glb.encode_glb(textured)
        return preview, video, glb_bytes, watch.stages

    def report(self, asset: Asset, write_ms: dict[str, float]) -> tuple[dict[str, Any], dict[str, Any]]:
        """``(evidence, report)`` of ``asset``; ``write_ms``: the steps timed while writing it."""
        raise NotImplementedError

    def write(self, asset: Asset, outputs: RunOutputs) -> dict[str, Any]:
        """Every declared file (:func:`asset_outputs`) and the report(s), complete and together or not at all;
        returns the evidence."""
        watch = Stopwatch()
        with outputs.commit() as commit:
            files = commit.files
            files["asset.glb"].write_bytes(asset.glb_bytes)
            asset.preview.save(files["preview.png"], format="PNG")
            if "mesh.ply" in files:
                mesh_io.write_ply(files["mesh.ply"], *asset.mesh)
            mesh_io.save_voxels(files["voxels.safetensors"], *asset.voxels)
            if PREVIEW_VIDEO in files:
                with watch.stage("encode_mp4"):
                    turntable.write_turntable(files[PREVIEW_VIDEO], asset.video)
            evidence, commit.report = self.report(asset, watch.stages)
        return evidence


@dataclasses.dataclass(frozen=True)
class Session(PipelineSession):
    """Image → 3D: upstream's ``Trellis2ImageTo3DPipeline`` and the defaults of its requests."""

    pipeline_type: str
    export_options: export.ExportOptions
    memory_plan: memory.MemoryPlan
    max_num_tokens: int | None = None  # --max-num-tokens; None: what the free memory holds (memory.token_budget)

    @classmethod
    def load(
        cls, args: argparse.Namespace, stack: contextlib.ExitStack, device: torch.device, checked: Checked
    ) -> Session:
        """The downloaded folders (already checked), or tiny random models written in the released layout into a
        temporary folder that ``stack`` removes, loaded once on ``device`` and placed by the memory plan (``--memory``
        for ``checked.pipeline_types``); ``checked.rembg_model`` is what upstream's BiRefNet loads for an image
        without alpha."""
        hooks.set_pipeline_device(device)  # upstream names its sparse backends at import: the ones that run on device
        rembg.select_rembg_model(checked.rembg_model)
        pipeline_class = upstream.import_pipeline_class(checked.checkout)  # the tiny models are upstream classes too
        weights_dir, weights_files = args.weights, list(checked.weights_files)
        if args.smoke:
            root = stack.enter_context(tempfile.TemporaryDirectory(prefix=f"trellis2-{args.smoke}-"))
            write = full_size.write_full_weights if args.smoke == "full" else tiny.write_tiny_weights
            weights_dir = write(root, seed=0)
            weights_files = smoke_weights(root) + weights_files
        plan = memory.choose_memory_plan(device, args.memory, pipeline_types=checked.pipeline_types)
        print(f"memory plan: {plan.name} ({plan.why})", flush=True)
        loaded = loader.load_pipeline(weights_dir, device, pipeline_class, offload=plan.loads_per_stage)
        memory.apply_memory_plan(loaded, plan, device)
        if args.smoke == "full":
            full_size.pin_occupancy(loaded.models["sparse_structure_decoder"])
        elif args.smoke:
            tiny.add_occupancy_prior(loaded.models["sparse_structure_decoder"])
        return cls(
            loaded=loaded,
            device=device,
            pipeline_type=args.pipeline or loaded.default_pipeline_type,
            export_options=export_options(args),
            memory_plan=plan,
            max_num_tokens=args.max_num_tokens,
            **cls._loaded_fields(args, checked, weights_files),
        )

    def request(
        self,
        picture: tuple,
        image_name: str | None,
        seed: int,
        steps: int | None = None,
        *,
        pipeline_type: str | None = None,
        options: export.ExportOptions | None = None,
    ) -> AssetRequest:
        """A request for ``picture`` (:func:`trellis2_npu.image.pipeline_input`'s pair); ``steps``, ``pipeline_type``
        and the export ``options`` default to this session's."""
        image, preprocess = picture
        steps = self.default_steps if steps is None else steps
        pipeline_type = pipeline_type or self.pipeline_type
        return AssetRequest(image, preprocess, seed, steps, pipeline_type, options or self.export_options, image_name)

    def run(self, request: AssetRequest, started: float | None = None) -> Asset:
        """The pipeline, its mesh checked (no face, NaN/Inf: exit 7), exported to a GLB, previewed; a cascade run
        on a smaller grid than its type's, for its token budget, says so in one ``warning:`` line."""
        started = time.perf_counter() if started is None else started
        devices.reset_peak_memory_stats(self.device)
        budget = memory.token_budget(self.memory_plan, request.pipeline_type, self.device, self.max_num_tokens)
        result = generate.run_pipeline(self.loaded, request, self.device, budget=budget)
        if result.degraded:
            print(f"warning: {result.degraded}", file=sys.stderr, flush=True)
        peak, mesh = devices.max_memory_allocated(self.device), generate.check_mesh(result, self.device)
        exported = export.to_glb(mesh.vertices, mesh.faces, mesh.attrs, mesh.coords, result.resolution,
                                 **dataclasses.asdict(request.export_options))  # fmt: skip
        preview, video, glb_bytes, views_ms = self._views(exported.mesh)
        return Asset(
            request, result, exported, glb_bytes, preview, video, {**exported.stages_ms, **views_ms}, peak, started,
            voxels=(mesh.coords, mesh.attrs, result.resolution), mesh=(mesh.vertices, mesh.faces),
        )  # fmt: skip

    def report(self, asset: Asset, write_ms: dict[str, float]) -> tuple[dict[str, Any], dict[str, Any]]:
        return report.asset_report(self, asset, write_ms)


@dataclasses.dataclass(frozen=True)
class TexturingSession(PipelineSession):
    """Texturing an existing mesh: upstream's ``Trellis2TexturingPipeline`` and the defaults of its requests."""

    resolution: int
    texture_size: int

    FILES: ClassVar[tuple[str, ...]] = TEXTURING_FILES

    @classmethod
    def load(cls, args: argparse.Namespace, stack: contextlib.ExitStack, device: torch.device, checked: Checked,
             resolution: int) -> TexturingSession:  # fmt: skip
        """``texturing_pipeline.json``'s models from the downloaded folder (checked), or the tiny random ones written
        in the released layout into a temporary folder that ``stack`` removes, loaded once on ``device``;
        ``resolution``: from :func:`trellis2_npu.generate.check_texturing_options`."""
        hooks.set_pipeline_device(device)
        rembg.select_rembg_model(checked.rembg_model)
        pipeline_class = upstream.import_texturing_pipeline_class(checked.checkout)
        weights_dir, weights_files = args.weights, list(checked.weights_files)
        if args.smoke:
            root = stack.enter_context(tempfile.TemporaryDirectory(prefix="trellis2-tiny-texturing-"))
            weights_dir = tiny.write_tiny_texturing(tiny.write_tiny_weights(root, seed=0), seed=0)
            weights_files = smoke_weights(root) + weights_files
        loaded = loader.load_pipeline(weights_dir, device, pipeline_class, config_file=loader.TEXTURING_CONFIG)
        return cls(
            loaded=loaded,
            device=device,
            resolution=resolution,
            texture_size=args.texture_size,
            **cls._loaded_fields(args, checked, weights_files),
        )

    def request(self, mesh: trimesh.Trimesh, picture: tuple, names: tuple[str, str], seed: int,
                steps: int | None = None) -> TexturingRequest:  # fmt: skip
        """``mesh`` textured from ``picture`` at this session's grid and texture size; ``names``: the mesh's and
        the image's, as the report gives them."""
        image, preprocess = picture
        steps = self.default_steps if steps is None else steps
        return TexturingRequest(mesh, image, preprocess, seed, steps, self.resolution, self.texture_size, *names)

    def run(self, request: TexturingRequest, started: float | None = None) -> Asset:
        """The pipeline (its decoded voxels checked: NaN/Inf is exit 7), its textured GLB, previewed."""
        started = time.perf_counter() if started is None else started
        devices.reset_peak_memory_stats(self.device)
        result = generate.run_texturing(self.loaded, request, self.device)
        peak = devices.max_memory_allocated(self.device)
        if not torch.isfinite(result.attrs).all():
            raise NumericsError(f"NaN/Inf in the decoded texture voxels on {self.device}")
        preview, video, glb_bytes, views_ms = self._views(result.textured)
        export_ms = {**result.exported.stages_ms, **views_ms}
        voxels = (result.coords, result.attrs, result.resolution)
        return Asset(request, result, result.exported, glb_bytes, preview, video, export_ms, peak, started, voxels)

    def report(self, asset: Asset, write_ms: dict[str, float]) -> tuple[dict[str, Any], dict[str, Any]]:
        return report.texturing_report(self, asset, write_ms)
