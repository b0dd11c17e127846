"""HTTP serving: what every delivery's ``serve.py`` shares, in the shape Ascend users already call (OpenAI's images
and videos contracts, as sglang-diffusion and vLLM-Omni serve them).

A delivery describes itself as a :class:`Service` (its model id, how one device's session loads, how one job runs and
writes its files, and its routes); :func:`serve` does the rest:

- start-up as ``inference.py``'s: the same checks, ``error:`` lines and exit codes, one session loaded per
  ``--devices`` entry before the port opens (a port in use is exit 6);
- every accepted request is a job in :class:`deliverykit.jobs.JobStore` under ``--jobs`` (SQLite), run by one
  worker thread per device from one FIFO queue shared by every server on that folder, its files committed together;
- ``GET /health`` (alive), ``/ready`` (loaded and not stopping), ``/metrics`` (Prometheus text), ``/v1/models``;
- errors in OpenAI's shape ``{"error": {"message", "type", "param", "code"}}`` with the CLI's message text: 400 bad
  input, 401 without the ``--api-key-env`` key (on every path but :data:`PUBLIC_PATHS`), 404 unknown job, 413 over
  ``--max-body-mb``, 429 with ``Retry-After`` when ``--max-queue`` jobs wait;
- ``--ray ADDRESS``: no model in this process; the sessions are Ray actors, one per device of the cluster
  (:mod:`deliverykit.cluster`), each fed its jobs by one of this server's workers;
- SIGTERM (or Ctrl-C): stop accepting, let each worker finish its running job, exit 0; queued jobs wait in the
  database for the next start.

FastAPI, uvicorn and prometheus-client are imported with this module (pinned in each delivery's
``requirements-app.txt``): a ``serve.py`` imports it once its flags (:func:`deliverykit.cli.add_server_args`) are
checked.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import contextlib
import dataclasses
import hmac
import json
import logging
import os
import re
import signal
import socket
import sqlite3
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse

from .errors import DeliveryError, ExitCode, OutputError
from .files import Outputs
from .jobs import DATABASE, Claimer, Job, JobStore, QueueFull, WorkerLost, new_id

logger = logging.getLogger(__name__)
T = TypeVar("T")

STAGE_BUCKETS_S = (0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600)
IDLE_POLL_S = 0.25  # a worker with nothing to do looks at the shared queue this often (other servers add jobs)
PUBLIC_PATHS = ("/health", "/ready", "/metrics")  # what a load balancer or Prometheus reads without the key
HTTP_STATUS = {ExitCode.USAGE: 400, ExitCode.INPUT: 400, ExitCode.NUMERICS: 500, ExitCode.OUTPUT: 507}
ERROR_TYPE = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    409: "conflict_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    503: "server_error",
}


class ApiError(Exception):
    """An HTTP error answered in OpenAI's shape."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        kind = ERROR_TYPE.get(self.status, "server_error")
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


@dataclasses.dataclass(frozen=True)
class Service:
    """What a delivery serves.

    Args:
        model_id (`str`): the model's id in ``/v1/models`` and in the job objects.
        kinds (`tuple[str, ...]`): the job kinds its workers run (the prefix of their ids: ``video``, ``img``).
        load (`Callable[[str | None, contextlib.ExitStack], Any]`): one device's session (inference.py's loading).
        run (`Callable[[Any, Job, Path], dict]`): run ``job`` on a session and commit its files into the folder;
            returns the job's result (``stages_s``: seconds per stage, for ``/metrics``).
        routes (`Callable[[Api], None]`): adds the delivery's endpoints to ``api.app``.
        defaults (`Callable[[Any], Any]`, *optional*): what the routes need of a loaded session (``api.defaults``),
            picklable: under ``--ray`` the server holds no session and asks an actor.
    """

    model_id: str
    kinds: tuple[str, ...]
    load: Callable[[str | None, contextlib.ExitStack], Any]
    run: Callable[[Any, Job, Path], dict[str, Any]]
    routes: Callable[[Api], None]
    defaults: Callable[[Any], Any] | None = None


