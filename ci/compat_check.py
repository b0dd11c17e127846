"""Compat check: does the monorepo set up and pass on a platform ("system") torch, as on an Ascend image?

For each ``--python`` (a plain CPython prefix with only torch installed: ``ci/make_system_torch.sh``; one without
torch takes torch 2.13.0 from the locks), in order:

1. ``ci/setup_venv.sh`` with ``PYTHON=<it>`` into a fresh venv under ``--work``;
2. the venv's torch must be the system one (version, and imported from the system prefix, not the venv);
3. the three smoke runs exactly as ``make demo`` runs them (trellis2-npu ``scripts/conditioning.py --smoke full``,
   sulphur2-npu and ursa-npu ``--smoke``; ursa-npu on ``$URSA_SRC``);
4. the test suite (``pytest -q -p no:cacheprovider``; ``shared/tests/test_publish_selftest.py`` left out: it
   needs the package index and minutes), with ``TRELLIS2_SRC`` / ``URSA_SRC`` passed through.

One row per interpreter goes into ``--output`` (a run report; rows of other torch versions already there are kept),
from which ``make compat-readme`` renders the root README's version table. Run by the repo's ``.venv/bin/python``.

usage: .venv/bin/python ci/compat_check.py --python DEST/bin/python3 [--python ...]
       --work DIR [--output results/compat.json]
       (without --python: only re-render the tables of --output)
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from deliverykit import __version__  # run by the repo's .venv, where deliverykit is installed
from deliverykit.device import device_name
from deliverykit.report import build_report, git_commit, load_report, write_report

REPO = Path(__file__).resolve().parents[1]

COLUMNS = [
    "Python",
    "system torch",
    "torch after setup",
    "transformers",
    "diffusers",
    "setup",
    "trellis2-npu smoke",
    "sulphur2-npu smoke",
    "ursa-npu smoke",
    "tests passed",
    "failed or error",
    "skipped",
]
_FROM_LOCK = "none (2.13.0 from the lock)"
_VERSIONS = (
    "import importlib.metadata as m, platform, torch\n"
    "def v(name):\n"
    "    try:\n"
    "        return m.version(name)\n"
    "    except m.PackageNotFoundError:\n"
    "        return None\n"
    "print(platform.python_version(), v('torch'), v('transformers'), v('diffusers'), torch.__file__)\n"
)


def _run(command: list[str], log: Path, env: dict[str, str] | None = None) -> int:
    """Run ``command`` from the repo root, stdout+stderr into ``log``; its exit status."""
    with open(log, "w", encoding="utf-8") as handle:
        handle.write("$ " + " ".join(command) + "\n")
        handle.flush()
        return subprocess.run(command, cwd=REPO, stdout=handle, stderr=subprocess.STDOUT, env=env).returncode


def _probe(python: str) -> list[str]:
    out = subprocess.run([python, "-c", _VERSIONS], capture_output=True, text=True, check=True).stdout
    return out.split()


def _prefix(python: str) -> str:
    return subprocess.run(
        [python, "-c", "import sys; print(sys.prefix)"], capture_output=True, text=True, check=True
    ).stdout.strip()


def _system_torch(python: str) -> str | None:
    code = (
        "import importlib.metadata as m\ntry:\n    print(m.version('torch'))\nexcept m.PackageNotFoundError:\n    pass"
    )
    return subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout.strip() or None


def _pytest_counts(log: Path) -> tuple[dict[str, int], list[str]]:
    text = log.read_text(encoding="utf-8", errors="replace")
    summary = [line for line in text.splitlines() if re.search(r"\d+ (passed|failed|error)", line)]
    counts = {key: 0 for key in ("passed", "failed", "skipped", "error")}
    if summary:
        for number, key in re.findall(r"(\d+) (passed|failed|skipped|errors?)", summary[-1]):
            counts["error" if key.startswith("error") else key] += int(number)
    failures = [line.split(" - ")[0] for line in text.splitlines() if line.startswith(("FAILED ", "ERROR "))]
    return counts, failures


def check(python: str, work: Path) -> tuple[list, list[str]]:
    """One row of the table for ``python``, and its failing tests."""
    tag = "torch" + (_system_torch(python) or "-from-lock")
    run_dir = work / tag
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    venv = run_dir / "venv"
    system_torch = _system_torch(python)
    env = dict(os.environ, PYTHON=python, VENV=str(venv))
    started = time.monotonic()
    setup_rc = _run(["ci/setup_venv.sh"], run_dir / "setup.log", env)
    print(f"compat {tag}: setup exit {setup_rc} in {time.monotonic() - started:.0f} s", flush=True)
    if setup_rc != 0:
        row = [
            None,
            system_torch or _FROM_LOCK,
            None,
            None,
            None,
            f"exit {setup_rc}",
            *["not run"] * 3,
            None,
            None,
            None,
        ]
        return row, []
    py = str(venv / "bin" / "python")
    python_version, torch_after, transformers, diffusers, torch_file = _probe(py)
    kept = system_torch is None or (
        torch_after == system_torch and Path(torch_file).resolve().is_relative_to(Path(_prefix(python)).resolve())
    )
    outputs = run_dir / "outputs"
    ursa_src = os.environ["URSA_SRC"]
    conditioning = "trellis2-npu/scripts/conditioning.py"  # the DINOv3 smoke; image → 3D needs a TRELLIS.2 checkout
    smokes = {
        "trellis2-npu": [py, conditioning, "--smoke", "full", "--output", f"{outputs}/trellis2-npu"],
        "sulphur2-npu": [py, "sulphur2-npu/inference.py", "--smoke", "--output", f"{outputs}/sulphur2-npu/smoke.mp4"],
        "ursa-npu": [py, "ursa-npu/inference.py", "--smoke", "--upstream", ursa_src, "--output", f"{outputs}/ursa.jpg"],
    }
    smoke_results = []
    for name, command in smokes.items():
        started = time.monotonic()
        rc = _run(command, run_dir / f"smoke-{name}.log")
        smoke_results.append("pass" if rc == 0 else f"exit {rc}")
        print(f"compat {tag}: {name} smoke exit {rc} in {time.monotonic() - started:.0f} s", flush=True)
    started = time.monotonic()
    test_log = run_dir / "pytest.log"
    tests = [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--ignore=shared/tests/test_publish_selftest.py"]
    _run(tests, test_log)
    counts, failures = _pytest_counts(test_log)
    print(f"compat {tag}: tests {counts} in {time.monotonic() - started:.0f} s", flush=True)
    row = [
        python_version,
        system_torch or _FROM_LOCK,
        torch_after,
        transformers,
        diffusers,
        "torch kept" if kept and system_torch else ("ok" if kept else "torch REPLACED"),
        *smoke_results,
        counts["passed"],
        counts["failed"] + counts["error"],
        counts["skipped"],
    ]
    return row, failures


def _torch_key(row: list) -> tuple:
    version = "2.13.0" if row[1] == _FROM_LOCK else str(row[1])
    return tuple(int(part) if part.isdigit() else 999 for part in re.split(r"[.+]", version)[:3])


def _load(output: Path) -> tuple[dict[str, list], dict[str, list[str]]]:
    """The rows and failing tests already measured, by system torch (also from a file with only its tables)."""
    results = load_report(output)["results"]
    if "rows" in results:
        return results["rows"], results["failures"]
    rows, failures = {}, {}
    for table in results["tables"]:
        for row in table["rows"]:
            if table["columns"][:2] == COLUMNS[:2]:
                rows[str(row[1])] = row
            else:
                failures.setdefault(str(row[0]), []).append(row[1])
    return rows, failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--python", action="append", default=[], help="interpreter to check (repeatable; none: re-render --output)"
    )
    parser.add_argument("--work", type=Path, help="folder for the venvs, logs and smoke outputs (with --python)")
    parser.add_argument("--output", default=str(REPO / "results" / "compat.json"))
    args = parser.parse_args(argv)
    for python in args.python:
        if not os.access(python, os.X_OK):
            print(
                f"error: --python {python} is not an executable interpreter; pass e.g. DEST/bin/python3",
                file=sys.stderr,
            )
            return 2
    if args.python and args.work is None:
        print("error: --python needs --work DIR for the venvs, logs and smoke outputs", file=sys.stderr)
        return 2
    for variable in ("URSA_SRC", "TRELLIS2_SRC") if args.python else ():
        if not os.environ.get(variable):
            print(f"error: ${variable} is not set; point it at the patched upstream checkout", file=sys.stderr)
            return 2

    output = Path(args.output)
    rows, failures = _load(output) if output.is_file() else ({}, {})
    if not args.python and not rows:
        print(f"error: {output} holds no rows to render; pass --python INTERPRETER to measure one", file=sys.stderr)
        return 2
    for python in args.python:
        row, failed = check(python, args.work)
        rows[str(row[1])] = row
        failures[str(row[1])] = failed

    ordered = sorted(rows.values(), key=_torch_key)
    tables = [{"title": "", "columns": COLUMNS, "rows": ordered}]
    by_test: dict[str, list[str]] = {}
    for key in sorted(rows, key=lambda key: _torch_key(rows[key])):
        for failure in failures.get(key, []):
            by_test.setdefault(failure, []).append(key.split()[0] if key != _FROM_LOCK else "2.13.0 (lock)")
    if by_test:
        failed_rows = [[*failure.split(" ", 1), ", ".join(on)] for failure, on in by_test.items()]
        tables.append({"title": "Failing tests", "columns": ["outcome", "test", "system torch"], "rows": failed_rows})
    environment = {
        "device": "cpu",
        "device_name": device_name("cpu"),
        "packages": {"deliverykit": __version__},
        "git_commit": git_commit(REPO),
    }
    report = build_report(
        "compat",
        "monorepo",
        random_weights=True,
        environment=environment,
        results={"tables": tables, "rows": rows, "failures": failures},
    )
    if not args.python:  # a re-render keeps when, how and on what the rows were measured
        report.update({key: load_report(output)[key] for key in ("created_utc", "command", "environment")})
    write_report(output, report)
    print(f"compat: {len(ordered)} row(s) in {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
