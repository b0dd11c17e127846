"""The run reports of both pipelines: one image → 3D asset (:func:`asset_report`) and one textured mesh
(:func:`texturing_report`): their evidence lines, ``report.json`` and README tables, in one place.

Each pipeline's own evidence keys are listed once (:data:`FULL_EVIDENCE_KEYS`, :data:`TEXTURING_EVIDENCE_KEYS`),
after deliverykit's; what both runs report is built by :func:`_run_evidence` and :func:`_run_report`. Both take
the session, the asset it made (:class:`trellis2_npu.session.Asset`) and the steps timed while writing it.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from deliverykit import device as devices
from deliverykit.report import RunRecord, peak_host_rss_mb

from .geometry import turntable
from .geometry.mesh_io import PBR_LAYOUT
from .hooks import is_installed

if TYPE_CHECKING:
    from .session import Asset, PipelineSession, Session, TexturingSession

DELIVERY_DIR = Path(__file__).resolve().parents[1]  # its git commit goes into the report
FULL_EVIDENCE_KEYS = (
    "PIPELINE",
    "VOXELS_SHAPE",
    "TOKENS",
    "TIMING_TOTAL_MS",
    "GLB_SHAPE",
    "TEXTURE_SIZE",
    "TIMING_EXPORT_MS",
    "PEAK_HOST_RSS_MB",
    "WALL_S",
)
TEXTURING_EVIDENCE_KEYS = ("RESOLUTION", *FULL_EVIDENCE_KEYS[1:])


def asset_report(session: Session, asset: Asset, write_ms: dict[str, float]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(evidence, report)`` of one image → 3D run and its GLB export."""
    result, request, options = asset.run, asset.request, asset.request.export_options
    vertices, faces = result.mesh.vertices, result.mesh.faces
    export_ms = {**asset.export_ms, **write_ms}
    export_total_ms = sum(export_ms.values())
    glb_stats = {**asset.exported.stats, "file_bytes": len(asset.glb_bytes), "texture_format": "webp"}
    evidence = _run_evidence(
        session, asset, glb_stats, export_total_ms, output=vertices,
        head={"PIPELINE": request.pipeline_type, "OUTPUT_SHAPE": [int(vertices.shape[0]), int(faces.shape[0])]},
    )  # fmt: skip
    tables = [
        {
            "title": f"{request.pipeline_type} pipeline stages on {devices.device_string(session.device)}, "
            f"{request.steps or 'default'} steps per flow (exclusive times)",
            "columns": ["stage", "ms", "share"],
            "rows": [[stage, ms, f"{100 * ms / result.total_ms:.0f} %"] for stage, ms in result.stages_ms.items()]
            + [["total", result.total_ms, "100 %"]],
        },
        {
            "title": "Tokens per flow stage and output size",
            "columns": ["what", "count"],
            "rows": [
                *([key, count] for key, count in result.tokens.items()),
                ["mesh vertices", int(vertices.shape[0])],
                ["mesh faces", int(faces.shape[0])],
            ],
        },
        {
            "title": f"GLB export on the CPU (decimation target {options.decimation_target}, "
            f"{options.texture_size}² textures, {'remesh' if options.remesh else 'no remesh'})",
            "columns": ["step", "ms", "share"],
            "rows": [[step, ms, f"{100 * ms / export_total_ms:.0f} %"] for step, ms in export_ms.items()]
            + [["total", export_total_ms, "100 %"]],
        },
        {
            "title": "GLB contents",
            "columns": ["what", "count"],
            "rows": [
                ["faces", glb_stats["faces"]],
                ["vertices (split on UV seams)", glb_stats["vertices"]],
                ["texture size", f"{options.texture_size}²"],
                ["texture coverage", round(glb_stats["texel_coverage"], 3)],
                ["charts", glb_stats["charts"]],
                ["charts under 8 texels", f"{100 * glb_stats['small_chart_share']:.1f} %"],
                ["texels per unit (density)", round(glb_stats["texels_per_unit"])],
                ["file MiB", round(len(asset.glb_bytes) / 2**20, 2)],
            ],
        },
        {
            "title": "The exported surface (before the UV seams split its vertices)",
            "columns": ["check", "value"],
            "rows": [[key.replace("_", " "), value] for key, value in glb_stats["mesh_qa"].items()],
        },
    ]
    inputs = {"image": request.image_name or "tiny RGBA test image", "seed": request.seed, "steps": request.steps}
    report = _run_report(
        session, asset, evidence, export_ms, model={"pipeline": request.pipeline_type}, inputs=inputs,
        results={
            "glb": glb_stats,
            "mesh_file": "mesh.ply",
            "resolution": result.resolution,
            "vertices": int(vertices.shape[0]),
            "faces": int(faces.shape[0]),
            "fill_holes": "cumesh" if vertices.device.type == "cuda" and is_installed("cumesh") else "mesh_repair",
            "tables": tables,
        },
    )  # fmt: skip
    report["memory_plan"] = session.memory_plan.as_dict()  # which models the stages had on the device
    if result.budget is not None:  # the cascade's token budget, and the grid it left (lowered: degraded says why)
        report["token_budget"] = {**dataclasses.asdict(result.budget), "degraded": result.degraded}
    return evidence, report


