#!/usr/bin/env python3
"""Requests per hour through a delivery's HTTP server vs one ``inference.py --batch`` process on the same requests,
side by side in one run, with the server's queue latency.

The command after ``--`` is a delivery's ``serve.py`` with its model flags (no ``--port`` or ``--jobs``), e.g.

    python shared/benchmarks/serve_overhead.py --api images --items 8 \\
        --output ursa-npu/results/serve_overhead.json -- \\
        python ursa-npu/serve.py --upstream "$URSA_SRC" --smoke --device cpu

The batch run is ``inference.py`` beside it with the same model flags, ``--batch FILE --output DIR``; the server
gets the same requests (prompt ``i``, seed ``i``) at once from ``--clients`` threads, through its API (``images``:
``POST /v1/images/generations``; ``videos``: ``POST /v1/videos``; ``assets``: ``POST /v1/assets``) on 127.0.0.1.
What is compared is the span of the work once the model is loaded: the batch's, from its first item's start to its
last item's end (``.batch/items/*.json``); the server's, from its first request to its last job's end (the job
database), so HTTP, the queue and the polling are inside it. ``--rounds`` alternate which runs first; the medians
are reported, the whole process times (model load included) beside them, and the difference per request: what the
server adds to each, whatever the model, to set against a request's own time. Queue latency is a job's wait from its
request to its start.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from deliverykit.jobs import JobStore
from deliverykit.report import build_report, environment_fingerprint
from deliverykit.testing import served

SHARED = Path(__file__).resolve().parents[1]
POLL_S = 0.2  # how often the client asks how a job stands
KINDS = {"images": "img", "videos": "video", "assets": "asset"}


def submit(client: Any, api: str, index: int) -> str | None:
    """Send request ``index``; the job id of an asynchronous job (images answer when done: None)."""
    if api == "images":
        body = {"prompt": f"object number {index}", "seed": index, "output_format": "jpeg"}  # as --batch writes
        client.post("v1/images/generations", json=body).raise_for_status()
        return None
    if api == "videos":
        answer = client.post("v1/videos", data={"prompt": f"object number {index}", "seed": str(index)})
    else:
        answer = client.post("v1/assets", data={"seed": str(index)})  # the smoke model's own test image
    answer.raise_for_status()
    return answer.json()["id"]


def wait_all(client: Any, api: str, job_ids: list[str], timeout: float = 3600) -> None:
    deadline = time.monotonic() + timeout
    for job_id in job_ids:
        while (status := client.get(f"v1/{api}/{job_id}").json()["status"]) not in ("completed", "failed"):
            if time.monotonic() > deadline:
                sys.exit(f"error: job {job_id} did not end within {timeout:g} s")
            time.sleep(POLL_S)
        if status == "failed":
            sys.exit(f"error: job {job_id} failed: {client.get(f'v1/{api}/{job_id}').json()['error']}")


def run_server(command: list[str], api: str, items: int, clients: int, work: Path) -> dict[str, Any]:
    import httpx

    jobs = work / "jobs"
    start = time.perf_counter()
    with served([*command, "--port", "0", "--jobs", str(jobs)], timeout=1800) as server:
        with httpx.Client(base_url=server.url, timeout=3600) as client:
            with concurrent.futures.ThreadPoolExecutor(clients) as pool:
                ids = [job_id for job_id in pool.map(lambda i: submit(client, api, i), range(items)) if job_id]
            wait_all(client, api, ids)
        process_s = time.perf_counter() - start
        if server.stop() != 0:
            sys.exit(f"error: the server did not stop cleanly:\n{server.output}")
    store = JobStore(jobs)
    done = store.jobs(KINDS[api], limit=items, descending=False)
    if len(done) != items or any(job.status != "completed" for job in done):
        sys.exit(f"error: {len(done)} jobs recorded, not {items} completed")
    waits = [job.started_at - job.created_at for job in done]
    span = max(job.completed_at for job in done) - min(job.created_at for job in done)
    return {
        "span_s": span,
        "process_s": process_s,
        "queue_p50_s": percentile(waits, 50),
        "queue_p95_s": percentile(waits, 95),
    }


def run_batch(command: list[str], api: str, items: int, work: Path) -> dict[str, Any]:
    batch_file, output = work / "requests.jsonl", work / "batch"
    lines = [{"seed": i} if api == "assets" else {"prompt": f"object number {i}", "seed": i} for i in range(items)]
    batch_file.write_text("".join(json.dumps(line) + "\n" for line in lines))
    inference = str(Path(command[1]).with_name("inference.py"))
    start = time.perf_counter()
    done = subprocess.run(
        [command[0], inference, *command[2:], "--batch", str(batch_file), "--output", str(output)],
        capture_output=True,
        text=True,
    )
    process_s = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"error: the batch exited {done.returncode}: {done.stderr.strip().splitlines()[-1:]}")
    records = [json.loads(path.read_text()) for path in (output / ".batch" / "items").glob("*.json")]
    span = max(r["finished"] for r in records) - min(r["finished"] - r["seconds"] for r in records)
    return {"span_s": span, "process_s": process_s}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--api", choices=tuple(KINDS), required=True, help="the delivery's API")
    parser.add_argument("--items", type=int, default=8, help="requests per run (default 8)")
    parser.add_argument("--clients", type=int, default=4, help="client threads sending them (default 4)")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each, order alternating (default 2)")
    parser.add_argument("--output", required=True, help="results JSON")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- python DELIVERY/serve.py FLAGS")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if len(command) < 2 or args.items < 1 or args.rounds < 1:
        parser.error("give --items >= 1, --rounds >= 1 and the serve.py command after --")

    runs: dict[str, list[dict[str, Any]]] = {"batch": [], "server": []}
    for round_index in range(args.rounds):
        order = ("batch", "server") if round_index % 2 == 0 else ("server", "batch")
        for name in order:
            with tempfile.TemporaryDirectory(prefix="serve-bench-") as work:
                if name == "batch":
                    runs[name].append(run_batch(command, args.api, args.items, Path(work)))
                else:
                    runs[name].append(run_server(command, args.api, args.items, args.clients, Path(work)))
            print(f"round {round_index + 1} {name}: {runs[name][-1]}", flush=True)

    def median(name: str, key: str) -> float:
        return statistics.median(run[key] for run in runs[name])

    batch_span, server_span = median("batch", "span_s"), median("server", "span_s")
    overhead = server_span / batch_span - 1
    per_hour = [round(3600 * args.items / span) for span in (batch_span, server_span)]
    queue = [round(median("server", key), 2) for key in ("queue_p50_s", "queue_p95_s")]
    processes = [round(median(name, "process_s"), 1) for name in ("batch", "server")]
    row = [args.items, args.clients, round(batch_span, 2), round(server_span, 2), *per_hour]
    per_request_ms = round(1000 * (server_span - batch_span) / args.items)
    row += [f"{100 * overhead:+.1f} %", per_request_ms, *queue, *processes]
    print(f"requests/h: batch {row[4]}, server {row[5]} ({row[6]}, {row[7]} ms a request); queue p50 {row[8]} s")
    delivery = Path(command[1]).resolve().parent.name
    device = command[command.index("--device") + 1] if "--device" in command else None
    report = build_report(
        "benchmark",
        delivery,
        random_weights="--smoke" in command,
        evidence={"ITEMS": args.items, "SERVE_OVERHEAD_PCT": round(100 * overhead, 1)},
        environment=environment_fingerprint(device, SHARED),
        results={
            "command": shlex.join(command),
            "rounds": runs,
            "tables": [
                {
                    "title": f"{args.api} through serve.py vs one inference.py --batch, same requests (medians of "
                    f"{args.rounds} rounds; spans after the model is loaded)",
                    "columns": [
                        "requests",
                        "clients",
                        "batch s",
                        "server s",
                        "requests/h batch",
                        "requests/h server",
                        "server overhead",
                        "ms a request",
                        "queue p50 s",
                        "queue p95 s",
                        "batch process s",
                        "server process s",
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
