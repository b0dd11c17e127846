#!/usr/bin/env python3
"""512x512 text → image benchmark: ``inference.py --bench`` with fixed settings, warmup + repeats, report JSON.

Real weights on an NPU (the figures the README asks for):

    python ursa-npu/benchmarks/text_to_image_512.py --upstream ~/src/URSA --weights ~/weights/URSA-1.7B-IBQ512 \\
        --device npu --report ursa-npu/results/benchmark_512_npu.json

Without weights, ``--smoke`` runs the tiny URSA at the real sequence shape (320 prompt tokens + 1024 image tokens
through a stride-16 VQ decoder to 512x512): it times the pipeline's overheads, not the 1.7B model.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
from pathlib import Path

DELIVERY_DIR = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--weights", help="downloaded URSA folder")
    source.add_argument("--smoke", action="store_true", help="tiny URSA at the real sequence shape (tiny512)")
    parser.add_argument("--upstream", help="patched baaivision/URSA checkout (default: $URSA_SRC)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", help="default: fp16 on an accelerator, fp32 on the CPU")
    parser.add_argument("--steps", type=int, default=25, help="sampling steps (default 25, as upstream's demo)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--report", required=True, help="results JSON, e.g. ursa-npu/results/benchmark_512.json")
    args = parser.parse_args(argv)

    spec = importlib.util.spec_from_file_location("ursa_inference", DELIVERY_DIR / "inference.py")
    inference = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(inference)
    with tempfile.TemporaryDirectory(prefix="ursa-bench-") as scratch:
        forwarded = ["--smoke", "tiny512"] if args.smoke else ["--weights", args.weights]
        forwarded += ["--prompt", "a red cat on the mountain under the blue sky with sun"]
        forwarded += ["--height", "512", "--width", "512", "--steps", str(args.steps), "--device", args.device]
        forwarded += ["--bench", "--warmup", str(args.warmup), "--runs", str(args.runs), "--report", args.report]
        forwarded += ["--output", str(Path(scratch) / "bench.jpg")]
        forwarded += ["--upstream", args.upstream] if args.upstream else []
        forwarded += ["--dtype", args.dtype] if args.dtype else []
        return inference.run_main(lambda: inference.main(forwarded))


if __name__ == "__main__":
    sys.exit(main())
