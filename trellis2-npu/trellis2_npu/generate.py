"""One run of the TRELLIS.2 image → mesh pipeline (upstream's ``run()``), with per-stage timings and token counts.

:func:`run_pipeline` calls the patched upstream pipeline built by :func:`trellis2_npu.loader.load_pipeline` and
times its stages with :class:`deliverykit.timing.Stopwatch`. Nothing here does model maths: that is upstream's code
and this package's hooks (:mod:`.hooks`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from PIL import Image

from deliverykit.errors import DeliveryError, ExitCode, NumericsError
from deliverykit.timing import Stopwatch

from . import hooks

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
) -> PipelineResult:
    """``pipeline.run(image, pipeline_type=..., seed=...)`` with stage timings and token counts.

    Stages (exclusive, milliseconds): ``conditioning_<px>``, ``flow:<model key>`` (one per flow model run),
    ``decoder:<model key>`` (``.upsample`` for the cascade's coordinate upsampling) and ``mesh_extraction``
    (taken out of the shape decoder's time). Tokens: the flow input sizes (dense 16³ for the sparse structure),
    then ``voxels`` (decoded voxels carrying PBR attributes).
    """
    if pipeline_type not in PIPELINE_TYPES:
        raise DeliveryError(
            f"--pipeline {pipeline_type!r} is not supported; pick one of {', '.join(PIPELINE_TYPES)}", ExitCode.USAGE
        )
    watch = Stopwatch(device)
    tokens: dict[str, int] = {}
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
    hooks.set_stage_timer(watch.stage)
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
        hooks.set_stage_timer(None)
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