class Workers:
    """One thread per loaded session, each taking the oldest queued job, running it and recording how it ended."""

    def __init__(self, store: JobStore, service: Service, sessions: list[Any], metrics: Metrics) -> None:
        self.store, self.service, self.sessions, self.metrics = store, service, sessions, metrics
        self.draining = threading.Event()  # finish the running job, take no other
        self.wake = threading.Event()  # a job was queued here (other servers' jobs are seen by polling)
        self.listeners: list[Callable[[str], None]] = []  # told of each job this server ended, from its thread
        self.threads = [
            threading.Thread(target=self._loop, args=(session, f"worker{i}"), name=f"job-worker{i}", daemon=True)
            for i, session in enumerate(sessions)
        ]

    def start(self) -> None:
        self.store.recover()
        for thread in self.threads:
            thread.start()

    def stop(self) -> None:
        """Take no new job; wait for the running ones to finish and be recorded."""
        self.draining.set()
        self.wake.set()
        for thread in self.threads:
            if thread.ident is not None:  # started
                thread.join()

    def alive(self) -> int:
        """Workers still taking jobs (one whose Ray actor died has stopped)."""
        return sum(thread.is_alive() for thread in self.threads)

    def _loop(self, session: Any, name: str) -> None:
        claimer = Claimer.here(name)
        while not self.draining.is_set():
            try:
                self.store.recover(every_s=IDLE_POLL_S)
                job = self.store.claim(claimer, self.service.kinds)
            except sqlite3.Error as err:  # a database that stays locked or a full disk: try again, keep serving
                logger.warning("worker %s cannot reach the job database (%s); retrying", name, err)
                self.draining.wait(IDLE_POLL_S)
                continue
            if job is None:
                self.wake.wait(IDLE_POLL_S)
                self.wake.clear()
                continue
            try:
                self._run(session, job, claimer)
            except WorkerLost as err:  # its Ray actor died: the job waits for another worker, this one stops
                logger.warning("worker %s lost its actor (%s); job %s requeued", name, err, job.id)
                self.store.release(job.id, claimer)
                return

    def _run(self, session: Any, job: Job, claimer: Claimer) -> None:
        folder = self.store.folder(job.id)
        folder.mkdir(exist_ok=True)
        beat = threading.Event()
        heart = threading.Thread(target=self._beat, args=(job.id, claimer, beat), daemon=True)
        heart.start()
        try:
            if self.store.is_written(job.id):  # committed before the server died, not yet recorded
                result = self.store.read_result(job.id)
            else:
                result = self.service.run(session, job, folder)
                self.store.write_result(job.id, result)
        except WorkerLost:
            raise
        except DeliveryError as err:
            self.store.fail(job.id, claimer, str(err), err.exit_code.name.lower())
        except Exception as err:
            logger.exception("job %s failed", job.id)
            self.store.fail(job.id, claimer, f"internal error ({type(err).__name__}); see the server log", "internal")
        else:
            self.metrics.observe(result.get("stages_s", {}))
            self.store.complete(job.id, claimer, result)
        finally:
            beat.set()
            heart.join()
            for listener in self.listeners:
                listener(job.id)

    def _beat(self, job_id: str, claimer: Claimer, done: threading.Event) -> None:
        while not done.wait(self.store.lease_s / 4):
            self.store.heartbeat(job_id, claimer)


class Metrics:
    """``/metrics``: the queue and jobs by state (read from the database at each scrape, so they count every server
    on the folder), seconds per stage of this server's jobs, device and host memory."""

    def __init__(self, store: JobStore, devices: list[Any]) -> None:
        from prometheus_client import CollectorRegistry, Histogram

        self.store, self.devices = store, devices
        self.registry = CollectorRegistry()
        self.stages = Histogram(
            "delivery_stage_seconds",
            "Seconds per stage of the jobs this server ran",
            ["stage"],
            registry=self.registry,
            buckets=STAGE_BUCKETS_S,
        )
        self.registry.register(self)

    def observe(self, stages_s: dict[str, float]) -> None:
        for stage, seconds in stages_s.items():
            self.stages.labels(stage).observe(seconds)

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily

        from . import device as devices
        from .report import peak_host_rss_mb

        counts = self.store.counts()
        yield GaugeMetricFamily("delivery_queue_depth", "Jobs waiting in the queue", value=counts["queued"])
        jobs = GaugeMetricFamily("delivery_jobs", "Jobs in the database by state", labels=["state"])
        for state, count in counts.items():
            jobs.add_metric([state], count)
        yield jobs
        memory = GaugeMetricFamily("delivery_device_memory_bytes", "Device memory", labels=["device", "kind"])
        for device in self.devices:
            backend = devices.backend(device)
            peak, info = backend.max_memory_allocated(), backend.memory_info()
            if peak is not None:
                memory.add_metric([str(device), "peak_allocated"], peak)
            if info is not None:
                memory.add_metric([str(device), "used"], info[1] - info[0])
                memory.add_metric([str(device), "total"], info[1])
        yield memory
        yield GaugeMetricFamily(
            "delivery_host_peak_resident_bytes",
            "Peak resident memory of this server process",
            value=peak_host_rss_mb() * 2**20,
        )


