"""sulphur2-npu/app.py in a real browser: the tiny model served, a text → video and an image → video request made,
the video on the page is the mp4 the app wrote (with its audio track); a bad size is a message on the page; started
with ``--pipeline a2v``, an uploaded sound track is the video's, with ``--pipeline retake`` an uploaded video is
retaken; start-up failures are inference.py's errors and exit codes."""

from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path

import av
import pytest
from PIL import Image

from deliverykit.errors import ExitCode
from deliverykit.testing import (
    assert_refused_before_serving,
    attribute_when,
    headless_chromium,
    save_screenshot,
    served,
    sine_wav,
    start_app_until_exit,
)

pytest.importorskip("gradio", reason="gradio is not installed: pip install -r sulphur2-npu/requirements-app.txt")
APP = Path(__file__).resolve().parents[1] / "app.py"


@pytest.mark.parametrize(
    ("argv", "code", "says"),
    [
        ((), ExitCode.USAGE, "pass --model FILE and --text-encoder DIR, or --smoke"),
        # inference.py's answer to the same flags (exit 3, the Gemma folder named): checked before any weights
        (("--model", "/nonexistent/s.safetensors", "--text-encoder", "/nonexistent/gemma"), ExitCode.INPUT, "gemma"),
        (("--smoke", "--memory", "group-offload", "--device", "cpu"), ExitCode.USAGE, "frees Gemma-3"),
    ],
)
def test_start_up_fails_before_serving_like_inference(tmp_path, argv, code, says):
    done = start_app_until_exit(APP, *argv, "--output", tmp_path / "out")
    assert_refused_before_serving(done, code, says, tmp_path / "out")


def test_browser_makes_videos_and_shows_a_bad_size(tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser = headless_chromium(height=1100)
    out = tmp_path / "out"
    command = [sys.executable, str(APP), "--smoke", "--device", "cpu", "--port", "0", "--output", str(out)]

    shown: list[str] = []  # the video URLs the page showed, one per request

    def generate_and_wait(count: int) -> Path:
        browser.find_element(By.CSS_SELECTOR, "#generate").click()
        WebDriverWait(browser, 180).until(lambda b: len(list(out.glob("*/report.json"))) == count)
        (folder,) = sorted(out.iterdir(), key=lambda f: f.stat().st_mtime)[-1:]
        # the previous request's player stays on the page until gradio replaces it: wait for a new URL
        src = attribute_when(browser, "#video video", "src", lambda s: "video.mp4" in s and s not in shown)
        shown.append(src)
        served = urllib.request.urlopen(src, timeout=30).read()
        assert served == (folder / "video.mp4").read_bytes()  # the page shows the file the app wrote
        with av.open(str(folder / "video.mp4")) as container:
            assert container.streams.video and container.streams.audio  # mp4 with its audio track
        return folder

    try:
        with served(command, env={"GRADIO_TEMP_DIR": str(tmp_path / "gradio")}) as app:
            url, log = app.url, app.lines
            browser.get(url)
            WebDriverWait(browser, 60).until(lambda b: b.find_elements(By.CSS_SELECTOR, "#generate"))
            text_folder = generate_and_wait(1)
            inputs = json.loads((text_folder / "report.json").read_text())["inputs"]
            assert (inputs["pipeline"], inputs["width"]) == ("distilled", 128)  # ltx-pipelines' default, two stages
            browser.execute_script("window.scrollTo(0, 0)")
            save_screenshot(browser, tmp_path, "sulphur2-npu-app.png")

            first = tmp_path / "first.png"
            Image.new("RGB", (96, 64), (200, 40, 40)).save(first)
            browser.find_element(By.CSS_SELECTOR, "#first input[type=file]").send_keys(str(first))
            image_folder = generate_and_wait(2)
            assert image_folder != text_folder

            width = browser.find_element(By.CSS_SELECTOR, "#width input")
            width.clear()
            width.send_keys("100")  # not a multiple of 32
            browser.find_element(By.CSS_SELECTOR, "#generate").click()
            WebDriverWait(browser, 60).until(lambda b: "error: " in b.find_element(By.TAG_NAME, "body").text)
            assert "100" in browser.find_element(By.TAG_NAME, "body").text
            assert len(list(out.iterdir())) == 2  # the refused request wrote nothing
            assert not [line for line in log if "Traceback" in line]
    finally:
        browser.quit()


def _made_from_an_upload(tmp_path: Path, pipeline: str, field: str, upload: Path, shown: str) -> Path:
    """The folder of the one video the page, started with ``--pipeline pipeline``, makes once ``upload`` is given to
    its ``#field`` input and shown there (``shown``: the element that appears); no traceback in the app's output."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser = headless_chromium(height=1300)
    out = tmp_path / "out"
    command = [sys.executable, str(APP), "--smoke", "--device", "cpu", "--pipeline", pipeline, "--port", "0"]
    try:
        with served([*command, "--output", str(out)], env={"GRADIO_TEMP_DIR": str(tmp_path / "gradio")}) as app:
            browser.get(app.url)
            selector = f"#{field} input[type=file]"
            WebDriverWait(browser, 60).until(lambda b: b.find_elements(By.CSS_SELECTOR, selector))
            browser.find_element(By.CSS_SELECTOR, selector).send_keys(str(upload))
            WebDriverWait(browser, 60).until(lambda b: b.find_elements(By.CSS_SELECTOR, shown))
            browser.find_element(By.CSS_SELECTOR, "#generate").click()
            WebDriverWait(browser, 180).until(lambda b: list(out.glob("*/report.json")))
            assert not [line for line in app.lines if "Traceback" in line]
    finally:
        browser.quit()
    (folder,) = out.iterdir()
    return folder


def test_browser_makes_a_video_to_an_uploaded_sound_track(tmp_path):
    """Started with ``--pipeline a2v``, the page takes a sound track: the mp4 it shows keeps that file's sound."""
    sound = sine_wav(tmp_path / "tone.wav", 0.5)
    folder = _made_from_an_upload(tmp_path, "a2v", "sound", sound, "#sound audio, #sound wave")
    inputs = json.loads((folder / "report.json").read_text())["inputs"]
    assert inputs["pipeline"] == "a2v" and inputs["audio"]["sample_rate"] == 16_000
    with av.open(str(folder / "video.mp4")) as container:
        assert container.streams.audio[0].rate == 16_000  # the uploaded file's sound, not the vocoder's


def test_browser_retakes_an_uploaded_video(tmp_path):
    """Started with ``--pipeline retake``, the page takes a video and a span: the mp4 it writes has the source's size
    and length, and its report names the span."""
    from sulphur2_npu.tiny import smoke_frames
    from sulphur2_npu.video_io import write_mp4

    source = tmp_path / "source.mp4"
    write_mp4(source, smoke_frames(64, 96, 9).numpy() / 255.0, None, 0, fps=24)  # portrait: not the page's default
    folder = _made_from_an_upload(tmp_path, "retake", "source", source, "#source video")
    inputs = json.loads((folder / "report.json").read_text())["inputs"]
    assert inputs["mode"] == "retake" and (inputs["retake"]["start"], inputs["retake"]["end"]) == (0.1, 0.25)
    with av.open(str(folder / "video.mp4")) as container:
        stream = container.streams.video[0]
        assert (stream.width, stream.height, sum(1 for _ in container.decode(stream))) == (64, 96, 9)
