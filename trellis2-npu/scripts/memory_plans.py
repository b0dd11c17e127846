#!/usr/bin/env python3
"""The memory plan ``--memory auto`` picks on each Ascend card per pipeline type, as results tables for the README.

The choice is :func:`trellis2_npu.memory.choose_memory_plan` given the free memory a card typically reports
(``deliverykit.memory_plans.ASCEND_CARDS``); the expected peaks are the module's: the released checkpoints' bytes
plus an estimated workspace, not measurements (nothing here ran on an NPU). On a real card ``--memory auto`` queries
the free memory itself.

    python trellis2-npu/scripts/memory_plans.py --output trellis2-npu/results/memory_plans.json
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from deliverykit.errors import run_main

COMMAND = "python trellis2-npu/inference.py --weights DIR --image FILE --pipeline TYPE --device npu:0 --output DIR"
SERVING = "any (app.py, serve.py)"  # a server's requests pick their pipeline type: its plan covers the largest


def plan_tables() -> tuple[dict[str, Any], list[str]]:
    """The results (per card and pipeline type the plan auto picks and both plans' peaks; the models' sizes; the
    workspace estimates), their README tables, and a line per card."""
    from deliverykit.memory_plans import ASCEND_CARDS, GB
    from trellis2_npu import memory
    from trellis2_npu.options import PIPELINE_TYPES

    runs = {pipeline_type: (pipeline_type,) for pipeline_type in PIPELINE_TYPES} | {SERVING: PIPELINE_TYPES}
    rows, plans = [], {}
    for card in ASCEND_CARDS:
        for label, pipeline_types in runs.items():
            plan = memory.choose_memory_plan("npu:0", free_bytes=int(card.free_gb * GB), pipeline_types=pipeline_types)
            peaks = [
                memory.make_plan(name, "", "npu:0", pipeline_types).expected_peak_gb for name in memory.MEMORY_PLANS
            ]
            plans.setdefault(card.name, {})[label] = {"name": plan.name, "why": plan.why, "peaks_gb": peaks}
            rows.append([card.name, card.hbm_gb, label, plan.name, *peaks])
    workspace = [
        [
            pipeline_type,
            *memory.asset_size(memory.OUTPUT_RESOLUTION[pipeline_type]),
            round(max(stage.workspace_gb for stage in memory.pipeline_stages(pipeline_type)), 1),
        ]
        for pipeline_type in PIPELINE_TYPES
    ]
    tables = [
        {
            "title": "What --memory auto picks per card and pipeline type, and the expected device peak of each plan "
            "in GB (the released checkpoints' bytes in weights-manifest.json plus an estimated workspace for a "
            "typical asset; not measured on an NPU)",
            "columns": [
                "card",
                "HBM GB",
                "pipeline",
                "--memory auto",
                *(f"{name}: peak GB" for name in memory.MEMORY_PLANS),
            ],
            "rows": rows,
        },
        {
            "title": "Model sizes on the device (bytes of the released safetensors, weights-manifest.json)",
            "columns": ["model", "GB"],
            "rows": [[name, round(gb, 2)] for name, gb in memory.model_gb().items()],
        },
        {
            "title": f"Workspace estimates: {memory.flow_bytes_per_token():,} bytes per flow token (one block's bf16 "
            f"activations), {memory.DECODER_BYTES_PER_VOXEL:,} bytes per decoded voxel + {memory.DECODER_BLOCKS_GB:g} "
            "GB of sparse-convolution buffers",
            "columns": ["pipeline", "tokens per SLat flow", "decoded voxels", "source", "largest stage workspace GB"],
            "rows": workspace,
        },
    ]
    lines = [f"{card}: {by_run[SERVING]['name']} ({by_run[SERVING]['why']})" for card, by_run in plans.items()]
    return {"plans": plans, "model_gb": memory.model_gb(), "command": COMMAND, "tables": tables}, lines


def main(argv: list[str] | None = None) -> int:
    from deliverykit.memory_plans import write_plan_tables

    return write_plan_tables(argv, __doc__.split("\n\n")[0], Path(__file__).resolve().parents[1], plan_tables)


if __name__ == "__main__":
    sys.exit(run_main(main))
