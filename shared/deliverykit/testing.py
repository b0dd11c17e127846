"""pytest helpers shared by the deliveries' tests: device-dependent skips, upstream checkouts, CLIs run in process.

A test that needs hardware or an upstream checkout skips with a reason that says how to run it, never silently.
``DELIVERYKIT_TEST_DEVICE`` retargets device tests (default ``cpu``); ``RUN_SLOW=1`` enables slow tests.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import pytest

from .errors import ExitCode
from .imports import load_script

__all__ = ["load_script"]  # the scripts' loader, for tests and benchmarks; the rest is imported by name

TEST_DEVICE_ENV_VAR = "DELIVERYKIT_TEST_DEVICE"


def get_test_device() -> str:
    """The device device-dependent tests run on: ``$DELIVERYKIT_TEST_DEVICE`` or ``cpu``."""
    return os.environ.get(TEST_DEVICE_ENV_VAR, "cpu")


def _npu_reason() -> str | None:
    from .device import probe_npu

    status = probe_npu()
    return None if status.available else f"needs an Ascend NPU ({status.reason})"


def require_npu(test):
    """Skip unless a usable NPU is present; marked ``device``, the tests ``deliverykit npu-check`` runs."""
    reason = _npu_reason()
    return pytest.mark.device(pytest.mark.skipif(reason is not None, reason=reason or "")(test))


def require_accelerator(test):
    """Skip unless an NPU or a CUDA device is present; marked ``device`` too."""
    from .device import probe_accelerators

    available = any(status.available for status in probe_accelerators().values())
    return pytest.mark.device(pytest.mark.skipif(not available, reason="needs an NPU or a CUDA device")(test))


def require_cards(kind: str, count: int) -> Callable:
    """Skip unless ``count`` ``kind`` devices are visible (a multi-card job: HCCL or NCCL ranks); marked ``device``."""
    from .device import probe_accelerators

    status = probe_accelerators()[kind]
    enough = status.available and status.device_count >= count
    reason = f"needs {count} {kind} devices ({status.reason})"
    return lambda test: pytest.mark.device(pytest.mark.skipif(not enough, reason=reason)(test))


def slow(test):
    """Skip unless ``RUN_SLOW=1``: long tests stay out of the default ``make test``."""
    return pytest.mark.skipif(os.environ.get("RUN_SLOW") != "1", reason="slow test; run with RUN_SLOW=1")(test)


def upstream_checkout(env_var: str, marker_file: str) -> Path:
    """The upstream checkout named by ``$env_var``, or skip the test saying how to provide one.

    ``marker_file`` is a path inside the checkout that must exist (guards against pointing at the wrong folder).
    """
    value = os.environ.get(env_var)
    if not value:
        pytest.skip(f"needs an upstream checkout: set {env_var}=/path/to/checkout (see the delivery's README)")
    path = Path(value)
    if not (path / marker_file).exists():
        pytest.fail(f"{env_var}={value} does not look like the upstream checkout ({marker_file} missing)")
    return path


class CliRunner:
    """A delivery script loaded once and run in process like ``python SCRIPT ARGS``: ``(exit code, stdout, stderr)``.

    Output is captured with redirects, not ``capsys``, so a session- or module-scoped fixture can share one run.
    ``module`` is the loaded script, for tests of its functions (``parse_args``).
    """

    def __init__(self, path: str | os.PathLike, name: str | None = None) -> None:
        path = Path(path)
        self.module = load_script(path, name or f"{path.resolve().parent.name.replace('-', '_')}_{path.stem}")

    def __call__(self, *argv: object) -> tuple[int, str, str]:
        return self.run(lambda: self.module.main([str(arg) for arg in argv]))

    @staticmethod
    def run(main: Callable[[], int]) -> tuple[int, str, str]:
        from .errors import run_main

        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = run_main(main)
        return code, out.getvalue(), err.getvalue()


class CliContract:
    """What every delivery's ``inference.py`` promises on bad input, as tests its suite inherits (a ``TestCli...``
    subclass setting the class attributes): one ``error:`` line naming the problem and the fix, the documented exit
    code, and nothing written. The bad-input cases are refused before anything loads (no weights, no upstream); two
    cases run the smoke model: an interrupt while the files are written, and a ``--batch`` rerun.

    The single run writes ``written`` (a file name under the test's folder) for ``--output output``; ``text_flag``
    is the free-text flag checked for UTF-8 (None: the delivery takes none); ``batch_line``, a good ``--batch``
    line (JSON). A delivery whose smoke run needs more flags (a patched upstream) overrides the ``run_flags``
    fixture.
    """

    inference: ClassVar[Path]
    output: ClassVar[str]
    written: ClassVar[str]
    batch_line: ClassVar[str]
    text_flag: ClassVar[str | None] = None
    smoke: ClassVar[tuple[str, ...]] = ("--smoke", "--device", "cpu")

    @pytest.fixture(scope="class")
    def cli(self) -> CliRunner:
        return CliRunner(self.inference)

    @pytest.fixture
    def run_flags(self) -> tuple:
        """What a smoke run that loads the model adds to :attr:`smoke`."""
        return ()

    def refused(self, done: tuple[int, str, str], code: int, says: str | tuple[str, ...], folder: Path,
                left: set[str]) -> None:  # fmt: skip
        """One error line containing ``says`` (after argparse's usage text, for a usage error), exit ``code``, no
        traceback, and ``folder`` holding only ``left``."""
        status, _, err = done
        errors = [line for line in err.splitlines() if line.startswith("error: ") or ": error: " in line]
        fragments = (says,) if isinstance(says, str) else says
        assert status == code and len(errors) == 1 and "Traceback" not in err, err
        assert all(fragment in errors[0] for fragment in fragments), err
        assert {p.relative_to(folder).as_posix() for p in folder.rglob("*")} == left

    def test_an_output_taken_by_a_folder_is_exit_6(self, cli: CliRunner, tmp_path: Path) -> None:
        (tmp_path / self.written).mkdir(parents=True)
        left = {Path(self.written).as_posix(), *(p.as_posix() for p in Path(self.written).parents if p.name)}
        done = cli(*self.smoke, "--output", tmp_path / self.output)
        self.refused(
            done, 6, f"{Path(self.written).name} is a folder, where this run writes a file; move it", tmp_path, left
        )

    def test_an_output_under_a_file_is_exit_6(self, cli: CliRunner, tmp_path: Path) -> None:
        (tmp_path / "file").write_text("")
        done = cli(*self.smoke, "--output", tmp_path / "file" / self.output)
        self.refused(done, ExitCode.OUTPUT, "file is a file, not a folder; choose another --output", tmp_path, {"file"})

    def test_an_unavailable_device_is_exit_5(self, cli: CliRunner, tmp_path: Path) -> None:
        done = cli("--smoke", "--device", "npu", "--output", tmp_path / self.output)
        self.refused(done, ExitCode.DEVICE, "--device npu requested but", tmp_path, set())

    def test_text_that_is_not_utf8_is_exit_2(self, tmp_path: Path) -> None:
        """Real argv bytes, as a shell with a Latin-1 locale passes them: refused while parsing."""
        if self.text_flag is None:
            pytest.skip(f"{self.inference.parent.name} takes no free text")
        argv = [
            sys.executable,
            self.inference,
            *self.smoke,
            self.text_flag,
            b"caf\xe9",
            "--output",
            tmp_path / self.output,
        ]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        says = f"{self.text_flag} is not valid UTF-8 text (byte 0xe9 at position 3); pass it in UTF-8"
        self.refused((done.returncode, done.stdout, done.stderr), ExitCode.USAGE, says, tmp_path, set())

    @pytest.mark.parametrize(
        ("bad", "says"),
        [({"colour": 1}, ("b.jsonl:2: unknown field 'colour'",)), ({"steps": 0}, ("b.jsonl:2:", "steps 0"))],
    )
    def test_a_bad_batch_line_is_exit_2_naming_its_line(
        self, cli: CliRunner, tmp_path: Path, bad: dict, says: tuple[str, ...]
    ) -> None:
        batch_file = tmp_path / "b.jsonl"
        batch_file.write_text(f"{self.batch_line}\n{json.dumps({**json.loads(self.batch_line), **bad})}\n")
        done = cli(*self.smoke, "--batch", batch_file, "--output", tmp_path / "out")
        self.refused(done, ExitCode.USAGE, says, tmp_path, {"b.jsonl"})

    def test_an_interrupt_while_writing_is_exit_130_and_leaves_nothing(
        self, cli: CliRunner, tmp_path: Path, run_flags: tuple, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Ctrl-C (KeyboardInterrupt) when the outputs are being committed: none of them appears."""
        from . import files

        def interrupted(*args: Any, **kwargs: Any) -> None:
            raise KeyboardInterrupt

        monkeypatch.setattr(files, "Commit", interrupted)
        done = cli(*self.smoke, *run_flags, "--output", tmp_path / "run" / self.output)
        self.refused(done, 130, "error: interrupted", tmp_path, set())

    def test_a_batch_rerun_makes_only_what_is_missing(self, cli: CliRunner, tmp_path: Path, run_flags: tuple) -> None:
        """A rerun of a finished batch redoes nothing; with one request's folder gone, it makes only that one."""
        batch_file, out = tmp_path / "b.jsonl", tmp_path / "out"
        batch_file.write_text(f"{self.batch_line}\n{self.batch_line}\n")
        code, _, err = cli(*self.smoke, *run_flags, "--batch", batch_file, "--output", out)
        assert code == 0, err
        first, second = (out / name / "report.json" for name in ("00000", "00001"))
        made = (first.stat().st_ino, first.stat().st_mtime_ns)  # a rewrite renames a new file onto it
        for path in second.parent.iterdir():
            path.unlink()
        second.parent.rmdir()
        code, _, err = cli(*self.smoke, *run_flags, "--batch", batch_file, "--output", out)
        assert code == 0 and (first.stat().st_ino, first.stat().st_mtime_ns) == made and second.is_file(), err
        summary = json.loads((out / "batch.json").read_text())
        assert [row["status"] for row in summary["items"]] == ["done", "done"]

    @pytest.mark.parametrize(
        ("argv", "says"),
        [
            (("--devices", "0,1"), "--devices, --overwrite, --ray and --ray-outputs go with --batch"),
            (("--overwrite",), "--devices, --overwrite, --ray and --ray-outputs go with --batch"),
            (("--ray", "auto"), "--devices, --overwrite, --ray and --ray-outputs go with --batch"),
            (("--batch", "b.jsonl", "--ray", "auto", "--devices", "0,1"), "--ray and --devices exclude each other"),
            (("--batch", "b.jsonl", "--devices", "0,0"), "listed twice"),
        ],
    )
    def test_batch_flags_that_do_not_fit_are_exit_2(
        self, cli: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, argv: tuple, says: str
    ) -> None:
        monkeypatch.chdir(tmp_path)
        (tmp_path / "b.jsonl").write_text(self.batch_line + "\n")
        done = cli(*self.smoke, *argv, "--output", tmp_path / self.output)
        self.refused(done, ExitCode.USAGE, says, tmp_path, {"b.jsonl"})


@contextlib.contextmanager
def torch_threads(count: int):
    """``torch.set_num_threads(count)`` inside the block (also above the core count, so that CPU workers or intra-op
    threads really run side by side), the caller's count restored after."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def start_app_until_exit(app: str | os.PathLike, *argv: object, env: dict | None = None, timeout: float = 300):
    """Run ``app`` (``python app.py ARGV --port 0``) expecting it to stop before serving: start-up errors."""
    import subprocess

    command = [sys.executable, str(app), *map(str, argv), "--port", "0"]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)


def assert_refused_before_serving(done, code: int, says: str, output: str | os.PathLike) -> None:
    """One ``error:`` line naming ``says``, exit ``code``, no traceback, no URL served and no output folder."""
    assert done.returncode == code, done.stderr
    assert done.stderr.count("error:") == 1 and says in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert "URL=" not in done.stdout and not Path(output).exists()


BROWSER_HINT = "apt-get install chromium chromium-driver && pip install -r ci/requirements-dev.txt (selenium)"


def headless_chromium(width: int = 1280, height: int = 760):
    """A selenium WebDriver on the system's headless Chromium and chromedriver (never a downloaded one).

    Skips, saying how to install them, where selenium, a Chromium or its driver is missing.
    """
    import shutil

    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.skip(f"selenium is not installed: {BROWSER_HINT}")
    browser = next(
        (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None
    )
    driver = shutil.which("chromedriver")
    if browser is None or driver is None:
        pytest.skip(f"no headless browser here (chromium: {browser}, chromedriver: {driver}): {BROWSER_HINT}")
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        f"--window-size={width},{height}",
    ):
        options.add_argument(argument)
    return webdriver.Chrome(service=Service(executable_path=driver), options=options)


SCREENSHOTS_ENV_VAR = "DELIVERYKIT_SCREENSHOTS"


def attribute_when(browser, selector: str, attribute: str, accept: Callable[[str], bool], timeout: float = 60) -> str:
    """The first ``selector`` element's ``attribute`` once ``accept`` takes it, the element found anew at each poll.

    A page that re-renders (gradio does on every result) replaces the element a test held: reading it again raises
    a stale-element error, so the element is never kept between polls.
    """
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    def read(b) -> str | None:
        try:
            found = b.find_elements(By.CSS_SELECTOR, selector)
            value = found[0].get_attribute(attribute) if found else None
        except StaleElementReferenceException:
            return None
        return value if value and accept(value) else None

    return WebDriverWait(browser, timeout).until(read)


def save_screenshot(browser, folder: str | os.PathLike, name: str) -> Path:
    """``browser``'s page as ``folder/name``, and also in ``$DELIVERYKIT_SCREENSHOTS`` when set: the READMEs'
    screenshots are made by running the browser tests with it (``make screenshots``)."""
    import shutil

    path = Path(folder) / name
    browser.save_screenshot(str(path))
    if os.environ.get(SCREENSHOTS_ENV_VAR):
        Path(os.environ[SCREENSHOTS_ENV_VAR]).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, Path(os.environ[SCREENSHOTS_ENV_VAR]) / name)
    return path


def pristine_copy(source: str | os.PathLike, target: str | os.PathLike, commit: str, paths: list[str]) -> Path:
    """Copy an upstream git checkout to ``target`` and reset ``paths`` to ``commit`` (undoing any local patches).

    Tests patch this copy, never the user's checkout; ``__pycache__`` folders are left behind.
    """
    import shutil
    import subprocess

    target = Path(target)
    shutil.copytree(source, target, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(["git", "-C", str(target), "checkout", "-q", "--force", commit, "--", *paths], check=True)
    return target


def ignore_tests_below_python(minimum: tuple[int, int], why: str) -> list[str]:
    """A conftest's ``collect_ignore_glob``: all its tests when this Python is older than ``minimum``, else none.

    For a delivery whose pinned stack needs a newer Python than the monorepo's floor: ``ci/setup_venv.sh`` leaves
    its requirements out there, so its tests could not even import. Says so on stderr instead of failing.
    """
    if sys.version_info >= minimum:
        return []
    print(f"not collected: {why} (this is Python {sys.version.split()[0]})", file=sys.stderr)
    return ["test_*.py"]


# Two objects that compute the same maths (a loaded pipeline and one built in memory, two processes) may run different
# kernels: which one ATen, MKL and oneDNN pick depends on the CPU (AVX2/AVX-512/AMX), the thread count and the buffers'
# alignment, and each sums in its own order. Each rounding costs at most one ulp; through a network of a few dozen
# layers they add up to tens of ulps of the output's scale (1.9e-6 of a [0, 1] frame, 16 ulps, was seen in float32 on
# AMD), while a real mapping or guidance bug moves outputs by percent. Hence 2**8 ulps of the output's peak (3e-5 in
# float32): a 16x margin over what was seen, three orders of magnitude below a bug.
REORDERING_ULPS = 2**8


def reordering_tolerance(expected: Any, dtype: Any = None, ulps: int = REORDERING_ULPS) -> float:
    """Absolute tolerance for two runs of the same maths by different kernels: ``ulps`` of ``expected``'s peak."""
    import numpy as np
    import torch

    values = expected.detach().cpu().double().numpy() if isinstance(expected, torch.Tensor) else np.asarray(expected)
    if dtype is None:
        dtype = expected.dtype if isinstance(expected, torch.Tensor) else values.dtype
    eps = torch.finfo(dtype).eps if isinstance(dtype, torch.dtype) else float(np.finfo(dtype).eps)
    peak = float(np.abs(values.astype(np.float64)).max(initial=0.0))
    return ulps * eps * max(peak, 1e-30)


def assert_equal_up_to_reordering(actual: Any, expected: Any, what: str = "", ulps: int = REORDERING_ULPS) -> None:
    """Assert two float outputs of the same maths agree to :data:`REORDERING_ULPS` ulps of the expected peak.

    For results of two different objects or processes; use exact equality where the code guarantees the same tensors.
    """
    import numpy as np
    import torch

    def as_array(x: Any) -> np.ndarray:
        return x.detach().cpu().double().numpy() if isinstance(x, torch.Tensor) else np.asarray(x, dtype=np.float64)

    got, want = as_array(actual), as_array(expected)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    tolerance = reordering_tolerance(expected, ulps=ulps)
    worst = float(np.abs(got - want).max(initial=0.0))
    assert worst <= tolerance, f"{what}: max |Δ| {worst:.3g} > {tolerance:.3g} ({ulps} ulps of the peak)"


def assert_images_equal_up_to_rounding(actual: Any, expected: Any, what: str = "") -> None:
    """Assert two uint8 images quantised from float outputs of the same maths differ by at most one level.

    A value within an ulp of a rounding boundary may land on either side when the float outputs differ by
    kernel reordering (see :data:`REORDERING_ULPS`); more than one level, or many flipped pixels, is a real change.
    """
    import numpy as np

    got, want = np.asarray(actual).astype(np.int16), np.asarray(expected).astype(np.int16)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    diff = np.abs(got - want)
    assert diff.max(initial=0) <= 1, f"{what}: {int(diff.max())} levels apart"
    assert (diff > 0).mean() <= 1e-3, f"{what}: {(diff > 0).mean():.2%} of the values moved by one level"


def assert_jpegs_equal_up_to_rounding(actual: bytes, expected: bytes, what: str = "") -> None:
    """Two JPEGs of images equal up to rounding (:func:`assert_images_equal_up_to_rounding`): JPEG's 8x8 quantisation
    can spread a one-level change over its block, a few levels in a few places, never a different picture."""
    import io

    import numpy as np
    from PIL import Image

    got, want = (np.asarray(Image.open(io.BytesIO(data))).astype(np.int16) for data in (actual, expected))
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    diff = np.abs(got - want)
    assert diff.max(initial=0) <= 16 and diff.mean() <= 0.5, f"{what}: {int(diff.max())} levels, {diff.mean():.3f}"


def sine_wav(path: str | os.PathLike, seconds: float, *, rate: int = 16_000, hz: float = 330.0) -> Path:
    """A mono 16-bit PCM WAV of a sine (amplitude a quarter of full scale), written by the standard library's
    ``wave`` (not by the media library a test checks): a sound track whose samples a test can predict."""
    import math
    import struct
    import wave

    count = round(rate * seconds)
    samples = [round(8192 * math.sin(2 * math.pi * hz * n / rate)) for n in range(count)]
    path = Path(path)
    with wave.open(str(path), "wb") as file:
        file.setnchannels(1)
        file.setsampwidth(2)
        file.setframerate(rate)
        file.writeframes(struct.pack(f"<{count}h", *samples))
    return path


def header_only_png(path: str | os.PathLike, width: int, height: int) -> Path:
    """A PNG whose header says ``width`` x ``height`` and which has no pixel data: a decompression bomb in 45 bytes.

    Pillow checks the size when it opens the file, so it never decodes; a 40000x40000 bomb costs nothing to test.
    """
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)  # 1-bit grayscale
    path = Path(path)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IEND", b""))
    return path


class Served:
    """A server process started by :func:`served` (an ``app.py`` or a ``serve.py``): its ``url``
    (``http://127.0.0.1:PORT/``) and ``lines``, its output so far (stdout and stderr together)."""

    def __init__(self, proc: subprocess.Popen, lines: list[str]) -> None:
        self.proc, self.lines, self.url = proc, lines, ""

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def stop(self, sig: int = 15, timeout: float = 120.0) -> int:
        """Send ``sig`` (SIGTERM by default) and wait for the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            pytest.fail(f"the server did not stop within {timeout:g} s after signal {sig}:\n{self.output}")


@contextlib.contextmanager
def served(command: list[Any], *, cwd: str | os.PathLike | None = None, timeout: float = 180.0, env=None):
    """Start ``command`` (a delivery's ``app.py`` or ``serve.py`` with ``--port 0``), wait for its ``URL=...`` line,
    yield :class:`Served`, stop it.

    Bounded: a server that exits or does not listen within ``timeout`` seconds fails the test with its output, and
    every server is stopped (SIGTERM, then SIGKILL) when the block ends, whatever happened in it. ``env`` is added
    to this process's environment.
    """
    import threading
    import time

    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    proc = subprocess.Popen(
        [str(part) for part in command], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    server = Served(proc, [])
    reader = threading.Thread(target=lambda: server.lines.extend(line.rstrip("\n") for line in proc.stdout))
    reader.daemon = True
    reader.start()
    deadline = time.monotonic() + timeout
    try:
        while not server.url:
            found = [line for line in list(server.lines) if line.startswith("URL=")]
            if found:
                server.url = found[0].split("=", 1)[1]
            elif proc.poll() is not None or time.monotonic() > deadline:
                reader.join(5)
                pytest.fail(f"the server did not print URL= (exit {proc.poll()}):\n" + "\n".join(server.lines[-40:]))
            else:
                time.sleep(0.1)
        yield server
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        reader.join(5)


# A Ray cluster made by a test stays on the loopback: unless told it is no cluster of machines, Ray binds its processes
# to the host's outward address (read when ray is imported: the suite's conftest.py sets these for every process).
RAY_LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}


@contextlib.contextmanager
def local_ray_cluster(nodes: int = 2):
    """A real Ray cluster on 127.0.0.1: a head and ``nodes - 1`` more nodes, one CPU each (one actor each), made by
    Ray's own ``ray.cluster_utils.Cluster``; yields it (``.address``, ``.remove_node``), shut down at the end."""
    os.environ.update(RAY_LOOPBACK_ENV)
    cluster_utils = pytest.importorskip("ray.cluster_utils", reason="ray is missing: pip install -r "
                                        "<delivery>/requirements-app.txt")  # fmt: skip
    loopback = {"num_cpus": 1, "node_ip_address": "127.0.0.1"}
    cluster = cluster_utils.Cluster(initialize_head=True, head_node_args={**loopback, "include_dashboard": False})
    try:
        for _ in range(nodes - 1):
            cluster.add_node(**loopback)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        cluster.shutdown()


def check_ray_batch(command: list[Any], lines: list[dict], folder: Path, compare: Callable[[Path, Path], None]) -> None:
    """Run ``command --batch`` (a delivery's ``inference.py`` with its model flags) on ``lines`` in one process, then
    with ``--ray`` over a local two-node cluster: every item done, both nodes used, and ``compare(one, ray)`` on each
    item's two folders (the delivery's own comparison: two processes agree up to float reordering, not bytes).

    The one process runs with one CPU thread, as Ray gives each one-CPU actor (``OMP_NUM_THREADS=1``).
    """
    requests = folder / "requests.jsonl"
    requests.write_text("".join(json.dumps(line) + "\n" for line in lines))
    argv = [sys.executable, *map(str, command), "--batch", str(requests)]
    one = subprocess.run([*argv, "--output", str(folder / "one")], capture_output=True, text=True, timeout=900,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})  # fmt: skip
    assert one.returncode == 0, one.stderr
    with local_ray_cluster(2) as cluster:
        spread = subprocess.run([*argv, "--output", str(folder / "ray"), "--ray", cluster.address],
                                capture_output=True, text=True, timeout=900)  # fmt: skip
    assert spread.returncode == 0 and "Traceback" not in spread.stderr, spread.stderr
    summary = json.loads((folder / "ray" / "batch.json").read_text())
    assert summary["done"] == len(lines) and len({row["rank"] for row in summary["items"]}) == 2, summary
    for row in summary["items"]:
        compare(folder / "one" / row["name"], folder / "ray" / row["name"])
