"""``deliverykit npu-check`` on a machine without an NPU: what it refuses, skips and writes, and that the files render.

The NPU steps themselves cannot run here; their plumbing is checked with a fake delivery whose benchmark is a small
script (a passing and a failing one) and a probe that reports an NPU.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from deliverykit import device
from deliverykit.device import AcceleratorStatus
from deliverykit.errors import ExitCode
from deliverykit.tools.commands import main as cli_main
from deliverykit.tools.commands import npu_check
from deliverykit.tools.readme import backfill

REPO = Path(__file__).resolve().parents[2]
DELIVERIES = ("sulphur2-npu", "trellis2-npu", "ursa-npu")


@pytest.fixture
def no_npu(monkeypatch):
    monkeypatch.setattr(device, "probe_npu", lambda: AcceleratorStatus("npu", False, 0, "torch_npu is not installed"))


def test_without_an_npu_it_stops_before_any_work_with_exit_5(no_npu, tmp_path, capsys):
    out = tmp_path / "check"
    assert cli_main(["npu-check", "--root", str(REPO), "--output", str(out)]) == ExitCode.DEVICE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: no usable NPU (torch_npu is not installed)")
    assert "--allow-missing-device" in err[0] and not out.exists()


def test_allowed_without_an_npu_it_marks_every_npu_step_skipped_and_writes_renderable_files(no_npu, tmp_path, capsys):
    out = tmp_path / "check"
    assert cli_main(["npu-check", "--root", str(REPO), "--output", str(out), "--allow-missing-device"]) == 0
    printed = capsys.readouterr().out
    for delivery in DELIVERIES:
        report = json.loads((out / delivery / npu_check.RESULTS_FILE).read_text())
        assert report["kind"] == "npu-check" and report["delivery"] == delivery
        [table] = report["results"]["tables"]
        steps = {row[0]: row for row in table["rows"]}
        plan = json.loads((REPO / delivery / npu_check.PLAN_FILE).read_text())["benchmarks"]
        assert list(steps) == ["environment", "device-gated tests", *(bench["name"] for bench in plan)]
        assert steps["environment"][1] == "pass" and "torch" in steps["environment"][3]
        for name in list(steps)[1:]:
            assert steps[name][1] == "skipped" and steps[name][3] == "no NPU here: torch_npu is not installed"
            assert f"{delivery}: {name}: skipped (no NPU here: torch_npu is not installed)" in printed
        readme = tmp_path / f"{delivery}.md"  # a copy of the delivery's README: its npu_check section is filled
        readme.write_text((REPO / delivery / "README.md").read_text(encoding="utf-8"), encoding="utf-8")
        assert backfill(readme, {"npu_check": out / delivery / npu_check.RESULTS_FILE})
        assert "| device-gated tests | skipped | n/a | no NPU here: torch_npu is not installed |" in readme.read_text()


def test_every_planned_command_runs_a_script_of_the_delivery_with_flags_it_accepts():
    for delivery in DELIVERIES:
        for bench in json.loads((REPO / delivery / npu_check.PLAN_FILE).read_text())["benchmarks"]:
            script = REPO / delivery / bench["command"][0]
            assert script.is_file(), f"{delivery}: {bench['name']}: no {script.name}"
            helped = subprocess.run(
                [sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120
            )
            assert helped.returncode == 0, helped.stderr[-500:]
            flags = [word for word in bench["command"] if word.startswith("--")]
            unknown = [flag for flag in flags if flag not in helped.stdout]
            assert not unknown, f"{delivery}: {bench['name']}: {script.name} has no {unknown}"


def test_with_an_npu_each_benchmark_is_run_and_its_figures_or_failure_recorded(monkeypatch, tmp_path):
    delivery = tmp_path / "demo-npu"
    (delivery / "tests").mkdir(parents=True)
    (delivery / "bench.py").write_text(
        "import json, sys\n"
        "report, code = sys.argv[1], int(sys.argv[2])\n"
        "json.dump({'evidence': {'TIMING_MEDIAN_MS': '12.5000', 'PEAK_MEMORY_MB': '3.0000'}}, open(report, 'w'))\n"
        "print('done' if code == 0 else 'error: the kernel failed')\n"
        "sys.exit(code)\n"
    )
    benchmarks = [
        {"name": "works", "command": ["bench.py", "{output}/ok.json", "0"], "report": "{output}/ok.json"},
        {"name": "breaks", "command": ["bench.py", "{output}/bad.json", "3"], "report": "{output}/missing.json"},
        {"name": "needs a checkout", "needs": ["DEMO_SRC"], "command": ["bench.py"], "report": "{output}/x.json"},
    ]
    (delivery / npu_check.PLAN_FILE).write_text(json.dumps({"benchmarks": benchmarks}))
    monkeypatch.delenv("DEMO_SRC", raising=False)
    rows = npu_check.check_delivery(tmp_path, delivery, tmp_path / "out", "npu:0", None)
    assert rows[0][:2] == ["device-gated tests", "pass"]  # none collected in an empty tests folder
    assert rows[1][0:2] == ["works", "pass"] and rows[1][3] == "TIMING_MEDIAN_MS=12.5000, PEAK_MEMORY_MB=3.0000"
    assert rows[2][0:2] == ["breaks", "fail"] and rows[2][3] == "exit 3: error: the kernel failed"
    assert rows[3] == ["needs a checkout", "skipped", None, "set DEMO_SRC (see the README)"]
    assert (tmp_path / "out" / "works.log").read_text().strip() == "done"


def test_a_published_tree_is_its_own_single_delivery(tmp_path):
    (tmp_path / npu_check.PLAN_FILE).write_text('{"benchmarks": []}')
    assert npu_check.find_deliveries(tmp_path) == [tmp_path]
    assert npu_check.find_deliveries(REPO) == [REPO / name for name in DELIVERIES]
