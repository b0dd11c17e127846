"""Atomic output: the files of a run appear complete and together, or not at all; nothing of the user's is deleted.

A run declares its outputs up front (:class:`Outputs`), checks them before any work (:meth:`Outputs.check`: a
folder in the way, a parent that is a file, a location that cannot be written), writes every file to a temporary
sibling ``.<name>.<pid>.tmp`` and renames them all into place at the end (:meth:`Outputs.commit`). If anything
fails, the temporaries are removed, folders the run created are removed again, and files already renamed are
rolled back, so no final file appears. A run killed with SIGKILL cannot clean up: the next run writing the same
names removes the temporaries whose writer process is dead (the PID in the name), and never any other file.
A full disk, a quota, a read-only file system or a permission error becomes one :class:`OutputError` line (exit 6).
:class:`RunOutputs` is the same for one request of a session: its files by name and its report(s), the report
written last in the same commit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from .errors import OutputError

# errno → the fix the error line proposes; any other OSError is not the output location's fault and propagates.
_WRITE_ERRORS = {
    errno.ENOSPC: "free space or choose another {flag}",
    errno.EDQUOT: "free space (disk quota exceeded) or choose another {flag}",
    errno.EROFS: "choose a writable {flag} (this file system is read-only)",
    errno.EACCES: "choose a writable {flag} or fix its permissions",
    errno.EPERM: "choose a writable {flag} or fix its permissions",
}


def output_error(err: OSError, target: str | os.PathLike, flag: str = "--output") -> OutputError | None:
    """The exit-6 error line for a write error of ``target``, or None when ``err`` is not a write-location error."""
    fix = _WRITE_ERRORS.get(err.errno)
    if fix is None:
        return None
    reason = err.strerror or os.strerror(err.errno)
    return OutputError(f"cannot write {target} ({reason}); {fix.format(flag=flag)}")


def temp_name(target: Path, tag: str = "") -> Path:
    """``dir/name`` → ``dir/.name.<tag><pid>.tmp``: the PID lets a later run tell a dead writer's leftovers."""
    return target.with_name(f".{target.name}.{tag}{os.getpid()}.tmp")


