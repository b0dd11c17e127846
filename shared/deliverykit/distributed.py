"""One process per card under ``torchrun``: the rank's device, the process group, and failure on any rank ending all.

``torchrun`` sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``;
:func:`init_distributed` reads them, puts the rank on ``<type>:LOCAL_RANK`` (``LOCAL_RANK`` counts the visible
devices, so ``ASCEND_RT_VISIBLE_DEVICES`` / ``CUDA_VISIBLE_DEVICES`` pick the cards) and starts the process group with
the backend of that device type: ``hccl`` on Ascend, ``nccl`` on CUDA, ``gloo`` on the CPU.

Failure: a collective only notices a dead peer at its timeout (30 minutes by default), so a rank that fails would
leave the others hanging. :class:`FailureGuard` runs a watchdog thread on every rank that shares one key space in the
rendezvous store: a rank whose main code raises writes ``abort`` there before it exits; every rank writes a heartbeat
and reads the others'. A watchdog that sees ``abort``, a heartbeat older than ``stale_s`` (a killed rank) or a store
that no longer answers (rank 0 or the launcher gone) prints one ``error:`` line and ends its process at once with
:attr:`~deliverykit.errors.ExitCode.DISTRIBUTED`; nothing that was not already renamed into place is written.

Splitting work: :class:`RoundRobinCalls` spreads a library's fixed sequence of independent calls (the tiles of a
tiled VAE decode) over the ranks without copying the library's loop.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from typing import Any

import torch

from .errors import DeliveryError, DeviceUnavailableError, ExitCode

BACKENDS = {"npu": "hccl", "cuda": "nccl", "cpu": "gloo"}
TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
DEFAULT_TIMEOUT_S = 1800.0  # a collective may wait for a slow peer (a VAE decode on rank 0) this long
HEARTBEAT_S = 1.0
STALE_S = 20.0  # no heartbeat for this long = the rank is dead (killed, OOM-killed)
_ABORT_KEY = "abort"


def backend_for(device: torch.device | str) -> str:
    """The collective backend of a device type: hccl (npu), nccl (cuda), gloo (cpu)."""
    kind = device.type if isinstance(device, torch.device) else device.split(":")[0]  # "npu" needs torch_npu
    if kind not in BACKENDS:
        raise DeliveryError(f"no distributed backend for device type {kind!r}; use npu, cuda or cpu", ExitCode.USAGE)
    return BACKENDS[kind]


def launched_with_torchrun(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the torchrun variables are set (``WORLD_SIZE`` > 1 or not, every one of them)."""
    environ = os.environ if environ is None else environ
    return all(key in environ for key in TORCHRUN_ENV)


def world_size_from_env(environ: Mapping[str, str] | None = None) -> int:
    """``WORLD_SIZE`` when launched with torchrun, else 1 (one plain process)."""
    environ = os.environ if environ is None else environ
    return int(environ["WORLD_SIZE"]) if launched_with_torchrun(environ) else 1


def rank_device(kind: str, local_rank: int) -> torch.device:
    """``kind:local_rank`` (``cpu`` for every rank on the CPU), checked against the visible devices."""
    from .device import probe_accelerators

    if kind == "cpu":
        return torch.device("cpu")
    status = probe_accelerators()[kind]
    if not status.available:
        raise DeviceUnavailableError(f"--device {kind} requested but {status.reason}; use --device cpu or auto")
    if local_rank >= status.device_count:
        visible = "ASCEND_RT_VISIBLE_DEVICES" if kind == "npu" else "CUDA_VISIBLE_DEVICES"
        raise DeviceUnavailableError(
            f"LOCAL_RANK {local_rank} but only {status.device_count} {kind} device(s) are visible; lower "
            f"--nproc-per-node to {status.device_count} or list more cards in {visible}"
        )
    return torch.device(kind, local_rank)


