"""sulphur2-npu/serve.py on the smoke model, driven by the official ``openai`` client on 127.0.0.1: its videos are
``inference.py``'s with the same seed (text → video and image → video, frames equal up to rounding), the thumbnail
is the first frame, a bad request is a 400 with the CLI's message, and start-up refuses what the server cannot do.
The job machinery (queue, kill -9, SIGTERM, the other error codes) is tested on a stand-in in
``shared/tests/test_server.py``."""

from __future__ import annotations

import base64
import io
import signal
import sys
import time
from pathlib import Path

import av
import pytest
from PIL import Image

from deliverykit.errors import ExitCode
from deliverykit.jobs import JobStore
from deliverykit.testing import (
    assert_images_equal_up_to_rounding,
    assert_refused_before_serving,
    header_only_png,
    served,
    sine_wav,
    start_app_until_exit,
)

openai = pytest.importorskip("openai", reason="the openai client is missing: pip install -r ci/requirements-dev.txt")
pytest.importorskip("fastapi", reason="fastapi is not installed: pip install -r sulphur2-npu/requirements-app.txt")
SERVE = Path(__file__).resolve().parents[1] / "serve.py"
pytestmark = pytest.mark.filterwarnings("ignore:The Sora API:DeprecationWarning")  # the client's note, not ours


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    jobs = tmp_path_factory.mktemp("jobs")
    with served([sys.executable, SERVE, "--smoke", "--device", "cpu", "--port", 0, "--jobs", jobs]) as running:
        running.jobs = jobs
        yield running
        assert running.stop() == 0


def png(colour: tuple[int, int, int]) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (128, 64), colour).save(buffer, format="PNG")
    return buffer.getvalue()


def data_url(image: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(image).decode()


RED_PNG = png((200, 40, 10))
RED_URL = data_url(RED_PNG)


def pipeline_server(tmp_path_factory, pipeline: str):
    """A smoke server started with ``--pipeline pipeline`` (its jobs folder as ``.jobs``), stopped cleanly after."""
    jobs = tmp_path_factory.mktemp(f"{pipeline}-jobs")
    command = [sys.executable, SERVE, "--smoke", "--device", "cpu", "--pipeline", pipeline, "--port", 0]
    with served([*command, "--jobs", jobs]) as running:
        running.jobs = jobs
        yield running
        assert running.stop() == 0


@pytest.fixture(scope="module")
def keyframes_server(tmp_path_factory):
    yield from pipeline_server(tmp_path_factory, "keyframes")


@pytest.fixture(scope="module")
def a2v_server(tmp_path_factory):
    yield from pipeline_server(tmp_path_factory, "a2v")


@pytest.fixture(scope="module")
def retake_server(tmp_path_factory):
    yield from pipeline_server(tmp_path_factory, "retake")


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "v1", api_key="unused", max_retries=0)


def made(client, **create) -> str:
    """The id of a completed video job (the test fails on a failed one)."""
    video = client.videos.create(**create)
    deadline = time.monotonic() + 300
    while video.status in ("queued", "in_progress") and time.monotonic() < deadline:
        time.sleep(0.2)
        video = client.videos.retrieve(video.id)
    assert video.status == "completed", video
    return video.id


def same_video(server, video_id: str, made_here: Path) -> None:
    """The served video is ``inference.py``'s: its first and last frames (PNG, straight from the float video) equal
    up to rounding in another process, as many frames in the mp4, and the thumbnail is the first frame. The mp4's
    bytes are not compared: x264 turns a one-level change of a pixel into other motion choices."""
    client = openai.OpenAI(base_url=server.url + "v1", api_key="unused", max_retries=0)
    folder = server.jobs / video_id / "video"
    for served_frame, own in (("video_first.png", "_first.png"), ("video_last.png", "_last.png")):
        pictures = [Image.open(path) for path in (folder / served_frame, made_here.with_name(made_here.stem + own))]
        assert_images_equal_up_to_rounding(*pictures, what=own)
    thumbnail = client.videos.download_content(video_id, variant="thumbnail").read()
    assert thumbnail == (folder / "video_first.png").read_bytes()
    counts = [frame_count(client.videos.download_content(video_id).read()), frame_count(made_here.read_bytes())]
    assert counts[0] == counts[1] == 9


