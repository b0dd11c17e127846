"""``deliverykit npu-check``: the one command that proves an Ascend host, and one results file per delivery.

Users on a new host ask "does it run?" and then "what is the 910B number?". This runs, in order: the environment
check (``deliverykit env``), every device-gated test (``pytest -m device`` on ``--device``: the NPU kernels against
their CPU references, HCCL ranks where there are cards), and each delivery's NPU benchmarks at its README's settings
(declared in ``<delivery>/npu-check.json``). Each delivery gets ``DIR/<delivery>/npu_check.json``, a run report
with one row per step (pass / fail / skipped, and why) that ``deliverykit readme backfill`` renders into the
README's ``npu_check`` section, beside the benchmarks' own reports and the logs.

Without a usable NPU it stops before any work with exit 5, unless ``--allow-missing-device``: then the environment
check runs, every NPU step is marked skipped with the probe's reason, the files are written and the exit is 0.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

PLAN_FILE = "npu-check.json"
RESULTS_FILE = "npu_check.json"
COLUMNS = ["step", "status", "seconds", "detail"]


def find_deliveries(root: Path) -> list[Path]:
    """The delivery folders at ``root``: itself when it is one (a published tree), else its ``*-npu`` folders."""
    if (root / PLAN_FILE).is_file():
        return [root]
    return sorted(path for path in root.glob("*-npu") if (path / PLAN_FILE).is_file())


def _plan(delivery: Path) -> list[dict[str, Any]]:
    return json.loads((delivery / PLAN_FILE).read_text(encoding="utf-8"))["benchmarks"]


def _run(command: list[str], cwd: Path, log: Path, env: dict[str, str]) -> tuple[int, float, str]:
    """Run ``command``, its output into ``log``; ``(exit code, seconds, its last non-empty line)``."""
    started = time.perf_counter()
    with open(log, "w", encoding="utf-8") as handle:
        code = subprocess.run(
            command, cwd=cwd, env=env, stdout=handle, stderr=subprocess.STDOUT, check=False
        ).returncode
    lines = [line.strip() for line in log.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    return code, round(time.perf_counter() - started, 1), lines[-1] if lines else ""


def _test_paths(root: Path, delivery: Path) -> list[str]:
    paths = [delivery / "tests"] + ([root / "shared" / "tests"] if (root / "shared" / "tests").is_dir() else [])
    return [str(path) for path in paths if path.is_dir()]


def _benchmark_row(bench: dict[str, Any], delivery: Path, out: Path, device: str, env: dict[str, str]) -> list[Any]:
    missing = [name for name in bench.get("needs", []) if not env.get(name)]
    if missing:
        return [bench["name"], "skipped", None, f"set {', '.join(missing)} (see the README)"]
    values = {"device": device, "output": str(out), "python": sys.executable, **env}
    command = [sys.executable, *(part.format(**values) for part in bench["command"])]
    code, seconds, last = _run(command, delivery, out / f"{bench['name'].replace(' ', '_')}.log", env)
    report = Path(bench["report"].format(**values))
    evidence = json.loads(report.read_text(encoding="utf-8")).get("evidence", {}) if report.is_file() else {}
    figures = ", ".join(f"{key}={evidence[key]}" for key in ("TIMING_MEDIAN_MS", "PEAK_MEMORY_MB") if key in evidence)
    return [bench["name"], "pass" if code == 0 else "fail", seconds, figures or f"exit {code}: {last[:200]}"]


def check_delivery(root: Path, delivery: Path, out: Path, device: str, npu_reason: str | None) -> list[list[Any]]:
    """The rows of one delivery: its device-gated tests, then its benchmarks (skipped, with why, without an NPU)."""
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "DELIVERYKIT_TEST_DEVICE": device}
    benches = _plan(delivery)
    if npu_reason is not None:
        return [["device-gated tests", "skipped", None, npu_reason]] + [
            [bench["name"], "skipped", None, npu_reason] for bench in benches
        ]
    tests = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-m",
        "device",
        *_test_paths(root, delivery),
    ]
    code, seconds, last = _run(tests, root, out / "tests.log", env)
    rows = [["device-gated tests", "pass" if code in (0, 5) else "fail", seconds, last[:200]]]  # 5: none collected
    return rows + [_benchmark_row(bench, delivery, out, device, env) for bench in benches]


def npu_check_command(args: argparse.Namespace) -> int:
    from deliverykit.device import probe_npu
    from deliverykit.errors import ExitCode, OutputError
    from deliverykit.files import ensure_writable_dir
    from deliverykit.report import build_report, environment_fingerprint, write_report

    from .env import collect_checks

    root = Path(args.root).resolve()
    deliveries = find_deliveries(root)
    if not deliveries:
        print(f"error: no delivery with a {PLAN_FILE} under {root}; run from the repository root", file=sys.stderr)
        return int(ExitCode.USAGE)
    npu = probe_npu()
    if not npu.available and not args.allow_missing_device:
        print(f"error: no usable NPU ({npu.reason}); on a CPU machine add --allow-missing-device", file=sys.stderr)
        return int(ExitCode.DEVICE)
    try:
        output = ensure_writable_dir(args.output)
    except OutputError as err:
        print(f"error: {err}", file=sys.stderr)
        return int(ExitCode.OUTPUT)
    reason = None if npu.available else f"no NPU here: {npu.reason}"
    checks = collect_checks(args.device if npu.available else None)
    summary = "; ".join(c.line() for c in checks if c.name in ("torch", "torch_npu", "CANN", "npu devices"))
    env_row = ["environment", "fail" if any(c.status == "FAIL" for c in checks) else "pass", 0.0, summary]
    command = ["python", "-m", "deliverykit", "npu-check", "--device", args.device, "--output", str(args.output)]
    command += ["--allow-missing-device"] if args.allow_missing_device else []
    failed = env_row[1] == "fail"
    for delivery in deliveries:
        rows = [env_row, *check_delivery(root, delivery, output / delivery.name, args.device, reason)]
        failed |= any(row[1] == "fail" for row in rows)
        title = f"npu-check on {args.device}" + (" (skipped: no NPU)" if reason else "")
        report = build_report(
            "npu-check",
            delivery.name,
            random_weights=True,
            environment=environment_fingerprint(args.device if npu.available else "cpu", delivery),
            command=command,
            results={"tables": [{"title": title, "columns": COLUMNS, "rows": rows}]},
        )
        path = write_report(output / delivery.name / RESULTS_FILE, report)
        for row in rows:
            print(f"{delivery.name}: {row[0]}: {row[1]}" + (f" ({row[3]})" if row[3] else ""))
        print(f"{delivery.name}: wrote {path}")
    return int(ExitCode.FAILURE if failed else ExitCode.OK)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("npu-check", help="prove an Ascend host: env, device tests, NPU benchmarks")
    parser.add_argument("--device", default="npu:0", help="the NPU to check (default npu:0)")
    parser.add_argument("--allow-missing-device", action="store_true", help="without an NPU: mark its steps skipped")
    parser.add_argument("--output", default="outputs/npu-check", help="results folder (one subfolder per delivery)")
    parser.add_argument("--root", default=".", help="the repository (or published delivery) root")
    parser.set_defaults(func=npu_check_command)