class Api:
    """The FastAPI app of one server, and what a delivery's routes use: submit a job with its input files, wait for
    it, look one up (404), answer its files."""

    def __init__(
        self, service: Service, store: JobStore, args: argparse.Namespace, workers: Any, defaults: Any
    ) -> None:
        self.service, self.store, self.args, self.workers, self.defaults = service, store, args, workers, defaults
        self.app = FastAPI(title=service.model_id, docs_url=None, redoc_url=None, openapi_url=None)
        self.key = os.environ.get(args.api_key_env) if args.api_key_env else None
        self.loop: asyncio.AbstractEventLoop | None = None  # set by the first wait
        self.waiting: dict[str, asyncio.Event] = {}  # job id → the event its synchronous request awaits
        workers.listeners.append(self._ended)
        self._install()
        service.routes(self)

    def _install(self) -> None:
        from fastapi.exceptions import RequestValidationError
        from starlette.exceptions import HTTPException

        app = self.app

        @app.exception_handler(ApiError)
        async def api_error(request: Request, err: ApiError) -> JSONResponse:
            return JSONResponse(err.body(), status_code=err.status, headers=err.headers)

        @app.exception_handler(DeliveryError)
        async def delivery_error(request: Request, err: DeliveryError) -> JSONResponse:
            return await api_error(request, as_api_error(err))

        @app.exception_handler(HTTPException)
        async def http_error(request: Request, err: HTTPException) -> JSONResponse:
            return await api_error(request, ApiError(err.status_code, str(err.detail)))

        @app.exception_handler(RequestValidationError)
        async def validation_error(request: Request, err: RequestValidationError) -> JSONResponse:
            first = err.errors()[0] if err.errors() else {}
            param = ".".join(str(part) for part in first.get("loc", ())[1:]) or None
            return await api_error(request, ApiError(400, f"{param}: {first.get('msg', 'invalid')}", param=param))

        @app.middleware("http")
        async def authenticate(request: Request, call_next: Callable) -> Any:
            guarded = request.url.path not in PUBLIC_PATHS
            given = request.headers.get("authorization", "").encode()
            if guarded and self.key is not None and not hmac.compare_digest(given, f"Bearer {self.key}".encode()):
                message = "missing or wrong API key: send 'Authorization: Bearer <key>'"
                err = ApiError(401, message, code="invalid_api_key")
                return await api_error(request, err)
            return await call_next(request)

        app.add_middleware(BodyLimit, limit_mb=self.args.max_body_mb)

        @app.get("/health")
        async def health() -> dict[str, str]:
            return {"status": "ok"}

        @app.get("/ready")
        async def ready() -> JSONResponse:
            alive = self.workers.alive()
            ok = alive > 0 and not self.workers.draining.is_set()
            status = "ready" if ok else "stopping" if self.workers.draining.is_set() else "no worker left"
            body = {"status": status, "workers": alive}
            return JSONResponse(body, status_code=200 if ok else 503)

        @app.get("/metrics")
        async def metrics() -> PlainTextResponse:
            from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

            return PlainTextResponse(generate_latest(self.workers.metrics.registry), media_type=CONTENT_TYPE_LATEST)

        @app.get("/v1/models")
        async def models() -> dict[str, Any]:
            model = {"id": self.service.model_id, "object": "model", "created": 0, "owned_by": "deliverykit"}
            return {"object": "list", "data": [model]}

    def submit(self, kind: str, request: dict[str, Any], inputs: dict[str, bytes] | None = None) -> Job:
        """Queue a job; ``inputs``: files written into its folder first (an accepted job has all it needs)."""
        job_id = new_id(kind)
        folder = self.store.folder(job_id)
        if inputs:
            folder.mkdir()
            for name, data in inputs.items():
                (folder / name).write_bytes(data)
        try:
            job = self.store.submit(kind, request, max_queue=self.args.max_queue, job_id=job_id)
        except QueueFull as err:
            if inputs:
                for name in inputs:
                    (folder / name).unlink()
                folder.rmdir()
            raise ApiError(429, str(err), code="queue_full", headers={"Retry-After": str(self.retry_after())}) from None
        self.workers.wake.set()
        return job

    def retry_after(self) -> int:
        """Seconds until a place in the queue is likely free: the queue's share of one worker's recent run time."""
        mean = self.store.mean_run_s() or 1.0
        return max(1, round(mean * self.args.max_queue / max(1, self.workers.alive())))

    async def wait(self, job_id: str) -> Job:
        """The job once ended (a synchronous endpoint's answer); 503 when the server stops before it started. Woken
        when this server's worker ends it; a job that another server on the folder runs is looked up each second."""
        self.loop = asyncio.get_running_loop()
        ended = self.waiting.setdefault(job_id, asyncio.Event())
        try:
            while True:
                job = self.store.get(job_id)
                if job is None:
                    raise ApiError(404, f"job {job_id} was deleted while it ran")
                if job.ended:
                    return job
                if self.workers.draining.is_set() and job.status == "queued":
                    raise ApiError(503, f"the server is stopping; job {job_id} stays queued and runs after a restart")
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(ended.wait(), timeout=1.0)
        finally:
            self.waiting.pop(job_id, None)

    def _ended(self, job_id: str) -> None:
        """From a worker thread: wake the request waiting for ``job_id``, if any."""
        event, loop = self.waiting.get(job_id), self.loop
        if event is not None and loop is not None:
            loop.call_soon_threadsafe(event.set)

    @staticmethod
    def failure(job: Job) -> ApiError:
        """A failed job as a synchronous endpoint answers it: 400 for what the request asked wrong, else 500."""
        status = 400 if job.error["code"] in ("usage", "input") else 500
        return ApiError(status, job.error["message"], code=job.error["code"])

    def job(self, job_id: str, kind: str) -> Job:
        """``job_id`` of ``kind``, or 404 in OpenAI's shape."""
        job = self.store.get(job_id) if job_id.startswith(f"{kind}_") else None
        if job is None:
            raise ApiError(404, f"no {kind} job {job_id!r}; list them with GET", param="id", code="not_found")
        return job

    def file(self, job: Job, name: str, media_type: str) -> Any:
        """A completed job's file (409 before it completes: nothing partial is ever served)."""
        if job.status != "completed":
            raise ApiError(
                409, f"job {job.id} is {job.status}; its files exist once it is completed", code="not_completed"
            )
        return FileResponse(self.store.folder(job.id) / name, media_type=media_type)


