#!/usr/bin/env python3
"""The memory plan ``--memory auto`` picks on each Ascend card, as a results table for the README.

The choice is :func:`sulphur2_npu.memory.choose_memory_plan` given the free memory a card typically reports after
CANN's own reservation; the expected peaks are the module's estimates from the bf16 component sizes, not
measurements (nothing here ran on an NPU). On a real card, ``--memory auto`` queries the free memory itself.

    python sulphur2-npu/scripts/memory_plans.py --output sulphur2-npu/results/memory_plans.json
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from deliverykit.errors import run_main

COMMAND = "python sulphur2-npu/inference.py --model FILE --text-encoder DIR --prompt ... --device npu:0"


def plan_tables() -> tuple[dict[str, Any], list[str]]:
    """The results (each card's plans, the README table) and a line per card."""
    from deliverykit.memory_plans import ASCEND_CARDS, GB
    from sulphur2_npu.memory import COMPONENT_GB, TWO_STAGE_GB, WORKSPACE_GB, choose_memory_plan

    rows, plans = [], {}
    for card in ASCEND_CARDS:
        plan = choose_memory_plan("npu:0", "auto", free_bytes=int(card.free_gb * GB))
        two_stage = choose_memory_plan("npu:0", "auto", free_bytes=int(card.free_gb * GB), two_stage=True)
        plans[card.name] = plan.as_dict() | {"two_stage": two_stage.as_dict()}
        rows.append(
            [
                card.name,
                card.hbm_gb,
                plan.name + (", text encoder freed after encoding" if plan.free_text_encoder else ""),
                plan.expected_peak_gb,
                two_stage.expected_peak_gb
                if two_stage.name == plan.name
                else f"{two_stage.name}: {two_stage.expected_peak_gb}",
                "on" if plan.vae_tiling else "off",
                f"--memory auto (= {plan.name})",
            ]
        )
    table = {
        "title": "What --memory auto picks per card (estimates from the bf16 sizes "
        + ", ".join(f"{name.replace('_', ' ')} {gb:g} GB" for name, gb in COMPONENT_GB.items())
        + f" and {WORKSPACE_GB:g} GB of workspace; the two-stage pipelines add "
        + ", ".join(f"{name.replace('_', ' ')} {gb:g} GB" for name, gb in TWO_STAGE_GB.items())
        + "; stage 2 has the one-stage call's tokens; not measured on an NPU)",
        "columns": ["card", "HBM GB", "plan", "expected peak GB", "two-stage peak GB", "VAE tiling", "flag"],
        "rows": rows,
    }
    lines = [f"{card}: {plan['name']} ({plan['why']})" for card, plan in plans.items()]
    return {"plans": plans, "command": COMMAND, "tables": [table]}, lines


def main(argv: list[str] | None = None) -> int:
    from deliverykit.memory_plans import write_plan_tables

    return write_plan_tables(argv, __doc__.split("\n\n")[0], Path(__file__).resolve().parents[1], plan_tables)


if __name__ == "__main__":
    sys.exit(run_main(main))
