"""trellis2-npu/app.py in a real browser (needs TRELLIS2_SRC): the tiny models served, the default image made into
an asset, the GLB in the 3D viewer and the downloads are the files the app wrote; an RGB photo on the smoke models is
a message on the page, and with "Use the image whole" ticked it is made into an asset; start-up failures are
inference.py's errors and exit codes."""

from __future__ import annotations

import os
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from PIL import Image

from deliverykit.errors import ExitCode
from deliverykit.testing import (
    assert_refused_before_serving,
    headless_chromium,
    running_app,
    save_screenshot,
    start_app_until_exit,
)

pytest.importorskip("gradio", reason="gradio is not installed: pip install -r trellis2-npu/requirements-app.txt")
APP = Path(__file__).resolve().parents[1] / "app.py"


@pytest.mark.parametrize(
    ("argv", "code", "says"),
    [
        ((), ExitCode.USAGE, "pass --weights DIR"),
        (("--smoke", "--texture-size", "1000"), ExitCode.USAGE, "texture"),  # inference.py's export check
        (("--weights", "/nonexistent/TRELLIS.2-4B", "--upstream", "UPSTREAM"), ExitCode.WEIGHTS, "pipeline.json"),
        (
            ("--smoke", "--upstream", "UPSTREAM", "--rembg-model", "/nonexistent/BiRefNet"),
            ExitCode.WEIGHTS,
            "--rembg-model /nonexistent/BiRefNet: no folder",
        ),
    ],
)
def test_start_up_fails_before_serving_like_inference(tmp_path, request, argv, code, says):
    if "UPSTREAM" in argv:  # only these cases get as far as the checkout (TRELLIS2_SRC); the others run everywhere
        argv = [str(request.getfixturevalue("patched")) if arg == "UPSTREAM" else arg for arg in argv]
    done = start_app_until_exit(APP, *argv, "--output", tmp_path / "out")
    assert_refused_before_serving(done, code, says, tmp_path / "out")


def test_start_up_without_an_upstream_checkout_is_exit_3(tmp_path):
    env = {key: value for key, value in os.environ.items() if key != "TRELLIS2_SRC"}
    done = start_app_until_exit(APP, "--smoke", "--output", tmp_path / "out", env=env)
    assert_refused_before_serving(done, ExitCode.INPUT, "TRELLIS2_SRC", tmp_path / "out")


def test_browser_makes_an_asset_and_refuses_an_rgb_photo(tmp_path, patched):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser = headless_chromium(height=900)
    out = tmp_path / "out"
    command = [sys.executable, str(APP), "--smoke", "--upstream", str(patched), "--device", "cpu"]
    command += ["--port", "0", "--output", str(out), "--no-remesh"]  # the page's flow; the remesh costs ~25 s here
    try:
        with running_app(command, env={"GRADIO_TEMP_DIR": str(tmp_path / "gradio")}) as (url, log):
            browser.get(url)
            WebDriverWait(browser, 60).until(lambda b: b.find_elements(By.CSS_SELECTOR, "#generate"))
            browser.find_element(By.CSS_SELECTOR, "#generate").click()
            links = WebDriverWait(browser, 600).until(lambda b: b.find_elements(By.CSS_SELECTOR, "#files a"))
            (folder,) = out.iterdir()
            assert sorted(p.name for p in folder.iterdir()) == sorted(
                ["asset.glb", "mesh.ply", "preview.mp4", "preview.png", "report.json", "voxels.safetensors"]
            )
            served = {
                Path(a.get_attribute("href")).name: urllib.request.urlopen(a.get_attribute("href")).read()
                for a in links
            }
            assert served == {name: (folder / name).read_bytes() for name in ("asset.glb", "mesh.ply")}
            assert served["asset.glb"][:4] == b"glTF"
            assert browser.find_elements(By.CSS_SELECTOR, "#model canvas")  # the 3D viewer holds the GLB
            assert browser.find_elements(By.CSS_SELECTOR, "#video video")  # and the player the turntable
            time.sleep(2)  # let the viewer draw the GLB before the picture is taken (nothing is timed here)
            save_screenshot(browser, tmp_path, "trellis2-npu-app.png")

            photo = tmp_path / "photo.jpg"
            Image.new("RGB", (64, 64), (90, 140, 200)).save(photo)
            browser.find_element(By.CSS_SELECTOR, "#image button[aria-label='Remove Image']").click()
            browser.find_element(By.CSS_SELECTOR, "#image input[type=file]").send_keys(str(photo))
            browser.find_element(By.CSS_SELECTOR, "#generate").click()
            WebDriverWait(browser, 60).until(lambda b: "error: " in b.find_element(By.TAG_NAME, "body").text)
            page = browser.find_element(By.TAG_NAME, "body").text
            assert "the image has no alpha channel" in page and '"Use the image whole" (--no-rembg)' in page
            assert list(out.iterdir()) == [folder]  # the refused request wrote nothing

            browser.find_element(By.CSS_SELECTOR, "#whole input[type=checkbox]").click()  # --no-rembg on the page
            browser.find_element(By.CSS_SELECTOR, "#generate").click()
            WebDriverWait(browser, 600).until(lambda b: len(list(out.iterdir())) == 2)
            (whole,) = set(out.iterdir()) - {folder}
            six = sorted(["asset.glb", "mesh.ply", "preview.mp4", "preview.png", "report.json", "voxels.safetensors"])
            WebDriverWait(browser, 60).until(lambda b: sorted(p.name for p in whole.iterdir()) == six)
            assert not [line for line in log if "Traceback" in line]
    finally:
        browser.quit()