@dataclasses.dataclass
class DistributedContext:
    """This process's place in the job. ``store`` is the rendezvous store (``None`` for a single process)."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str | None
    store: object | None = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def _device_kind(spec: str | None) -> str:
    from .device import resolve_device

    if spec is None or spec.strip().lower() == "auto":
        return resolve_device("auto").type
    return spec.split(":")[0].strip().lower()


def init_distributed(device_spec: str | None = None, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> DistributedContext:
    """Join the torchrun job (or stay a single process) and return where this rank runs.

    Without the torchrun variables this is ``resolve_device(device_spec)`` and no process group. With them, the
    device type comes from ``device_spec`` (``auto``: npu > cuda > cpu; an index in it is ignored, the rank's
    device is ``LOCAL_RANK``), the backend from the device type, and every collective times out after ``timeout_s``.
    """
    import torch.distributed as dist

    from .device import resolve_device

    if not launched_with_torchrun():
        return DistributedContext(0, 1, 0, resolve_device(device_spec), None)
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    device = rank_device(_device_kind(device_spec), local_rank)
    if device.type != "cpu":
        torch.get_device_module(device.type).set_device(device)
    backend = backend_for(device)
    timeout = datetime.timedelta(seconds=timeout_s)
    store, _, _ = next(dist.rendezvous("env://", rank=rank, world_size=world_size, timeout=timeout))
    dist.init_process_group(
        backend, store=dist.PrefixStore("pg", store), rank=rank, world_size=world_size, timeout=timeout
    )
    return DistributedContext(rank, world_size, local_rank, device, backend, dist.PrefixStore("deliverykit", store))


def destroy_distributed(context: DistributedContext) -> None:
    """Leave the process group (a no-op for a plain single process; torchrun with one rank still has a group)."""
    import torch.distributed as dist

    if context.backend is not None and dist.is_initialized():
        dist.destroy_process_group()


class RoundRobinCalls:
    """Split a fixed sequence of independent calls over the ranks, then let every rank replay it with all results.

    For library code that makes several independent calls and then combines their results (diffusers' tiled VAE
    decode: one decoder call per tile, then the blend), split without copying that code: run it once with
    :meth:`record` in place of the call (call k runs on rank k % world size; every call returns ``placeholder(*args,
    **kwargs)``, a cheap stand-in the combining code accepts), :meth:`exchange` the results (each broadcast from the
    rank that made it), then run it again with :meth:`replay`, which returns the results in call order: the combining
    code sees what one process would have computed. The sequence must be the same on every rank and in both runs.
    """

    def __init__(self, rank: int, world_size: int):
        self.rank, self.world_size = rank, world_size
        self.results: dict[int, torch.Tensor] = {}
        self.count = 0
        self.bytes_received = 0

    def record(self, fn: Callable[..., torch.Tensor], placeholder: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` for this rank's calls of the first run, ``placeholder`` returned for every call."""

        def call(*args: Any, **kwargs: Any) -> Any:
            index, self.count = self.count, self.count + 1
            if index % self.world_size == self.rank:
                self.results[index] = fn(*args, **kwargs).contiguous()
            return placeholder(*args, **kwargs)

        return call

    def exchange(self, device: torch.device) -> None:
        """Every result to every rank: shapes and dtypes first (one small object each), then one broadcast a call."""
        import torch.distributed as dist

        layouts: list[Any] = [None] * self.world_size
        mine = {index: (tuple(t.shape), t.dtype) for index, t in self.results.items()}
        dist.all_gather_object(layouts, mine)
        shapes = {index: layout for gathered in layouts for index, layout in gathered.items()}
        for index in range(self.count):
            owner = index % self.world_size
            if owner != self.rank:
                shape, dtype = shapes[index]
                self.results[index] = torch.empty(shape, dtype=dtype, device=device)
                self.bytes_received += self.results[index].nbytes
            dist.broadcast(self.results[index], src=owner)

    def replay(self) -> Callable[..., torch.Tensor]:
        """The second run's call: the exchanged results in call order (a different sequence raises)."""
        order = iter(range(self.count))

        def call(*args: Any, **kwargs: Any) -> torch.Tensor:
            index = next(order, None)
            if index is None:
                raise RuntimeError(f"the replay made more than the {self.count} calls recorded")
            return self.results[index]

        return call


