"""Jobs that outlive the server: one SQLite row per accepted request, its files in a folder beside the database.

A served request is a job (``queued`` → ``in_progress`` → ``completed`` | ``failed``) in ``<jobs>/jobs.sqlite3``
(WAL, so readers never wait on the writer). Workers take the oldest queued job with one ``UPDATE`` inside a write
transaction, so any number of workers, threads or server processes on the same folder share one FIFO queue and never
take a job twice. A claim records its host, PID and a heartbeat: a claim whose process is dead (same host) or whose
heartbeat is older than the lease (another host) is stale, and :meth:`JobStore.recover` puts its job back in the
queue, in its place, until it has been tried ``max_attempts`` times; then it fails with that reason. So an accepted
job is never lost: ``kill -9`` of the server, a restart, and the job runs again.

A job's files live in ``<jobs>/<id>/``, written with :class:`deliverykit.files.RunOutputs` (all together); its result
``job.json`` is written after them: a job whose result is there completed, even when the server died before its row
said so, and is not run again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import socket
import sqlite3
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .errors import DeliveryError, ExitCode
from .files import pid_alive, write_json_atomic

DATABASE = "jobs.sqlite3"
STATES = ("queued", "in_progress", "completed", "failed")
RESULT = "job.json"  # written last, after the job's own files: the job completed
_ID_RE = re.compile(r"^[a-z]+_[0-9a-f]{32}$")
_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    kind TEXT NOT NULL,
    status TEXT NOT NULL,
    request TEXT NOT NULL,
    created_at REAL NOT NULL,
    started_at REAL,
    completed_at REAL,
    attempts INTEGER NOT NULL DEFAULT 0,
    claimed_by TEXT,
    heartbeat_at REAL,
    error TEXT,
    result TEXT
);
CREATE INDEX IF NOT EXISTS jobs_status ON jobs (status, seq);
"""


class WorkerLost(Exception):
    """The device process behind a worker died (a Ray actor, its node): its job goes back to the queue."""


class QueueFull(DeliveryError):
    """``max_queue`` jobs already wait: the client should retry later (HTTP 429)."""

    exit_code = ExitCode.USAGE


@dataclasses.dataclass(frozen=True)
class Job:
    """One row: what was asked (``request``, JSON), where it stands and, once ended, its ``result`` or ``error``."""

    id: str
    kind: str
    status: str
    request: dict[str, Any]
    created_at: float
    started_at: float | None
    completed_at: float | None
    attempts: int
    claimed_by: str | None
    error: dict[str, Any] | None
    result: dict[str, Any] | None

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> Job:
        def loads(text: str | None) -> Any:
            return None if text is None else json.loads(text)

        return cls(
            row["id"], row["kind"], row["status"], json.loads(row["request"]), row["created_at"], row["started_at"],
            row["completed_at"], row["attempts"], row["claimed_by"], loads(row["error"]), loads(row["result"]),
        )  # fmt: skip

    @property
    def ended(self) -> bool:
        return self.status in ("completed", "failed")


@dataclasses.dataclass(frozen=True)
class Claimer:
    """Who holds a claim: host, process and worker name (``host/pid/worker``, stored in the row)."""

    host: str
    pid: int
    worker: str

    @classmethod
    def here(cls, worker: str) -> Claimer:
        return cls(socket.gethostname(), os.getpid(), worker)

    @classmethod
    def parse(cls, text: str) -> Claimer:
        host, pid, worker = text.split("/", 2)
        return cls(host, int(pid), worker)

    def __str__(self) -> str:
        return f"{self.host}/{self.pid}/{self.worker}"

    def is_dead(self) -> bool:
        """Known dead: a process of this host that is gone (another host's is judged by its heartbeat)."""
        return self.host == socket.gethostname() and not pid_alive(self.pid)


