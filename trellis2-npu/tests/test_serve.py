"""trellis2-npu/serve.py on the tiny models (needs TRELLIS2_SRC), driven by plain HTTP on 127.0.0.1: an asset job's
GLB is ``inference.py``'s mesh with the same image, seed and options, every content variant is the file the
job wrote, Hunyuan3D-2.1's ``/generate``, ``/send`` and ``/status/{uid}`` answer over the same jobs, a bad request
is a 400 with ``inference.py``'s own message, and start-up refuses what ``inference.py`` refuses, before serving.
One server for the module, which makes two assets. The job machinery (queue, kill -9,
SIGTERM, the other error codes) is tested on a stand-in in ``shared/tests/test_server.py``."""

from __future__ import annotations

import base64
import io
import os
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import trimesh
from PIL import Image

from deliverykit.errors import ExitCode
from deliverykit.testing import assert_refused_before_serving, header_only_png, served, start_app_until_exit
from trellis2_npu.tiny import tiny_image

from .conftest import START_UP_REFUSALS

httpx = pytest.importorskip("httpx", reason="httpx is not installed: pip install -r trellis2-npu/requirements-app.txt")
pytest.importorskip("fastapi", reason="fastapi is not installed: pip install -r trellis2-npu/requirements-app.txt")
SERVE = Path(__file__).resolve().parents[1] / "serve.py"
# the server's defaults, small as test_app.py's (the remesh costs ~25 s here, a 2048² bake ~15 s)
FAST = ("--no-remesh", "--texture-size", "64", "--preview-frames", "2")
# what the asset requests ask for: the 512 pipeline (half the cascade's time) and a face budget below the default
ASKED = {"seed": 5, "pipeline_type": "512", "faces": 20000}
CLI_ASKED = ("--seed", 5, "--pipeline", "512", "--faces", 20000)
WHOLE_IMAGE = "remove_background=false (--no-rembg)"


@pytest.fixture(scope="module")
def jobs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("serve") / "jobs"


@pytest.fixture(scope="module")
def server(patched, jobs):
    command = [sys.executable, SERVE, "--smoke", "--upstream", patched, "--device", "cpu", "--port", 0, "--jobs", jobs]
    with served([*command, *FAST]) as running:
        yield running
        assert running.stop() == 0


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, timeout=600) as http:
        yield http


@pytest.fixture(scope="module")
def uploads(tmp_path_factory) -> dict[str, Path]:
    """Files a client could send: the tiny RGBA object, an RGB photo, a decompression bomb and a text file."""
    folder = tmp_path_factory.mktemp("uploads")
    files = {name: folder / name for name in ("object.png", "photo.jpg", "bomb.png", "notes.png")}
    tiny_image().save(files["object.png"])
    Image.new("RGB", (64, 64), (90, 140, 200)).save(files["photo.jpg"])
    header_only_png(files["bomb.png"], 40000, 40000)
    files["notes.png"].write_text("not an image")
    return files


def b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def completed(client: httpx.Client, job_id: str, timeout: float = 600) -> dict:
    deadline = time.monotonic() + timeout
    job = client.get(f"v1/assets/{job_id}").json()
    while job["status"] in ("queued", "in_progress") and time.monotonic() < deadline:
        time.sleep(0.2)
        job = client.get(f"v1/assets/{job_id}").json()
    assert job["status"] == "completed", job
    return job


def refusal(answer: httpx.Response) -> str:
    """The message of a 400 in OpenAI's error shape."""
    body = answer.json()
    assert answer.status_code == 400 and body["error"]["type"] == "invalid_request_error", body
    return body["error"]["message"]


