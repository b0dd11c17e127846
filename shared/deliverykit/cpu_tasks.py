"""Independent CPU tasks on worker threads whose torch ops each run on one intra-op thread.

Why not torch's own intra-op threads: every op opens an OpenMP parallel region, and vectorised geometry (closest
points, distance fields, sparse convolution) is thousands of short ops. GNU OpenMP's threads spin between regions:
with both cores free a second thread gained little (TRELLIS.2's GLB export on 2 cores,
trellis2-npu/benchmarks/glb_export.py), and when another process holds a core each region waits until the spinning
thread is scheduled again (a sparse convolution many times slower than on one thread,
trellis2-npu/benchmarks/sparse_conv.py). Split into independent tasks, each on a worker with one intra-op thread,
the same work uses every core with no parallel region, and a worker on a busy core just takes fewer tasks.
``OMP_WAIT_POLICY=passive`` would also help, but libgomp reads it only when it loads.

Policies: ``"workers"`` (the default) or ``"intra-op"`` (the tasks one after the other on the calling thread,
torch's threads inside each op). ``torch.set_num_threads(1)`` means one thread: the tasks run on the caller.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import torch

POLICIES = ("workers", "intra-op")

_T = TypeVar("_T")
_R = TypeVar("_R")
TaskRunner = Callable[[Callable[[_T], _R], Iterable[_T]], list[_R]]


def task_runner(device: torch.device | str, policy: str = "workers", max_workers: int | None = None) -> TaskRunner:
    """``run(fn, items) -> [fn(item) for item in items]``: on single-threaded workers for CPU tensors.

    Args:
        device (`torch.device` or `str`): where the tasks' tensors live; off the CPU the tasks run in order on the
            calling thread (an accelerator's kernels are its own parallelism).
        policy (`str`, *optional*, defaults to `"workers"`): one of :data:`POLICIES`.
        max_workers (`int`, *optional*): at most this many workers (each holds one task's temporaries in memory);
            default: one per torch thread.

    A task that itself asks for a runner gets the serial one (a worker waiting for its own pool would never
    return). Tasks must not depend on each other's order; each item's result is kept at its position.
    """
    count = worker_count(device, policy, max_workers)
    return _serial if count == 1 else worker_pool(count).map_all


def worker_count(device: torch.device | str, policy: str = "workers", max_workers: int | None = None) -> int:
    """How many tasks :func:`task_runner` with these arguments runs at once (1: one after the other)."""
    import torch

    if policy not in POLICIES:
        raise ValueError(f"CPU task policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    if torch.device(device).type != "cpu" or policy == "intra-op" or _IN_WORKER.active:
        return 1
    threads = torch.get_num_threads()
    return max(1, threads if max_workers is None else min(threads, max_workers))


def _serial(fn: Callable[[_T], _R], items: Iterable[_T]) -> list[_R]:
    return [fn(item) for item in items]


class WorkerPool:
    """``count`` threads whose torch ops each run on one intra-op thread (OpenMP and MKL settings are per thread).

    ``torch.set_num_threads`` in a worker also changes the count that threads started later begin with, so the
    creating thread's count is restored once every worker has set its own.
    """

    def __init__(self, count: int) -> None:
        import torch

        self._count = count
        caller_threads = torch.get_num_threads()
        started = threading.Barrier(count)
        self._pool = ThreadPoolExecutor(count, thread_name_prefix="cpu-task", initializer=_one_intra_op_thread)
        # `count` tasks that wait for each other occupy `count` distinct threads, so every worker exists afterwards
        list(self._pool.map(lambda _: started.wait(), range(count)))
        torch.set_num_threads(caller_threads)

    def map_all(self, fn: Callable[[_T], _R], items: Iterable[_T]) -> list[_R]:
        """``[fn(item) for item in items]``, items taken in order by whichever worker is free; raises fn's error.

        Every worker runs one task that takes the next item until none is left, so the calling thread wakes once
        per worker, not once per item (its wake-ups compete with the workers for the cores and the GIL).
        """
        items = list(items)
        results: list[Any] = [None] * len(items)
        positions = itertools.count()  # next() on it is atomic under the GIL

        def drain() -> None:
            while (position := next(positions)) < len(items):
                results[position] = fn(items[position])

        tasks = [self._pool.submit(drain) for _ in range(min(self._count, len(items)))]
        concurrent.futures.wait(tasks)  # all of them, so that no worker still writes when an error is raised
        for task in tasks:
            task.result()
        return results


class _WorkerFlag(threading.local):
    active = False


_IN_WORKER = _WorkerFlag()


def _one_intra_op_thread() -> None:
    """This thread's torch ops on one intra-op thread, for good.

    torch sets a thread's count from the process-wide one at its first parallel call (``at::init_num_threads``):
    asking for the count first makes that happen now, so that the caller restoring the process-wide count later
    does not reach this thread.
    """
    import torch

    _IN_WORKER.active = True
    torch.get_num_threads()
    torch.set_num_threads(1)


_POOLS: dict[int, WorkerPool] = {}
_POOLS_LOCK = threading.Lock()
if hasattr(os, "register_at_fork"):  # a forked child has the pools but not their threads: it starts its own
    os.register_at_fork(after_in_child=_POOLS.clear)


def worker_pool(count: int) -> WorkerPool:
    """The process's pool of ``count`` single-threaded workers, started on first use and kept."""
    with _POOLS_LOCK:
        if count not in _POOLS:
            _POOLS[count] = WorkerPool(count)
        return _POOLS[count]
