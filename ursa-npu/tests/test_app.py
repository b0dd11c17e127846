"""ursa-npu/app.py in a real browser: the smoke model served, a request made, the image on the page is the file
the app wrote; a bad size is a message on the page; start-up failures are inference.py's errors and exit codes."""

from __future__ import annotations

import os
import sys
import urllib.request
from pathlib import Path

import pytest

from deliverykit.errors import ExitCode
from deliverykit.testing import (
    assert_refused_before_serving,
    headless_chromium,
    save_screenshot,
    served,
    start_app_until_exit,
)

pytest.importorskip("gradio", reason="gradio is not installed: pip install -r ursa-npu/requirements-app.txt")
APP = Path(__file__).resolve().parents[1] / "app.py"


@pytest.mark.parametrize(
    ("argv", "code", "says"),
    [
        ((), ExitCode.USAGE, "pass --weights DIR"),
        (("--weights", "/nonexistent/URSA"), ExitCode.WEIGHTS, "/nonexistent/URSA"),
    ],
)
def test_start_up_fails_before_serving_like_inference(tmp_path, argv, code, says):
    done = start_app_until_exit(APP, *argv, "--output", tmp_path / "out")
    assert_refused_before_serving(done, code, says, tmp_path / "out")


def test_start_up_without_an_upstream_checkout_is_exit_3(tmp_path):
    env = {key: value for key, value in os.environ.items() if key != "URSA_SRC"}
    done = start_app_until_exit(APP, "--smoke", "--output", tmp_path / "out", env=env)
    assert_refused_before_serving(done, ExitCode.INPUT, "URSA_SRC", tmp_path / "out")


def test_browser_makes_an_image_and_shows_a_bad_size(tmp_path, patched_upstream):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser = headless_chromium()
    out = tmp_path / "out"
    command = [sys.executable, str(APP), "--smoke", "tiny512", "--upstream", str(patched_upstream), "--device", "cpu"]
    command += ["--port", "0", "--output", str(out)]
    env = {"GRADIO_TEMP_DIR": str(tmp_path / "gradio"), "HF_HOME": str(tmp_path / "hf")}
    try:
        with served(command, env=env) as app:
            url, log = app.url, app.lines
            browser.get(url)
            WebDriverWait(browser, 60).until(lambda b: b.find_elements(By.CSS_SELECTOR, "#generate"))
            browser.find_element(By.CSS_SELECTOR, "#generate").click()
            image = WebDriverWait(browser, 180).until(lambda b: b.find_elements(By.CSS_SELECTOR, "#image img"))[0]
            shown = urllib.request.urlopen(image.get_attribute("src"), timeout=30).read()
            report = browser.find_element(By.CSS_SELECTOR, "#report a").get_attribute("href")
            save_screenshot(browser, tmp_path, "ursa-npu-app.png")
            (folder,) = out.iterdir()
            assert shown == (folder / "image.jpg").read_bytes() and shown[:2] == b"\xff\xd8"  # the JPEG it wrote
            assert urllib.request.urlopen(report, timeout=30).read() == (folder / "report.json").read_bytes()

            width = browser.find_element(By.CSS_SELECTOR, "#width input")
            width.clear()
            width.send_keys("500")  # not a multiple of the VQ stride
            browser.find_element(By.CSS_SELECTOR, "#generate").click()
            WebDriverWait(browser, 60).until(lambda b: "error: " in b.find_element(By.TAG_NAME, "body").text)
            message = browser.find_element(By.TAG_NAME, "body").text
            save_screenshot(browser, tmp_path, "ursa-npu-app-error.png")
            assert "error: --width 500 is not supported: the VQ model needs a multiple of its stride" in message
            assert list(out.iterdir()) == [folder]  # the refused request wrote nothing
            assert not [line for line in log if "Traceback" in line]
    finally:
        browser.quit()
