"""deliverykit.app and the browser harness, on a small app (tests/data/shout_app.py) driven by headless Chromium.

The same harness drives each delivery's app.py; this file proves it on an app whose output is known exactly.
"""

from __future__ import annotations

import sys
import urllib.request
from pathlib import Path

import pytest

from deliverykit import app, testing
from deliverykit.errors import ExitCode, InputError

gr = pytest.importorskip("gradio", reason="gradio is not installed: pip install -r <delivery>/requirements-app.txt")
SHOUT_APP = Path(__file__).with_name("data") / "shout_app.py"


def test_request_folders_are_new_and_not_created(tmp_path):
    first, second = app.request_folder(tmp_path), app.request_folder(tmp_path)
    assert first != second and first.parent == tmp_path and not first.exists()
    assert sorted([second.name, first.name])[0][:15] == first.name[:15]  # time-ordered names (to the second)


def test_app_argv_falls_back_to_the_studio_variable(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["app.py"])
    monkeypatch.setenv(app.APP_ARGS_ENV, "--smoke --host 0.0.0.0 --output 'my outputs'")
    assert app.app_argv() == ["--smoke", "--host", "0.0.0.0", "--output", "my outputs"]
    assert app.app_argv(["--port", "1"]) == ["--port", "1"]
    monkeypatch.setattr(sys, "argv", ["app.py", "--weights", "w"])
    assert app.app_argv() == ["--weights", "w"]


def test_shown_on_page_keeps_the_one_line_error_and_hides_bugs():
    @app.shown_on_page
    def bad_input():
        raise InputError("image.png is not an image; pass a PNG or JPEG")

    @app.shown_on_page
    def bug():
        raise KeyError("oops")

    with pytest.raises(gr.Error) as caught:
        bad_input()
    assert caught.value.message == "error: image.png is not an image; pass a PNG or JPEG"
    with pytest.raises(gr.Error) as caught:
        bug()
    message = caught.value.message
    assert "KeyError" in message and "oops" not in message and "server log" in message


def test_a_port_in_use_is_exit_6(tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        runner = testing.CliRunner(SHOUT_APP)
        code, _, err = runner("--port", port, "--output", tmp_path / "out")
    assert code == ExitCode.OUTPUT and err.count("\n") == 1 and "pass another --port" in err
    assert not (tmp_path / "out").exists()


def test_browser_submits_shows_the_written_file_and_the_error(tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser = testing.headless_chromium()
    out = tmp_path / "out"
    command = [sys.executable, str(SHOUT_APP), "--port", "0", "--output", str(out)]
    try:
        with testing.served(command, env={"GRADIO_TEMP_DIR": str(tmp_path / "gradio")}) as app:
            url, log = app.url, app.lines
            browser.get(url)
            WebDriverWait(browser, 60).until(lambda b: b.find_elements(By.CSS_SELECTOR, "#run"))
            browser.find_element(By.CSS_SELECTOR, "#run").click()
            link = WebDriverWait(browser, 60).until(lambda b: b.find_elements(By.CSS_SELECTOR, "#result a"))[0]
            served = urllib.request.urlopen(link.get_attribute("href"), timeout=30).read()
            browser.save_screenshot(str(tmp_path / "ok.png"))
            (written,) = out.glob("*/shout.txt")
            assert served == written.read_bytes() == b"HELLO"

            box = browser.find_element(By.CSS_SELECTOR, "#text textarea")
            box.clear()
            box.send_keys(" ")
            browser.find_element(By.CSS_SELECTOR, "#run").click()
            WebDriverWait(browser, 60).until(
                lambda b: "error: the text is empty" in b.find_element(By.TAG_NAME, "body").text
            )
            browser.save_screenshot(str(tmp_path / "error.png"))
            assert len(list(out.iterdir())) == 1  # the failed request wrote nothing
            assert not [line for line in log if "Traceback" in line]
    finally:
        browser.quit()