def test_an_asset_job_equals_inference_py_and_serves_each_variant(client, jobs, uploads, run_cli, patched, tmp_path):
    picture = uploads["object.png"]
    created = client.post("v1/assets", files={"image": ("object.png", picture.read_bytes(), "image/png")}, data=ASKED)
    job = created.json()
    assert created.status_code == 200 and job["object"] == "asset", job
    assert (job["pipeline_type"], job["faces"], job["texture_size"], job["remesh"]) == ("512", 20000, 64, False)
    # Hunyuan3D's /send queues a job behind it: processing until it ends (deleted here before it runs)
    uid = client.post("send", json={"image": b64(picture), **ASKED}).json()["uid"]
    assert client.get(f"status/{uid}").json() == {"status": "processing"}
    assert client.delete(f"v1/assets/{uid}").json()["deleted"]

    out = tmp_path / "cli"
    code, _, err = run_cli("--smoke", "tiny", "--upstream", patched, "--device", "cpu", *FAST, *CLI_ASKED,
                           "--image", picture, "--output", out)  # fmt: skip
    assert code == 0, err
    job = completed(client, job["id"])
    glb = client.get(f"v1/assets/{job['id']}/content")
    assert glb.headers["content-type"] == "model/gltf-binary"
    # the same asset as inference.py's, another process: the same mesh up to float reordering (bytes: not promised)
    served_mesh, cli_mesh = (trimesh.load(io.BytesIO(data), file_type="glb", force="mesh")
                             for data in (glb.content, (out / "asset.glb").read_bytes()))  # fmt: skip
    assert served_mesh.faces.shape == cli_mesh.faces.shape and (served_mesh.faces == cli_mesh.faces).all()
    np.testing.assert_allclose(served_mesh.vertices, cli_mesh.vertices, rtol=1e-4, atol=1e-5)
    status = client.get(f"status/{job['id']}").json()
    assert status["status"] == "completed" and base64.b64decode(status["model_base64"]) == glb.content

    folder = jobs / job["id"]
    assert sorted(p.name for p in folder.iterdir()) == ["asset", "image", "job.json"]
    assert sorted(p.name for p in (folder / "asset").iterdir()) == sorted(p.name for p in out.iterdir())
    for variant, name, media_type in (("preview", "preview.png", "image/png"), ("video", "preview.mp4", "video/mp4")):
        answer = client.get(f"v1/assets/{job['id']}/content", params={"variant": variant})
        assert answer.headers["content-type"] == media_type and answer.content == (folder / "asset" / name).read_bytes()
    # the same views of the same GLB; a depth tie in the rasteriser may go the other way (seen: 1 pixel of 1024²)
    served_preview, cli_preview = (np.asarray(Image.open(p / "preview.png")) for p in (folder / "asset", out))
    assert served_preview.shape == cli_preview.shape and (served_preview != cli_preview).mean() < 1e-4
    assert 'delivery_stage_seconds_count{stage="flow:sparse_structure_flow_model"}' in client.get("metrics").text


def test_generate_answers_the_glb_and_an_rgb_photo_needs_remove_background_false(client, uploads):
    """Hunyuan3D-2.1's synchronous route, its body as its clients send it (their own knobs are left unused)."""
    photo = {"image": b64(uploads["photo.jpg"]), **ASKED}
    message = refusal(client.post("generate", json=photo))
    assert message.startswith("the image has no alpha channel") and WHOLE_IMAGE in message
    body = {**photo, "remove_background": False, "texture": True, "octree_resolution": 256}
    answer = client.post("generate", json=body)
    assert answer.status_code == 200 and answer.headers["content-type"] == "model/gltf-binary"
    assert answer.content[:4] == b"glTF"
    (newest,) = client.get("v1/assets", params={"limit": 1}).json()["data"]
    assert client.get(f"v1/assets/{newest['id']}/content").content == answer.content


