"""deliverykit.server on a live stand-in delivery (``server_app.py``) on 127.0.0.1: the job API, the error matrix,
many clients, kill -9 and SIGTERM. Each server is a real process, started with ``--port 0`` and stopped by the test.
"""

from __future__ import annotations

import concurrent.futures
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from deliverykit.jobs import JobStore
from deliverykit.testing import local_ray_cluster, served

httpx = pytest.importorskip("httpx", reason="httpx is not installed: pip install -r <delivery>/requirements-app.txt")
pytest.importorskip("fastapi", reason="fastapi is not installed: pip install -r <delivery>/requirements-app.txt")

APP = Path(__file__).with_name("server_app.py")
KEY_ENV = "TOY_SERVER_KEY"


def toy(jobs: Path, *flags: object) -> list[object]:
    return [sys.executable, APP, "--port", 0, "--jobs", jobs, *flags]


def wait_for(client: httpx.Client, job_id: str, states: tuple[str, ...], timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = client.get(f"v1/echoes/{job_id}").json()
        if job["status"] in states:
            return job
        assert job["status"] != "failed", job
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} never reached {states}: {job}")


def assert_error(response: httpx.Response, status: int, says: str, code: str | None = None) -> dict:
    """OpenAI's error shape: ``{"error": {"message", "type", "param", "code"}}``."""
    body = response.json()
    assert response.status_code == status, body
    assert set(body["error"]) == {"message", "type", "param", "code"} and says in body["error"]["message"], body
    if code is not None:
        assert body["error"]["code"] == code, body
    return body["error"]


def test_jobs_run_and_answer_in_the_videos_shape(tmp_path):
    with served(toy(tmp_path)) as server, httpx.Client(base_url=server.url, timeout=30) as client:
        assert client.get("health").json() == {"status": "ok"}
        assert client.get("ready").json()["status"] == "ready"
        assert client.get("v1/models").json()["data"][0]["id"] == "toy/echo-1"
        created = client.post("v1/echoes", data={"text": "hello"}, files={"attachment": ("a.bin", b"12345")}).json()
        assert created["object"] == "echo" and created["status"] in ("queued", "in_progress", "completed")
        job = wait_for(client, created["id"], ("completed",))
        assert job["progress"] == 100 and job["completed_at"] >= job["created_at"] and job["error"] is None
        assert client.get(f"v1/echoes/{job['id']}/content").text == "hello 5\n"
        assert client.get(f"v1/echoes/{job['id']}/content", params={"variant": "report"}).json()["text"] == "hello"
        second = client.post("v1/echoes", json={"text": "json body", "delay": "0"}).json()
        wait_for(client, second["id"], ("completed",))
        listed = client.get("v1/echoes", params={"limit": 1}).json()
        assert [j["id"] for j in listed["data"]] == [second["id"]] and listed["has_more"]
        rest = client.get("v1/echoes", params={"after": second["id"]}).json()
        assert [j["id"] for j in rest["data"]] == [job["id"]] and not rest["has_more"]
        metrics = client.get("metrics").text
        assert 'delivery_jobs{state="completed"} 2.0' in metrics and "delivery_queue_depth 0.0" in metrics
        assert 'delivery_stage_seconds_count{stage="echo"} 2.0' in metrics
        assert client.delete(f"v1/echoes/{job['id']}").json() == {"id": job["id"], "object": "echo.deleted",
                                                                  "deleted": True}  # fmt: skip
        assert not (tmp_path / job["id"]).exists()
        assert_error(client.get(f"v1/echoes/{job['id']}"), 404, "no echo job")
        assert server.stop() == 0


def _form(parts: list[tuple[str, str]]) -> object:
    """A Starlette request whose body is a multipart form of text ``parts`` (name, value), as a client sends it."""
    from starlette.requests import Request

    boundary = "formboundary"
    body = b"".join(
        f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode()
        for name, value in parts
    )
    body += f"--{boundary}--\r\n".encode()
    headers = [(b"content-type", f"multipart/form-data; boundary={boundary}".encode())]
    scope = {"type": "http", "method": "POST", "path": "/", "headers": headers, "query_string": b""}

    async def receive() -> dict:
        return {"type": "http.request", "body": body, "more_body": False}

    return Request(scope, receive)


