"""What ships names no path of the machine that made it: results files, READMEs, usage texts and scripts.

A published delivery shows its results and READMEs to every reader, and a "made by" command with a checkout or temp
folder of the build machine in it cannot be rerun as written. Paths are repo-relative or the variables a user sets
(``$TRELLIS2_SRC``, ``DIR``); system locations (``/usr/local/Ascend/...``) are the same on every host and allowed.
"""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# A path that starts at the root of a folder where machines keep checkouts, work trees, temp files or data: not one
# inside a URL (https://...), a word (x86_64/aarch64) or a relative path (../shared). ``~/weights`` is the reader's
# own home, the same words on every host.
MACHINE_PATH = re.compile(
    r"(?<![\w:/.~$-])/(?:home|root|tmp|work|mnt|media|data|src|srv|opt|var|scratch|nfs|Users)/[\w.$-]*"
)


def _shipped_files() -> list[Path]:
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, text=True, check=True, timeout=30
        ).stdout.split("\0")
    except (OSError, subprocess.SubprocessError):
        pytest.skip("needs the git checkout (git ls-files)")
    return [REPO / name for name in listed if name and (REPO / name).is_file()]


def _texts(path: Path) -> list[str]:
    """The text of ``path`` that a reader or a user of the script sees; for Python, its string literals."""
    text = path.read_text(encoding="utf-8")
    if path.suffix != ".py":
        return [text]
    return [
        node.value
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]


def _is_checked(path: Path) -> bool:
    relative = path.relative_to(REPO)
    if "tests" in relative.parts[:-1]:
        return False  # tests make and name their own temp folders
    return (
        (relative.parent.name == "results" and path.suffix == ".json")
        or path.suffix in {".md", ".py", ".sh"}
        or path.name in {"Makefile", "run"}
    )


def test_the_pattern_finds_machine_paths_and_nothing_else():
    found = MACHINE_PATH.findall(
        "--upstream /work/up/x --out /tmp/a ~/src/URSA '/home/me/w' https://github.com/a/tmp/b x86_64/aarch64 "
        "../shared/tmp/ /usr/local/Ascend/set_env.sh /v1/videos 1/300 $VAR/tmp/x"
    )
    assert found == ["/work/up", "/tmp/a", "/home/me"]


def test_no_shipped_file_names_a_path_of_the_build_machine():
    hits = []
    for path in filter(_is_checked, _shipped_files()):
        for text in _texts(path):
            for line in text.splitlines():
                if MACHINE_PATH.search(line):
                    hits.append(f"{path.relative_to(REPO)}: {line.strip()[:160]}")
    assert not hits, "machine paths (use repo-relative paths, $TRELLIS2_SRC-style variables or DIR):\n" + "\n".join(
        hits
    )