@dataclasses.dataclass(frozen=True)
class JobRoutes:
    """An asynchronous job resource in the shape of OpenAI's videos API, for any kind of job: ``POST {path}`` →
    the job object (``queued``), ``GET {path}`` (list, newest first; ``after``, ``limit``, ``order``),
    ``GET {path}/{id}``, ``DELETE {path}/{id}``, ``GET {path}/{id}/content?variant=``.

    Args:
        path (`str`): ``/v1/videos``.
        kind (`str`): the job kind and the id prefix (``video``); the object's ``object`` field is ``kind``.
        accept (`Callable[[dict, dict], tuple[dict, dict]]`): ``(fields, files)`` of a body → ``(request, inputs)``:
            what the job stores and the input files written into its folder; raises :class:`ApiError` or a
            :class:`DeliveryError` (a 400 with its message) for what the CLI would refuse.
        describe (`Callable[[Job], dict]`): the object's fields of this kind (``size``, ``seconds``, ``prompt``).
        variants (`dict[str, tuple[str, str]]`): ``variant`` → (file in the job's folder, media type); the first
            is the default.
    """

    path: str
    kind: str
    accept: Callable[[dict[str, Any], dict[str, bytes]], tuple[dict[str, Any], dict[str, bytes]]]
    describe: Callable[[Job], dict[str, Any]]
    variants: dict[str, tuple[str, str]]

    def add_to(self, api: Api) -> None:

        app, kind = api.app, self.kind

        async def create(request: Request) -> dict[str, Any]:
            fields, files = await read_body(request)
            with bad_input():
                stored, inputs = self.accept(fields, files)
            return self.object(api.submit(kind, stored, inputs), api)

        async def listed(after: str | None = None, limit: int = 20, order: str = "desc") -> dict[str, Any]:
            if order not in ("asc", "desc") or not 1 <= limit <= 100:
                raise ApiError(400, "order is asc or desc, limit 1-100", param="order" if limit else "limit")
            jobs = api.store.jobs(kind, limit=limit + 1, after=after, descending=order == "desc")
            data = [self.object(job, api) for job in jobs[:limit]]
            first, last = (data[0]["id"], data[-1]["id"]) if data else (None, None)
            return {"object": "list", "data": data, "first_id": first, "last_id": last, "has_more": len(jobs) > limit}

        async def retrieve(job_id: str) -> dict[str, Any]:
            return self.object(api.job(job_id, kind), api)

        async def delete(job_id: str) -> dict[str, Any]:
            job = api.store.delete(api.job(job_id, kind).id)
            if job is None:
                raise ApiError(404, f"no {kind} job {job_id!r}", param="id", code="not_found")
            if job.status == "in_progress":
                raise ApiError(409, f"job {job_id} is running; delete it once it has ended", code="job_running")
            return {"id": job_id, "object": f"{kind}.deleted", "deleted": True}

        async def content(job_id: str, variant: str | None = None) -> Any:
            job = api.job(job_id, kind)
            variant = variant or next(iter(self.variants))
            if variant not in self.variants:
                raise ApiError(400, f"variant {variant!r}: one of {', '.join(self.variants)}", param="variant")
            name, media_type = self.variants[variant]
            return api.file(job, name, media_type)

        app.add_api_route(self.path, create, methods=["POST"])
        app.add_api_route(self.path, listed, methods=["GET"])
        app.add_api_route(self.path + "/{job_id}", retrieve, methods=["GET"])
        app.add_api_route(self.path + "/{job_id}", delete, methods=["DELETE"])
        app.add_api_route(self.path + "/{job_id}/content", content, methods=["GET"])

    def object(self, job: Job, api: Api) -> dict[str, Any]:
        """The job as OpenAI's clients read a video: id, object, status, progress, times, model, error."""
        return {
            "id": job.id,
            "object": self.kind,
            "status": job.status,
            "progress": 100 if job.status == "completed" else 0,
            "created_at": int(job.created_at),
            "completed_at": None if job.completed_at is None else int(job.completed_at),
            "model": api.service.model_id,
            "error": job.error,
            **self.describe(job),
        }


