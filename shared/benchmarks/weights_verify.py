#!/usr/bin/env python3
"""Throughput and memory of ``deliverykit weights verify`` on a large file: it must stream, not load.

Writes a file of --size-gb (default 2) of random bytes, builds a one-file manifest for it, and runs the full
verification (sha256) in a fresh process, which reports its wall time and peak resident memory (the file was just
written, so it is read from the page cache: this measures hashing, not the disk). Target: peak RSS growth below
100 MB whatever the file size (a verify that read the file whole would need its size in memory).

    python shared/benchmarks/weights_verify.py --output shared/benchmarks/results/weights_verify.json

The temporary file is deleted afterwards (it is this script's own). Exit code 0, or 1 with --check on a miss.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

TARGET_RSS_GROWTH_MB = 100.0

# Runs in a fresh process so that ru_maxrss is this measurement's own.
_CHILD = r"""
import json, resource, sys, time
from deliverykit.assets.manifest import verify
start_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
checks = verify(sys.argv[1], sys.argv[2], progress=False)
elapsed = time.perf_counter() - start
print(json.dumps({
    "seconds": elapsed,
    "ok": [c.status for c in checks] == ["ok"],
    "start_rss_kb": start_rss,
    "peak_rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
}))
"""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-gb", type=float, default=2.0, help="size of the test file in GB (default 2)")
    parser.add_argument("--dir", help="where to write the test file (default: the system temp folder)")
    parser.add_argument("--output", required=True, help="results JSON")
    parser.add_argument("--check", action="store_true", help="exit 1 when the memory target is missed")
    return parser.parse_args(argv)


def write_random_file(path: Path, size: int) -> str:
    """Write ``size`` random bytes in 64 MiB blocks; return their sha256."""
    import hashlib

    digest, block = hashlib.sha256(), 64 * 2**20
    with open(path, "wb") as handle:
        remaining = size
        while remaining:
            chunk = os.urandom(min(block, remaining))
            handle.write(chunk)
            digest.update(chunk)
            remaining -= len(chunk)
    return digest.hexdigest()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from deliverykit.files import ensure_writable_dir, write_json_atomic
    from deliverykit.report import build_report, environment_fingerprint

    ensure_writable_dir(Path(args.output).parent)
    size = int(args.size_gb * 1e9)
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="verify-bench-") as scratch:
        root = Path(scratch)
        (root / "model").mkdir()
        sha256 = write_random_file(root / "model" / "big.safetensors", size)
        manifest = {
            "schema_version": 1,
            "delivery": "benchmark",
            "models": [
                {
                    "id": "bench/big",
                    "role": "main",
                    "revision": None,
                    "hub": {"huggingface": None, "modelscope": None},
                    "license": "n/a",
                    "gated": False,
                    "local_dir": "model",
                    "files": [
                        {
                            "path": "big.safetensors",
                            "bytes": size,
                            "sha256": sha256,
                            "component": "benchmark",
                            "required": True,
                            "source": "written by this benchmark",
                        }
                    ],
                }
            ],
        }
        manifest_path = root / "manifest.json"
        manifest_path.write_text(json.dumps(manifest))
        done = subprocess.run(
            [sys.executable, "-c", _CHILD, str(manifest_path), str(root)], capture_output=True, text=True, check=True
        )
    measured = json.loads(done.stdout.strip().splitlines()[-1])
    throughput = size / 1e6 / measured["seconds"]
    growth_mb = (measured["peak_rss_kb"] - measured["start_rss_kb"]) / 1024
    met = growth_mb < TARGET_RSS_GROWTH_MB and measured["ok"]
    peak_mb = measured["peak_rss_kb"] / 1024
    rows = [
        [f"{size / 1e9:g} GB", measured["seconds"], throughput, peak_mb, growth_mb, f"< {TARGET_RSS_GROWTH_MB:g}", met]
    ]
    columns = ["file", "verify s", "MB/s", "process peak RSS MB", "growth during verify MB", "target MB", "met"]
    report = build_report(
        "benchmark",
        "deliverykit",
        random_weights=True,
        environment=environment_fingerprint(None, Path(__file__)),
        results={
            "bytes": size,
            **measured,
            "mb_per_s": throughput,
            "rss_growth_mb": growth_mb,
            "tables": [
                {"title": "weights verify (sha256, streamed) on one large file", "columns": columns, "rows": rows}
            ],
        },
    )
    write_json_atomic(args.output, report)
    print(
        f"verify {size / 1e9:g} GB: {measured['seconds']:.1f} s, {throughput:.0f} MB/s, "
        f"process peak RSS {peak_mb:.0f} MB (+{growth_mb:.1f} MB during verify)"
    )
    print(f"results: {args.output}")
    return 1 if args.check and not met else 0


if __name__ == "__main__":
    sys.exit(main())