class FailureGuard:
    """The watchdog of the module docstring; use :func:`failure_guard` (a context manager).

    Heartbeats are counters, not clock times (the nodes' clocks differ): a peer is stale when its counter has not
    moved for ``stale_s`` on this rank's monotonic clock. A rank that finishes cleanly writes ``done``.
    """

    def __init__(self, context: DistributedContext, *, heartbeat_s: float = HEARTBEAT_S, stale_s: float = STALE_S):
        self.context = context
        self.heartbeat_s = heartbeat_s
        self.stale_s = stale_s
        self._beats = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="deliverykit-failure-guard", daemon=True)

    def start(self) -> None:
        self._beat()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5 * self.heartbeat_s)
        with suppress(Exception):
            self.context.store.set(self._key(self.context.rank), "done")

    def signal_failure(self, message: str) -> None:
        """Tell every rank to stop; best effort (the store may already be gone)."""
        with suppress(Exception):
            self.context.store.set(_ABORT_KEY, f"rank {self.context.rank}: {message}")

    def peer_failure(self, wait_s: float = 2.0) -> str | None:
        """Another rank's abort message, waiting up to ``wait_s`` for it (it writes before its connections close)."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                if self.context.store.check([_ABORT_KEY]):
                    return self.context.store.get(_ABORT_KEY).decode(errors="replace")
            except Exception:
                return None
            if time.monotonic() > deadline:
                return None
            time.sleep(0.1)

    @staticmethod
    def _key(rank: int) -> str:
        return f"heartbeat/{rank}"

    def _beat(self) -> None:
        self._beats += 1
        self.context.store.set(self._key(self.context.rank), str(self._beats))

    def _end(self, reason: str) -> None:
        if self._stop.is_set():
            return
        print(f"error: {reason}; rank {self.context.rank} stops too, nothing was written", file=sys.stderr)
        print(f"EXIT_CODE={int(ExitCode.DISTRIBUTED)}", flush=True)
        sys.stderr.flush()
        os._exit(int(ExitCode.DISTRIBUTED))

    def _watch(self) -> None:
        store, rank = self.context.store, self.context.rank
        seen = {peer: (None, time.monotonic()) for peer in range(self.context.world_size) if peer != rank}
        while not self._stop.wait(self.heartbeat_s):
            try:
                self._beat()
                if store.check([_ABORT_KEY]):
                    self._end(f"another rank failed ({store.get(_ABORT_KEY).decode(errors='replace')})")
                now = time.monotonic()
                for peer, (last, since) in seen.items():
                    value = store.get(self._key(peer)).decode() if store.check([self._key(peer)]) else None
                    if value == "done":
                        continue
                    if value != last:
                        seen[peer] = (value, now)
                    elif now - since > self.stale_s:
                        self._end(f"rank {peer} stopped answering for {now - since:.0f} s (killed or out of memory)")
            except Exception as err:  # the store lives in rank 0 or the launcher: it went away
                self._end(f"the rendezvous store stopped answering ({type(err).__name__}: rank 0 or torchrun died)")


@contextmanager
def failure_guard(context: DistributedContext, **kwargs: float) -> Iterator[FailureGuard | None]:
    """Run the body with the watchdog on (distributed runs only); an exception in it stops every rank.

    The exception still propagates on this rank (its own ``error:`` line and exit code); the other ranks end with
    :attr:`ExitCode.DISTRIBUTED` within a heartbeat or two.
    """
    if not context.distributed:
        yield None
        return
    import torch.distributed as dist

    guard = FailureGuard(context, **kwargs)
    guard.start()
    try:
        yield guard
        dist.barrier()  # nobody leaves (taking the store with it) before everybody is done
    except DeliveryError as err:
        guard.signal_failure(_first_line(err))
        guard.stop()
        raise
    except BaseException as err:
        peer = guard.peer_failure()
        guard.signal_failure(_first_line(err))
        guard.stop()
        if peer is not None:  # a collective broke because another rank failed first: that rank tells why
            message = f"another rank failed ({peer}); rank {context.rank} stops too"
            raise DeliveryError(message, ExitCode.DISTRIBUTED) from None
        if _is_broken_collective(err):
            raise DeliveryError(
                f"a collective failed, another rank died ({_first_line(err)}); rank {context.rank} stops too",
                ExitCode.DISTRIBUTED,
            ) from err
        raise
    guard.stop()


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _is_broken_collective(err: BaseException) -> bool:
    """A backend error of a collective whose peer went away (gloo says so at once; hccl/nccl at their timeout)."""
    import torch.distributed as dist

    if isinstance(err, getattr(dist, "DistBackendError", ())):
        return True
    return isinstance(err, RuntimeError) and "closed by peer" in str(err)