def test_a_form_list_arrives_as_a_list_and_a_field_may_exceed_one_mib():
    """The openai client sends a list of ``extra_body`` in a form as repeated ``name[]`` fields; Starlette caps a
    text part unless told otherwise, below the size of a data-URL image."""
    import asyncio

    from deliverykit.server import ApiError, read_body

    large = "A" * (2 << 20)
    parts = [("prompt", "a fox"), ("keyframes[]", "first:0"), ("keyframes[]", large), ("keyframes[]", "last:8")]
    fields, files = asyncio.run(read_body(_form(parts)))
    assert fields == {"prompt": "a fox", "keyframes": ["first:0", large, "last:8"]} and files == {}
    for mixed in ([("keyframes", "a:0"), ("keyframes[]", "b:1")], [("keyframes[]", "b:1"), ("keyframes", "a:0")]):
        with pytest.raises(ApiError, match="both as one field and as a list"):
            asyncio.run(read_body(_form(mixed)))


@pytest.mark.parametrize(
    ("text", "data_url", "expected"),
    [
        ("data:image/png;base64,aGVs\nbG8=", None, b"hello"),  # whitespace in it, as some clients wrap
        ("aGVsbG8=", None, b"hello"),
        ("data:image/png;base64,aGVsbG8=", "data:image/png;base64,...", b"hello"),
        ("aGVsbG8=", "data:image/png;base64,...", "image: send the file inline as data:image/png;base64,..."),
        ("/etc/hostname", None, "image is not base64"),
        ("data:image/png,hello", None, "image: send the data URL base64-encoded (data:image/png;base64,...)"),
    ],
    ids=["data-url", "bare", "data-url-asked", "bare-refused", "a-path", "not-base64-url"],
)
def test_a_file_sent_as_text_is_decoded_or_refused_naming_its_field(text, data_url, expected):
    from deliverykit.server import ApiError, base64_bytes

    if isinstance(expected, bytes):
        assert base64_bytes(text, "image", data_url=data_url) == expected
        return
    with pytest.raises(ApiError) as refused:
        base64_bytes(text, "image", data_url=data_url, param="images")
    assert refused.value.status == 400 and expected in str(refused.value) and refused.value.param == "images"


def test_the_error_matrix(tmp_path):
    """401 without the key, 413 over the body limit (declared or streamed), 400 with the CLI's message, 404, 409
    before completion, 429 with Retry-After when the queue is full; failed jobs say why, and nothing of theirs is
    served."""
    env = {KEY_ENV: "sk-test-secret"}
    flags = ("--api-key-env", KEY_ENV, "--max-body-mb", 0.001, "--max-queue", 1)
    auth = {"Authorization": "Bearer sk-test-secret"}
    with served(toy(tmp_path, *flags), env=env) as server, httpx.Client(base_url=server.url, timeout=30) as anon:
        client = httpx.Client(base_url=server.url, timeout=30, headers=auth)
        assert anon.get("health").status_code == 200 and anon.get("metrics").status_code == 200
        assert_error(anon.get("v1/models"), 401, "missing or wrong API key", "invalid_api_key")
        wrong = {"Authorization": "Bearer sk-test-wrong"}
        assert_error(anon.get("v1/models", headers=wrong), 401, "missing or wrong API key")
        too_big = {"attachment": ("a.bin", b"x" * 2048)}
        assert_error(client.post("v1/echoes", data={"text": "t"}, files=too_big), 413, "over 0.001 MB")
        streamed = client.post("v1/echoes", content=iter([b'{"text": "', b"x" * 2048, b'"}']))
        assert_error(streamed, 413, "--max-body-mb", "body_too_large")
        assert_error(client.post("v1/echoes", json={}), 400, "text is required")
        assert_error(client.post("v1/echoes", json={"text": "refuse"}), 400, "the CLI refuses this; pass another")
        assert_error(client.post("v1/echoes", json={"text": "t", "delay": "soon"}), 400, "delay must be float")
        assert_error(client.post("v1/echoes", content=b"not json"), 400, "not JSON")
        assert_error(client.get("v1/echoes/echo_" + "0" * 32), 404, "no echo job", "not_found")
        assert_error(client.get("v1/echoes/../../etc"), 404, "")
        assert_error(client.get("v1/echoes", params={"order": "sideways"}), 400, "order is asc or desc")

        running = client.post("v1/echoes", json={"text": "slow", "delay": 3}).json()["id"]
        wait_for(client, running, ("in_progress",))
        queued = client.post("v1/echoes", json={"text": "next"}).json()["id"]
        full = client.post("v1/echoes", json={"text": "one too many"})
        assert_error(full, 429, "1 jobs are waiting (--max-queue 1)", "queue_full")
        assert int(full.headers["Retry-After"]) >= 1
        assert_error(client.get(f"v1/echoes/{queued}/content"), 409, "its files exist once it is completed")
        assert_error(client.delete(f"v1/echoes/{running}"), 409, "is running")
        assert client.delete(f"v1/echoes/{queued}").json()["deleted"]
        assert_error(client.get(f"v1/echoes/{running}/content", params={"variant": "gif"}), 400, "variant 'gif'")

        assert wait_for(client, running, ("completed",))["status"] == "completed"
        failed = client.post("v1/echoes", json={"text": "f", "fail": True}).json()["id"]
        failed_job = wait_for(client, failed, ("failed",))
        bug = client.post("v1/echoes", json={"text": "b", "boom": "true"}).json()["id"]
        bug_job = wait_for(client, bug, ("failed",))
        assert failed_job["error"] == {"code": "input", "message": "asked to fail; send fail=false"}
        assert bug_job["error"] == {"code": "internal", "message": "internal error (TypeError); see the server log"}
        assert_error(client.get(f"v1/echoes/{failed}/content"), 409, "is failed")
        client.close()
        assert server.stop() == 0
    assert "sk-test-secret" not in server.output