@pytest.mark.parametrize(
    ("fields", "upload", "flags"),
    [
        ({"pipeline_type": "2048"}, "object.png", ("--pipeline", "2048")),
        ({"faces": "3"}, "object.png", ("--faces", "3")),
        ({"decimation_target": "3"}, "object.png", ("--decimation-target", "3")),
        ({"texture_size": "1000"}, "object.png", ("--texture-size", "1000")),
        ({"steps": "0"}, "object.png", ("--steps", "0")),
        ({}, "notes.png", ()),
        ({}, "bomb.png", ()),
        ({}, "photo.jpg", ()),
    ],
    ids=["pipeline", "faces", "decimation_target", "texture_size", "steps", "not_an_image", "bomb", "rgb_photo"],
)
def test_bad_requests_are_400_with_inference_pys_message(client, uploads, run_cli, patched, tmp_path, fields, upload,
                                                         flags):  # fmt: skip
    """The message ``inference.py`` prints for the same flags and file, the request field named for the flag
    where they differ (the upload for ``--image PATH``, ``remove_background=false`` beside ``--no-rembg``); nothing
    is queued."""
    picture = uploads[upload]
    before = client.get("v1/assets", params={"limit": 100}).json()["data"]
    message = refusal(client.post("v1/assets", data=fields, files={"image": ("upload", picture.read_bytes())}))
    _, _, err = run_cli("--smoke", "tiny", "--upstream", patched, "--device", "cpu", "--image", picture, *flags,
                        "--output", tmp_path / "o")  # fmt: skip
    cli = err.strip().splitlines()[-1].split("error: ", 1)[1]
    assert message in cli.replace(f"--image {picture}", "image").replace(str(picture), "image").replace(
        "--no-rembg", WHOLE_IMAGE
    ), (message, cli)
    assert "trellis2-upload-" not in message  # no temporary path of the server's
    assert client.get("v1/assets", params={"limit": 100}).json()["data"] == before


def test_requests_inference_py_has_no_flag_for(client, uploads):
    picture = {"image": ("object.png", uploads["object.png"].read_bytes())}
    assert refusal(client.post("v1/assets", data={"colour": "red"}, files=picture)).startswith("unknown field 'colour'")
    assert "given twice" in refusal(client.post("v1/assets", data={"faces": 9, "face_count": 9}, files=picture))
    assert "is not base64" in refusal(client.post("send", json={"image": "not base64!"}))
    assert client.get("status/asset_" + "0" * 32).status_code == 404
    assert client.get("v1/models").json()["data"][0]["id"] == "microsoft/TRELLIS.2-4B"


@pytest.mark.parametrize(("argv", "code", "says"), START_UP_REFUSALS)
def test_start_up_fails_before_serving_like_inference(tmp_path, request, argv, code, says):
    if "UPSTREAM" in argv:  # only these cases get as far as the checkout (TRELLIS2_SRC); the others run everywhere
        argv = [str(request.getfixturevalue("patched")) if arg == "UPSTREAM" else arg for arg in argv]
    done = start_app_until_exit(SERVE, *argv, "--device", "cpu", "--jobs", tmp_path / "jobs")
    assert_refused_before_serving(done, code, says, tmp_path / "jobs")


def test_start_up_without_an_upstream_checkout_is_exit_3(tmp_path):
    env = {key: value for key, value in os.environ.items() if key != "TRELLIS2_SRC"}
    done = start_app_until_exit(SERVE, "--smoke", "--device", "cpu", "--jobs", tmp_path / "jobs", env=env)
    assert_refused_before_serving(done, ExitCode.INPUT, "TRELLIS2_SRC", tmp_path / "jobs")


def test_the_official_openai_client_lists_the_model_and_reads_the_errors(server):
    """OpenAI's client has no 3D resource; its generic calls still speak to the server: the model list, and an
    unknown asset as its NotFoundError with the server's message."""
    openai = pytest.importorskip("openai", reason="openai is missing: pip install -r ci/requirements-dev.txt")
    client = openai.OpenAI(base_url=server.url + "v1", api_key="unused", max_retries=0)
    assert [model.id for model in client.models.list()] == ["microsoft/TRELLIS.2-4B"]
    with pytest.raises(openai.NotFoundError, match="no asset job"):
        client.get("/assets/asset_" + "0" * 32, cast_to=object)