def pid_alive(pid: int) -> bool:
    """Whether a process with ``pid`` runs on this host (a zombie, dead but not yet reaped, counts as gone)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    with contextlib.suppress(OSError, IndexError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return True


def sweep_stale_temps(target: str | os.PathLike) -> list[Path]:
    """Remove ``.<name>.[old.]<pid>.tmp[.ext]`` siblings of ``target`` whose writer PID is dead; return them.

    Only names of that exact form for this ``target`` are touched, so a user's file can never match.
    """
    target = Path(target)
    pattern = re.compile(rf"^\.{re.escape(target.name)}\.(?:old\.)?(\d+)\.tmp(?:\.[A-Za-z0-9]+)?$")
    removed = []
    try:
        entries = list(os.scandir(target.parent))
    except OSError:
        return removed
    for entry in entries:
        match = pattern.match(entry.name)
        if match and entry.is_file(follow_symlinks=False) and not pid_alive(int(match.group(1))):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)
                removed.append(Path(entry.path))
    return removed


def _nearest_existing(path: Path) -> Path:
    while not path.exists() and path.parent != path:
        path = path.parent
    return path


class Outputs:
    """Every output file of one run, checked before any work and committed together at the end.

    ``add(path, flag)`` names the command-line flag the path came from, so the error line says which one to change.
    """

    def __init__(self) -> None:
        self._targets: dict[Path, str] = {}

    def add(self, path: str | os.PathLike, flag: str = "--output") -> Path:
        path = Path(os.path.abspath(path))
        self._targets.setdefault(path, flag)
        return path

    def add_reports(self, folder: str | os.PathLike, report: str | os.PathLike | None = None) -> list[Path]:
        """``folder/report.json`` and the ``--report`` copy when given: where a run writes its report."""
        paths = [self.add(Path(folder) / "report.json")]
        if report:
            paths.append(self.add(report, "--report"))
        return paths

    @property
    def targets(self) -> list[Path]:
        return list(self._targets)

    def check(self) -> None:
        """Fail now (exit 6) if any output could not be written; sweep dead writers' temporaries. Creates nothing."""
        probed = set()
        for target, flag in self._targets.items():
            if target.is_dir():
                raise OutputError(
                    f"{target} is a folder, where this run writes a file; move it away or choose another {flag}"
                )
            existing = _nearest_existing(target.parent)
            if not existing.is_dir():
                raise OutputError(f"cannot create {target}: {existing} is a file, not a folder; choose another {flag}")
            if existing not in probed:
                probed.add(existing)
                probe = existing / f".deliverykit-probe.{os.getpid()}.tmp"
                try:
                    os.close(os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
                    os.unlink(probe)
                except OSError as err:
                    raise (output_error(err, existing, flag) or err) from None
            sweep_stale_temps(target)

    @contextlib.contextmanager
    def commit(self) -> Iterator[dict[Path, Path]]:
        """Yield ``{target: temporary path}``; rename every temporary onto its target only if the block succeeds.

        On any failure no target changes: temporaries are removed, created folders removed again and targets
        already replaced restored from their hard-linked previous version.
        """
        self.check()
        created: list[Path] = []
        temps = {target: temp_name(target) for target in self._targets}
        committed = False
        try:
            for target, flag in self._targets.items():
                for folder in reversed([target.parent, *target.parent.parents]):
                    if not folder.exists():
                        try:
                            folder.mkdir()
                        except OSError as err:
                            raise (output_error(err, folder, flag) or err) from None
                        created.append(folder)
            yield temps
            self._rename_all(temps)
            committed = True
        except OSError as err:
            target = self._target_of(err, temps)
            mapped = output_error(err, target, self._targets.get(target, "--output"))
            if mapped is None:
                raise
            raise mapped from None
        finally:
            for temp in temps.values():
                with contextlib.suppress(OSError):
                    temp.unlink()
            if not committed:
                for folder in reversed(created):
                    with contextlib.suppress(OSError):
                        folder.rmdir()  # only if still empty

    def _target_of(self, err: OSError, temps: dict[Path, Path]) -> Path:
        """The target a write error belongs to: the file it names, else the temporary written last, else the folder.

        ``write()`` errors carry no file name; the temporary being written when the disk filled is the newest one.
        """
        for target, temp in temps.items():
            if err.filename is not None and str(err.filename).startswith(str(temp)):
                return target
        written = {temp.stat().st_mtime_ns: target for target, temp in temps.items() if temp.exists()}
        if written:
            return written[max(written)]
        targets = list(self._targets)
        return targets[0] if len(targets) == 1 else Path(os.path.commonpath(targets))

    def _rename_all(self, temps: dict[Path, Path]) -> None:
        mode = 0o666 & ~_umask()  # mkstemp-like writers leave 0600; give the files the permissions open() would
        for target, temp in temps.items():
            if not temp.is_file():
                raise RuntimeError(f"the writer of {target} did not write {temp}")
            os.chmod(temp, mode)
        backups: dict[Path, Path] = {}
        done: list[Path] = []
        existed = {target for target in temps if target.exists()}
        try:
            for target in temps:
                if target.is_file():
                    backup = temp_name(target, "old.")
                    backup.unlink(missing_ok=True)
                    with contextlib.suppress(OSError):  # no hard links here: such a file stays replaced on failure
                        os.link(target, backup)
                        backups[target] = backup
            for target, temp in temps.items():
                os.replace(temp, target)
                done.append(target)
        except BaseException:
            for target in done:
                if target in backups:
                    os.replace(backups.pop(target), target)
                elif target not in existed:
                    target.unlink(missing_ok=True)
            raise
        finally:
            for backup in backups.values():
                backup.unlink(missing_ok=True)


@dataclasses.dataclass
class Commit:
    """Where a :meth:`RunOutputs.commit` block writes: ``files[name]``, temporary paths; ``report``, set by the block
    once the files are written (so that it can say how long writing them took)."""

    files: dict[str, Path]
    report: Mapping[str, Any] | None = None


@dataclasses.dataclass(frozen=True)
class RunOutputs:
    """One request's files by name and its report(s) (``report.json`` and the ``--report`` copy): declared and checked
    (exit 6) before any work, then written together by :meth:`commit`, or none of them."""

    files: dict[str, Path]
    reports: tuple[Path, ...]
    outputs: Outputs = dataclasses.field(repr=False, compare=False)

    @classmethod
    def declare(
        cls,
        files: Mapping[str, str | os.PathLike],
        report: str | os.PathLike | None = None,
        *,
        folder: str | os.PathLike | None = None,
    ) -> RunOutputs:
        """``files`` by name, ``report.json`` in ``folder`` (default: the first file's) and ``report``, checked now."""
        outputs = Outputs()
        named = {name: outputs.add(path) for name, path in files.items()}
        if folder is None:
            folder = next(iter(named.values())).parent
        reports = tuple(outputs.add_reports(folder, report))
        outputs.check()
        return cls(named, reports, outputs)

    def __getitem__(self, name: str) -> Path:
        return self.files[name]

    def __contains__(self, name: object) -> bool:
        return name in self.files

    @contextlib.contextmanager
    def commit(self) -> Iterator[Commit]:
        """Yield a :class:`Commit`; when the block has written every file and set the report, the report goes to each
        report path and everything is renamed into place together (:meth:`Outputs.commit`), else nothing is."""
        with self.outputs.commit() as temps:
            commit = Commit({name: temps[path] for name, path in self.files.items()})
            yield commit
            if commit.report is None:
                raise RuntimeError("the commit block set no report (commit.report)")
            text = json_text(commit.report)
            for path in self.reports:
                temps[path].write_text(text, encoding="utf-8")


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike, flag: str = "--output") -> Iterator[Path]:
    """Yield a temporary path next to ``target``; rename it onto ``target`` only if the block succeeds."""
    outputs = Outputs()
    target = outputs.add(target, flag)
    with outputs.commit() as temps:
        yield temps[target]


def ensure_writable_dir(path: str | os.PathLike) -> Path:
    """Create ``path`` (and parents) if needed and check that files can be written in it.

    For folders a script writes into at once (benchmark results); an ``inference.py`` uses :class:`Outputs`, which
    creates nothing before the run succeeds. Raises :class:`OutputError` naming the folder and the fix.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise OutputError(f"output path {path} exists and is not a folder; pass a folder to --output")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".deliverykit-probe.{os.getpid()}.tmp"
        os.close(os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        os.unlink(probe)
    except OSError as err:
        raise OutputError(f"cannot write to output folder {path} ({err.strerror}); choose a writable --output") from err
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def json_text(data: Any) -> str:
    """The JSON files deliverykit writes: indented, keys in insertion order, a final newline."""
    return json.dumps(data, indent=2, sort_keys=False) + "\n"


def write_text_atomic(target: str | os.PathLike, text: str) -> Path:
    with atomic_path(target) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(target)


def write_json_atomic(target: str | os.PathLike, data: Any) -> Path:
    return write_text_atomic(target, json_text(data))
