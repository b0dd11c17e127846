#!/usr/bin/env python3
"""Per-step time and bytes received per step for N = 1, 2, 4 ranks, side by side in one run (README "Several cards").

Each N runs what users run: ``inference.py`` (one process for N = 1, ``torchrun --nproc-per-node N`` with
``--parallel`` above) with ``--bench`` and ``--report``; per-step time is the median of the steps after the first
(``generate.GenerationTimings.per_step_ms``), bytes are what rank 0 receives from its guidance group per step
(``COMM_BYTES_PER_STEP``; Ulysses' all-to-alls inside diffusers are not counted). On the CPU the ranks are gloo
processes sharing the host's cores, so the figure shows the mechanism and its traffic, not a speed-up. On an Ascend
host the same script with ``--device npu`` and the real model fills the N = 1, 2, 4, 8 rows (``--kind mixed``:
guidance=min(N, 4) x ulysses for the rest; 704x480x161 has 6930 video tokens, so Ulysses 2 at most):

    python sulphur2-npu/benchmarks/parallel_scaling.py --output sulphur2-npu/results/parallel_cpu.json
    python sulphur2-npu/benchmarks/parallel_scaling.py --device npu --ranks 1,2,4,8 --kind mixed \
        --output sulphur2-npu/results/parallel_npu.json -- --model sulphur_dev_bf16.safetensors \
        --text-encoder gemma-3-12b --prompt "a red fox runs through snow" --pipeline one-stage --schedule dev \
        --width 704 --height 480 --num-frames 161

Arguments after ``--`` go to ``inference.py`` (default: ``SMOKE``, one stage with the dev schedule: guidance splits
only a step with several guidance passes, which the smoke's default distilled pipeline has not). Exit code 0, 1 when
a run failed.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from deliverykit.errors import run_main

DELIVERY_DIR = Path(__file__).resolve().parents[1]
INFERENCE = DELIVERY_DIR / "inference.py"
SMOKE = ("--smoke", "--pipeline", "one-stage", "--schedule", "dev")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else list(SMOKE)
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", help="device type of every rank (default cpu: gloo ranks)")
    parser.add_argument("--ranks", default="1,2,4", help="comma-separated world sizes (default 1,2,4)")
    parser.add_argument(
        "--kind",
        choices=("guidance", "ulysses", "mixed"),
        default="guidance",
        help="how N ranks split a step: guidance=N, ulysses=N, or mixed (guidance=min(N, 4) x ulysses=N/that)",
    )
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs per N (default 1)")
    parser.add_argument("--runs", type=int, default=3, help="timed runs per N (default 3)")
    parser.add_argument("--output", required=True, help="results JSON for the README")
    args = parser.parse_args(argv)
    args.extra = extra
    args.ranks = [int(n) for n in args.ranks.split(",")]
    return args


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def parallel_spec(ranks: int, kind: str) -> str:
    """The --parallel value of ``ranks`` ranks split ``kind``-wise."""
    if kind == "mixed":
        guidance = min(ranks, 4)
        return f"ulysses={ranks // guidance},guidance={guidance}"
    return f"{kind}={ranks}"


def command_for(ranks: int, args: argparse.Namespace, folder: Path) -> list[str]:
    """The inference.py command line of world size ``ranks`` (torchrun above 1)."""
    own = ["--device", args.device, "--bench", "--warmup", str(args.warmup), "--runs", str(args.runs)]
    own += ["--output", str(folder / "out.mp4"), "--report", str(folder / "report_n.json"), *args.extra]
    if ranks == 1:
        return [sys.executable, str(INFERENCE), *own]
    launcher = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={ranks}"]
    launcher += ["--master-addr=127.0.0.1", f"--master-port={_free_port()}"]
    return [*launcher, str(INFERENCE), *own, "--parallel", parallel_spec(ranks, args.kind)]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from deliverykit.report import delivery_report, write_report

    rows, commands = [], {}
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    with tempfile.TemporaryDirectory(prefix="sulphur2-parallel-") as scratch:
        for ranks in args.ranks:
            folder = Path(scratch) / f"n{ranks}"
            folder.mkdir()
            command = command_for(ranks, args, folder)
            commands[ranks] = command
            done = subprocess.run(command, env=env, capture_output=True, text=True)
            if done.returncode != 0:
                print(
                    f"error: N={ranks} failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}", file=sys.stderr
                )
                return 1
            report = json.loads((folder / "report_n.json").read_text())
            timing, results = report["timing"], report["results"]
            rows.append(
                [
                    ranks,
                    parallel_spec(ranks, args.kind) if ranks > 1 else "-",
                    timing["per_step"]["median_ms"],
                    results["comm_bytes_per_step"],
                    timing["total"]["median_ms"],
                ]
            )
    base = rows[0][2]
    for row in rows:
        row.append(base / row[2] if row[2] else None)
    columns = ["N ranks", "--parallel", "per step ms", "bytes received per step (rank 0)", "total ms", "step speed-up"]
    title = f"inference.py {' '.join(args.extra)} on {args.device} ranks (medians of {args.runs} runs)"
    report = delivery_report(
        "benchmark",
        DELIVERY_DIR,
        device=args.device,
        random_weights="--smoke" in args.extra,
        results={
            "rows": [dict(zip(columns, row, strict=True)) for row in rows],
            "commands": {str(k): v for k, v in commands.items()},
            "tables": [{"title": title, "columns": columns, "rows": rows}],
        },
    )
    write_report(args.output, report)
    print(" | ".join(columns))
    for row in rows:
        print(" | ".join(f"{v:.2f}" if isinstance(v, float) else str(v) for v in row))
    print(f"results: {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
