"""deliverykit.jobs: one FIFO queue in SQLite that several processes share, and jobs that survive a dead server."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from deliverykit.jobs import Claimer, JobStore, QueueFull

CLAIM_ALL = """
import sys, time
from deliverykit.jobs import Claimer, JobStore
store, me, taken = JobStore(sys.argv[1]), Claimer.here(sys.argv[2]), []
while (job := store.claim(me, ("echo",))) is not None:
    taken.append(job.id)
    store.complete(job.id, me, {})
    time.sleep(0.01)  # a job takes time: the processes overlap
print(" ".join(taken))
"""


def dead_pid() -> int:
    """The PID of a process that has exited (and been reaped)."""
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(proc.stdout)


def test_jobs_are_claimed_in_submission_order(tmp_path):
    store = JobStore(tmp_path)
    ids = [store.submit("echo", {"i": i}).id for i in range(4)]
    store.submit("other", {})
    me = Claimer.here("w")
    assert [store.claim(me, ("echo",)).id for _ in ids] == ids
    assert store.claim(me, ("echo",)) is None
    assert store.counts() == {"queued": 1, "in_progress": 4, "completed": 0, "failed": 0}


def test_three_processes_take_every_job_exactly_once(tmp_path):
    """Claims are one write transaction each: processes racing on one database never take the same job."""
    store = JobStore(tmp_path)
    ids = {store.submit("echo", {"i": i}).id for i in range(60)}
    procs = [
        subprocess.Popen([sys.executable, "-c", CLAIM_ALL, str(tmp_path), f"w{i}"], stdout=subprocess.PIPE, text=True)
        for i in range(3)
    ]
    taken = [job_id for proc in procs for job_id in proc.communicate(timeout=120)[0].split()]
    assert sorted(taken) == sorted(ids)
    assert store.counts()["completed"] == 60


def test_a_dead_claimers_job_is_requeued_in_its_place_then_failed_after_max_attempts(tmp_path):
    store = JobStore(tmp_path, max_attempts=2)
    first, second = store.submit("echo", {}).id, store.submit("echo", {}).id
    ghost = Claimer(Claimer.here("w").host, dead_pid(), "w")
    assert store.claim(ghost, ("echo",)).id == first
    assert store.recover() == [first]
    job = store.get(first)
    assert (job.status, job.attempts, job.claimed_by) == ("queued", 1, None)
    assert store.claim(ghost, ("echo",)).id == first  # still ahead of the job submitted after it
    assert store.recover() == [first]
    job = store.get(first)
    assert job.status == "failed" and job.error["code"] == "server_died"
    assert "stopped during this job 2 times" in job.error["message"]
    assert store.get(second).status == "queued"


def test_another_hosts_claim_is_stale_only_when_its_heartbeat_is(tmp_path):
    store = JobStore(tmp_path, lease_s=0.5)
    job_id = store.submit("echo", {}).id
    elsewhere = Claimer("another-host", 1, "w")  # a PID there says nothing here: only the heartbeat counts
    store.claim(elsewhere, ("echo",))
    store.heartbeat(job_id, elsewhere)
    assert store.recover() == []
    time.sleep(0.6)
    assert store.recover() == [job_id]
    assert store.get(job_id).status == "queued"


def test_a_claimer_that_lost_its_job_cannot_end_it(tmp_path):
    store = JobStore(tmp_path, lease_s=0.0)
    job_id = store.submit("echo", {}).id
    old, new = Claimer("h1", 1, "a"), Claimer("h2", 2, "b")
    store.claim(old, ("echo",))
    store.recover()
    store.claim(new, ("echo",))
    assert not store.complete(job_id, old, {"by": "old"})
    assert store.complete(job_id, new, {"by": "new"})
    job = store.get(job_id)
    assert (job.status, job.result, job.attempts) == ("completed", {"by": "new"}, 2)


def test_a_full_queue_refuses_and_counts_only_waiting_jobs(tmp_path):
    store = JobStore(tmp_path)
    store.submit("echo", {}, max_queue=2)
    store.submit("echo", {}, max_queue=2)
    with pytest.raises(QueueFull, match="2 jobs are waiting"):
        store.submit("echo", {}, max_queue=2)
    store.claim(Claimer.here("w"), ("echo",))
    store.submit("echo", {}, max_queue=2)
    assert store.counts()["queued"] == 2


def test_delete_removes_the_folder_but_leaves_a_running_job(tmp_path):
    store = JobStore(tmp_path)
    done, running = store.submit("echo", {}).id, store.submit("echo", {}).id
    for job_id in (done, running):
        store.folder(job_id).mkdir()
        (store.folder(job_id) / "out.txt").write_text("x")
    me = Claimer.here("w")
    store.claim(me, ("echo",))
    store.complete(done, me, {})
    store.claim(me, ("echo",))
    assert store.delete(done).status == "completed"
    assert store.get(done) is None and not store.folder(done).exists()
    assert store.delete(running).status == "in_progress"
    assert store.get(running) is not None and (store.folder(running) / "out.txt").is_file()
    assert store.delete("echo_" + "0" * 32) is None


def test_a_result_written_after_the_files_marks_the_job_done(tmp_path):
    store = JobStore(tmp_path)
    job_id = store.submit("echo", {}).id
    assert not store.is_written(job_id)
    store.folder(job_id).mkdir()
    store.write_result(job_id, {"stages_s": {"echo": 1.5}})
    assert store.is_written(job_id) and store.read_result(job_id) == {"stages_s": {"echo": 1.5}}
    assert json.loads((store.folder(job_id) / "job.json").read_text()) == {"stages_s": {"echo": 1.5}}


@pytest.mark.parametrize("bad", ["../x", "echo_123", "ECHO_" + "0" * 32, "echo_" + "0" * 32 + "/.."])
def test_only_job_ids_name_a_folder(tmp_path, bad):
    with pytest.raises(ValueError, match="not a job id"):
        JobStore(tmp_path).folder(bad)