@contextlib.contextmanager
def bad_input(param: str | None = None) -> Iterator[None]:
    """A request the CLI would refuse (its :class:`DeliveryError`, with the same message) is a 400 here."""
    try:
        yield
    except ApiError:
        raise
    except DeliveryError as err:
        raise ApiError(400, str(err), param=param, code="invalid_request") from None


def as_api_error(err: DeliveryError) -> ApiError:
    if isinstance(err, ApiError):
        return err
    status = HTTP_STATUS.get(err.exit_code, 500)
    return ApiError(status, str(err), code=err.exit_code.name.lower())


class BodyLimit:
    """413 for a request body over the limit: by its Content-Length before reading it; a body without one (chunked)
    is read here up to the limit, then handed on."""

    def __init__(self, app: Any, limit_mb: float) -> None:
        self.app, self.limit_mb, self.limit = app, limit_mb, int(limit_mb * 2**20)

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None:
            if length.isdigit() and int(length) > self.limit:
                return await self._refuse(send)
            return await self.app(scope, receive, send)
        chunks, seen = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return None  # the client went away
            seen += len(message.get("body", b""))
            if seen > self.limit:
                return await self._refuse(send)
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        replay = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

        async def replayed() -> dict:
            return replay.pop() if replay else await receive()

        return await self.app(scope, replayed, send)

    async def _refuse(self, send: Callable) -> None:
        message = f"the request body is over {self.limit_mb:g} MB (--max-body-mb); send a smaller file"
        body = json.dumps(ApiError(413, message, code="body_too_large").body()).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def listen(host: str, port: int) -> socket.socket:
    """The server's socket, bound now: a port in use is one error line (exit 6) before any request."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        raise OutputError(f"cannot listen on {host}:{port} ({err.strerror}); pass another --port") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def serve(
    service: Service,
    args: argparse.Namespace,
    *,
    stack: contextlib.ExitStack,
    devices: list[str | None] | None = None,
    origin: tuple[str, list[str] | None] | None = None,
) -> int:
    """Load one session per device (with ``--ray``, one per device of the cluster, in Ray actors), then serve until
    SIGTERM / Ctrl-C; print ``URL=...`` once listening. ``devices``: one entry per local worker
    (:func:`deliverykit.cli.server_devices`; default ``--device``); ``origin``: the ``serve.py`` and its argv (None:
    the command line's), from which ``--ray``'s actors build the same service (its ``parse_args`` and
    ``build_service``)."""
    import uvicorn

    from .device import resolve_device

    jobs = Outputs()
    jobs.add(Path(args.jobs) / DATABASE, "--jobs")
    jobs.check()  # exit 6 now, before loading, and nothing created until the sessions have loaded
    if args.ray:  # the sessions are the cluster's actors; jobs and files stay here
        import ray

        from . import cluster

        script, argv = origin
        spec = cluster.WorkerSpec.here(script, sys.argv[1:] if argv is None else argv)
        sessions, defaults = cluster.start_sessions(spec, args.ray, args.device)
        stack.callback(ray.shutdown)
        devices = []
        runner = dataclasses.replace(service, run=cluster.run_on_actor)
    else:
        specs = devices or [args.device]
        for spec in specs:
            resolve_device(spec)  # exit 5 before any loading
        sessions = [service.load(spec, stack) for spec in specs]
        defaults = service.defaults(sessions[0]) if service.defaults else None
        devices = [getattr(session, "device", None) for session in sessions]
        runner = service
    store = JobStore(args.jobs)
    workers = Workers(store, runner, sessions, Metrics(store, devices))
    api = Api(service, store, args, workers, defaults)
    sock = listen(args.host, args.port)
    config = uvicorn.Config(api.app, log_level="warning", timeout_graceful_shutdown=None, lifespan="off")
    server = _Server(config, workers)
    workers.start()
    previous = {sig: signal.signal(sig, _absorb) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        server.run(sockets=[sock])
    finally:
        workers.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        sock.close()
    print("stopped: every running job finished", flush=True)
    return int(ExitCode.OK)


def _absorb(sig: int, frame: Any) -> None:
    """uvicorn re-raises the signal it stopped on after its shutdown: the server has already stopped cleanly."""


class _Server:
    """uvicorn's server, printing ``URL=`` once listening and telling the workers to drain when a signal arrives."""

    def __new__(cls, config: Any, workers: Any) -> Any:
        import uvicorn

        class Server(uvicorn.Server):
            async def startup(self, sockets: list[socket.socket] | None = None) -> None:
                await super().startup(sockets=sockets)
                host, port = sockets[0].getsockname()[:2]
                shown = f"[{host}]" if ":" in host else host
                print(f"URL=http://{shown}:{port}/", flush=True)

            def handle_exit(self, sig: int, frame: Any) -> None:
                workers.draining.set()
                super().handle_exit(sig, frame)

        return Server(config)


def form_value(fields: dict[str, Any], name: str, kind: type, default: Any = None) -> Any:
    """A body field as ``kind`` (multipart sends text; JSON numbers and strings both accepted); 400 naming it."""
    value = fields.get(name)
    if value is None or value == "":
        return default
    try:
        if kind is int and isinstance(value, float) and not value.is_integer():
            raise ValueError
        if kind is bool and isinstance(value, str):
            return {"true": True, "false": False, "1": True, "0": False}[value.lower()]
        return kind(value)
    except (ValueError, TypeError, KeyError):
        raise ApiError(400, f"{name} must be {kind.__name__}, got {value!r}", param=name) from None


async def read_body(request: Any) -> tuple[dict[str, Any], dict[str, bytes]]:
    """A JSON or multipart (form) body: ``(fields, uploaded files by field)``; 400 for anything else.

    A form sends a list as repeated ``name[]`` fields (the ``openai`` client's encoding of a list in ``extra_body``):
    they come back as one list under ``name``, as a JSON body gives it. A text field may be as large as the body
    (``--max-body-mb`` bounds that), not Starlette's default cap per part: an image sent inline as a data URL.
    """
    content_type = request.headers.get("content-type", "")
    if content_type.startswith("multipart/form-data") or content_type.startswith("application/x-www-form"):
        form = await request.form(max_part_size=sys.maxsize)
        fields: dict[str, Any] = {}
        files: dict[str, bytes] = {}
        for key, value in form.multi_items():
            if hasattr(value, "read"):
                files[key] = await value.read()
            else:
                _add_form_field(fields, key, value)
        return fields, files
    try:
        body = json.loads(await request.body() or b"{}")
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ApiError(400, "the body is not JSON; send application/json or multipart/form-data") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object")
    return body, {}


def _add_form_field(fields: dict[str, Any], key: str, value: str) -> None:
    """``name[]`` appends to the list ``fields[name]``, any other key sets its value; 400 for a name sent both ways."""
    name = key.removesuffix("[]")
    listed = name != key
    if name in fields and isinstance(fields[name], list) != listed:
        raise ApiError(400, f"{name} is sent both as one field and as a list ({name}[]): send one of them", param=name)
    if listed:
        fields.setdefault(name, []).append(value)
    else:
        fields[name] = value


def base64_bytes(text: str, field: str, *, data_url: str | None = None, param: str | None = None) -> bytes:
    """The bytes of a file sent as text: a ``data:...;base64,`` URL, or bare base64 unless ``data_url`` (the form to
    name, e.g. ``data:audio/wav;base64,...``) asks for the URL (a path there would be a file to open: the server opens
    none a client names); whitespace is ignored. Otherwise a 400 naming ``field`` (the body's ``param``)."""
    param = param or field
    if text.startswith("data:"):
        header, _, text = text.partition(",")
        if not header.endswith(";base64"):
            raise ApiError(400, f"{field}: send the data URL base64-encoded ({header};base64,...)", param=param)
    elif data_url is not None:
        raise ApiError(
            400, f"{field}: send the file inline as {data_url}; the server opens no file by name", param=param
        )
    try:
        return base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError):
        raise ApiError(400, f"{field} is not base64: send the file's bytes base64-encoded", param=param) from None


def read_upload(data: bytes, field: str, read: Callable[[Path], T]) -> T:
    """An uploaded file read by the CLI's own reader (``read(path)``: its checks, a decompression bomb refused): what
    it refuses is a 400 with its message, naming the body's field instead of the scratch file."""
    with tempfile.TemporaryDirectory(prefix="deliverykit-upload-") as folder:
        path = Path(folder) / field
        path.write_bytes(data)
        try:
            return read(path)
        except DeliveryError as err:
            message = re.sub(rf"--\w[\w-]* {re.escape(str(path))}", field, str(err)).replace(str(path), field)
            raise ApiError(400, message, param=field, code="invalid_request") from None


def parse_size(size: str | None, param: str = "size") -> tuple[int, int] | None:
    """``"WxH"`` → ``(width, height)``; 400 naming the field otherwise."""
    if size is None:
        return None
    parts = str(size).lower().split("x")
    if len(parts) != 2 or not all(part.isdigit() for part in parts):
        raise ApiError(400, f"size {size!r}: write it as WIDTHxHEIGHT, e.g. 512x512", param=param)
    width, height = (int(part) for part in parts)
    return width, height
