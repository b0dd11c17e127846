"""Atomic output: a file appears complete or not at all, and nothing of the user's is ever deleted."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .errors import OutputError


def ensure_writable_dir(path: str | os.PathLike) -> Path:
    """Create ``path`` (and parents) if needed and check that files can be written in it.

    Raises :class:`OutputError` naming the folder and the fix, before any work is done.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise OutputError(f"output path {path} exists and is not a folder; pass a folder to --output")
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-check-"):
            pass
    except OSError as err:
        raise OutputError(f"cannot write to output folder {path} ({err.strerror}); choose a writable --output") from err
    return path


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``target``; rename it onto ``target`` only if the block succeeds."""
    target = Path(target)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        # mkstemp (and some writers that recreate the file) leave 0600; give it the permissions open() would.
        os.chmod(tmp_path, 0o666 & ~_umask())
        os.replace(tmp_path, target)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_text_atomic(target: str | os.PathLike, text: str) -> Path:
    with atomic_path(target) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(target)


def write_json_atomic(target: str | os.PathLike, data: Any) -> Path:
    return write_text_atomic(target, json.dumps(data, indent=2, sort_keys=False) + "\n")