def frame_count(mp4: bytes) -> int:
    with av.open(io.BytesIO(mp4)) as container:
        return sum(1 for _ in container.decode(video=0))


def test_text_to_video_equals_inference_py_with_the_same_seed(server, client, run_cli, tmp_path):
    video_id = made(client, prompt="a red fox runs through snow", extra_body={"seed": 5})
    code, _, err = run_cli("--smoke", "--device", "cpu", "--seed", 5, "--output", tmp_path / "x.mp4")
    assert code == 0, err
    same_video(server, video_id, tmp_path / "x.mp4")
    video = client.videos.retrieve(video_id)
    assert (video.size, video.model, video.progress) == ("128x64", "SulphurAI/Sulphur-2-base", 100)


def test_image_to_video_takes_the_input_reference_as_its_first_frame(server, client, run_cli, tmp_path):
    picture = tmp_path / "first.png"
    Image.new("RGB", (96, 64), (200, 40, 10)).save(picture)
    upload = ("first.png", picture.read_bytes(), "image/png")
    video_id = made(client, prompt="a red fox", input_reference=upload, size="128x64", extra_body={"seed": 9})
    argv = ["--smoke", "--device", "cpu", "--seed", 9, "--prompt", "a red fox", "--image", picture]
    code, _, err = run_cli(*argv, "--output", tmp_path / "i2v.mp4")
    assert code == 0, err
    same_video(server, video_id, tmp_path / "i2v.mp4")


def test_a_request_may_ask_for_one_stage(server, client, run_cli, tmp_path):
    """The server runs ltx-pipelines' distilled two-stage pipeline; ``pipeline: one-stage`` (an extra field, as a
    ``--batch`` line) runs one call at 96x64, which two stages cannot make, with the run's (distilled) schedule."""
    video_id = made(client, prompt="a red fox", size="96x64", extra_body={"seed": 4, "pipeline": "one-stage"})
    argv = ["--smoke", "--device", "cpu", "--seed", 4, "--prompt", "a red fox", "--pipeline", "one-stage"]
    argv += ["--schedule", "distilled"]
    code, _, err = run_cli(*argv, "--output", tmp_path / "one.mp4")
    assert code == 0, err
    same_video(server, video_id, tmp_path / "one.mp4")
    assert client.videos.retrieve(video_id).size == "96x64"


def test_keyframes_come_inline_as_data_urls_and_make_inference_pys_video(keyframes_server, run_cli, tmp_path):
    """A server started with ``--pipeline keyframes`` takes the ``--keyframe`` values with data-URL images (JSON body:
    a list): the video is ``inference.py``'s from the same images in files; the images stay in the job's folder."""
    first, last = tmp_path / "first.png", tmp_path / "last.png"
    first.write_bytes(RED_PNG)
    last.write_bytes(png((10, 40, 200)))
    client = openai.OpenAI(base_url=keyframes_server.url + "v1", api_key="unused", max_retries=0)
    keyframes = [f"{RED_URL}:0", f"{data_url(last.read_bytes())}:8:0.9"]
    video_id = made(client, prompt="a red fox", extra_body={"seed": 6, "keyframes": keyframes})
    argv = ["--smoke", "--device", "cpu", "--seed", 6, "--prompt", "a red fox", "--pipeline", "keyframes"]
    argv += ["--keyframe", f"{first}:0", "--keyframe", f"{last}:8:0.9"]
    code, _, err = run_cli(*argv, "--output", tmp_path / "keyframes.mp4")
    assert code == 0, err
    same_video(keyframes_server, video_id, tmp_path / "keyframes.mp4")
    assert (keyframes_server.jobs / video_id / "keyframe_1").read_bytes() == last.read_bytes()
    with pytest.raises(openai.BadRequestError) as refused:
        client.videos.create(prompt="a red fox", extra_body={"keyframes": [data_url(b"not an image") + ":0"]})
    assert "keyframes[0] is not a readable image" in refused.value.body["message"]


