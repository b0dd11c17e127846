"""deliverykit.distributed: backend per device type, rank devices, and failure on one rank ending every rank.

The multi-process tests launch real ``torchrun`` jobs of 2 CPU ranks on gloo (the CI machine has no accelerator);
on a host with two NPUs, ``deliverykit npu-check`` runs the same job on HCCL, one card per rank.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from deliverykit.distributed import (
    BACKENDS,
    RoundRobinCalls,
    backend_for,
    init_distributed,
    launched_with_torchrun,
    rank_device,
    world_size_from_env,
)
from deliverykit.errors import DeliveryError, DeviceUnavailableError, ExitCode
from deliverykit.testing import require_cards

SHARED = Path(__file__).resolve().parents[1]
SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    import torch, torch.distributed as dist
    from deliverykit.distributed import destroy_distributed, failure_guard, init_distributed
    from deliverykit.errors import run_main

    def main():
        mode, device = sys.argv[1], sys.argv[2]
        context = init_distributed(device)
        with failure_guard(context, heartbeat_s=0.5, stale_s=5.0):
            total = torch.full((3,), float(context.rank + 1), device=context.device)
            dist.all_reduce(total)
            print(f"RANK{context.rank} backend={context.backend} device={context.device} sum={total[0].item()}")
            if context.rank == 1 and mode == "raise":
                raise RuntimeError("injected failure on rank 1")
            if context.rank == 1 and mode == "kill":
                os.kill(os.getpid(), 9)
            if context.rank == 0 and mode == "kill":
                time.sleep(120)  # busy, not in a collective: only the heartbeat can notice the dead peer
        destroy_distributed(context)

    sys.exit(run_main(main))
    """
)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _torchrun(
    script: Path, mode: str, *, nodes: int = 1, nproc: int = 2, device: str = "cpu"
) -> list[subprocess.Popen]:
    """One torchrun per "node" on localhost (static rendezvous), each with ``nproc`` ranks."""
    env = {**os.environ, "PYTHONPATH": str(SHARED), "OMP_NUM_THREADS": "1"}
    port = _free_port()
    common = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}"]
    common += [f"--nnodes={nodes}", "--master-addr=127.0.0.1", f"--master-port={port}"]
    return [
        subprocess.Popen(
            [*common, f"--node-rank={node}", str(script), mode, device],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for node in range(nodes)
    ]


def _finish(procs: list[subprocess.Popen], timeout: float) -> list[tuple[int, str]]:
    deadline = time.monotonic() + timeout
    results = []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for other in procs:
                other.kill()
            pytest.fail(f"a rank still ran after {timeout} s: the failure did not end the job")
        results.append((proc.returncode, out))
    return results


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "job.py"
    path.write_text(SCRIPT)
    return path


def test_backend_per_device_type():
    assert backend_for("npu:3") == "hccl"
    assert backend_for(torch.device("cuda", 1)) == "nccl"
    assert backend_for("cpu") == "gloo"
    assert set(BACKENDS) == {"npu", "cuda", "cpu"}
    with pytest.raises(DeliveryError):
        backend_for("meta")


def test_single_process_without_torchrun_variables(monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    assert not launched_with_torchrun()
    assert world_size_from_env() == 1
    context = init_distributed("cpu")
    assert (context.rank, context.world_size, context.backend, context.store) == (0, 1, None, None)
    assert context.device == torch.device("cpu") and context.is_main and not context.distributed
    partial = {"RANK": "0", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "MASTER_ADDR": "h"}
    assert not launched_with_torchrun(partial) and world_size_from_env(partial) == 1


def test_rank_device_checks_the_visible_devices():
    assert rank_device("cpu", 5) == torch.device("cpu")
    with pytest.raises(DeviceUnavailableError) as info:
        rank_device("npu", 0)  # never installed in CI
    assert info.value.exit_code == ExitCode.DEVICE


def test_two_cpu_ranks_join_with_gloo(script):
    [(code, out)] = _finish(_torchrun(script, "ok"), timeout=120)
    assert code == 0, out
    for rank in (0, 1):  # 1 + 2: the all-reduce saw both ranks
        assert f"RANK{rank} backend=gloo device=cpu sum=3.0" in out


@require_cards("npu", 2)
def test_two_npu_ranks_join_with_hccl(script):
    """The same job on two cards: HCCL, each rank on its own card, the sum the gloo ranks get."""
    [(code, out)] = _finish(_torchrun(script, "ok", device="npu"), timeout=300)
    assert code == 0, out
    for rank in (0, 1):
        assert f"RANK{rank} backend=hccl device=npu:{rank} sum=3.0" in out


def test_exception_on_rank_1_ends_every_rank(script):
    start = time.monotonic()
    [(code, out)] = _finish(_torchrun(script, "raise"), timeout=120)
    assert code != 0
    assert "RuntimeError: injected failure on rank 1" in out
    # rank 0 was in a collective: it ends with one error line naming rank 1's failure and the documented code
    assert "error: another rank failed (rank 1: injected failure on rank 1); rank 0 stops too" in out
    assert f"EXIT_CODE={int(ExitCode.DISTRIBUTED)}" in out
    assert time.monotonic() - start < 60 + 30  # 30 s: two Python+torch start-ups on a loaded 2-core runner


def test_killed_rank_on_another_node_ends_a_busy_rank(script):
    """Two torchrun "nodes" on localhost: node 1's agent cannot stop node 0's rank, only the heartbeat does."""
    start = time.monotonic()
    results = _finish(_torchrun(script, "kill", nodes=2, nproc=1), timeout=120)
    (code0, out0), (code1, _) = results
    assert code0 != 0 and code1 != 0
    assert "error: rank 1 stopped answering" in out0
    assert f"EXIT_CODE={int(ExitCode.DISTRIBUTED)}" in out0
    assert time.monotonic() - start < 60 + 30


def test_round_robin_calls_record_this_ranks_share_and_replay_in_order():
    """Rank 1 of 2 computes calls 1 and 3 of 5 and returns the placeholder for all; the replay returns every result in
    call order (here the ones ``exchange`` would bring from rank 0 are filled in by hand) and refuses a sixth call."""
    calls = RoundRobinCalls(rank=1, world_size=2)
    made = []
    record = calls.record(lambda x: made.append(x) or torch.tensor([x]), placeholder=lambda x: "stand-in")
    assert [record(x) for x in range(5)] == ["stand-in"] * 5 and made == [1, 3]
    calls.results.update({index: torch.tensor([index]) for index in (0, 2, 4)})
    replay = calls.replay()
    assert [int(replay(x)) for x in range(5)] == [0, 1, 2, 3, 4]
    with pytest.raises(RuntimeError, match="more than the 5 calls"):
        replay(5)
