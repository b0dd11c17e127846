from __future__ import annotations

import threading

import pytest
import torch

from deliverykit import cpu_tasks
from deliverykit.cpu_tasks import task_runner, worker_pool
from deliverykit.testing import torch_threads


@pytest.fixture
def two_threads():
    with torch_threads(2):
        yield


def test_workers_run_one_intra_op_thread_each_return_in_order_and_raise(two_threads):
    workers = worker_pool(2)
    assert workers.map_all(lambda item: (item, torch.get_num_threads()), range(20)) == [(i, 1) for i in range(20)]
    assert torch.get_num_threads() == 2  # the caller's count is its own

    def fail_on_five(item):
        if item == 5:
            raise RuntimeError("item 5")
        return item

    with pytest.raises(RuntimeError, match="item 5"):
        workers.map_all(fail_on_five, range(10))
    assert workers.map_all(str, []) == []


def test_workers_share_the_tasks(two_threads):
    """Both workers take tasks: a task that waits for a second one to start only returns if another thread runs it."""
    both = threading.Barrier(2, timeout=30)
    names = task_runner("cpu")(lambda _: (both.wait(), threading.current_thread().name)[1], range(2))
    assert len(set(names)) == 2 and all(name.startswith("cpu-task") for name in names)


def test_serial_runner_off_the_cpu_for_intra_op_one_thread_and_inside_a_worker(two_threads):
    caller = threading.current_thread().name
    on_caller = [caller] * 3

    def names(run):
        return run(lambda _: threading.current_thread().name, range(3))

    assert names(task_runner("meta")) == on_caller  # an accelerator's tasks stay on the calling thread
    assert names(task_runner("cpu", "intra-op")) == on_caller
    assert names(task_runner("cpu", max_workers=1)) == on_caller
    # a task asking for workers itself runs its sub-tasks where it is (its pool would wait for itself)
    nested = task_runner("cpu")(lambda _: (threading.current_thread().name, names(task_runner("cpu"))), range(2))
    for worker, inner in nested:
        assert inner == [worker] * 3


def test_one_thread_runs_on_the_caller():
    with torch_threads(1):
        assert task_runner("cpu")(lambda _: threading.current_thread().name, [0]) == [threading.current_thread().name]


def test_unknown_policy_names_the_choices():
    with pytest.raises(ValueError, match="workers, intra-op"):
        task_runner("cpu", "auto")
    assert cpu_tasks.POLICIES == ("workers", "intra-op")