def test_a_sound_track_comes_inline_and_makes_inference_pys_video(a2v_server, run_cli, tmp_path):
    """A server started with ``--pipeline a2v`` takes the sound track as a data URL: the video (frames and the sound
    track's presence) is ``inference.py --audio``'s from the same file; a track shorter than the video is a 400."""
    sound = sine_wav(tmp_path / "tone.wav", 0.5)
    client = openai.OpenAI(base_url=a2v_server.url + "v1", api_key="unused", max_retries=0)
    url = "data:audio/wav;base64," + base64.b64encode(sound.read_bytes()).decode()
    video_id = made(client, prompt="a red fox", extra_body={"seed": 3, "audio": url})
    argv = ["--smoke", "--device", "cpu", "--seed", 3, "--prompt", "a red fox", "--pipeline", "a2v", "--audio", sound]
    code, _, err = run_cli(*argv, "--output", tmp_path / "a2v.mp4")
    assert code == 0, err
    same_video(a2v_server, video_id, tmp_path / "a2v.mp4")
    with av.open(str(a2v_server.jobs / video_id / "video" / "video.mp4")) as container:
        assert container.streams.audio[0].rate == 16_000  # the file's sound, at its rate
    short = base64.b64encode(sine_wav(tmp_path / "short.wav", 0.1).read_bytes()).decode()
    with pytest.raises(openai.BadRequestError) as refused:
        client.videos.create(prompt="a red fox", extra_body={"audio": f"data:audio/wav;base64,{short}"})
    assert "audio lasts 0.10 s; the video lasts 0.38 s" in refused.value.body["message"]


def test_a_retake_source_comes_inline_and_makes_inference_pys_video(retake_server, run_cli, tmp_path):
    """A server started with ``--pipeline retake`` takes the source video as a data URL and the span as extra fields:
    the video is ``inference.py --video``'s from the same file; a source it cannot retake is a 400 naming the field."""
    from sulphur2_npu.tiny import TINY_PRESET, smoke_frames
    from sulphur2_npu.video_io import write_mp4

    def mp4_url(path: Path, frames: int) -> str:
        write_mp4(path, smoke_frames(TINY_PRESET.width, TINY_PRESET.height, frames).numpy() / 255.0, None, 0, fps=24)
        return "data:video/mp4;base64," + base64.b64encode(path.read_bytes()).decode()

    source = mp4_url(tmp_path / "source.mp4", 9)
    client = openai.OpenAI(base_url=retake_server.url + "v1", api_key="unused", max_retries=0)
    span = {"retake_start": 0.1, "retake_end": 0.25}
    video_id = made(client, prompt="a red fox", extra_body={"seed": 3, "video": source, **span})
    argv = ["--smoke", "--device", "cpu", "--seed", 3, "--prompt", "a red fox", "--pipeline", "retake"]
    span_flags = ["--retake-start", 0.1, "--retake-end", 0.25]
    code, _, err = run_cli(*argv, "--video", tmp_path / "source.mp4", *span_flags, "--output", tmp_path / "retake.mp4")
    assert code == 0, err
    same_video(retake_server, video_id, tmp_path / "retake.mp4")
    with pytest.raises(openai.BadRequestError) as refused:
        client.videos.create(prompt="a red fox", extra_body={"video": mp4_url(tmp_path / "ten.mp4", 10), **span})
    assert refused.value.body["message"].startswith("video is 96x64, 10 frames: a retake needs")


def test_seconds_and_fps_give_the_frame_count(client):
    """``seconds * fps + 1`` frames, as LTX counts them (8k + 1): 2 s at 4 fps is 9 frames."""
    video_id = made(client, prompt="a red fox", seconds="2", extra_body={"fps": 4, "seed": 1})
    assert client.videos.retrieve(video_id).seconds == "2"
    assert frame_count(client.videos.download_content(video_id).read()) == 9


