#!/usr/bin/env python3
"""What float32 RoPE frequencies (the NPU policy) cost against LTX-2's float64, measured on the CPU.

Two parts (``sulphur2_npu.precision``): the tiny model loaded through the delivery's loader (RoPE tables, first
transformer forward with identical inputs, whole pipeline with identical noise: max |Δ| and relative L2 error), and
the video RoPE tables of the full-size 22B transformer at each preset's latent grid (built on the meta device: the
tables depend on the config, not on the weights).

    python sulphur2-npu/benchmarks/rope_precision.py --output sulphur2-npu/results/rope_precision.json
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from deliverykit.errors import run_main

DELIVERY_DIR = Path(__file__).resolve().parents[1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", required=True, help="results JSON for the README")
    parser.add_argument("--seed", type=int, default=42)
    return parser.parse_args(argv)


def latent_grid(width: int, height: int, num_frames: int) -> tuple[int, int, int]:
    """(frames, height, width) in latent units: the VAE compresses 8x in time (+ the first frame), 32x in space."""
    return (num_frames - 1) // 8 + 1, height // 32, width // 32


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    from deliverykit.files import ensure_writable_dir
    from deliverykit.report import delivery_report, write_report
    from sulphur2_npu.accuracy import tiny_request
    from sulphur2_npu.generate import pipeline_kwargs
    from sulphur2_npu.loader import load_pipeline
    from sulphur2_npu.precision import full_size_rope_cost, measure_rope_precision_cost
    from sulphur2_npu.presets import PRESETS
    from sulphur2_npu.tiny import write_smoke_files

    ensure_writable_dir(Path(args.output).parent)
    with tempfile.TemporaryDirectory(prefix="sulphur2-rope-") as scratch:
        files = write_smoke_files(Path(scratch), seed=0)
        pipe = load_pipeline(files.checkpoint, files.text_encoder, torch_dtype=torch.float32).pipe
    tiny = measure_rope_precision_cost(pipe, pipeline_kwargs(pipe, tiny_request()), seed=args.seed)
    full_size = {}
    for name, preset in PRESETS.items():
        full_size[name] = full_size_rope_cost(latent_grid(preset.width, preset.height, preset.num_frames))

    labels = {"rope": "RoPE table", "transformer": "first forward", "pipeline": "2-step pipeline"}
    tiny_rows = [
        [f"{labels[stage]}: {part}", errors["max_abs"], errors["rel_l2"]]
        for stage in labels
        for part, errors in tiny[stage].items()
    ]
    full_rows = [
        [name, f"{p.width}x{p.height}x{p.num_frames}", "x".join(map(str, cost["latent_grid"])),
         cost["cos"]["max_abs"], cost["sin"]["max_abs"], max(cost["cos"]["rel_l2"], cost["sin"]["rel_l2"])]
        for (name, cost), p in zip(full_size.items(), PRESETS.values(), strict=True)
    ]  # fmt: skip
    report = delivery_report(
        "accuracy",
        DELIVERY_DIR,
        device="cpu",
        random_weights=True,
        results={
            "tiny": tiny,
            "full_size": full_size,
            "tables": [
                {
                    "title": "float32 vs float64 RoPE, tiny LTX-2.3 (random weights, 96x64x9, CPU generator "
                    f"seed {args.seed}, same inputs and noise)",
                    "columns": ["output", "max abs", "rel L2"],
                    "rows": tiny_rows,
                },
                {
                    "title": "float32 vs float64 video RoPE tables of the full-size transformer "
                    f"(32 heads x 128, rope dim {next(iter(full_size.values()))['rope_dim']}) at each preset",
                    "columns": ["preset", "video", "latent grid", "cos max abs", "sin max abs", "rel L2"],
                    "rows": full_rows,
                },
            ],
        },
    )
    write_report(args.output, report)
    for row in tiny_rows + full_rows:
        print(" | ".join(str(cell) for cell in row))
    print(f"results: {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
