#!/usr/bin/env python3
"""The memory plan ``--memory auto`` picks on each Ascend card, as a results table for the README.

The choice is :func:`sulphur2_npu.memory.choose_memory_plan` given the free memory a card typically reports after
CANN's own reservation; the expected peaks are the module's estimates from the bf16 component sizes, not
measurements (nothing here ran on an NPU). On a real card, ``--memory auto`` queries the free memory itself.

    python sulphur2-npu/scripts/memory_plans.py --output sulphur2-npu/results/memory_plans.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from deliverykit.errors import run_main

# (card, HBM GB, free GB assumed: HBM minus ~2.5 GB held by the runtime; a real run reads it from the device)
CARDS = (
    ("Ascend 910B4 (32 GB)", 32, 29.5),
    ("Ascend 910B1/B2/B3 (64 GB)", 64, 61.0),
)
COMMAND = "python sulphur2-npu/inference.py --model FILE --text-encoder DIR --prompt ... --device npu:0"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", required=True, help="results JSON for the README")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from deliverykit.files import ensure_writable_dir
    from deliverykit.report import delivery_report, write_report
    from sulphur2_npu.memory import COMPONENT_GB, GB, TWO_STAGE_GB, WORKSPACE_GB, choose_memory_plan

    ensure_writable_dir(Path(args.output).parent)
    rows, plans = [], {}
    for card, hbm_gb, free_gb in CARDS:
        plan = choose_memory_plan("npu:0", "auto", free_bytes=int(free_gb * GB))
        two_stage = choose_memory_plan("npu:0", "auto", free_bytes=int(free_gb * GB), two_stage=True)
        plans[card] = plan.as_dict() | {"two_stage": two_stage.as_dict()}
        rows.append(
            [
                card,
                hbm_gb,
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
    report = delivery_report(
        "benchmark",
        Path(__file__).resolve().parents[1],
        device="cpu",
        random_weights=True,
        results={"plans": plans, "command": COMMAND, "tables": [table]},
    )
    write_report(args.output, report)
    for card, plan in plans.items():
        print(f"{card}: {plan['name']} ({plan['why']})")
    print(f"results: {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
