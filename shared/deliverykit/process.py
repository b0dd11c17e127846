"""Running external tools (git, patch) the same way everywhere: no input, no prompt, English messages.

Their first line of output is what a one-line error shows the user, so it must be predictable; variables that
point git at another repository (set by git hooks, for one) are dropped so a tool acts on the folder it is given.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

_REPO_ENV = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY", "GIT_COMMON_DIR")


def run_tool(args: Sequence[str], cwd: Path, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``args`` in ``cwd`` with no stdin, ``LC_ALL=C``, no git prompt, plus ``env``; never raises on failure."""
    environment = {key: value for key, value in os.environ.items() if key not in _REPO_ENV}
    environment.update({"LC_ALL": "C", "GIT_TERMINAL_PROMPT": "0"})
    environment.update(env or {})
    return subprocess.run(
        list(args),
        cwd=cwd,
        env=environment,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        errors="replace",
        check=False,
    )
