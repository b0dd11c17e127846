#!/usr/bin/env python3
"""Multi-rank runs against the one-process run: max |Δ| of frames and audio per --parallel configuration (CPU gloo).

Each configuration is ``scripts/parallel_job.py`` (tiny LTX-2.3 through the real loader, fp32, seed 42) under
``torchrun`` on CPU ranks; the reference is the same script as one process. The default tiny model has 2 heads
(Ulysses 2 at most); ``tiny-heads8`` (8 heads, 128x64x9) runs Ulysses 4 and 8, up to 8 ranks. What the README's
"Several cards" parity table shows; tests/test_parallel.py asserts the 1e-5-of-peak bound on some of the same jobs.

    python sulphur2-npu/scripts/parallel_parity.py --output sulphur2-npu/results/parallel_parity.json
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from deliverykit.errors import run_main

HERE = Path(__file__).resolve().parent
DELIVERY_DIR = HERE.parent
JOB = HERE / "parallel_job.py"
CONFIGS = (  # (mode, --parallel, tiny variant)
    ("t2v", "guidance=2", "tiny"),
    ("i2v", "guidance=2", "tiny"),
    ("t2v", "guidance=4", "tiny"),
    ("t2v", "ulysses=2", "tiny"),
    ("i2v", "ulysses=2", "tiny"),
    ("distilled", "ulysses=2", "tiny"),
    ("t2v", "ulysses=2,guidance=2", "tiny"),
    ("i2v", "ulysses=2,guidance=2", "tiny"),
    ("t2v", "ulysses=4", "tiny-heads8"),
    ("i2v", "ulysses=4", "tiny-heads8"),
    ("distilled", "ulysses=4", "tiny-heads8"),
    ("t2v", "ulysses=2,guidance=2", "tiny-heads8"),
    ("t2v", "ulysses=8", "tiny-heads8"),
    ("i2v", "ulysses=8", "tiny-heads8"),
    ("distilled", "ulysses=8", "tiny-heads8"),
    ("t2v", "ulysses=4,guidance=2", "tiny-heads8"),
    ("t2v", "ulysses=2,guidance=4", "tiny-heads8"),
)
BOUND = 1e-5  # relative to the peak: what the tests assert


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run(args: list[str], ranks: int | None) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, str(JOB), *args]
    if ranks is not None:
        launcher = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={ranks}"]
        command = [*launcher, "--master-addr=127.0.0.1", f"--master-port={_free_port()}", str(JOB), *args]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed (exit {done.returncode}): {done.stderr.strip()[-1500:]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", required=True, help="results JSON for the README")
    args = parser.parse_args(argv)
    from deliverykit.report import delivery_report, write_report

    rows = []
    with tempfile.TemporaryDirectory(prefix="sulphur2-parity-") as scratch:
        folder = Path(scratch)
        references = {}
        for mode, model in sorted({(mode, model) for mode, _, model in CONFIGS}):
            _run([str(folder / f"{mode}-{model}.npz"), mode, f"--model={model}"], None)
            references[mode, model] = np.load(folder / f"{mode}-{model}.npz")
        for mode, spec, model in CONFIGS:
            ranks = int(np.prod([int(part.split("=")[1]) for part in spec.split(",")]))
            out = folder / f"{mode}-{spec}-{model}.npz"
            _run([str(out), mode, f"--parallel={spec}", f"--model={model}"], ranks)
            result, reference = np.load(out), references[mode, model]
            deltas = [float(np.abs(result[k] - reference[k]).max()) for k in ("video", "audio")]
            peaks = [float(np.abs(reference[k]).max()) for k in ("video", "audio")]
            within = all(d <= BOUND * p for d, p in zip(deltas, peaks, strict=True))
            rows.append([model, mode, spec, ranks, *deltas, int(result["comm"]), within])
            print(f"{model} {mode} {spec}: video {deltas[0]:.2e} audio {deltas[1]:.2e}", flush=True)
    columns = ["model", "mode", "--parallel", "ranks", "frames max abs diff", "audio max abs diff"]
    columns += ["guidance bytes/step to rank 0", f"within {BOUND} of peak"]
    report = delivery_report(
        "accuracy",
        DELIVERY_DIR,
        device="cpu",
        random_weights=True,
        results={
            "bound_relative_to_peak": BOUND,
            "tables": [
                {
                    "title": "Several CPU gloo ranks vs one process: tiny LTX-2.3 (random weights; tiny: 2 heads, "
                    "96x64x9; tiny-heads8: 8 heads, 128x64x9), fp32, dev 2 steps with full guidance (t2v, i2v) or "
                    "distilled 8 steps",
                    "columns": columns,
                    "rows": rows,
                }
            ],
        },
    )
    write_report(args.output, report)
    print(f"results: {args.output}")
    return 0 if all(row[-1] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(run_main(main))