def test_twenty_requests_from_four_threads_on_two_workers_none_lost_or_run_twice(tmp_path):
    with served(toy(tmp_path, "--devices", "cpu,cpu")) as server, httpx.Client(base_url=server.url) as client:

        def submit_five(thread: int) -> list[tuple[str, str]]:
            texts = [f"t{thread}-{i}" for i in range(5)]
            return [(client.post("v1/echoes", json={"text": t, "delay": 0.05}).json()["id"], t) for t in texts]

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            jobs = [job for five in pool.map(submit_five, range(4)) for job in five]
        assert len({job_id for job_id, _ in jobs}) == 20
        for job_id, text in jobs:
            wait_for(client, job_id, ("completed",))
            assert client.get(f"v1/echoes/{job_id}/content").text == f"{text} 0\n"
            assert len((tmp_path / job_id / "runs.log").read_text().splitlines()) == 1
        assert client.get("v1/echoes", params={"limit": 100}).json()["data"].__len__() == 20


def test_two_servers_on_one_jobs_folder_share_its_queue(tmp_path):
    with served(toy(tmp_path)) as first, served(toy(tmp_path)) as second:
        with httpx.Client(base_url=first.url) as client:
            ids = [client.post("v1/echoes", json={"text": f"{i}", "delay": 0.5}).json()["id"] for i in range(6)]
            for job_id in ids:
                wait_for(client, job_id, ("completed",))
        runners = {(tmp_path / job_id / "runs.log").read_text().split()[0] for job_id in ids}
        assert runners == {str(first.proc.pid), str(second.proc.pid)}
        with httpx.Client(base_url=second.url) as other:  # any server answers for any job of the folder
            assert other.get(f"v1/echoes/{ids[0]}/content").text == "0 0\n"


def test_kill_9_mid_job_then_a_restart_runs_it_again_and_keeps_what_was_done(tmp_path):
    with served(toy(tmp_path)) as server, httpx.Client(base_url=server.url) as client:
        done = client.post("v1/echoes", json={"text": "before"}).json()["id"]
        wait_for(client, done, ("completed",))
        killed = client.post("v1/echoes", json={"text": "interrupted", "delay": 2}).json()["id"]
        wait_for(client, killed, ("in_progress",))
        waiting = client.post("v1/echoes", json={"text": "waiting"}).json()["id"]
        assert server.stop(signal.SIGKILL) == -signal.SIGKILL
    assert not (tmp_path / killed / "out.txt").exists()
    with served(toy(tmp_path)) as server, httpx.Client(base_url=server.url) as client:
        assert wait_for(client, killed, ("completed",))["status"] == "completed"
        assert client.get(f"v1/echoes/{killed}/content").text == "interrupted 0\n"
        assert wait_for(client, waiting, ("completed",))["status"] == "completed"
        assert client.get(f"v1/echoes/{done}/content").text == "before 0\n"
        assert len((tmp_path / killed / "runs.log").read_text().splitlines()) == 2
        assert len((tmp_path / done / "runs.log").read_text().splitlines()) == 1