def texturing_report(
    session: TexturingSession, asset: Asset, write_ms: dict[str, float]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(evidence, report)`` of one texturing run and its GLB."""
    result, request = asset.run, asset.request
    stats = {**asset.exported.stats, "file_bytes": len(asset.glb_bytes), "texture_format": "webp"}
    export_ms = {**asset.export_ms, **write_ms}
    export_total_ms = sum(export_ms.values())
    evidence = _run_evidence(
        session, asset, stats, export_total_ms, output=result.attrs,
        head={"OUTPUT_SHAPE": [stats["input_vertices"], stats["input_faces"]], "RESOLUTION": result.resolution},
    )  # fmt: skip
    inputs = {"mesh": request.mesh_name, "image": request.image_name, "seed": request.seed, "steps": request.steps}
    report = _run_report(
        session, asset, evidence, export_ms, model={"pipeline": "texturing", "resolution": result.resolution},
        inputs=inputs, results={"glb": stats, "resolution": result.resolution},
    )  # fmt: skip
    return evidence, report


def _run_evidence(session: PipelineSession, asset: Asset, glb_stats: dict[str, Any], export_total_ms: float, *,
                  output: torch.Tensor, head: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    """The evidence both pipelines print: deliverykit's head (devices, ``OUTPUT_SHAPE``, peak memory), ``head``
    (each pipeline's own first keys), then the keys both add."""
    record = RunRecord(DELIVERY_DIR, session.device, session.random_weights)
    device_head = record.evidence_head(
        model_device=session.loaded.device,
        output_device=output.device,
        cpu_fallback=output.device.type != torch.device(session.device).type,
        output_shape=head["OUTPUT_SHAPE"],
        peak_memory_bytes=asset.peak_memory_bytes,
    )
    return {
        **device_head,
        **head,
        "VOXELS_SHAPE": list(asset.voxels[1].shape),
        "TOKENS": ",".join(f"{key}:{count}" for key, count in asset.run.tokens.items()),
        "TIMING_TOTAL_MS": round(asset.run.total_ms, 1),
        "PEAK_HOST_RSS_MB": peak_host_rss_mb(),
        "GLB_SHAPE": [glb_stats["vertices"], glb_stats["faces"]],
        "TEXTURE_SIZE": glb_stats["texture_size"],
        "TIMING_EXPORT_MS": round(export_total_ms, 1),
        "WALL_S": round(time.perf_counter() - asset.started, 1),
    }


def _run_report(session: PipelineSession, asset: Asset, evidence: dict[str, Any], export_ms: dict[str, float], *,
                model: dict[str, Any], inputs: dict[str, Any], results: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    """``report.json`` of either pipeline: timings, tokens and the files both write, then ``results``."""
    record = RunRecord(DELIVERY_DIR, session.device, session.random_weights)
    half_models = devices.half_compute_dtype(session.device)  # the released fp16 decoders' dtype in this run
    return record.report(
        "inference",
        evidence,
        model={**model, **session.model, "fp16_models_compute_in": str(half_models).removeprefix("torch.")},
        inputs=inputs,
        upstream={"path": str(session.checkout)},
        weights=session.weights,
        timing={
            "stages_ms": asset.run.stages_ms,
            "total_ms": asset.run.total_ms,
            "export_ms": export_ms,
            "export_total_ms": sum(export_ms.values()),
        },
        tokens=asset.run.tokens,
        results={
            "glb_file": "asset.glb",
            "preview_file": "preview.png",
            "preview_video_file": None if asset.video is None else "preview.mp4",
            "preview_video": turntable.video_record(asset.video),
            "voxels_file": "voxels.safetensors",
            "pbr_layout": PBR_LAYOUT,
            **results,
        },
    )
