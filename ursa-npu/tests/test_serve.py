"""ursa-npu/serve.py on the smoke model, driven by the official ``openai`` client and plain HTTP on 127.0.0.1: the
images it serves are ``inference.py``'s with the same seed (equal up to rounding: another process), and a bad
request is a 400 with the CLI's message. The job machinery (queue, kill -9, SIGTERM, error codes) is tested on a
stand-in in ``shared/tests/test_server.py``."""

from __future__ import annotations

import base64
import io
import sys
import urllib.request
from pathlib import Path

import pytest
from PIL import Image

from deliverykit.errors import ExitCode
from deliverykit.testing import (
    assert_images_equal_up_to_rounding,
    assert_jpegs_equal_up_to_rounding,
    assert_refused_before_serving,
    served,
    start_app_until_exit,
)

openai = pytest.importorskip("openai", reason="the openai client is missing: pip install -r ci/requirements-dev.txt")
pytest.importorskip("fastapi", reason="fastapi is not installed: pip install -r ursa-npu/requirements-app.txt")
SERVE = Path(__file__).resolve().parents[1] / "serve.py"


@pytest.fixture(scope="module")
def server(patched_upstream, tmp_path_factory):
    jobs = tmp_path_factory.mktemp("jobs")
    command = [sys.executable, SERVE, "--smoke", "--upstream", patched_upstream, "--device", "cpu", "--port", 0]
    with served([*command, "--jobs", jobs], env={"HF_HOME": str(jobs / "hf")}) as running:
        yield running
        assert running.stop() == 0


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "v1", api_key="unused", max_retries=0)


def test_images_equal_inference_py_with_the_same_seeds(server, client, run_cli, patched_upstream, tmp_path):
    """n images get seeds seed, seed + 1, ...: each byte-equal to ``inference.py --seed`` (same model, same PNG)."""
    answer = client.images.generate(prompt="a red fox", n=2, size="16x16", extra_body={"seed": 7, "steps": 2})
    served_images = [base64.b64decode(image.b64_json) for image in answer.data]
    for index, seed in enumerate((7, 8)):
        out = tmp_path / f"{seed}.png"
        argv = ["--smoke", "--upstream", patched_upstream, "--device", "cpu", "--prompt", "a red fox"]
        code, _, err = run_cli(*argv, "--seed", seed, "--steps", 2, "--height", 16, "--width", 16, "--output", out)
        assert code == 0, err
        pictures = [Image.open(io.BytesIO(served_images[index])), Image.open(out)]
        assert_images_equal_up_to_rounding(*pictures, what=f"seed {seed}")  # PNG: lossless, another process
    assert served_images[0] != served_images[1]


def test_jpeg_output_equals_inference_py_writing_a_jpg(client, run_cli, patched_upstream, tmp_path):
    answer = client.images.generate(prompt="a red fox", output_format="jpeg", extra_body={"seed": 4})
    argv = ["--smoke", "--upstream", patched_upstream, "--device", "cpu", "--prompt", "a red fox", "--seed", 4]
    code, _, err = run_cli(*argv, "--output", tmp_path / "x.jpg")
    assert code == 0, err
    served_jpeg = base64.b64decode(answer.data[0].b64_json)
    assert_jpegs_equal_up_to_rounding(served_jpeg, (tmp_path / "x.jpg").read_bytes(), what="seed 4")
    by_url = client.images.generate(prompt="a red fox", output_format="jpeg", response_format="url",
                                    extra_body={"seed": 4})  # fmt: skip
    assert by_url.data[0].url.endswith("/0.jpg")
    by_url_jpeg = urllib.request.urlopen(by_url.data[0].url, timeout=30).read()  # a second job: its own run
    assert_jpegs_equal_up_to_rounding(by_url_jpeg, served_jpeg, what="the url answer")


def test_url_answers_serve_the_same_file(client):
    first = client.images.generate(prompt="a lighthouse", extra_body={"seed": 3})
    by_url = client.images.generate(prompt="a lighthouse", response_format="url", extra_body={"seed": 3})
    assert by_url.data[0].url.startswith("http://127.0.0.1:")
    pictures = [urllib.request.urlopen(by_url.data[0].url, timeout=30).read(), base64.b64decode(first.data[0].b64_json)]
    assert_images_equal_up_to_rounding(*(Image.open(io.BytesIO(data)) for data in pictures), what="two runs, one seed")


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"prompt": "x", "size": "13x16"}, "--width 13 is not supported"),
        ({"prompt": "x", "size": "big"}, "write it as WIDTHxHEIGHT"),
        ({"prompt": "  "}, "prompt is required"),
        ({"prompt": "x", "n": 11}, "ask for 1 to 10 images"),
        ({"prompt": "x", "response_format": "gif"}, "use b64_json or url"),
        ({"prompt": "x", "output_format": "gif"}, "use png or jpeg"),
        ({"prompt": "x", "steps": 0}, "steps 0: need at least 1"),
    ],
)
def test_bad_requests_are_400_with_the_clis_message(client, body, says):
    prompt, extra = body.pop("prompt"), dict(body)
    with pytest.raises(openai.BadRequestError) as refused:
        client.images.generate(prompt=prompt, extra_body=extra)
    assert says in refused.value.body["message"] and refused.value.body["type"] == "invalid_request_error"


def test_models_and_health(server, client):
    assert [model.id for model in client.models.list()] == ["BAAI/URSA-1.7B-IBQ512"]
    assert urllib.request.urlopen(server.url + "ready", timeout=30).status == 200


def test_start_up_fails_before_serving_like_inference(tmp_path):
    done = start_app_until_exit(SERVE, "--weights", "/nonexistent/URSA", "--jobs", tmp_path / "jobs")
    assert_refused_before_serving(done, ExitCode.WEIGHTS, "/nonexistent/URSA", tmp_path / "jobs")
