#!/usr/bin/env python3
"""Overhead of the delivery's inference path against a bare call of its diffusers pipeline, measured side by side.

Ours is what ``inference.py`` runs on the tiny LTX-2.3 single file: the delivery's loader, fused NPU attention
processors, RoPE precision policy, ``generate.generate`` (timing hooks, per-step device synchronization, NaN/Inf
check). Bare is the loaded pipeline's class (``LTX2Pipeline`` drawing its noise as ltx-core, ``reference_fixes``)
called directly, ``cls(**components)(**pipeline_kwargs, generator=...)`` on the same components object, so both run
the very same modules (two separately loaded copies of the tiny model differ by ±3 % on the CPU from memory
placement alone, more than the overhead sought). In one process, alternating round by round
(``deliverykit.timing.benchmark_alternating``) so machine noise hits both alike; the ratio is the median over rounds
of ours / bare; target ≤ 1.02. The shared modules carry our attention processors in both variants, so their own
cost is measured apart: one attention call through ours vs diffusers' ``dispatch_attention_fn``, per call.

    python sulphur2-npu/benchmarks/sulphur_overhead.py --output sulphur2-npu/results/overhead.json

Exit code 0, or 1 with --check when the target is missed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from deliverykit.errors import run_main

DELIVERY_DIR = Path(__file__).resolve().parents[1]

TARGET = 1.02
OURS, BARE = "ours (loader + generate)", "bare LTX2Pipeline call"
DISPATCH_SHAPE = (2, 12, 2, 8)  # the tiny video self-attention: batch 2 (CFG), 12 tokens, 2 heads x 8


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", help="device (default cpu, as the README's figures)")
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--rounds", type=int, default=30, help="alternating rounds (default 30)")
    parser.add_argument("--output", required=True, help="results JSON for the README")
    parser.add_argument("--check", action="store_true", help="exit 1 when the ratio misses its target")
    return parser.parse_args(argv)


def attention_dispatch_cost(device, dtype, rounds: int) -> dict[str, float]:
    """Median µs of one small attention call through ours and through diffusers' dispatcher (1000 calls a sample)."""
    import torch
    from diffusers.models.attention_dispatch import dispatch_attention_fn

    from deliverykit.timing import benchmark_alternating
    from sulphur2_npu.attention import dispatch_ltx2_attention

    query = torch.randn(DISPATCH_SHAPE, device=device, dtype=dtype)
    calls = 1000

    def repeat(fn):
        return lambda: [fn(query, query, query) for _ in range(calls)]

    variants = {
        "ours (dispatch_ltx2_attention)": repeat(dispatch_ltx2_attention),
        "diffusers": repeat(dispatch_attention_fn),
    }
    for fn in variants.values():
        fn()
    samples = benchmark_alternating(variants, rounds, device)
    return {name: statistics.median(values) * 1000 / calls for name, values in samples.items()}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import numpy as np
    import torch

    from deliverykit import device as devices
    from deliverykit.cli import torch_dtype
    from deliverykit.files import ensure_writable_dir
    from deliverykit.report import delivery_report, write_report
    from deliverykit.timing import benchmark_alternating, paired_ratio
    from sulphur2_npu.accuracy import tiny_request
    from sulphur2_npu.attention import enable_npu_attention
    from sulphur2_npu.generate import generate, pipeline_kwargs
    from sulphur2_npu.loader import load_pipeline
    from sulphur2_npu.precision import apply_rope_precision_policy
    from sulphur2_npu.tiny import write_smoke_files

    ensure_writable_dir(Path(args.output).parent)
    device = devices.resolve_device(args.device)
    dtype = torch_dtype(args.dtype)
    with tempfile.TemporaryDirectory(prefix="sulphur2-overhead-") as scratch:
        files = write_smoke_files(Path(scratch), seed=0)
        ours = load_pipeline(files.checkpoint, files.text_encoder, torch_dtype=dtype).pipe
    enable_npu_attention(ours)
    rope = apply_rope_precision_policy(ours, device)
    ours.to(device)
    bare = type(ours)(**ours.components)
    bare.set_progress_bar_config(disable=True)
    request = tiny_request()
    kwargs = pipeline_kwargs(bare, request)

    def run_ours():
        return generate(ours, request, device=device, generator=devices.make_generator(42))

    def run_bare():
        return bare(**kwargs, generator=devices.make_generator(42))

    with torch.inference_mode():
        mine, theirs = run_ours(), run_bare()  # warm both before timing either
        identical = bool(np.array_equal(mine.video, theirs.frames[0]) and torch.equal(mine.audio, theirs.audio[0]))
        samples = benchmark_alternating({OURS: run_ours, BARE: run_bare}, args.rounds, device)
        dispatch = attention_dispatch_cost(device, dtype, args.rounds)
    ratio = paired_ratio(samples, OURS, BARE)
    medians = {name: statistics.median(values) for name, values in samples.items()}

    title = (
        f"Tiny LTX-2.3 (random weights), {request.width}x{request.height}x{request.num_frames}, {request.steps} steps, "
        f"guidance {request.guidance}, {devices.device_string(device)} {args.dtype}, RoPE {rope}"
    )
    rows = [[name, medians[name], min(samples[name]), max(samples[name]), len(samples[name])] for name in samples]
    report = delivery_report(
        "benchmark",
        DELIVERY_DIR,
        device=device,
        random_weights=True,
        results={
            "ratio": ratio,
            "target": TARGET,
            "met": ratio <= TARGET,
            "outputs_identical": identical,
            "medians_ms": medians,
            "samples_ms": samples,
            "attention_dispatch_us": dispatch,
            "tables": [
                {
                    "title": f"{title}: ratio (median over {args.rounds} alternating rounds)",
                    "columns": ["ratio", "measured", "target", "met", "identical outputs"],
                    "rows": [["ours / bare", ratio, f"≤ {TARGET}", ratio <= TARGET, identical]],
                },
                {
                    "title": f"{title}: call times",
                    "columns": ["variant", "median ms", "min ms", "max ms", "runs"],
                    "rows": rows,
                },
                {
                    "title": f"One attention call ({DISPATCH_SHAPE}, BSND) on {devices.device_string(device)} "
                    f"{args.dtype}: our processors' dispatcher vs diffusers'",
                    "columns": ["dispatcher", "median µs per call"],
                    "rows": [[name, value] for name, value in dispatch.items()],
                },
            ],
        },
    )
    write_report(args.output, report)
    verdict = "ok" if ratio <= TARGET else "MISSED"
    print(f"ours / bare: {ratio:.4f} (target ≤ {TARGET}) {verdict}; identical outputs: {identical}")
    print(f"results: {args.output}")
    return 1 if args.check and ratio > TARGET else 0


if __name__ == "__main__":
    sys.exit(run_main(main))