def test_sigterm_finishes_the_running_job_leaves_the_queue_and_exits_0(tmp_path):
    with served(toy(tmp_path)) as server, httpx.Client(base_url=server.url) as client:
        running = client.post("v1/echoes", json={"text": "finish me", "delay": 1.5}).json()["id"]
        wait_for(client, running, ("in_progress",))
        queued = client.post("v1/echoes", json={"text": "later"}).json()["id"]
        assert server.stop(signal.SIGTERM) == 0
    store = JobStore(tmp_path)
    assert store.get(running).status == "completed" and (tmp_path / running / "out.txt").read_text() == "finish me 0\n"
    assert store.get(queued).status == "queued"
    assert "stopped: every running job finished" in server.output and "Traceback" not in server.output


def start_up(*argv: object, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, APP, *map(str, argv)], capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (("--host", "0.0.0.0"), "--host 0.0.0.0 is reachable from other machines; pass --api-key-env NAME"),
        (("--api-key-env", "TOY_UNSET_KEY"), "$TOY_UNSET_KEY is empty; export the key first"),
        (("--devices", "cpu,gpu"), "'gpu' is not a device"),
    ],
)
def test_start_up_refusals_are_exit_2_with_one_error_line(tmp_path, flags, says):
    env = {key: value for key, value in os.environ.items() if key != "TOY_UNSET_KEY"}
    done = start_up("--jobs", tmp_path / "jobs", *flags, env=env)
    assert done.returncode == 2 and says in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert not (tmp_path / "jobs").exists()


def test_a_port_in_use_is_exit_6(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        done = start_up("--jobs", tmp_path, "--port", taken.getsockname()[1])
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert done.returncode == 6 and len(errors) == 1 and "pass another --port" in errors[0], done.stderr


def test_a_jobs_folder_under_a_file_is_exit_6_before_loading(tmp_path):
    (tmp_path / "file").write_text("")
    done = start_up("--jobs", tmp_path / "file" / "jobs", "--load-s", 60)
    assert done.returncode == 6 and "choose another --jobs" in done.stderr, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


@pytest.mark.heavy
def test_served_over_a_ray_cluster_the_jobs_run_in_its_actors(tmp_path):
    """``--ray``: the server loads nothing; one actor per node takes the jobs from its database, and SIGTERM lets
    them finish their running jobs."""
    pytest.importorskip("ray", reason="ray is missing: pip install -r <delivery>/requirements-app.txt")
    with local_ray_cluster(2) as cluster, served(toy(tmp_path, "--ray", cluster.address)) as server:
        with httpx.Client(base_url=server.url) as client:
            ids = [client.post("v1/echoes", json={"text": f"{i}", "delay": 0.5}).json()["id"] for i in range(6)]
            for index, job_id in enumerate(ids):
                wait_for(client, job_id, ("completed",))
                assert client.get(f"v1/echoes/{job_id}/content").text == f"{index} 0\n"
            last = client.post("v1/echoes", json={"text": "last", "delay": 1.5}).json()["id"]
            wait_for(client, last, ("in_progress",))
        assert server.stop() == 0
        runners = {(tmp_path / job_id / "runs.log").read_text().split()[0] for job_id in ids}
        assert len(runners) == 2 and str(server.proc.pid) not in runners
        assert JobStore(tmp_path).get(last).status == "completed"


@pytest.mark.heavy
def test_a_ray_node_lost_mid_job_puts_its_job_back_for_another_actor(tmp_path):
    pytest.importorskip("ray", reason="ray is missing: pip install -r <delivery>/requirements-app.txt")
    with local_ray_cluster(2) as cluster, served(toy(tmp_path, "--ray", cluster.address)) as server:
        with httpx.Client(base_url=server.url) as client:
            ids = [client.post("v1/echoes", json={"text": f"{i}", "delay": 1.5}).json()["id"] for i in range(4)]
            deadline = time.monotonic() + 60
            while JobStore(tmp_path).counts()["in_progress"] < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            cluster.remove_node(cluster.list_all_nodes()[1])  # one of the two running jobs loses its actor
            for index, job_id in enumerate(ids):
                wait_for(client, job_id, ("completed",))
                assert client.get(f"v1/echoes/{job_id}/content").text == f"{index} 0\n"
            assert client.get("ready").json() == {"status": "ready", "workers": 1}  # the other one stopped
        assert server.stop() == 0
    assert "lost its actor" in server.output
    assert sorted(JobStore(tmp_path).get(job_id).attempts for job_id in ids) == [1, 1, 1, 2]
