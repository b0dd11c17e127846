"""A stand-in delivery for the batch tests: each item writes ``out.npy`` (a seeded draw) and its report, all or none.

    python batch_worker.py BATCH OUTPUT [--sleep S] [--overwrite]

An item whose prompt contains "nan" produces NaN (a NumericsError); "boom" raises a bug (TypeError).
"""

from __future__ import annotations

import argparse
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


def make_item(sleep: float, device: str):
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
        return {"steps": item.fields.get("steps", 1)}

    return run_item


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("batch")
    parser.add_argument("output")
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--overwrite", action="store_true")
    parser.add_argument("--devices", type=parse_devices)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    if args.devices:
        return spawn_ranks(args.devices, sys.argv if argv is None else [__file__, *argv])
    items = read_batch(args.batch, FIELDS, required=("prompt",), check=check)
    result = run_batch(
        items, make_item(args.sleep, args.device), args.output, overwrite=args.overwrite, ranks=Ranks.from_env()
    )
    return result.exit_code


if __name__ == "__main__":
    sys.exit(run_main(main))
