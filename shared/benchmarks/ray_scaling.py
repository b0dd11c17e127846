#!/usr/bin/env python3
"""Items per hour of ``inference.py --batch --ray`` on a local Ray cluster of one, then two nodes (one CPU each),
beside one plain ``--batch`` process, side by side in one run.

The command after ``--`` is a delivery's ``inference.py`` with its model flags, e.g.

    python shared/benchmarks/ray_scaling.py --items 8 --output sulphur2-npu/results/ray_scaling.json -- \\
        python sulphur2-npu/inference.py --smoke --device cpu

The cluster is Ray's own ``ray.cluster_utils.Cluster`` on 127.0.0.1: every node is a process group on this machine,
so on a 2-core machine the figures show Ray's overhead and how two actors share the cores, not what a second host
adds. Each run's span is its first item's start to its last item's end (``.batch/items/*.json``), the model loads
outside it; the whole process times are kept beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from deliverykit.report import build_report, environment_fingerprint
from deliverykit.testing import RAY_LOOPBACK_ENV, local_ray_cluster

SHARED = Path(__file__).resolve().parents[1]


def run_batch(command: list[str], lines: list[dict], work: Path, ray_address: str | None) -> dict[str, float]:
    batch_file, output = work / "requests.jsonl", work / "out"
    work.mkdir()
    batch_file.write_text("".join(json.dumps(line) + "\n" for line in lines))
    argv = [*command, "--batch", str(batch_file), "--output", str(output)]
    if ray_address:
        argv += ["--ray", ray_address]
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, **RAY_LOOPBACK_ENV})
    process_s = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"error: {shlex.join(argv)} exited {done.returncode}: {done.stderr.strip().splitlines()[-1:]}")
    records = [json.loads(path.read_text()) for path in (output / ".batch" / "items").glob("*.json")]
    span = max(r["finished"] for r in records) - min(r["finished"] - r["seconds"] for r in records)
    return {"span_s": span, "process_s": process_s, "actors": len({r["rank"] for r in records})}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=8)
    parser.add_argument(
        "--input",
        choices=("prompt", "seed"),
        default="prompt",
        help="what varies between requests (seed: the smoke model's own input, trellis2-npu)",
    )
    parser.add_argument("--output", required=True, help="results JSON")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- python DELIVERY/inference.py FLAGS")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if len(command) < 2 or args.items < 1:
        parser.error("give --items >= 1 and the inference.py command after --")
    lines = [
        {"seed": i} if args.input == "seed" else {"prompt": f"object number {i}", "seed": i} for i in range(args.items)
    ]
    runs = {}
    with tempfile.TemporaryDirectory(prefix="ray-scaling-") as work:
        runs["one process, --batch"] = run_batch(command, lines, Path(work) / "plain", None)
        for nodes in (1, 2):
            with local_ray_cluster(nodes) as cluster:
                name = f"--ray, {nodes} node(s)"
                runs[name] = run_batch(command, lines, Path(work) / f"ray{nodes}", cluster.address)
            print(f"{name}: {runs[name]}", flush=True)
    rows = [
        [
            name,
            run["actors"],
            round(run["span_s"], 2),
            round(3600 * args.items / run["span_s"]),
            round(run["process_s"], 1),
        ]
        for name, run in runs.items()
    ]
    device = command[command.index("--device") + 1] if "--device" in command else None
    report = build_report(
        "benchmark",
        Path(command[1]).resolve().parent.name,
        random_weights="--smoke" in command,
        evidence={"ITEMS": args.items},
        environment=environment_fingerprint(device, SHARED),
        results={
            "command": shlex.join(command),
            "runs": runs,
            "tables": [
                {
                    "title": f"{args.items} requests: one --batch process vs --ray on a local cluster of 1 and 2 "
                    "nodes, one CPU each, on one 2-core machine (overhead, not a second host's speed-up)",
                    "columns": ["run", "actors", "span s", "items/h", "process s (load included)"],
                    "rows": rows,
                }
            ],
        },
    )
    Path(args.output).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
