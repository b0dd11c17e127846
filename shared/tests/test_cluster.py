"""deliverykit.cluster on a real local Ray cluster (a head and a second node, one CPU each, on 127.0.0.1), driven
through the stand-in delivery ``batch_worker.py --ray``: the same outputs as one process, both output modes, a node
killed mid-batch and a driver killed and rerun, every item committed exactly once."""

from __future__ import annotations

import collections
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from deliverykit.testing import RAY_LOOPBACK_ENV, local_ray_cluster

pytest.importorskip("ray", reason="ray is missing: pip install -r <delivery>/requirements-app.txt")

WORKER = Path(__file__).with_name("batch_worker.py")
pytestmark = pytest.mark.heavy


@pytest.fixture
def cluster():
    """A head node and a second node, one CPU each: two actors, one per node."""
    with local_ray_cluster(2) as made:
        yield made, made.list_all_nodes()[1]


def write_batch(folder: Path, count: int) -> Path:
    path = folder / "batch.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"p{i}", "seed": i}) + "\n" for i in range(count)))
    return path


def batch(*argv: object, **popen) -> subprocess.Popen:
    env = {**os.environ, **RAY_LOOPBACK_ENV}
    return subprocess.Popen([sys.executable, WORKER, *map(str, argv)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, **popen)  # fmt: skip


def finished(proc: subprocess.Popen, timeout: float = 300, says: str = "") -> int:
    out, _ = proc.communicate(timeout=timeout)
    assert "Traceback" not in out and says in out, out
    return proc.returncode


def outputs(folder: Path) -> dict[str, bytes]:
    return {path.parent.name: path.read_bytes() for path in sorted(folder.glob("*/out.npy"))}


def commits(folder: Path) -> collections.Counter[str]:
    return collections.Counter(line.split()[0] for line in (folder / "commits.log").read_text().splitlines())


@pytest.mark.parametrize("mode", ["shared", "driver"])
def test_a_batch_over_two_nodes_equals_the_single_process_batch(cluster, tmp_path, mode):
    head, _ = cluster
    requests = write_batch(tmp_path, 6)
    assert finished(batch(requests, tmp_path / "one")) == 0
    argv = [requests, tmp_path / "ray", "--ray", head.address, "--ray-outputs", mode, "--sleep", 0.3]
    assert finished(batch(*argv)) == 0
    assert outputs(tmp_path / "ray") == outputs(tmp_path / "one") and len(outputs(tmp_path / "one")) == 6
    summary = json.loads((tmp_path / "ray" / "batch.json").read_text())
    assert summary["done"] == 6 and summary["failed"] == 0
    ran_on = {json.loads(p.read_text())["rank"] for p in (tmp_path / "ray" / ".batch" / "items").glob("*.json")}
    assert len(ran_on) == 2  # both nodes' actors took requests
    if mode == "shared":
        assert set(commits(tmp_path / "ray").values()) == {1}


def test_a_node_killed_mid_batch_still_makes_every_item_exactly_once(cluster, tmp_path):
    head, second = cluster
    out = tmp_path / "out"
    driver = batch(write_batch(tmp_path, 10), out, "--ray", head.address, "--sleep", 0.6)
    deadline = time.monotonic() + 120
    while len(list(out.glob("*/report.json"))) < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    head.remove_node(second)  # its raylet, its actor and the request it held
    assert finished(driver, says="died") == 0  # the lost request went to the head node's actor
    assert len(outputs(out)) == 10 and set(commits(out).values()) == {1}
    assert json.loads((out / "batch.json").read_text())["done"] == 10


def test_the_driver_killed_and_rerun_resumes_without_rewriting(cluster, tmp_path):
    head, _ = cluster
    requests, out = write_batch(tmp_path, 10), tmp_path / "out"
    driver = batch(requests, out, "--ray", head.address, "--sleep", 0.5, start_new_session=True)
    deadline = time.monotonic() + 120
    while len(list(out.glob("*/report.json"))) < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    os.killpg(driver.pid, signal.SIGKILL)
    driver.wait()
    before = {p.parent.name: p.stat().st_mtime_ns for p in out.glob("*/report.json")}
    assert 3 <= len(before) < 10
    assert finished(batch(requests, out, "--ray", head.address)) == 0
    assert len(outputs(out)) == 10 and set(commits(out).values()) == {1}
    assert all((out / name / "report.json").stat().st_mtime_ns == mtime for name, mtime in before.items())


def test_an_address_where_no_cluster_answers_is_one_error_line(tmp_path):
    """Not Ray's minutes of retries and a traceback: exit 5 at once, nothing written."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # bound, never listening: a connection is refused
        proc = batch(write_batch(tmp_path, 2), tmp_path / "out", "--ray", f"127.0.0.1:{port}")
        out, _ = proc.communicate(timeout=60)
    errors = [line for line in out.splitlines() if line.startswith("error: ")]
    assert proc.returncode == 5 and len(errors) == 1 and "Traceback" not in out, out
    assert "no Ray cluster answers there" in errors[0] and not (tmp_path / "out").exists()
