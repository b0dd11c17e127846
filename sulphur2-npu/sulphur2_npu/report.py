"""The run report of one Sulphur-2 generation: its evidence lines, ``report.json`` and README table row, in one place.

Sulphur's own evidence keys are listed once (:data:`EVIDENCE_KEYS`), after deliverykit's documented ones.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deliverykit import device as devices
from deliverykit.report import RunRecord, peak_host_rss_mb
from deliverykit.timing import TimingStats
from sulphur2_npu import MODEL_ID

if TYPE_CHECKING:
    from sulphur2_npu.session import Result, Session

DELIVERY_DIR = Path(__file__).resolve().parents[1]  # its git commit goes into the report
EVIDENCE_KEYS = (
    "MODE",
    "PIPELINE",
    "SCHEDULE",
    "CHECKPOINT_FAMILY",
    "CONFIG_SOURCE",
    "RANDOM_WEIGHTS",
    "DTYPE",
    "MEMORY_PLAN",
    "ROPE_PRECISION",
    "LOAD_S",
    "PREPARE_MS",
    "FIRST_STEP_MS",
    "PER_STEP_MS",
    "VAE_DECODE_MS",
    "TOTAL_MS",
    "AUDIO_SAMPLE_RATE",
    "AUDIO_SHAPE",
    "PEAK_HOST_RSS_MB",
    "PARALLEL",
    "WORLD_SIZE",
    "COMM_BYTES_PER_STEP",
)


def generation_report(session: Session, result: Result, files: dict[str, str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(evidence, report)`` of ``result`` (the runs of one request on ``session``; the last one's video is written,
    its files named in ``files``: ``video_file``, ``first_frame_file``, ``last_frame_file``). The model's files are
    recorded as None with ``smoke``."""
    prepared, schedule, model, weights = session.prepared, session.schedule, session.model, session.weights
    asked, results, warmup, request = result.request, result.runs, result.warmup, result.request.call
    last, loaded, checkpoint = result.last, prepared.loaded, prepared.loaded.info.checkpoint
    pipe, device, plan, placement = loaded.pipe, prepared.device, prepared.plan, prepared.placement
    dtype_name, spec, world_size = prepared.dtype_name, prepared.spec, prepared.context.world_size
    attention_processors, rope_precision, lora = prepared.attention_processors, prepared.rope_precision, prepared.lora

    def stats(name: str) -> TimingStats:
        return TimingStats.from_samples([getattr(r.timings, name) for r in results], warmup=warmup)

    total, first_step, per_step, decode = (stats(n) for n in ("total_ms", "first_step_ms", "per_step_ms", "decode_ms"))
    prepare = stats("prepare_ms")
    peak = max((r.peak_memory_bytes for r in results if r.peak_memory_bytes is not None), default=None)
    device_label = devices.device_string(device)
    random_weights = bool(model["smoke"])
    record = RunRecord(DELIVERY_DIR, device, random_weights)
    evidence = {
        **record.evidence_head(
            model_device=placement.model_device,
            # Offload plans keep weights on the host by design; a fallback only means something when all is resident.
            cpu_fallback=placement.cpu_fallback if plan.name == "none" else False,
            latent_shape=[
                pipe.transformer.config.in_channels,
                (request.num_frames - 1) // pipe.vae_temporal_compression_ratio + 1,
                request.height // pipe.vae_spatial_compression_ratio,
                request.width // pipe.vae_spatial_compression_ratio,
            ],
            output_shape=last.video.shape,
            total_ms=[r.timings.total_ms for r in results],
            peak_memory_bytes=peak,
        ),
        "MODE": "a2v"
        if request.audio is not None
        else "retake"
        if request.retake
        else "i2v"
        if request.image
        else "t2v",
        "PIPELINE": request.pipeline,
        "SCHEDULE": schedule.name,
        "CHECKPOINT_FAMILY": checkpoint.family,
        "CONFIG_SOURCE": checkpoint.config_source,
        "RANDOM_WEIGHTS": random_weights,
        "DTYPE": dtype_name,
        "MEMORY_PLAN": plan.name,
        "ROPE_PRECISION": rope_precision,
        "LOAD_S": loaded.load_seconds,
        "PREPARE_MS": prepare.median_ms,
        "FIRST_STEP_MS": first_step.median_ms,
        "PER_STEP_MS": per_step.median_ms,
        "VAE_DECODE_MS": decode.median_ms,
        "TOTAL_MS": total.median_ms,
        "AUDIO_SAMPLE_RATE": last.sample_rate,
        "AUDIO_SHAPE": list(last.audio.shape),
        "PEAK_HOST_RSS_MB": peak_host_rss_mb(),
        "PARALLEL": f"ulysses={spec.ulysses},guidance={spec.guidance}",
        "WORLD_SIZE": world_size,
        "COMM_BYTES_PER_STEP": last.comm_bytes_per_step,
    }
    table = {
        "title": f"{request.width}x{request.height}x{request.num_frames}, {request.pipeline} pipeline, "
        f"{request.steps} steps ({schedule.name} schedule{', stage 1' if last.stages else ''}), guidance "
        f"{request.guidance}, {dtype_name}, memory plan {plan.name} on {device_label} (medians of "
        f"{len(results)} run(s) after {warmup} warmup)",
        "columns": ["load s", "first step ms", "per step ms", "VAE decode ms", "total ms", "peak device MB"],
        "rows": [
            [
                loaded.load_seconds,
                first_step.median_ms,
                per_step.median_ms,
                decode.median_ms,
                total.median_ms,
                evidence["PEAK_MEMORY_MB"],
            ]
        ],
    }
    report = record.report(
        "inference",
        evidence,
        model={
            "id": MODEL_ID,
            "smoke": model["smoke"],
            **{key: None if random_weights else model[key] for key in ("checkpoint", "text_encoder")},
            "family": checkpoint.family,
            "family_evidence": checkpoint.evidence,
            "config_source": checkpoint.config_source,
            "config_sources": checkpoint.config_sources,
            "assumptions": checkpoint.assumptions,
            "checkpoint_dtypes": checkpoint.dtypes,
            "parameter_counts": loaded.info.parameter_counts,
            "attention_processors_swapped": attention_processors,
            "rope_precision": rope_precision,
            "lora": None if lora is None else dataclasses.asdict(lora),
            "stage_adapters": {"stage_1": prepared.parts.stage_1_adapters, "stage_2": prepared.parts.stage_2_adapters},
        },
        weights=weights,
        inputs={
            "mode": evidence["MODE"],
            "prompt": request.prompt,
            "negative_prompt": request.negative_prompt,
            "image": asked.image_file,
            "audio": None if request.audio is None else _sound_track(request),
            "retake": None if request.retake is None else _retake(request.retake),
            "preset": asked.preset or ("tiny" if random_weights else None),
            "width": request.width,
            "height": request.height,
            "num_frames": request.num_frames,
            "pipeline": request.pipeline,
            "pipeline_why": schedule.pipeline_why,
            "schedule": schedule.name,
            "schedule_why": schedule.why,
            "steps": request.steps,
            "guidance": request.guidance,
            "fps": request.fps,
            "seed": asked.seed,
            "dtype": dtype_name,
            "max_sequence_length": request.max_sequence_length,
            "parallel": spec.as_dict(),
            "world_size": world_size,
        },
        memory_plan=plan.as_dict(),
        timing={
            "load_s": loaded.load_seconds,
            "encode_prompt_ms": asked.encode_ms,
            "runs": [r.timings.as_dict() for r in results],
            "prepare": prepare.to_dict(),
            "first_step": first_step.to_dict(),
            "per_step": per_step.to_dict(),
            "vae_decode": decode.to_dict(),
            "total": total.to_dict(),
            "stages": last.stages,  # two-stage pipelines: per stage sizes, tokens, σ and ms (the last run)
        },
        placement={"model_device": placement.model_device, "off_device": placement.off_device[:20]},
        results={
            **files,
            "frames": int(last.video.shape[0]),
            "sigmas": last.sigmas,
            "audio_sample_rate": last.sample_rate,
            "audio_samples": int(last.audio.shape[-1]),
            "peak_device_memory_mb": evidence["PEAK_MEMORY_MB"],
            "peak_host_rss_mb": evidence["PEAK_HOST_RSS_MB"],
            "comm_bytes_per_step": last.comm_bytes_per_step,
            "tables": [table],
        },
    )
    return evidence, report


def _sound_track(request: Any) -> dict[str, Any]:
    """The a2v request's sound track: where it came from, its rate and the seconds the video used."""
    audio = request.audio
    return {"source": audio.source, "sample_rate": audio.sample_rate, "seconds": audio.seconds}


def _retake(retake: Any) -> dict[str, Any]:
    """The retake request's source and span, and whether its sound was kept outside the span or made whole."""
    sound = "kept outside the span" if retake.sound is not None else "made whole (the source has none)"
    return {"source": retake.source, "start": retake.start, "end": retake.end, "fps": retake.fps, "sound": sound}
