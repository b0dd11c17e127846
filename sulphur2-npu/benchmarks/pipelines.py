#!/usr/bin/env python3
"""One-stage vs distilled vs two-stage (and HQ): per-stage time on the tiny model beside ltx-pipelines, and the real
model's transformer FLOPs per pipeline.

Part 1 (tiny LTX-2.3, random weights, fp32 on ``--device``): each pipeline runs through the delivery's ``generate`` at
704x448x121 (ltx-pipelines' two-stage sizes are multiples of 64: 704x480, the one-stage benchmark size, has a 240-pixel
stage 1), and each of its denoising loops and the upsampler again through Lightricks' code (``ltx_peer``:
``euler_denoising_loop``, or ``res2s_audio_video_denoising_loop`` for HQ, with ltx-core's transformer,
``upsample_video``, ``GaussianNoiser``) on the inputs the delivery's stages got, right after them; the pipelines' order
rotates round by round. The ratio per stage is the median over rounds of delivery ÷ ltx-pipelines (target ≤ 1.0). Peak
device memory per pipeline on an accelerator (the CPU has no such counter). Part 2 (no weights):
``torch.utils.flop_counter`` on LTX-2.3's real transformer config built on the meta device, one batch-1 pass at each
stage's token count, times steps and guidance passes.

    LTX2_SRC=/path/to/LTX-2 python sulphur2-npu/benchmarks/pipelines.py --output sulphur2-npu/results/pipelines.json
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from deliverykit.errors import InputError, run_main

DELIVERY_DIR = Path(__file__).resolve().parents[1]
WIDTH, HEIGHT, FRAMES = 704, 448, 121
DEV_STEPS = 8  # stage 1 of two-stage and one-stage dev (the presets use 10-30; the ratio does not depend on it)
TEXT_TOKENS = 1024  # Gemma-3's window at the real size
# LTX-2.3 over diffusers' LTX2VideoTransformer3DModel defaults (LTX-2.0's 48 x 4096 video / 2048 audio streams)
REAL_TRANSFORMER = {
    "gated_attn": True,
    "cross_attn_mod": True,
    "audio_gated_attn": True,
    "audio_cross_attn_mod": True,
    "rope_type": "split",
    "use_prompt_embeddings": False,
    "perturbed_attn": True,
}
COMMAND = "LTX2_SRC=... python sulphur2-npu/benchmarks/pipelines.py --output sulphur2-npu/results/pipelines.json"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", help="device (default cpu, as the README's figures)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    parser.add_argument("--output", required=True, help="results JSON for the README")
    return parser.parse_args(argv)


@dataclasses.dataclass(frozen=True)
class Case:
    """One pipeline as the benchmark runs it."""

    name: str
    pipeline: str
    schedule: str
    steps: int
    guidance: float


CASES = (
    Case("one-stage (dev)", "one-stage", "dev", DEV_STEPS, 3.0),
    Case("one-stage (distilled)", "one-stage", "distilled", 8, 1.0),
    Case("distilled", "distilled", "distilled", 8, 1.0),
    Case("two-stage", "two-stage", "dev", DEV_STEPS, 3.0),
    Case("two-stage-hq", "two-stage-hq", "dev", DEV_STEPS, 3.0),
)


def _timed(fn: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    value = fn()
    return value, (time.perf_counter() - start) * 1e3


def run_case(pipe: Any, model: Any, files: Any, checkpoint: Path, case: Case, device: Any) -> dict[str, Any]:
    """One round of ``case``: the delivery's stage times, then ltx-pipelines' on the same inputs."""
    import torch

    from deliverykit.device import max_memory_allocated
    from sulphur2_npu import ltx_peer
    from sulphur2_npu.accuracy import tiny_request
    from sulphur2_npu.generate import generate
    from sulphur2_npu.stages import load_stage_parts

    lora = (files.distilled_lora, 1.0)
    parts = load_stage_parts(pipe, case.pipeline, upsampler=files.upsampler, distilled_lora=lora)
    request = dataclasses.replace(
        tiny_request(), width=WIDTH, height=HEIGHT, num_frames=FRAMES, steps=case.steps, guidance=case.guidance,
        schedule=case.schedule, pipeline=case.pipeline,
    )  # fmt: skip
    capture = ltx_peer.StageCapture(pipe)
    try:
        result = generate(pipe, request, device=device, generator=torch.Generator().manual_seed(ltx_peer.SEED),
                          parts=parts)  # fmt: skip
    finally:
        capture.close()
    peak = max_memory_allocated(device)
    first = capture.calls[0]
    if result.stages is None:
        _, theirs = _timed(lambda: ltx_peer.pipelines_loop(model, first, result.sigmas, request))
        return {"ours": {"denoise": result.timings.denoise_ms}, "theirs": {"denoise": theirs}, "peak_bytes": peak}
    half = dataclasses.replace(request, width=WIDTH // 2, height=HEIGHT // 2, pipeline="one-stage")
    shape = tuple(capture.seen["upsample"][1].shape)
    plan = ltx_peer.reference_stages(case.pipeline, model, checkpoint, lora, shape, result.stages)
    options = {"sampler": plan.sampler}
    stage_1, theirs_1 = _timed(lambda: ltx_peer.pipelines_loop(plan.models[0], first, plan.sigmas[0], half, **options))
    encoder, upsampler = ltx_peer.video_encoder(checkpoint), ltx_peer.latent_upsampler(files.upsampler)
    upsampled, theirs_up = _timed(lambda: ltx_peer.upsample_tokens(stage_1[0], shape, encoder, upsampler))
    second = next(call for call in capture.calls if call["hidden_states"].shape[1] == upsampled.shape[1])
    generator = torch.Generator().manual_seed(ltx_peer.SEED)
    initial = (upsampled, stage_1[1])
    _, theirs_2 = _timed(
        lambda: ltx_peer.stage_2_loop(plan.models[1], second, initial, plan.sigmas[1], generator, **options)
    )
    ours = {
        "stage_1": result.stages["stage_1"]["denoise_ms"],
        "upsample": result.stages["upsample"]["ms"],
        "stage_2": result.stages["stage_2"]["denoise_ms"],
    }
    return {"ours": ours, "theirs": {"stage_1": theirs_1, "upsample": theirs_up, "stage_2": theirs_2},
            "peak_bytes": peak}  # fmt: skip


def real_transformer_flops() -> dict[str, float]:
    """TFLOPs of one batch-1 pass of the real LTX-2.3 transformer at the full size and at stage 1's half size."""
    import torch
    from diffusers import LTX2VideoTransformer3DModel
    from torch.utils.flop_counter import FlopCounterMode

    from sulphur2_npu.accuracy import tiny_request
    from sulphur2_npu.generate import pipeline_kwargs
    from sulphur2_npu.precision import capture_transformer_call
    from sulphur2_npu.tiny import tiny_pipeline

    with torch.device("meta"):
        model = LTX2VideoTransformer3DModel(**REAL_TRANSFORMER).eval()
    config = model.config
    small = tiny_pipeline()
    flops = {}
    for name, (width, height) in {"full": (WIDTH, HEIGHT), "half": (WIDTH // 2, HEIGHT // 2)}.items():
        request = dataclasses.replace(tiny_request(), width=width, height=height, num_frames=FRAMES, guidance=1.0)
        shapes = capture_transformer_call(small, pipeline_kwargs(small, request))  # token counts and positions
        widths = {
            "hidden_states": config.in_channels,
            "audio_hidden_states": config.audio_in_channels,
            "encoder_hidden_states": config.cross_attention_dim,
            "audio_encoder_hidden_states": config.audio_cross_attention_dim,
        }
        kwargs = {}
        for key, value in shapes.items():
            if not torch.is_tensor(value):
                kwargs[key] = value
            elif key in widths:
                tokens = TEXT_TOKENS if "encoder" in key else value.shape[1]
                kwargs[key] = torch.empty((1, tokens, widths[key]), device="meta")
            elif key.endswith("attention_mask"):
                kwargs[key] = torch.ones((1, TEXT_TOKENS), device="meta")
            else:
                kwargs[key] = value[:1].to("meta")
        counter = FlopCounterMode(display=False)
        with counter, torch.no_grad():
            model(**{**kwargs, "return_dict": False})
        flops[name] = counter.get_total_flops() / 1e12
    return flops


def flops_per_pipeline(per_pass: dict[str, float]) -> dict[str, float]:
    """Transformer TFLOPs of one video: model calls x sample rows per call x one pass (CFG + STG + modality = 4
    rows; the HQ guidance has no STG: 3). res_2s makes 2n + 1 calls of n steps."""
    from sulphur2_npu.stages import STAGE_2_SIGMAS

    guided_rows, hq_rows, plain_rows = 4, 3, 1
    stage_2 = len(STAGE_2_SIGMAS) * plain_rows * per_pass["full"]
    return {
        "one-stage (dev)": DEV_STEPS * guided_rows * per_pass["full"],
        "one-stage (distilled)": 8 * plain_rows * per_pass["full"],
        "distilled": 8 * plain_rows * per_pass["half"] + stage_2,
        "two-stage": DEV_STEPS * guided_rows * per_pass["half"] + stage_2,
        "two-stage-hq": (2 * DEV_STEPS + 1) * hq_rows * per_pass["half"]
        + (2 * len(STAGE_2_SIGMAS) + 1) * plain_rows * per_pass["full"],
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    from deliverykit import device as devices
    from deliverykit.files import ensure_writable_dir
    from deliverykit.report import delivery_report, write_report
    from sulphur2_npu import ltx_peer
    from sulphur2_npu.loader import load_pipeline
    from sulphur2_npu.tiny import write_smoke_files

    source = ltx_peer.peer_source()
    if source is None or not (source / "packages" / "ltx-core").is_dir():
        raise InputError(f"{ltx_peer.ENV} is unset or not a checkout: set it to Lightricks/LTX-2 at "
                         f"{ltx_peer.PINNED_COMMIT} (the ltx-pipelines side of the comparison)")  # fmt: skip
    ltx_peer.import_peer(source)
    ensure_writable_dir(Path(args.output).parent)
    device = devices.resolve_device(args.device)
    per_pass = real_transformer_flops()
    flops = flops_per_pipeline(per_pass)
    rounds: dict[str, list[dict[str, Any]]] = {case.name: [] for case in CASES}
    with tempfile.TemporaryDirectory(prefix="sulphur2-pipelines-") as scratch:
        files = write_smoke_files(Path(scratch), seed=0)
        checkpoint = ltx_peer.write_ltx_core_transformer(files.checkpoint, Path(scratch) / "ltx-core.safetensors")
        model = ltx_peer.transformer(checkpoint)
        with torch.inference_mode():
            for index in range(args.rounds):
                for case in CASES[index % len(CASES) :] + CASES[: index % len(CASES)]:
                    pipe = load_pipeline(checkpoint, files.text_encoder, torch_dtype=torch.float32).pipe.to(device)
                    rounds[case.name].append(run_case(pipe, model, files, checkpoint, case, device))
                    print(f"round {index + 1} {case.name}: {rounds[case.name][-1]['ours']}", flush=True)
    rows, summary = [], {}
    for case in CASES:
        samples = rounds[case.name]
        stages = list(samples[0]["ours"])
        ours = {s: statistics.median(r["ours"][s] for r in samples) for s in stages}
        theirs = {s: statistics.median(r["theirs"][s] for r in samples) for s in stages}
        ratios = {s: statistics.median(r["ours"][s] / r["theirs"][s] for r in samples) for s in stages}
        peaks = [r["peak_bytes"] for r in samples if r["peak_bytes"] is not None]
        summary[case.name] = {"ours_ms": ours, "theirs_ms": theirs, "ratio": ratios,
                              "peak_device_mb": max(peaks) / 2**20 if peaks else None,
                              "real_transformer_tflops": flops[case.name]}  # fmt: skip
        for stage in stages:
            rows.append([case.name, stage, ours[stage], theirs[stage], ratios[stage]])
    base = flops["one-stage (distilled)"]
    flops_rows = [[name, value, value / base] for name, value in flops.items()]
    title = (f"Tiny LTX-2.3 (random weights), {WIDTH}x{HEIGHT}x{FRAMES}, {devices.device_string(device)} fp32, "
             f"dev stage {DEV_STEPS} steps with guidance; medians of {args.rounds} alternating rounds")  # fmt: skip
    report = delivery_report(
        "benchmark",
        DELIVERY_DIR,
        device=device,
        random_weights=True,
        results={
            "size": [WIDTH, HEIGHT, FRAMES],
            "pipelines": summary,
            "rounds": rounds,
            "real_tflops_per_pass": per_pass,
            "peer": f"Lightricks/LTX-2 @ {ltx_peer.PINNED_COMMIT}",
            "command": COMMAND,
            "tables": [
                {
                    "title": f"{title}: denoising (and upsampler) ms per stage, the delivery vs ltx-pipelines' loops "
                    "on the same inputs (target ratio ≤ 1.0)",
                    "columns": ["pipeline", "stage", "delivery ms", "ltx-pipelines ms", "ratio"],
                    "rows": rows,
                },
                {
                    "title": f"Real LTX-2.3 transformer (48 layers, meta device), {WIDTH}x{HEIGHT}x{FRAMES}, "
                    f"{TEXT_TOKENS} text tokens: TFLOPs per video (one pass: {per_pass['full']:.1f} at full size, "
                    f"{per_pass['half']:.1f} at stage 1's half size; guidance = 4 sample rows a model call, HQ's 3; "
                    "res_2s: 2n + 1 calls)",
                    "columns": ["pipeline", "transformer TFLOPs", "vs one-stage (distilled)"],
                    "rows": flops_rows,
                },
            ],
        },
    )
    write_report(args.output, report)
    print(f"results: {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
