"""One run of either TRELLIS.2 pipeline, timed by stage, with token counts: image → mesh (upstream's
``Trellis2ImageTo3DPipeline.run``) and texturing (an existing mesh + an image → a PBR-textured mesh,
``Trellis2TexturingPipeline.run``).

:func:`run_pipeline` and :func:`run_texturing` call the patched upstream pipelines built by
:func:`trellis2_npu.loader.load_pipeline` and time their stages with :class:`deliverykit.timing.Stopwatch`. Nothing
here does model maths: that is upstream's code and this package's hooks (:mod:`.hooks`; for texturing, patch 0007:
the voxelisation is :mod:`.geometry.voxelize`, the unwrap and bake :func:`.geometry.export.texture_mesh`). The typed
requests are what :mod:`.session` runs; :func:`check_texturing_options` holds the checks that need no model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
import trimesh
from PIL import Image

from deliverykit.errors import DeliveryError, ExitCode, InputError, NumericsError
from deliverykit.timing import Stopwatch, shadowed

from . import hooks
from .geometry import export
from .memory import TokenBudget
from .options import PIPELINE_TYPES
from .stages import set_stage_timer

SAMPLERS = ("sparse_structure", "shape_slat", "tex_slat")
DECODERS = ("sparse_structure_decoder", "shape_slat_decoder", "tex_slat_decoder")


@dataclasses.dataclass(frozen=True)
class AssetRequest:
    """One image → 3D asset: the pipeline's inputs and the GLB export's options."""

    image: Image.Image
    preprocess: bool  # upstream preprocesses the image (no alpha: background removal); False: done already
    seed: int
    steps: int | None  # every flow stage's; None: pipeline.json's
    pipeline_type: str
    export_options: export.ExportOptions
    image_name: str | None = None  # what the report calls the input (None: the tiny test image)


@dataclasses.dataclass(frozen=True)
class TexturingRequest:
    """One mesh textured from an image: the pipeline's inputs, and what the report calls them."""

    mesh: trimesh.Trimesh
    image: Image.Image
    preprocess: bool
    seed: int
    steps: int | None  # the texture flow's; None: texturing_pipeline.json's
    resolution: int  # the voxel grid: one of RESOLUTIONS, or SMOKE_RESOLUTION on the tiny models
    texture_size: int
    mesh_name: str
    image_name: str


@dataclasses.dataclass
class PipelineResult:
    mesh: Any  # upstream MeshWithVoxel
    pipeline_type: str
    resolution: int
    stages_ms: dict[str, float]
    tokens: dict[str, int]
    total_ms: float
    budget: TokenBudget | None = None

    @property
    def degraded(self) -> str | None:
        """Why the output grid is below the pipeline type's (a ``warning:`` line and the report say it), else None."""
        if self.budget is None:
            return None
        tokens = self.tokens.get("shape_slat_flow_model_1024", 0)
        return self.budget.degraded(self.pipeline_type, self.resolution, tokens)


