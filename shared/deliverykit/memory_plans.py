"""Which ``--memory`` plan a run takes on its device: the part every delivery with a memory plan shares.

A delivery names its plans and, for ``auto``, rows of (free device memory a plan needs, plan): :func:`choose_plan`
takes a plan named by the flag as it is, and for ``auto`` the first row the device's free memory covers (read from
its runtime, :func:`deliverykit.device.memory_info`, or given to plan for another card). The delivery builds its
own plan record from the choice: what a plan moves where is model-specific. :data:`ASCEND_CARDS` are the cards the
READMEs plan for, and :func:`write_plan_tables` is the body of a delivery's ``scripts/memory_plans.py``, which writes
what ``auto`` picks on them as README tables.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .device import device_type, memory_info

if TYPE_CHECKING:
    import torch

GB = 1e9
AUTO = "auto"


@dataclasses.dataclass(frozen=True)
class Card:
    """An accelerator a README plans for: its memory and the free memory a run on it typically sees."""

    name: str
    hbm_gb: int
    free_gb: float  # the HBM less what the runtime holds (about 2.5 GB); a run reads the real figure from the device


ASCEND_CARDS = (Card("Ascend 910B4 (32 GB)", 32, 29.5), Card("Ascend 910B1/B2/B3 (64 GB)", 64, 61.0))


@dataclasses.dataclass(frozen=True)
class PlanChoice:
    """A plan's name, why it was taken, and the chosen ``auto`` row's ``option`` (None for a plan asked for by
    name, or the CPU's or an unknown device's default: the delivery's own default for the plan then)."""

    name: str
    why: str
    option: Any = None


@dataclasses.dataclass(frozen=True)
class AutoRows:
    """What ``auto`` picks from: ``rows`` of ``(min free GB, plan, option)``, most resident first, the last needing
    nothing; ``cpu`` on the CPU, ``unknown`` where the device cannot say its free memory (each a ``(plan, why)``)."""

    rows: Sequence[tuple[float, str, Any]]
    cpu: tuple[str, str]
    unknown: tuple[str, str]


def choose_plan(
    device: torch.device | str,
    requested: str,
    choices: Sequence[str],
    auto: AutoRows,
    free_bytes: int | None = None,
) -> PlanChoice:
    """The plan for ``device``: ``requested`` as is (one of ``choices``, else ``ValueError`` naming them), or for
    ``auto`` the first of ``auto.rows`` that the free memory covers. ``free_bytes`` overrides the device query (tests,
    or to plan for another card)."""
    if requested not in choices:
        raise ValueError(f"--memory {requested!r}; expected one of {', '.join(choices)}")
    if requested != AUTO:
        return PlanChoice(requested, f"requested with --memory {requested}")
    if free_bytes is None:
        if device_type(device) == "cpu":
            return PlanChoice(*auto.cpu)
        info = memory_info(device)
        if info is None:
            name, why = auto.unknown
            return PlanChoice(name, f"free memory of {device} unknown; {why}")
        free_bytes = info[0]
    free_gb = free_bytes / GB
    for index, (min_free_gb, name, option) in enumerate(auto.rows):
        if free_gb < min_free_gb:
            continue
        if min_free_gb == 0 and index:  # the fallback: say what did not fit
            needed_gb, needed_by = auto.rows[index - 1][:2]
            return PlanChoice(name, f"{free_gb:.1f} GB free < {needed_gb:.1f} GB needed by {needed_by}", option)
        return PlanChoice(name, f"{free_gb:.1f} GB free >= {min_free_gb:.1f} GB needed by {name}", option)
    raise ValueError(f"no memory plan fits {free_gb:.1f} GB: the last auto row must need 0 GB")


def write_plan_tables(
    argv: list[str] | None,
    description: str,
    delivery_dir: str | os.PathLike,
    build: Callable[[], tuple[dict[str, Any], list[str]]],
) -> int:
    """``scripts/memory_plans.py`` of the delivery in ``delivery_dir``: ``--output FILE``, then ``build()``'s
    ``(results with their tables, one line per card)`` written there as a computed report (on the CPU, no weights,
    nothing measured) for ``deliverykit readme backfill``, and the lines printed."""
    from .files import ensure_writable_dir
    from .report import delivery_report, write_report

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--output", required=True, help="results JSON for the README")
    args = parser.parse_args(argv)
    ensure_writable_dir(Path(args.output).parent)
    results, lines = build()
    report = delivery_report("benchmark", delivery_dir, device="cpu", random_weights=True, results=results)
    write_report(args.output, report)
    print("\n".join([*lines, f"results: {args.output}"]))
    return 0
