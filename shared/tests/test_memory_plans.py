"""deliverykit.memory_plans: a plan named by the flag as is, ``auto`` by free memory, the scripts' README tables."""

from __future__ import annotations

import pytest

from deliverykit import memory_plans
from deliverykit.memory_plans import GB, AutoRows, choose_plan, write_plan_tables
from deliverykit.report import load_report
from deliverykit.tools.readme import render_section

CHOICES = ("auto", "resident", "half", "streamed")
ROWS = AutoRows(
    ((40.0, "resident", "all"), (20.0, "half", "some"), (0.0, "streamed", None)),
    cpu=("resident", "CPU: host memory"),
    unknown=("streamed", "streaming"),
)


@pytest.mark.parametrize(
    ("free_gb", "expected"),
    [
        (41, ("resident", "41.0 GB free >= 40.0 GB needed by resident", "all")),
        (25, ("half", "25.0 GB free >= 20.0 GB needed by half", "some")),
        (12, ("streamed", "12.0 GB free < 20.0 GB needed by half", None)),  # the fallback says what did not fit
    ],
)
def test_auto_takes_the_first_row_that_fits(free_gb, expected):
    choice = choose_plan("npu:0", "auto", CHOICES, ROWS, int(free_gb * GB))
    assert (choice.name, choice.why, choice.option) == expected


def test_named_plans_the_cpu_and_an_unknown_device(monkeypatch):
    assert choose_plan("cpu", "half", CHOICES, ROWS).why == "requested with --memory half"
    assert choose_plan("cpu", "auto", CHOICES, ROWS) == memory_plans.PlanChoice("resident", "CPU: host memory")
    monkeypatch.setattr(memory_plans, "memory_info", lambda device: None)
    assert choose_plan("npu:0", "auto", CHOICES, ROWS).why == "free memory of npu:0 unknown; streaming"
    monkeypatch.setattr(memory_plans, "memory_info", lambda device: (int(30 * GB), int(32 * GB)))
    assert choose_plan("npu:0", "auto", CHOICES, ROWS).name == "half"
    with pytest.raises(ValueError, match="--memory 'quarter'; expected one of auto, resident, half, streamed"):
        choose_plan("cpu", "quarter", CHOICES, ROWS)


def test_write_plan_tables_makes_a_report_the_readme_renders(tmp_path, capsys):
    table = {
        "title": "plans",
        "columns": ["card", "plan"],
        "rows": [[card.name, "half"] for card in memory_plans.ASCEND_CARDS],
    }
    output = tmp_path / "results" / "memory_plans.json"
    code = write_plan_tables(["--output", str(output)], "test", tmp_path, lambda: ({"tables": [table]}, ["a: half"]))
    assert code == 0 and capsys.readouterr().out.splitlines() == ["a: half", f"results: {output}"]
    report = load_report(output)
    assert (report["kind"], report["random_weights"]) == ("benchmark", True)
    assert "| Ascend 910B4 (32 GB) | half |" in render_section(report, "results/memory_plans.json")
