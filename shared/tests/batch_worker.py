"""A stand-in delivery for the batch tests: each item writes ``out.npy`` (a seeded draw) and its report, all or none.

    python batch_worker.py BATCH OUTPUT [--sleep S] [--overwrite] [--ray ADDRESS [--ray-outputs driver]]

Each committed item appends its name and the process that made it to ``<OUTPUT>/commits.log`` (after its report), so
that a test can count how often an item was written.

An item whose prompt contains "nan" produces NaN (a NumericsError); "boom" raises a bug (TypeError).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path

import numpy as np

from deliverykit.batch import ITEM_REPORT, Ranks, parse_devices, read_batch, run_batch, spawn_ranks
from deliverykit.errors import DeliveryError, NumericsError, run_main
from deliverykit.files import atomic_path, write_json_atomic

FIELDS = {"prompt": str, "seed": int, "steps": int}


def check(fields: dict) -> None:
    """What a CLI checks of one request before loading anything."""
    if fields.get("steps", 1) < 1:
        raise DeliveryError(f"steps {fields['steps']}: need at least 1")


def make_item(sleep: float, device: str, log: Path | None = None):
    def run_item(item, folder: Path) -> dict:
        time.sleep(sleep)
        values = np.random.default_rng(item.fields.get("seed", 0)).standard_normal(8)
        if "nan" in item.fields["prompt"]:
            values[3] = np.nan
        if "boom" in item.fields["prompt"]:
            raise TypeError("a bug in one item")
        if not np.isfinite(values).all():
            raise NumericsError("the output holds NaN; try another seed")
        with atomic_path(folder / "out.npy") as tmp, open(tmp, "wb") as handle:
            np.save(handle, values)
        write_json_atomic(folder / ITEM_REPORT, {"prompt": item.fields["prompt"], "device": device})
        if log is not None:
            with open(log, "a", encoding="utf-8") as commits:
                commits.write(f"{item.name} {os.getpid()}\n")
        return {"steps": item.fields.get("steps", 1)}

    return run_item


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("batch")
    parser.add_argument("output")
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--overwrite", action="store_true")
    parser.add_argument("--devices", type=parse_devices)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--ray")
    parser.add_argument("--ray-outputs", default="shared")
    parser.add_argument("--retries", type=int, default=2)
    return parser.parse_args(argv)


def batch_worker(argv: list[str], device: str, stack: contextlib.ExitStack):
    """What a Ray actor runs (``deliverykit.cluster``): the item maker, as this command line makes it on ``device``."""
    args = parse_args(argv)
    log = Path(args.output).resolve() / "commits.log" if args.ray_outputs == "shared" else None
    return make_item(args.sleep, device, log)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.devices:
        return spawn_ranks(args.devices, sys.argv if argv is None else [__file__, *argv])
    items = read_batch(args.batch, FIELDS, required=("prompt",), check=check)
    if args.ray:
        from deliverykit import cluster

        return cluster.run_from_args(items, args, __file__, argv)
    log = Path(args.output).resolve() / "commits.log"
    result = run_batch(
        items, make_item(args.sleep, args.device, log), args.output, overwrite=args.overwrite, ranks=Ranks.from_env()
    )
    return result.exit_code


if __name__ == "__main__":
    sys.exit(run_main(main))