class JobStore:
    """The jobs of one ``--jobs`` folder: the database and each job's folder of files.

    Args:
        root (`Path`): the folder (created if missing).
        lease_s (`float`, *optional*, defaults to 120): a claim whose heartbeat is older is stale.
        max_attempts (`int`, *optional*, defaults to 3): runs a job gets before a stale claim fails it.
    """

    def __init__(self, root: str | os.PathLike, *, lease_s: float = 120.0, max_attempts: int = 3) -> None:
        self.root = Path(root)
        self.lease_s = lease_s
        self.max_attempts = max_attempts
        self.root.mkdir(parents=True, exist_ok=True)
        self._recovered_at = 0.0
        with self._connect() as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.executescript(_SCHEMA)

    @contextlib.contextmanager
    def _connect(self, write: bool = False) -> Iterator[sqlite3.Connection]:
        """A connection per call (threads and processes never share one); ``write``: one transaction that holds the
        database's write lock from its start, so that a read-then-update cannot interleave with another writer's."""
        db = sqlite3.connect(self.root / DATABASE, timeout=60.0, isolation_level=None)
        db.row_factory = sqlite3.Row
        db.execute("PRAGMA busy_timeout=60000")
        # WAL with NORMAL: a commit survives the server's crash (kill -9); only the host's power loss can take the
        # last ones, and it saves a disk flush per commit (several per job)
        db.execute("PRAGMA synchronous=NORMAL")
        try:
            if write:
                db.execute("BEGIN IMMEDIATE")
                try:
                    yield db
                except BaseException:
                    db.execute("ROLLBACK")
                    raise
                db.execute("COMMIT")
            else:
                yield db
        finally:
            db.close()

    def folder(self, job_id: str) -> Path:
        """Where ``job_id``'s files go (nothing else is ever written or removed by the server)."""
        if not _ID_RE.match(job_id):
            raise ValueError(f"not a job id: {job_id!r}")
        return self.root / job_id

    def submit(
        self, kind: str, request: dict[str, Any], *, max_queue: int | None = None, job_id: str | None = None
    ) -> Job:
        """Queue a job; :class:`QueueFull` when ``max_queue`` jobs already wait. ``job_id`` comes from
        :func:`new_id` when the caller stored input files in its folder first."""
        job_id = job_id or new_id(kind)
        with self._connect(write=True) as db:
            if max_queue is not None:
                (waiting,) = db.execute("SELECT COUNT(*) FROM jobs WHERE status = 'queued'").fetchone()
                if waiting >= max_queue:
                    raise QueueFull(f"{waiting} jobs are waiting (--max-queue {max_queue}); retry later")
            db.execute(
                "INSERT INTO jobs (id, kind, status, request, created_at) VALUES (?, ?, 'queued', ?, ?)",
                (job_id, kind, json.dumps(request), time.time()),
            )
        return self.get(job_id)

    def get(self, job_id: str) -> Job | None:
        with self._connect() as db:
            row = db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return None if row is None else Job.from_row(row)

    def jobs(self, kind: str, *, limit: int = 20, after: str | None = None, descending: bool = True) -> list[Job]:
        """``kind``'s jobs, newest first (``descending``), starting after job ``after``."""
        order = "DESC" if descending else "ASC"
        query, params = "SELECT * FROM jobs WHERE kind = ?", [kind]
        if after is not None:
            query += f" AND seq {'<' if descending else '>'} (SELECT seq FROM jobs WHERE id = ?)"
            params.append(after)
        with self._connect() as db:
            rows = db.execute(f"{query} ORDER BY seq {order} LIMIT ?", (*params, limit)).fetchall()
        return [Job.from_row(row) for row in rows]

    def claim(self, claimer: Claimer, kinds: tuple[str, ...]) -> Job | None:
        """The oldest queued job of ``kinds``, now ``in_progress`` under ``claimer``; None when none waits."""
        marks = ",".join("?" * len(kinds))
        with self._connect(write=True) as db:
            row = db.execute(
                f"SELECT id FROM jobs WHERE status = 'queued' AND kind IN ({marks}) ORDER BY seq LIMIT 1", kinds
            ).fetchone()
            if row is None:
                return None
            now = time.time()
            db.execute(
                "UPDATE jobs SET status = 'in_progress', started_at = ?, attempts = attempts + 1, claimed_by = ?, "
                "heartbeat_at = ? WHERE id = ?",
                (now, str(claimer), now, row["id"]),
            )
        return self.get(row["id"])

    def release(self, job_id: str, claimer: Claimer) -> None:
        """Put ``claimer``'s job back in the queue, in its place (its worker is gone; another takes it)."""
        with self._connect(write=True) as db:
            db.execute(
                "UPDATE jobs SET status = 'queued', claimed_by = NULL, heartbeat_at = NULL "
                "WHERE id = ? AND claimed_by = ? AND status = 'in_progress'",
                (job_id, str(claimer)),
            )

    def heartbeat(self, job_id: str, claimer: Claimer) -> None:
        with self._connect(write=True) as db:
            db.execute(
                "UPDATE jobs SET heartbeat_at = ? WHERE id = ? AND claimed_by = ? AND status = 'in_progress'",
                (time.time(), job_id, str(claimer)),
            )

    def complete(self, job_id: str, claimer: Claimer, result: dict[str, Any]) -> bool:
        """Mark ``job_id`` completed with ``result``, if ``claimer`` still holds it (a deleted job stays deleted)."""
        return self._end(job_id, claimer, "completed", result=result)

    def fail(self, job_id: str, claimer: Claimer, message: str, code: str) -> bool:
        return self._end(job_id, claimer, "failed", error={"message": message, "code": code})

    def _end(self, job_id: str, claimer: Claimer | None, status: str, **fields: Any) -> bool:
        sets = ", ".join(f"{name} = ?" for name in fields)
        values = [json.dumps(value) for value in fields.values()]
        query = f"UPDATE jobs SET status = ?, completed_at = ?, {sets} WHERE id = ? AND status = 'in_progress'"
        params: list[Any] = [status, time.time(), *values, job_id]
        if claimer is not None:
            query += " AND claimed_by = ?"
            params.append(str(claimer))
        with self._connect(write=True) as db:
            return db.execute(query, params).rowcount == 1

    def recover(self, every_s: float = 0.0) -> list[str]:
        """Requeue (or, after ``max_attempts`` runs, fail) the in-progress jobs whose claim is stale; their ids.
        ``every_s``: do nothing if this store looked less than that long ago (a worker looks before each claim)."""
        if time.monotonic() - self._recovered_at < every_s:
            return []
        self._recovered_at = time.monotonic()
        stale_before = time.time() - self.lease_s
        recovered = []
        with self._connect(write=True) as db:
            rows = db.execute("SELECT id, attempts, claimed_by, heartbeat_at FROM jobs WHERE status = 'in_progress'")
            for row in rows.fetchall():
                claimer = Claimer.parse(row["claimed_by"])
                if not (claimer.is_dead() or (row["heartbeat_at"] or 0) < stale_before):
                    continue
                recovered.append(row["id"])
                if row["attempts"] < self.max_attempts:
                    db.execute(
                        "UPDATE jobs SET status = 'queued', claimed_by = NULL, heartbeat_at = NULL WHERE id = ?",
                        (row["id"],),
                    )
                    continue
                error = {
                    "code": "server_died",
                    "message": f"the server stopped during this job {row['attempts']} times (last: {claimer}); "
                    "it is not tried again: check the server log, then submit it anew",
                }
                db.execute(
                    "UPDATE jobs SET status = 'failed', completed_at = ?, error = ? WHERE id = ?",
                    (time.time(), json.dumps(error), row["id"]),
                )
        return recovered

    def delete(self, job_id: str) -> Job | None:
        """Remove an ended or queued job and its folder; None when there is no such job. A running job is left."""
        with self._connect(write=True) as db:
            row = db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
            if row is None or row["status"] == "in_progress":
                return None if row is None else Job.from_row(row)
            db.execute("DELETE FROM jobs WHERE id = ?", (job_id,))
        shutil.rmtree(self.folder(job_id), ignore_errors=True)
        return Job.from_row(row)

    def counts(self) -> dict[str, int]:
        """Jobs by state (every state present, 0 when none)."""
        with self._connect() as db:
            rows = db.execute("SELECT status, COUNT(*) AS n FROM jobs GROUP BY status").fetchall()
        return {state: 0 for state in STATES} | {row["status"]: row["n"] for row in rows}

    def mean_run_s(self, recent: int = 20) -> float | None:
        """Mean run time of the last ``recent`` completed jobs (what ``Retry-After`` estimates from)."""
        with self._connect() as db:
            (mean,) = db.execute(
                "SELECT AVG(completed_at - started_at) FROM (SELECT * FROM jobs WHERE status = 'completed' "
                "ORDER BY seq DESC LIMIT ?)",
                (recent,),
            ).fetchone()
        return mean

    def is_written(self, job_id: str) -> bool:
        """Whether the job's files were committed and its result written after them."""
        return (self.folder(job_id) / RESULT).is_file()

    def write_result(self, job_id: str, result: dict[str, Any]) -> None:
        write_json_atomic(self.folder(job_id) / RESULT, result)

    def read_result(self, job_id: str) -> dict[str, Any]:
        return json.loads((self.folder(job_id) / RESULT).read_text(encoding="utf-8"))


def new_id(kind: str) -> str:
    """``<kind>_<32 hex>``: unguessable, and safe as a folder name."""
    return f"{kind}_{uuid.uuid4().hex}"
