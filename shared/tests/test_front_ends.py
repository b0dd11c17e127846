"""The front ends users run (``inference.py``, ``app.py``, ``serve.py``, every script in ``scripts/``): each drives its
delivery's package and no other front end, and answers ``--help`` before importing torch, diffusers, transformers,
gradio or the web server.
The ``benchmarks/`` are maintainers' tools, minutes long, and not held to this yet.

The import check reads ``python -X importtime`` (which modules a process imported), not the wall time: a usage error
that loads torch first costs seconds on a loaded machine and is no less wrong on a fast one.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DELIVERIES = ("trellis2-npu", "sulphur2-npu", "ursa-npu")
HEAVY = ("torch", "diffusers", "transformers", "gradio", "trimesh", "fastapi", "uvicorn")


def front_ends() -> list[Path]:
    found = []
    for delivery in DELIVERIES:
        root = REPO / delivery
        found += [path for path in (root / "inference.py", root / "app.py", root / "serve.py") if path.is_file()]
        found += sorted((root / "scripts").glob("*.py"))
    return found


def _rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def imported_top_modules(stderr: str) -> set[str]:
    """The top-level packages a ``-X importtime`` run imported (lines ``import time: self | cumulative | name``)."""
    names = set()
    for line in stderr.splitlines():
        if line.startswith("import time:") and line.count("|") == 2:
            names.add(line.rsplit("|", 1)[1].strip().split(".")[0])
    return names


def test_the_import_reader_sees_a_heavy_import():
    """The check below cannot pass by reading nothing: a process that imports torch is seen to."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", "import torch"], capture_output=True, text=True)
    assert done.returncode == 0 and "torch" in imported_top_modules(done.stderr)


@pytest.mark.parametrize("script", front_ends(), ids=_rel)
def test_help_answers_before_any_heavy_import(script):
    env = {**os.environ, "PYTHONPATH": ""}
    done = subprocess.run(
        [sys.executable, "-X", "importtime", str(script), "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env=env,
        check=False,
    )
    assert done.returncode == 0 and "usage:" in done.stdout, done.stderr[-2000:]
    heavy = sorted(imported_top_modules(done.stderr) & set(HEAVY))
    assert not heavy, f"{_rel(script)} --help imports {heavy}: parse the arguments first, import those after"


def _imported_names(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("script", front_ends(), ids=_rel)
def test_no_front_end_imports_another(script):
    """A second front end (the server, a Ray worker) would copy what one front end takes from another: what two
    share lives in the delivery's package (its ``session`` and ``options`` modules)."""
    scripts = {path.stem for path in front_ends()}
    assert not _imported_names(script) & scripts, f"{_rel(script)} imports a front end"
