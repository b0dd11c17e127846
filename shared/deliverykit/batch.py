"""Batch runs: many requests, one model load, resumable after a crash, spread over processes (ranks).

A batch is read and checked whole before anything loads (a bad line is a usage error naming its line). Each item
writes its outputs, all or none, into ``OUTPUT/<name>/``; the item's ``report.json`` is written last, so its
presence means the item completed, and a rerun of the same command skips it (``overwrite`` redoes it).

Processes share the work through the output folder alone: rank ``r`` of ``N`` takes items ``r, r+N, …`` and claims
each with a file created with ``O_EXCL`` under ``OUTPUT/.batch/claims/``. A claim whose process is dead (same host,
PID gone) is taken over; a live one is left alone, so two processes never write the same item. A failing item (bad
image, NaN) is recorded with its one-line error and the batch goes on. ``batch.json`` sums up every item's state;
each process rewrites it under a lock when it finishes, so the last one to finish leaves the complete picture.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import re
import socket
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from .errors import DeliveryError, ExitCode, InputError
from .files import pid_alive, write_json_atomic

logger = logging.getLogger(__name__)

ITEM_REPORT = "report.json"
STATE_DIR = ".batch"
SUMMARY = "batch.json"
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_JSON_TYPES: dict[type, tuple[type, ...]] = {str: (str,), int: (int,), float: (int, float), bool: (bool,)}


def _usage(message: str) -> DeliveryError:
    return DeliveryError(message, ExitCode.USAGE)


@dataclasses.dataclass(frozen=True)
class BatchItem:
    """One request of a batch: its position, where it came from, its output name and its fields."""

    index: int
    name: str
    fields: dict[str, Any]
    source: str  # "FILE:LINE" or the image path, for messages


def read_batch(
    path: str | os.PathLike,
    fields: Mapping[str, type],
    *,
    required: Sequence[str] = (),
    text_field: str = "prompt",
    image_field: str | None = None,
    check: Callable[[dict[str, Any]], None] | None = None,
) -> list[BatchItem]:
    """Read a batch: JSON Lines (one object a line), plain text (one ``text_field`` a line) or a folder of images.

    ``fields`` maps each accepted field to its type (``output`` is always accepted: the item's folder name);
    ``check`` validates one request's fields as the CLI would and raises :class:`DeliveryError`. Every problem is a
    usage error naming ``FILE:LINE`` and the fix, raised before the caller loads anything. Relative image paths are
    taken from the batch file's folder.
    """
    path = Path(path)
    if path.is_dir():
        if image_field is None:
            raise _usage(f"--batch {path} is a folder, but this delivery takes no image input; pass a .jsonl or .txt")
        images = sorted(p for p in path.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
        if not images:
            raise InputError(f"--batch folder {path} holds no image ({', '.join(IMAGE_SUFFIXES)}); add images to it")
        raw = [(str(image), {image_field: str(image), "output": image.stem}) for image in images]
    else:
        raw = _read_lines(path, fields, text_field)
    items, seen = [], {}
    for index, (source, request) in enumerate(raw):
        name = request.pop("output", None) or f"{index:05d}"
        if not isinstance(name, str) or not _NAME_RE.match(name):
            raise _usage(f"{source}: output {name!r} is not a plain folder name; use letters, digits, '.', '_', '-'")
        if name in seen:
            raise _usage(f"{source}: output {name!r} is also the output of {seen[name]}; give each item its own name")
        seen[name] = source
        missing = [key for key in required if key not in request]
        if missing:
            raise _usage(f"{source}: missing {', '.join(missing)}; every request needs {', '.join(required)}")
        if image_field and isinstance(request.get(image_field), str):
            request[image_field] = str((path.parent if path.is_file() else path) / request[image_field])
        if check is not None:
            try:
                check(dict(request))
            except DeliveryError as err:
                raise _usage(f"{source}: {err}") from err
        items.append(BatchItem(index=index, name=name, fields=request, source=source))
    if not items:
        raise _usage(f"--batch {path} holds no request; write one request a line")
    return items


def _read_lines(path: Path, fields: Mapping[str, type], text_field: str) -> list[tuple[str, dict[str, Any]]]:
    try:
        data = path.read_bytes()
    except OSError as err:
        raise InputError(f"cannot read --batch {path} ({err.strerror}); pass a readable .jsonl/.txt file") from err
    as_json = path.suffix.lower() in (".jsonl", ".json", ".ndjson")
    accepted = {**fields, "output": str}
    raw = []
    for number, line_bytes in enumerate(data.splitlines(), start=1):
        source = f"{path}:{number}"
        try:
            line = line_bytes.decode("utf-8").strip()
        except UnicodeDecodeError as err:
            raise _usage(f"{source}: not valid UTF-8 (byte {err.start + 1}); save the batch file as UTF-8") from err
        if not line or (not as_json and line.startswith("#")):
            continue
        if not as_json:
            raw.append((source, {text_field: line}))
            continue
        try:
            request = json.loads(line)
        except json.JSONDecodeError as err:
            raise _usage(f"{source}: not JSON ({err.msg}, column {err.colno}); write one JSON object a line") from err
        if not isinstance(request, dict):
            raise _usage(f'{source}: a JSON {type(request).__name__}, not an object; write {{"{text_field}": …}}')
        for key, value in request.items():
            if key not in accepted:
                raise _usage(f"{source}: unknown field {key!r}; accepted: {', '.join(sorted(accepted))}")
            kind = accepted[key]
            if not isinstance(value, _JSON_TYPES.get(kind, (kind,))) or (kind is not bool and isinstance(value, bool)):
                raise _usage(f"{source}: {key} must be {kind.__name__}, got {json.dumps(value)}")
        raw.append((source, request))
    return raw


@dataclasses.dataclass(frozen=True)
class Ranks:
    """Which share of a batch this process takes: rank ``rank`` of ``world_size``."""

    rank: int = 0
    world_size: int = 1

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Ranks:
        """torchrun's ``RANK`` / ``WORLD_SIZE`` (one process when unset)."""
        env = os.environ if environ is None else environ
        rank, world = int(env.get("RANK", "0")), int(env.get("WORLD_SIZE", "1"))
        if not 0 <= rank < world:
            raise _usage(f"RANK={rank} is not below WORLD_SIZE={world}; launch with torchrun --nproc-per-node N")
        return cls(rank, world)

    def share(self, items: Sequence[BatchItem]) -> list[BatchItem]:
        return list(items[self.rank :: self.world_size])


def rank_device_spec(spec: str | None, ranks: Ranks, environ: Mapping[str, str] | None = None) -> str | None:
    """This rank's ``--device``: as given for one process; with several ranks, an accelerator named without an index
    (``npu``, ``cuda``, ``auto``) becomes ``<type>:LOCAL_RANK`` (``LOCAL_RANK`` counts the visible devices)."""
    env = os.environ if environ is None else environ
    if ranks.world_size == 1:
        return spec
    spec = (spec or env.get("DELIVERY_DEVICE") or "auto").strip().lower()
    if spec == "cpu" or ":" in spec:
        return spec
    if spec == "auto":
        from .device import resolve_device

        spec = resolve_device("auto").type
    return spec if spec == "cpu" else f"{spec}:{int(env.get('LOCAL_RANK', ranks.rank))}"


class Claims:
    """Exclusive claims on item names, as files created with ``O_EXCL``; dead owners' claims are taken over."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.folder.mkdir(parents=True, exist_ok=True)
        self.host = socket.gethostname()

    def _path(self, name: str) -> Path:
        return self.folder / f"{name}.claim"

    def acquire(self, name: str, rank: int) -> bool:
        """Claim ``name``; False when a live process holds it."""
        path = self._path(name)
        owner = json.dumps({"pid": os.getpid(), "host": self.host, "rank": rank, "since": time.time()})
        for _ in range(3):
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                if not self._take_over_if_stale(path):
                    return False
                continue
            with os.fdopen(fd, "w") as handle:
                handle.write(owner)
            return True
        return False

    def _take_over_if_stale(self, path: Path) -> bool:
        try:
            holder = json.loads(path.read_text() or "{}")
        except (OSError, ValueError):
            holder = {}  # being written right now, or gone: treat as live unless it has no owner at all
            if path.exists() and time.time() - path.stat().st_mtime < 60:
                return False
        if holder and (holder.get("host") != self.host or pid_alive(int(holder.get("pid", -1)))):
            return False
        stale = path.with_name(f"{path.name}.stale.{os.getpid()}")
        try:
            os.rename(path, stale)  # only one process wins the rename; the others retry O_EXCL and lose to it
        except FileNotFoundError:
            return True
        stale.unlink(missing_ok=True)
        logger.info("took over %s from a dead process (%s)", path.name, holder or "no owner")
        return True

    def release(self, name: str) -> None:
        self._path(name).unlink(missing_ok=True)


@dataclasses.dataclass
class BatchResult:
    """What this process did: item states by name, and the exit code (0, or BATCH_PARTIAL if an item failed)."""

    states: dict[str, dict[str, Any]]
    summary_path: Path

    @property
    def failed(self) -> list[str]:
        return [name for name, state in self.states.items() if state["status"] == "failed"]

    @property
    def exit_code(self) -> int:
        return int(ExitCode.BATCH_PARTIAL if self.failed else ExitCode.OK)


def item_is_complete(item_dir: Path) -> bool:
    """The item's report (written last, with its outputs) is there and is a JSON object."""
    try:
        return isinstance(json.loads((item_dir / ITEM_REPORT).read_text(encoding="utf-8")), dict)
    except (OSError, ValueError):
        return False


def run_batch(
    items: Sequence[BatchItem],
    run_item: Callable[[BatchItem, Path], Mapping[str, Any] | None],
    output: str | os.PathLike,
    *,
    overwrite: bool = False,
    ranks: Ranks | None = None,
    progress: bool | None = None,
) -> BatchResult:
    """Run this rank's share of ``items`` with ``run_item(item, OUTPUT/<name>)``, which writes the item's outputs and
    its ``report.json`` (all or none) and may return figures to keep in ``batch.json`` (timings).

    A :class:`DeliveryError` from ``run_item`` fails that item only (its one-line message is kept); any other
    exception does too, with its traceback printed, since it is a bug. Items already complete are skipped unless
    ``overwrite``; items claimed by a live process are left to it. ``progress``: a tqdm bar (default: rank 0 only).
    """
    ranks = ranks or Ranks()
    output = Path(output)
    state_dir = output / STATE_DIR
    claims = Claims(state_dir / "claims")
    (state_dir / "items").mkdir(parents=True, exist_ok=True)
    mine = ranks.share(items)
    states: dict[str, dict[str, Any]] = {}
    show = (ranks.rank == 0) if progress is None else progress
    with progress_bar(len(mine), show, ranks) as bar:
        for item in mine:
            states[item.name] = _run_one(item, run_item, output, claims, overwrite, ranks.rank)
            bar.update(1)
            if states[item.name]["status"] == "failed":
                bar.write(f"error: {item.name} ({item.source}): {states[item.name]['error']}", file=sys.stderr)
    summary = write_summary(items, output)
    return BatchResult(states=states, summary_path=summary)


def _run_one(item, run_item, output: Path, claims: Claims, overwrite: bool, rank: int) -> dict[str, Any]:
    item_dir = output / item.name
    if not overwrite and item_is_complete(item_dir):
        return {"status": "skipped", "reason": "complete"}
    if not claims.acquire(item.name, rank):
        return {"status": "skipped", "reason": "claimed by another process"}
    try:
        state = attempt_item(item, run_item, item_dir)
    finally:
        claims.release(item.name)
    record_item(output, item, state, rank)
    return state


def attempt_item(
    item: BatchItem, run_item: Callable[[BatchItem, Path], Mapping[str, Any] | None], item_dir: Path
) -> dict[str, Any]:
    """Run one item into ``item_dir``: its state, ``done`` (with its seconds and figures) or ``failed`` (with the
    one-line error and exit code; a bug's traceback is printed). A failed item leaves no empty folder."""
    start = time.perf_counter()
    try:
        item_dir.mkdir(parents=True, exist_ok=True)
        figures = dict(run_item(item, item_dir) or {})
        state = {"status": "done", "seconds": round(time.perf_counter() - start, 3), **figures}
    except DeliveryError as err:
        state = {"status": "failed", "error": str(err), "exit_code": int(err.exit_code)}
    except Exception as err:  # a bug in one item must not lose the others; its traceback is printed
        traceback.print_exc()
        state = {"status": "failed", "error": f"{type(err).__name__}: {err}", "exit_code": int(ExitCode.FAILURE)}
    if state["status"] == "failed":
        with contextlib.suppress(OSError):
            item_dir.rmdir()  # an empty folder is not an output; never touches a folder with files in it
    return state


def record_item(output: Path, item: BatchItem, state: dict[str, Any], rank: int | str) -> None:
    """Keep ``item``'s state under ``OUTPUT/.batch/items/`` for ``batch.json`` (``rank``: who ran it)."""
    record_path = output / STATE_DIR / "items" / f"{item.name}.json"
    record_path.parent.mkdir(parents=True, exist_ok=True)
    record = {"finished": time.time(), **state, "rank": rank, "source": item.source}  # or when it ended elsewhere
    write_json_atomic(record_path, record)


def write_summary(items: Sequence[BatchItem], output: Path) -> Path:
    """Write ``batch.json`` from what is on disk, under a lock: each item complete, failed or pending."""
    output = Path(output)
    lock_path = output / STATE_DIR / "summary.lock"
    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        rows = []
        for item in items:
            record = _read_json(output / STATE_DIR / "items" / f"{item.name}.json") or {}
            complete = item_is_complete(output / item.name)
            status = "done" if complete else ("failed" if record.get("status") == "failed" else "pending")
            row = {"name": item.name, "source": item.source, "status": status}
            row |= {k: record[k] for k in ("seconds", "rank", "error", "exit_code") if k in record}
            if complete:  # an item that failed once and then completed: its old error no longer applies
                row = {k: v for k, v in row.items() if k not in ("error", "exit_code")}
            rows.append(row)
        counts = {status: sum(row["status"] == status for row in rows) for status in ("done", "failed", "pending")}
        seconds = [row["seconds"] for row in rows if row["status"] == "done" and "seconds" in row]
        summary = {
            "total": len(rows),
            **counts,
            "mean_item_seconds": round(sum(seconds) / len(seconds), 3) if seconds else None,
            "failures": [
                {k: row.get(k) for k in ("name", "source", "error", "exit_code")}
                for row in rows
                if row["status"] == "failed"
            ],
            "items": rows,
        }
        return write_json_atomic(output / SUMMARY, summary)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


@contextlib.contextmanager
def progress_bar(total: int, show: bool, ranks: Ranks) -> Iterator[Any]:
    try:
        from tqdm.auto import tqdm
    except ImportError:  # tqdm is in every delivery's lock; without it, no bar
        yield _NoBar()
        return
    desc = "items" if ranks.world_size == 1 else f"rank {ranks.rank}/{ranks.world_size} items"
    with tqdm(total=total, desc=desc, disable=not show, unit="item", file=sys.stderr) as bar:
        yield bar


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def write(self, message: str, file: Any = None) -> None:
        print(message, file=file)


def parse_devices(value: str, minimum: int = 2) -> list[str]:
    """``--devices``: device indices of one kind (``0,1,2,3`` → npu:0…; ``cuda:0,cuda:1``) or ``cpu,cpu`` for tests;
    ``minimum`` of them (a batch spawns one process per device: two at least)."""
    specs = []
    for part in (p.strip() for p in value.split(",")):
        if part.isdigit():
            part = f"npu:{part}"
        if not re.fullmatch(r"(npu|cuda):\d+|cpu", part):
            raise _usage(f"--devices {value}: {part!r} is not a device; use indices (0,1,2,3) or npu:N / cuda:N / cpu")
        specs.append(part)
    accelerators = [s for s in specs if s != "cpu"]
    if len(set(accelerators)) != len(accelerators):
        raise _usage(f"--devices {value}: a device is listed twice; one process per device")
    if len(specs) < minimum:
        raise _usage(f"--devices {value}: name at least {minimum} devices (one process each), or drop --devices")
    return specs


def spawn_ranks(devices: Sequence[str], argv: Sequence[str], devices_flag: str = "--devices") -> int:
    """Run this command once per device, as ranks 0…N-1 (``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` as torchrun sets
    them, ``--device`` the rank's device), wait for all, and return the worst exit code (9 if items failed)."""
    import subprocess

    args, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == devices_flag:
            skip = True
        elif not arg.startswith(f"{devices_flag}="):
            args.append(arg)
    world = len(devices)
    processes = []
    for rank, device in enumerate(devices):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank)}
        processes.append(subprocess.Popen([sys.executable, *args, "--device", device], env=env))
    codes = [process.wait() for process in processes]
    hard = [code for code in codes if code not in (ExitCode.OK, ExitCode.BATCH_PARTIAL)]
    return hard[0] if hard else max(codes)
