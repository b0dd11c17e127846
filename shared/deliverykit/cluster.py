"""Batch runs beyond one host: ``--batch FILE --ray ADDRESS`` spreads the requests over the devices of a Ray cluster.

One actor per device of the cluster (``resources={"NPU": 1}`` on Ascend, one GPU on CUDA, one CPU otherwise), each
holding one loaded session: it imports the delivery's ``inference.py`` (the same path on every host: the same image)
and calls its ``batch_worker(argv, device, stack)``, the loading and per-item code the single-host ``--batch`` runs.
The driver loads no model: it checks the batch whole, as ever, then hands each actor the next request not yet done.

Outputs: ``--ray-outputs shared`` (default) has each actor commit its item into ``OUTPUT/<name>/`` itself (``OUTPUT``
on storage every host sees); ``driver`` has the actor make the item in a scratch folder and return its files through
the object store, and the driver commits them. Either way an item's files appear together, and an item already
complete is never made again: a rerun resumes, and of two runs of one item the first commit wins.

An actor that dies (its process, or its node) loses only the request it held: that request goes to another actor,
up to ``--retries`` more times, then is recorded as failed. ``batch.json`` and exit code 9 are as on one host.

``serve.py --ray ADDRESS`` uses the same actors for the HTTP API (:class:`SessionActor`, :func:`run_on_actor`): the
server keeps its job database and files, and each of its worker threads hands one actor its jobs.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import os
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .batch import (
    BatchItem,
    BatchResult,
    attempt_item,
    item_is_complete,
    record_item,
    write_summary,
)
from .errors import DeliveryError, ExitCode
from .files import Outputs
from .imports import load_script
from .jobs import WorkerLost

logger = logging.getLogger(__name__)

OUTPUT_MODES = ("shared", "driver")
RESOURCE_NAMES = {"npu": "NPU", "cuda": "GPU", "cpu": "CPU"}  # Ray's names for one device of each kind


ENV_PREFIXES = ("HF_", "ASCEND_", "DELIVERY", "DELIVERYKIT_", "PYTORCH_NPU_", "HCCL_")  # passed on to the actors


@dataclasses.dataclass(frozen=True)
class WorkerSpec:
    """What an actor builds its worker from: the delivery's ``inference.py``, the command line it was given, and the
    driver's folder and environment (its ``*_SRC`` checkouts, Hugging Face and Ascend settings), so that relative
    paths and variables mean on every host what they mean here (the same image, the same paths)."""

    script: str
    argv: tuple[str, ...]
    cwd: str
    env: tuple[tuple[str, str], ...]

    @classmethod
    def here(cls, script: str, argv: list[str]) -> WorkerSpec:
        env = tuple((k, v) for k, v in os.environ.items() if k.startswith(ENV_PREFIXES) or k.endswith("_SRC"))
        return cls(str(Path(script).resolve()), tuple(argv), os.getcwd(), env)


def device_kind(device_spec: str | None, resources: dict[str, float]) -> str:
    """``npu``, ``cuda`` or ``cpu``: the ``--device`` kind, or (auto) the first the cluster has."""
    if device_spec and device_spec != "auto":
        return device_spec.split(":")[0]
    return next(kind for kind in ("npu", "cuda", "cpu") if resources.get(RESOURCE_NAMES[kind], 0) >= 1)


def actor_options(kind: str) -> dict[str, Any]:
    """One device of ``kind`` per actor (Ray sets the actor's visible devices, so it uses ``<kind>:0``)."""
    if kind == "npu":
        return {"resources": {"NPU": 1}, "num_cpus": 1}
    if kind == "cuda":
        return {"num_gpus": 1, "num_cpus": 1}
    return {"num_cpus": 1}


class ItemRunner:
    """The actor: one loaded session of the delivery, running one request at a time."""

    def __init__(self, spec: WorkerSpec, kind: str) -> None:
        self.stack = contextlib.ExitStack()
        if Path(spec.cwd).is_dir():
            os.chdir(spec.cwd)
        os.environ.update(dict(spec.env))
        module = _script(spec)
        device = "cpu" if kind == "cpu" else f"{kind}:0"
        self.run_item = module.batch_worker(list(spec.argv), device, self.stack)

    def run(self, item: BatchItem, output: str | None) -> dict[str, Any]:
        """``item`` into ``output/<name>`` (shared storage), or into a scratch folder whose files are returned."""
        where = {"pid": os.getpid(), "host": _node_id()}
        if output is not None:
            item_dir = Path(output) / item.name
            if item_is_complete(item_dir):  # made by an earlier attempt that was taken for dead: first one wins
                return {"state": {"status": "done", "seconds": 0.0}, "files": None, **where}
            return {"state": _finished(attempt_item(item, self.run_item, item_dir)), "files": None, **where}
        with tempfile.TemporaryDirectory(prefix="deliverykit-ray-") as scratch:
            item_dir = Path(scratch) / item.name
            state = _finished(attempt_item(item, self.run_item, item_dir))
            files = None
            if state["status"] == "done":
                files = {str(p.relative_to(item_dir)): p.read_bytes() for p in item_dir.rglob("*") if p.is_file()}
        return {"state": state, "files": files, **where}


def run_batch_on_ray(
    items: list[BatchItem],
    spec: WorkerSpec,
    output: str | os.PathLike,
    *,
    address: str,
    device_spec: str | None = None,
    overwrite: bool = False,
    retries: int = 2,
    outputs: str = "shared",
) -> BatchResult:
    """Make every item not yet complete on the actors of the cluster at ``address`` (``auto``: the running one)."""
    output = Path(output).resolve()
    todo = [item for item in items if overwrite or not item_is_complete(output / item.name)]
    if not todo:  # a rerun of a finished batch: no model to load anywhere
        return BatchResult(states={}, summary_path=write_summary(items, output))
    ray = connect(address)
    try:
        kind = device_kind(device_spec, ray.cluster_resources())
        count = int(ray.cluster_resources().get(RESOURCE_NAMES[kind], 0))
        if count < 1:
            name = RESOURCE_NAMES[kind]
            fix = "start its nodes with ray start --resources '{\"NPU\": 8}'" if kind == "npu" else "pass --device"
            raise DeliveryError(f"the Ray cluster at {address} has no {name}; {fix}", ExitCode.DEVICE)
        actor = ray.remote(ItemRunner).options(**actor_options(kind), max_restarts=0, max_concurrency=1)
        actors = [actor.remote(spec, kind) for _ in range(min(count, max(1, len(todo))))]
        states = _dispatch(ray, todo, actors, output, retries, outputs)
    finally:
        ray.shutdown()
    for item in todo:
        record_item(output, item, states[item.name], states[item.name].pop("ran_on", "ray"))
    return BatchResult(states=states, summary_path=write_summary(items, output))


def _dispatch(ray: Any, todo: list[BatchItem], actors: list, output: Path, retries: int, mode: str) -> dict:
    """Hand each idle actor the next request; requeue the request of an actor that died."""
    from ray.exceptions import RayActorError

    from .batch import Ranks, progress_bar

    queue, idle = collections.deque(todo), list(actors)
    pending: dict[Any, tuple[Any, BatchItem]] = {}
    deaths: collections.Counter[str] = collections.Counter()
    states: dict[str, dict[str, Any]] = {}
    shared = str(output) if mode == "shared" else None
    with progress_bar(len(todo), True, Ranks()) as bar:
        while queue or pending:
            while idle and queue:
                runner, item = idle.pop(), queue.popleft()
                pending[runner.run.remote(item, shared)] = (runner, item)
            if not pending:  # every actor died: what is left fails
                for item in queue:
                    states[item.name] = _lost(item, deaths[item.name], "no actor is left in the cluster")
                break
            (ref,), _ = ray.wait(list(pending), num_returns=1)
            runner, item = pending.pop(ref)
            try:
                answer = ray.get(ref)
            except RayActorError as err:
                deaths[item.name] += 1
                logger.warning(
                    "the actor running %s died (%s); %d retries left",
                    item.name,
                    type(err).__name__,
                    retries - deaths[item.name] + 1,
                )
                if deaths[item.name] > retries:
                    states[item.name] = _lost(item, deaths[item.name], str(err).splitlines()[0])
                    bar.update(1)
                else:
                    queue.appendleft(item)
                continue
            idle.append(runner)
            state = answer["state"]
            if answer["files"] is not None:
                _commit(output / item.name, answer["files"])
            states[item.name] = {**state, "ran_on": f"{answer['host']}/{answer['pid']}"}
            bar.update(1)
            if state["status"] == "failed":
                bar.write(f"error: {item.name} ({item.source}): {state['error']}", file=sys.stderr)
    return states


def _finished(state: dict[str, Any]) -> dict[str, Any]:
    """The state with the time the item ended on its actor (the driver records it later)."""
    return {**state, "finished": time.time()}


def _lost(item: BatchItem, deaths: int, why: str) -> dict[str, Any]:
    return {
        "status": "failed",
        "error": f"its actor died {deaths} times ({why}); rerun the batch to retry it",
        "exit_code": int(ExitCode.FAILURE),
    }


def _commit(item_dir: Path, files: dict[str, bytes]) -> None:
    """The driver writes an item's returned files together (``--ray-outputs driver``), unless it is complete."""
    if item_is_complete(item_dir):
        return
    outputs = Outputs()
    targets = {name: outputs.add(item_dir / name) for name in files}
    with outputs.commit() as temps:
        for name, data in files.items():
            temps[targets[name]].write_bytes(data)


def connect(address: str) -> Any:
    """``ray`` connected to the cluster at ``address`` (``auto``: this host's); one error line (exit 5) when Ray is
    missing or no cluster answers there, instead of Ray's minutes of retries on an address nobody listens on."""
    try:
        import ray
    except ImportError:
        raise DeliveryError("--ray needs Ray: pip install -r <delivery>/requirements-app.txt", ExitCode.USAGE) from None
    host, _, port = address.rpartition(":")
    if address != "auto" and host:
        try:
            socket.create_connection((host, int(port)), timeout=5).close()
        except (OSError, ValueError) as err:
            reason = getattr(err, "strerror", None) or str(err)
            message = f"--ray {address}: no Ray cluster answers there ({reason})"
            raise DeliveryError(f"{message}; start one with ray start --head, or pass --ray auto on one of its hosts",
                                ExitCode.DEVICE) from None  # fmt: skip
    try:
        ray.init(address=address, log_to_driver=False, configure_logging=False)
    except ConnectionError as err:
        raise DeliveryError(f"--ray {address}: {str(err).splitlines()[0]} (ray start --head makes one)",
                            ExitCode.DEVICE) from None  # fmt: skip
    return ray


def _script(spec: WorkerSpec) -> Any:
    return load_script(spec.script, f"deliverykit_ray_{Path(spec.script).parent.name.replace('-', '_')}")


def _node_id() -> str:
    import ray

    return ray.get_runtime_context().get_node_id()[:12]


def run_from_args(items: list[BatchItem], args: Any, script: str, argv: list[str] | None) -> int:
    """``--batch --ray``, as every ``inference.py`` takes it (``argv``: its own, None for the command line's)."""
    spec = WorkerSpec.here(script, sys.argv[1:] if argv is None else argv)
    options = {"overwrite": args.overwrite, "retries": args.retries, "outputs": args.ray_outputs}
    return run_batch_on_ray(items, spec, args.output, address=args.ray, device_spec=args.device, **options).exit_code


class SessionActor:
    """An actor of ``serve.py --ray``: one device's session of the delivery's service (built from the same
    ``serve.py`` and flags), running the jobs the server hands it in a scratch folder and returning their files."""

    def __init__(self, spec: WorkerSpec, kind: str) -> None:
        if Path(spec.cwd).is_dir():
            os.chdir(spec.cwd)
        os.environ.update(dict(spec.env))
        self.stack = contextlib.ExitStack()
        module = _script(spec)  # the delivery's serve.py
        self.service = module.build_service(module.parse_args(list(spec.argv)))
        self.session = self.service.load("cpu" if kind == "cpu" else f"{kind}:0", self.stack)

    def defaults(self) -> Any:
        """What the server's routes need of a loaded session (``Service.defaults``)."""
        return self.service.defaults(self.session) if self.service.defaults else None

    def where(self) -> str:
        return f"{_node_id()}/{os.getpid()}"

    def run(self, job: Any, inputs: dict[str, bytes]) -> dict[str, Any]:
        """``job`` with its input files: ``{"result", "files"}``, or ``{"error": [message, exit code name]}``."""
        with tempfile.TemporaryDirectory(prefix="deliverykit-job-") as scratch:
            folder = Path(scratch) / job.id
            folder.mkdir()
            for name, data in inputs.items():
                (folder / name).write_bytes(data)
            try:
                result = self.service.run(self.session, job, folder)
            except DeliveryError as err:
                return {"error": [str(err), err.exit_code.name]}
            made = (p for p in folder.rglob("*") if p.is_file() and p.relative_to(folder).as_posix() not in inputs)
            return {"result": result, "files": {p.relative_to(folder).as_posix(): p.read_bytes() for p in made}}


def start_sessions(spec: WorkerSpec, address: str, device_spec: str | None) -> tuple[list[Any], Any]:
    """``(actors, defaults)``: one :class:`SessionActor` per device of the cluster at ``address``, loaded."""
    ray = connect(address)
    kind = device_kind(device_spec, ray.cluster_resources())
    count = int(ray.cluster_resources().get(RESOURCE_NAMES[kind], 0))
    actor = ray.remote(SessionActor).options(**actor_options(kind), max_restarts=0)
    actors = [actor.remote(spec, kind) for _ in range(count)]
    try:
        where = ray.get([session.where.remote() for session in actors])
        defaults = ray.get(actors[0].defaults.remote())
    except ray.exceptions.RayError as err:
        ray.shutdown()
        cause = str(err).strip().splitlines()[-1]
        raise DeliveryError(f"a Ray actor could not load the model: {cause}", ExitCode.FAILURE) from None
    print(f"ray: {len(actors)} workers (node/pid: {', '.join(where)})", flush=True)
    return actors, defaults


def run_on_actor(actor: Any, job: Any, folder: Path) -> dict[str, Any]:
    """A server worker's run of ``job`` on its actor: the job's inputs sent, its files committed here together."""
    import ray
    from ray.exceptions import RayActorError

    inputs = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    try:
        answer = ray.get(actor.run.remote(job, inputs))
    except RayActorError as err:
        raise WorkerLost(str(err).splitlines()[0]) from None
    if "error" in answer:
        message, code = answer["error"]
        raise DeliveryError(message, ExitCode[code])
    outputs = Outputs()
    targets = {name: outputs.add(folder / name) for name in answer["files"]}
    with outputs.commit() as temps:
        for name, data in answer["files"].items():
            temps[targets[name]].write_bytes(data)
    return answer["result"]
