"""The run report of one URSA generation: its evidence lines, ``report.json`` and README table row, in one place.

URSA's own evidence keys are listed once (:data:`EVIDENCE_KEYS`), after deliverykit's documented ones.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from deliverykit import device as devices
from deliverykit.report import RunRecord, peak_host_rss_mb
from deliverykit.timing import TimingStats

from . import MODEL_ID

if TYPE_CHECKING:
    from .session import Result, Session

DELIVERY_DIR = Path(__file__).resolve().parents[1]  # its git commit goes into the report
EVIDENCE_KEYS = (
    "COMPILE_BACKEND",  # the patched RoPE kernel's torch.compile backend (deliverykit.compile)
    "DTYPE",
    "STEPS",
    "DIFFUSION_MS",
    "IT_PER_S",
    "VAE_DECODE_MS",
    "TOTAL_MS",
    "PROMPT_TOKENS",
    "PROMPT_TRUNCATED",
    "PEAK_HOST_RSS_MB",
)


def generation_report(session: Session, result: Result, image_name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(evidence, report)`` of ``result`` (the runs of one request; the last one's image is written as
    ``image_name``) and of where its transformer and VAE were while they ran (audited inside
    :func:`.generate.generate`: afterwards the transformer sits on the CPU by design)."""
    from deliverykit.compile import backend_name  # imports torch: not at module import (usage errors stay fast)

    request, results, warmup, device = result.request, result.runs, result.warmup, session.device
    dtype_name, prompt_tokens, max_prompt_length = session.dtype_name, result.prompt_tokens, session.max_prompt_length
    last = results[-1]
    placement = last.placement
    total = TimingStats.from_samples([r.total_ms for r in results], warmup=warmup)
    diffusion = TimingStats.from_samples([r.diffusion_ms for r in results], warmup=warmup)
    decode = TimingStats.from_samples([r.decode_ms for r in results], warmup=warmup)
    peak = max((r.peak_memory_bytes for r in results if r.peak_memory_bytes is not None), default=None)
    device_label = devices.device_string(device)
    record = RunRecord(DELIVERY_DIR, device, session.random_weights)
    evidence = {
        **record.evidence_head(
            model_device=placement[0].model_device,
            cpu_fallback=any(audit.cpu_fallback for audit in placement),
            latent_shape=last.token_ids.shape,
            output_shape=last.image.shape,
            total_ms=[r.total_ms for r in results],
            peak_memory_bytes=peak,
        ),
        "COMPILE_BACKEND": backend_name(device),
        "DTYPE": dtype_name,
        "STEPS": request.steps,
        "DIFFUSION_MS": diffusion.median_ms,
        "IT_PER_S": request.steps / (diffusion.median_ms / 1000.0),
        "VAE_DECODE_MS": decode.median_ms,
        "TOTAL_MS": total.median_ms,
        "PROMPT_TOKENS": prompt_tokens,
        "PROMPT_TRUNCATED": prompt_tokens > max_prompt_length,
        "PEAK_HOST_RSS_MB": peak_host_rss_mb(),
    }
    table = {
        "title": f"{request.height}x{request.width}, {request.steps} steps, guidance {request.guidance}, "
        f"{dtype_name} on {device_label} (medians of {len(results)} run(s) after {warmup} warmup)",
        "columns": ["diffusion ms", "it/s", "VAE decode ms", "total ms", "peak device MB"],
        "rows": [
            [diffusion.median_ms, evidence["IT_PER_S"], decode.median_ms, total.median_ms, evidence["PEAK_MEMORY_MB"]]
        ],
    }
    report = record.report(
        "inference",
        evidence,
        model={"id": MODEL_ID, **session.model},
        weights=session.weights,
        upstream={"path": str(session.checkout)},
        inputs={
            **request.as_dict(),
            "prompt_tokens": prompt_tokens,
            "max_prompt_length": max_prompt_length,
            "prompt_truncated": evidence["PROMPT_TRUNCATED"],
            "dtype": dtype_name,
        },
        timing={
            "stages_ms": last.stages_ms,
            "diffusion": diffusion.to_dict(),
            "vae_decode": decode.to_dict(),
            "total": total.to_dict(),
            "iterations_per_s": evidence["IT_PER_S"],
        },
        placement={"off_device": [name for audit in placement for name in audit.off_device]},
        results={
            "image_file": image_name,
            "token_ids_head": last.token_ids.flatten()[:16].tolist(),
            "tables": [table],
        },
    )
    return evidence, report
