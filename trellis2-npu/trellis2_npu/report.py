"""The run reports of both pipelines: one image → 3D asset (:func:`asset_report`) and one textured mesh
(:func:`texturing_report`): their evidence lines, ``report.json`` and README tables, in one place.

Each pipeline's own evidence keys are listed once (:data:`FULL_EVIDENCE_KEYS`, :data:`TEXTURING_EVIDENCE_KEYS`),
after deliverykit's; what both runs report is built by :func:`_run_evidence` and :func:`_run_report`.
"""

from __future__ import annotations

import resource
from pathlib import Path
from typing import Any

import torch

from deliverykit import device as devices
from deliverykit.report import build_report, environment_fingerprint

from .geometry.mesh_io import PBR_LAYOUT
from .hooks import is_installed

DELIVERY = "trellis2-npu"
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


def asset_report(
    result: Any,
    exported: Any,
    glb_bytes: bytes,
    export_ms: dict[str, float],
    *,
    inputs: dict[str, Any],
    device: Any,
    model_device: Any,
    pipeline_type: str,
    export: dict[str, int],
    peak: int | None,
    wall_s: float,
    remesh: bool,
    preview_video: dict[str, int] | None,
    model: dict[str, Any],
    upstream: Path,
    weights: list[dict[str, Any]],
    random_weights: bool,
    source: Path,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(evidence, report)`` of one pipeline run (``result``) and its GLB export (``exported``, ``glb_bytes``);
    ``preview_video``: the turntable's frames, size and fps, None without ``preview.mp4``."""
    mesh = result.mesh
    vertices, faces = mesh.vertices, mesh.faces
    export_total_ms = sum(export_ms.values())
    glb_stats = {**exported.stats, "file_bytes": len(glb_bytes), "texture_format": "webp"}
    texture_size, target = export["texture_size"], export["decimation_target"]
    evidence = _run_evidence(
        result, glb_stats, export_total_ms, device=device, model_device=model_device, output=vertices,
        voxels=mesh.attrs, peak=peak, wall_s=wall_s,
        head={"PIPELINE": pipeline_type, "OUTPUT_SHAPE": [int(vertices.shape[0]), int(faces.shape[0])]},
    )  # fmt: skip
    tables = [
        {
            "title": f"{pipeline_type} pipeline stages on {devices.device_string(device)}, "
            f"{inputs['steps'] or 'default'} steps per flow (exclusive times)",
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
            "title": f"GLB export on the CPU (decimation target {target}, {texture_size}² textures, "
            f"{'remesh' if remesh else 'no remesh'})",
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
                ["texture size", f"{texture_size}²"],
                ["file MiB", round(len(glb_bytes) / 2**20, 2)],
            ],
        },
    ]
    report = _run_report(
        result, evidence, export_ms, export_total_ms, preview_video, device=device, source=source,
        model={"pipeline": pipeline_type, **model}, inputs=inputs, upstream=upstream, weights=weights,
        random_weights=random_weights,
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
    return evidence, report


def texturing_report(
    result: Any,
    glb_bytes: bytes,
    export_ms: dict[str, float],
    *,
    inputs: dict[str, Any],
    device: Any,
    model_device: Any,
    peak: int | None,
    wall_s: float,
    preview_video: dict[str, int] | None,
    model: dict[str, Any],
    upstream: Path,
    weights: list[dict[str, Any]],
    random_weights: bool,
    source: Path,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(evidence, report)`` of one texturing run (``result``: :class:`trellis2_npu.texturing.TexturingResult`)
    and its GLB."""
    stats = {**result.exported.stats, "file_bytes": len(glb_bytes), "texture_format": "webp"}
    export_total_ms = sum(export_ms.values())
    evidence = _run_evidence(
        result, stats, export_total_ms, device=device, model_device=model_device, output=result.attrs,
        voxels=result.attrs, peak=peak, wall_s=wall_s,
        head={"OUTPUT_SHAPE": [stats["input_vertices"], stats["input_faces"]], "RESOLUTION": result.resolution},
    )  # fmt: skip
    report = _run_report(
        result, evidence, export_ms, export_total_ms, preview_video, device=device, source=source,
        model={"pipeline": "texturing", "resolution": result.resolution, **model}, inputs=inputs, upstream=upstream,
        weights=weights, random_weights=random_weights,
        results={"glb": stats, "resolution": result.resolution},
    )  # fmt: skip
    return evidence, report


def _run_evidence(result: Any, glb_stats: dict[str, Any], export_total_ms: float, *, device: Any, model_device: Any,
                  output: torch.Tensor, voxels: torch.Tensor, peak: int | None, wall_s: float,
                  head: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    """The evidence both pipelines print, ``head`` (each pipeline's own first keys) after the device keys."""
    return {
        "INPUT_DEVICE": devices.device_string(device),
        "MODEL_DEVICE": devices.device_string(model_device),
        "OUTPUT_DEVICE": devices.device_string(output.device),
        "CPU_FALLBACK": output.device.type != torch.device(device).type,
        **head,
        "VOXELS_SHAPE": list(voxels.shape),
        "TOKENS": ",".join(f"{key}:{count}" for key, count in result.tokens.items()),
        "TIMING_TOTAL_MS": round(result.total_ms, 1),
        "PEAK_MEMORY_MB": None if peak is None else peak / 2**20,
        "PEAK_HOST_RSS_MB": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "GLB_SHAPE": [glb_stats["vertices"], glb_stats["faces"]],
        "TEXTURE_SIZE": glb_stats["texture_size"],
        "TIMING_EXPORT_MS": round(export_total_ms, 1),
        "WALL_S": wall_s,
    }


def _run_report(result: Any, evidence: dict[str, Any], export_ms: dict[str, float], export_total_ms: float,
                preview_video: dict[str, int] | None, *, device: Any, source: Path, model: dict[str, Any],
                inputs: dict[str, Any], upstream: Path, weights: list[dict[str, Any]], random_weights: bool,
                results: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    """``report.json`` of either pipeline: timings, tokens and the files both write, then ``results``."""
    return build_report(
        "inference",
        DELIVERY,
        random_weights=random_weights,
        evidence=evidence,
        environment=environment_fingerprint(device, source),
        model=model,
        inputs=inputs,
        upstream={"path": str(upstream)},
        weights=weights,
        timing={
            "stages_ms": result.stages_ms,
            "total_ms": result.total_ms,
            "export_ms": export_ms,
            "export_total_ms": export_total_ms,
        },
        tokens=result.tokens,
        results={
            "glb_file": "asset.glb",
            "preview_file": "preview.png",
            "preview_video_file": None if preview_video is None else "preview.mp4",
            "preview_video": preview_video,
            "voxels_file": "voxels.safetensors",
            "pbr_layout": PBR_LAYOUT,
            **results,
        },
    )