@pytest.mark.parametrize(
    ("create", "says"),
    [
        ({"size": "100x64"}, "--width 100 is not a positive multiple of 64 (nearest valid: 64 or 128)"),
        ({"seconds": "1", "extra_body": {"fps": 5}}, "frames"),
        ({"extra_body": {"colour": "red"}}, "unknown field 'colour'; accepted: prompt"),
        ({"extra_body": {"seed": "soon"}}, "seed must be int"),
        ({"extra_body": {"audio": "/etc/hostname"}}, "audio: send the file inline as data:audio/wav;base64,"),
        ({"extra_body": {"audio": "data:audio/wav;base64,UklGRg=="}}, "--audio is for the a2v pipeline, not distill"),
        (
            {"extra_body": {"keyframes": ["/etc/hostname:0"]}},
            "keyframes[0]: send the file inline as data:image/png;base64,",
        ),
        ({"extra_body": {"keyframes": ["data:image/png;base64,@@:0"]}}, "keyframes[0] is not base64"),
        ({"extra_body": {"keyframes": [f"{RED_URL}:0"]}}, "is for the keyframes pipeline, not distilled"),
        (  # a form sends the list as keyframes[] fields
            {"input_reference": ("f.png", RED_PNG, "image/png"), "extra_body": {"keyframes": [f"{RED_URL}:0"]}},
            "with keyframes give it as a keyframe at frame 0",
        ),
        ({"input_reference": ("f.png", b"not an image", "image/png")}, "input_reference is not a readable image"),
    ],
)
def test_bad_requests_are_400_with_the_clis_message(client, create, says):
    with pytest.raises(openai.BadRequestError) as refused:
        client.videos.create(prompt="a red fox", **create)
    assert says in refused.value.body["message"] and "/tmp" not in refused.value.body["message"]


def test_a_decompression_bomb_is_refused_before_it_is_queued(client, tmp_path):
    bomb = header_only_png(tmp_path / "bomb.png", 40000, 40000).read_bytes()
    before = len(client.videos.list(limit=100).data)
    with pytest.raises(openai.BadRequestError, match="1,600,000,000 pixels"):
        client.videos.create(prompt="a red fox", input_reference=("bomb.png", bomb, "image/png"))
    assert len(client.videos.list(limit=100).data) == before


def test_an_unknown_video_is_404(client):
    with pytest.raises(openai.NotFoundError):
        client.videos.retrieve("video_" + "0" * 32)


@pytest.mark.parametrize(
    ("argv", "code", "says"),
    [
        (("--smoke", "--memory", "group-offload"), ExitCode.USAGE, "frees Gemma-3 after the first prompt"),
        (("--smoke", "--host", "0.0.0.0"), ExitCode.USAGE, "pass --api-key-env NAME"),
        (("--model", "/nonexistent/s.safetensors", "--text-encoder", "/nonexistent/gemma"), ExitCode.INPUT, "Gemma"),
    ],
)
def test_start_up_refuses_before_serving(tmp_path, argv, code, says):
    done = start_app_until_exit(SERVE, *argv, "--device", "cpu", "--jobs", tmp_path / "jobs")
    assert_refused_before_serving(done, code, says, tmp_path / "jobs")


def test_a_job_survives_kill_9_of_the_server(tmp_path):
    """The server killed while it makes a video; restarted on the same --jobs, it makes the video again."""
    command = [sys.executable, SERVE, "--smoke", "--device", "cpu", "--port", 0, "--jobs", tmp_path]
    with served(command) as server:
        client = openai.OpenAI(base_url=server.url + "v1", api_key="unused", max_retries=0)
        video = client.videos.create(prompt="a red fox", extra_body={"num_frames": 97, "seed": 3})
        while (status := client.videos.retrieve(video.id).status) == "queued":
            time.sleep(0.05)
        assert status == "in_progress"  # 97 frames take seconds here: the kill lands mid-job
        assert server.stop(signal.SIGKILL) == -signal.SIGKILL
    with served(command) as server:
        client = openai.OpenAI(base_url=server.url + "v1", api_key="unused", max_retries=0)
        made_again = client.videos.retrieve(video.id)
        assert made_again.status in ("queued", "in_progress", "completed")
        deadline = time.monotonic() + 300
        while made_again.status != "completed" and time.monotonic() < deadline:
            time.sleep(0.2)
            made_again = client.videos.retrieve(video.id)
        assert made_again.status == "completed", made_again
        assert frame_count(client.videos.download_content(video.id).read()) == 97
    assert JobStore(tmp_path).get(video.id).attempts == 2  # claimed by the killed server, then by the new one
