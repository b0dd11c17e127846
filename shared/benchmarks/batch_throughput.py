#!/usr/bin/env python3
"""Items per hour: one process running a ``--batch`` vs one process per item, side by side in one run.

The command after ``--`` is a delivery's ``inference.py`` with everything but the input and the output, e.g.

    python shared/benchmarks/batch_throughput.py --items 6 --single-suffix .jpg \\
        --output ursa-npu/results/batch_throughput.json -- \\
        python ursa-npu/inference.py --upstream "$URSA_SRC" --smoke --device cpu

Each item is a prompt (``--input prompt``), an image from ``--images DIR`` (``--input image``) or only a seed, the
smoke model's own input otherwise (``--input seed``: trellis2-npu's tiny test image). The batch run gets
``--batch FILE --output DIR``; each single run gets ``--prompt P`` (or ``--image F``) ``--seed i --output
single/i<suffix>``. The ratio shows what loading the model once saves: with tiny models it is mostly start-up and
load time; with real weights (minutes of loading per process) it grows with the load time.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from deliverykit.report import build_report, environment_fingerprint

SHARED = Path(__file__).resolve().parents[1]


def _run(argv: list[str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"error: {shlex.join(argv)} exited {done.returncode}: {done.stderr.strip().splitlines()[-1:]}")
    return time.perf_counter() - start


def _device_of(command: list[str]) -> str | None:
    """The ``--device`` the delivery command names (its own default when absent: not known here)."""
    if "--device" in command[:-1]:
        return command[command.index("--device") + 1]
    return next((arg.split("=", 1)[1] for arg in command if arg.startswith("--device=")), None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=6)
    parser.add_argument("--input", choices=("prompt", "image", "seed"), default="prompt")
    parser.add_argument("--images", help="folder of input images (--input image)")
    parser.add_argument("--single-suffix", default="", help="what a single run's --output ends with (.jpg, .mp4)")
    parser.add_argument("--output", required=True, help="results JSON")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- python DELIVERY/inference.py FLAGS")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command or args.items < 1:
        parser.error("give --items >= 1 and the delivery command after --")

    with tempfile.TemporaryDirectory(prefix="batch-bench-") as work:
        work = Path(work)
        if args.input == "prompt":
            inputs = [f"a photo of object number {i}" for i in range(args.items)]
            batch_file = work / "prompts.jsonl"
            batch_file.write_text("".join(json.dumps({"prompt": p, "seed": i}) + "\n" for i, p in enumerate(inputs)))
        elif args.input == "image":
            inputs = sorted(str(p) for p in Path(args.images).iterdir())[: args.items]
            batch_file = work / "images.jsonl"
            batch_file.write_text("".join(json.dumps({"image": p, "seed": i}) + "\n" for i, p in enumerate(inputs)))
        else:
            inputs = [None] * args.items
            batch_file = work / "seeds.jsonl"
            batch_file.write_text("".join(json.dumps({"seed": i}) + "\n" for i in range(args.items)))
        single_s = [
            _run(
                [
                    *command,
                    *([f"--{args.input}", item] if item is not None else []),
                    "--seed",
                    str(i),
                    "--output",
                    str(work / f"s{i}{args.single_suffix}"),
                ]
            )
            for i, item in enumerate(inputs)
        ]
        batch_s = _run([*command, "--batch", str(batch_file), "--output", str(work / "batch")])

    per_hour_single = 3600 * len(inputs) / sum(single_s)
    per_hour_batch = 3600 * len(inputs) / batch_s
    row = [len(inputs), round(sum(single_s), 2), round(batch_s, 2), round(per_hour_single), round(per_hour_batch)]
    row.append(round(per_hour_batch / per_hour_single, 2))
    print(
        f"items {len(inputs)}: one process per item {sum(single_s):.1f} s ({per_hour_single:.0f}/h), "
        f"one batch {batch_s:.1f} s ({per_hour_batch:.0f}/h): x{row[-1]}"
    )
    report = build_report(
        "benchmark",
        Path(command[1]).resolve().parent.name if len(command) > 1 else "unknown",
        random_weights="--smoke" in command,
        evidence={"ITEMS": len(inputs), "BATCH_SPEEDUP": row[-1]},
        environment=environment_fingerprint(_device_of(command), SHARED),
        results={
            "command": shlex.join(command),
            "single_seconds": single_s,
            "batch_seconds": batch_s,
            "tables": [
                {
                    "title": "one process per item vs one --batch process (wall time, model load included)",
                    "columns": [
                        "items",
                        "per-item processes s",
                        "batch s",
                        "items/h per-item",
                        "items/h batch",
                        "speed-up",
                    ],
                    "rows": [row],
                }
            ],
        },
    )
    Path(args.output).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