def run_pipeline(
    pipeline: Any,
    request: AssetRequest,
    device: torch.device,
    *,
    watch: Stopwatch | None = None,
    tokens: dict[str, int] | None = None,
    budget: TokenBudget | None = None,
) -> PipelineResult:
    """``pipeline.run(image, pipeline_type=..., seed=...)`` with stage timings and token counts.

    Stages (exclusive, milliseconds): ``conditioning_<px>``, ``flow:<model key>`` (one per flow model run),
    ``decoder:<model key>`` (``.upsample`` for the cascade's coordinate upsampling) and ``mesh_extraction``
    (taken out of the shape decoder's time). Tokens: the flow input sizes (dense 16³ for the sparse structure),
    then ``voxels`` (decoded voxels carrying PBR attributes). Models loaded per stage (:mod:`.offload`) add a
    ``load:<checkpoint>`` stage each. ``budget``: the cascade's ``max_num_tokens`` (:func:`.memory.token_budget`;
    None: upstream's default). ``watch``: a Stopwatch (subclass) of the caller's, e.g. one that also records
    memory per stage; ``tokens``: a dict of the caller's, filled as each flow starts (kept if a later stage fails).
    """
    pipeline_type = request.pipeline_type
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

    samplers = {id(sampler): sampler for sampler in (getattr(pipeline, f"{s}_sampler") for s in SAMPLERS)}
    wrappers: dict[tuple[Any, str], Callable[[Callable], Callable]] = {
        (sampler, "sample"): sampler_wrapper for sampler in samplers.values()
    }
    wrappers[(pipeline, "get_cond")] = cond_wrapper
    decoders = {(pipeline.models[key], "forward"): f"decoder:{key}" for key in DECODERS}
    decoders[(pipeline.models["shape_slat_decoder"], "upsample")] = "decoder:shape_slat_decoder.upsample"

    params = {"steps": request.steps} if request.steps is not None else {}
    cap = {} if budget is None else {"max_num_tokens": budget.max_num_tokens}
    set_stage_timer(watch.stage)
    try:
        with shadowed(wrappers), watch.timed_calls(decoders):
            meshes, (_, _, resolution) = pipeline.run(
                request.image,
                seed=request.seed,
                pipeline_type=pipeline_type,
                preprocess_image=request.preprocess,
                sparse_structure_sampler_params=params,
                shape_slat_sampler_params=params,
                tex_slat_sampler_params=params,
                return_latent=True,
                **cap,
            )
    finally:
        set_stage_timer(None)
    mesh = meshes[0]
    tokens["voxels"] = int(mesh.attrs.shape[0])
    stages = watch.stages
    if "mesh_extraction" in stages and "decoder:shape_slat_decoder" in stages:
        stages["decoder:shape_slat_decoder"] -= stages["mesh_extraction"]
    return PipelineResult(mesh, pipeline_type, int(resolution), stages, tokens, sum(stages.values()), budget)


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


RESOLUTIONS = (512, 1024, 1536)  # upstream's app_texturing.py choices; 512 takes the 512 flow, others the 1024 one
DEFAULT_RESOLUTION = 1024  # upstream's run() default
SMOKE_RESOLUTION = 64  # --smoke: the tiny models on a 64³ grid (4³ latent), seconds on a CPU


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


def run_texturing(pipeline: Any, request: TexturingRequest, device: torch.device) -> TexturingResult:
    """``pipeline.run(mesh, image, seed=..., resolution=..., texture_size=...)`` with stage timings and token counts.

    Stages (exclusive, ms): ``conditioning_<px>``, ``mesh_voxelization``, ``encoder:shape_slat_encoder``,
    ``flow:<flow key>`` and ``decoder:tex_slat_decoder``; upstream's ``postprocess_mesh`` (unwrap, bake, assemble)
    is timed by the export itself (:attr:`TexturingResult.exported`). Tokens: ``shape_slat`` (the latent the flow
    samples) and ``pbr_voxels`` (decoded).
    """
    watch = Stopwatch(device)
    record: dict[str, Any] = {}
    resolution = request.resolution
    flow_key = "tex_slat_flow_model_512" if resolution == 512 else "tex_slat_flow_model_1024"
    exports: list[export.GlbExport] = []
    calls = {
        (pipeline, "get_cond"): f"conditioning_{512 if resolution == 512 else 1024}",
        (pipeline, "encode_shape_slat"): "encoder:shape_slat_encoder",
        (pipeline.tex_slat_sampler, "sample"): f"flow:{flow_key}",
        (pipeline, "decode_tex_slat"): "decoder:tex_slat_decoder",
        (pipeline, "postprocess_mesh"): "export",
    }
    params = {"steps": request.steps} if request.steps is not None else {}
    set_stage_timer(watch.stage)
    hooks.set_export_observer(exports.append)
    try:
        with watch.timed_calls(calls, record):
            textured = pipeline.run(
                request.mesh, request.image, seed=request.seed, tex_slat_sampler_params=params,
                preprocess_image=request.preprocess, resolution=resolution, texture_size=request.texture_size,
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
