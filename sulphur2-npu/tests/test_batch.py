"""``inference.py --batch``: one load for many videos, equal to single runs, checked before loading, resumable."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from deliverykit.errors import ExitCode
from deliverykit.testing import assert_equal_up_to_reordering
from sulphur2_npu import generate, session
from sulphur2_npu.tiny import TINY_HEIGHT, TINY_WIDTH

SMOKE = ("--smoke", "--device", "cpu", "--pipeline", "one-stage")  # the pipelines: test_stages.py
# Six requests of one batch and the single-run flags that make the same videos: text and image to video, other seeds,
# a negative prompt, more steps, another size and frame rate.
ITEMS = [
    (
        {"prompt": "a red fox runs through snow", "seed": 1, "output": "fox"},
        ["--prompt", "a red fox runs through snow"],
    ),
    ({"prompt": "a cat on a wall", "seed": 2}, ["--prompt", "a cat on a wall"]),
    (
        {"prompt": "waves", "seed": 3, "negative_prompt": "blurry, dark"},
        ["--prompt", "waves", "--negative-prompt", "blurry, dark"],
    ),
    (
        {"prompt": "a city at night", "seed": 4, "steps": 3, "width": 64},
        ["--prompt", "a city at night", "--steps", 3, "--width", 64],
    ),
    (
        {"prompt": "the same frame moves", "seed": 5, "image": "first.png"},
        ["--prompt", "the same frame moves", "--image"],
    ),
    ({"prompt": "rain", "seed": 6, "image": "first.png", "fps": 12}, ["--prompt", "rain", "--fps", 12, "--image"]),
]


def _first_frame(folder):
    pixels = np.random.default_rng(1).integers(0, 255, (TINY_HEIGHT, TINY_WIDTH, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(folder / "first.png")
    return folder / "first.png"


def _write_batch(folder, items) -> object:
    path = folder / "requests.jsonl"
    path.write_text("".join(json.dumps(fields) + "\n" for fields in items))
    return path


@contextlib.contextmanager
def _videos():
    """The float frames and audio each ``write_mp4`` call of the session gets, by item folder name: H.264 is lossy,
    so the mp4s of two runs whose floats differ by kernel reordering can differ by far more."""
    written, write_mp4 = {}, session.write_mp4

    def capture(path, video, audio, sample_rate, fps):
        written[Path(path).parent.name] = (np.array(video), audio.clone())
        write_mp4(path, video, audio, sample_rate, fps)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(session, "write_mp4", capture)
        yield written


def _assert_same_video(got, want, name):
    assert_equal_up_to_reordering(got[0], want[0], f"{name} frames")
    assert_equal_up_to_reordering(got[1], want[1], f"{name} audio")


def _files(folder) -> dict:
    return {path: path.stat().st_mtime_ns for path in sorted(folder.rglob("*")) if path.is_file()}


@pytest.fixture(scope="module")
def batch_run(run_cli, tmp_path_factory):
    folder = tmp_path_factory.mktemp("batch")
    _first_frame(folder)
    batch = _write_batch(folder, [fields for fields, _ in ITEMS])
    with _videos() as videos:
        code, out, err = run_cli(*SMOKE, "--batch", batch, "--output", folder / "out")
    assert code == ExitCode.OK, err
    return folder, batch, out, videos


def test_a_batch_makes_what_single_runs_with_the_same_seeds_make(batch_run, run_cli, tmp_path):
    folder, _, out, videos = batch_run
    assert "EXIT_CODE=0" in out and "MODE=" not in out  # a batch prints no per-item evidence lines
    summary = json.loads((folder / "out" / "batch.json").read_text())
    assert summary["done"] == len(ITEMS) and summary["failed"] == 0
    for index, (fields, flags) in enumerate(ITEMS):
        name = fields.get("output", f"{index:05d}")
        flags = [*flags, folder / "first.png"] if "image" in fields else flags
        with _videos() as single:
            code, _, err = run_cli(*SMOKE, *flags, "--seed", fields["seed"], "--output", tmp_path / name / "out.mp4")
        assert code == ExitCode.OK, err
        _assert_same_video(videos[name], single[name], name)
        item = folder / "out" / name
        files = sorted(path.name for path in item.iterdir())
        assert files == [f"{name}.mp4", f"{name}_first.png", f"{name}_last.png", "report.json"]
        report, want = (json.loads(p.read_text()) for p in (item / "report.json", tmp_path / name / "report.json"))
        assert report["inputs"] | {"image": None} == want["inputs"] | {"image": None}, name
        assert report["evidence"]["MODE"] == ("i2v" if "image" in fields else "t2v")


def test_a_rerun_skips_the_completed_items(batch_run, run_cli):
    folder, batch, _, _ = batch_run
    items = [path for path in (folder / "out").iterdir() if not path.name.startswith(".") and path.is_dir()]
    before = {path: _files(path) for path in items}
    code, _, err = run_cli(*SMOKE, "--batch", batch, "--output", folder / "out")
    assert code == ExitCode.OK, err
    assert {path: _files(path) for path in items} == before  # not one file rewritten


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"prompt": "x", "width": 100}', "--width 100 is not a positive multiple of 32"),
        ('{"prompt": "x", "steps": 1}', "the dev schedule needs at least 2 steps"),
        ('{"prompt": "x", "preset": "huge"}', "preset 'huge'"),
        ('{"prompt": "x", "colour": "red"}', "unknown field 'colour'"),
        ('{"prompt": "x", "seed": "one"}', "seed must be int"),
        ("not json", "not JSON"),
    ],
    ids=["size", "steps", "preset", "field", "type", "json"],
)
def test_a_bad_line_is_exit_2_naming_file_and_line_before_anything_loads(run_cli, tmp_path, monkeypatch, line, message):
    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded before the batch was checked")

    monkeypatch.setattr(generate, "load_pipeline", no_load)  # what inference.py's load step calls
    monkeypatch.setattr(generate.tiny, "write_smoke_files", no_load)
    batch = tmp_path / "requests.jsonl"
    batch.write_text('{"prompt": "fine"}\n' + line + "\n")
    code, _, err = run_cli(*SMOKE, "--batch", batch, "--output", tmp_path / "out")
    assert code == ExitCode.USAGE and f"{batch}:2: " in err and message in err, err
    assert not (tmp_path / "out").exists()


def test_steps_on_a_line_of_a_distilled_batch_is_a_usage_error(run_cli, tmp_path):
    batch = _write_batch(tmp_path, [{"prompt": "x"}, {"prompt": "y", "steps": 4}])
    code, _, err = run_cli(*SMOKE, "--schedule", "distilled", "--batch", batch, "--output", tmp_path / "out")
    assert code == ExitCode.USAGE and f"{batch}:2: --steps cannot be used with the distilled schedule" in err, err


def test_a_missing_image_fails_its_item_only(run_cli, tmp_path):
    _first_frame(tmp_path)
    items = [{"prompt": "a", "seed": 1}, {"prompt": "b", "image": "absent.png"}, {"prompt": "c", "image": "first.png"}]
    batch = _write_batch(tmp_path, items)
    code, _, err = run_cli(*SMOKE, "--batch", batch, "--output", tmp_path / "out")
    assert code == ExitCode.BATCH_PARTIAL, err
    summary = json.loads((tmp_path / "out" / "batch.json").read_text())
    assert summary["done"] == 2 and [f["name"] for f in summary["failures"]] == ["00001"]
    assert summary["failures"][0]["exit_code"] == ExitCode.INPUT and "absent.png" in summary["failures"][0]["error"]
    assert (tmp_path / "out" / "00000" / "report.json").is_file() and (
        tmp_path / "out" / "00002" / "report.json"
    ).is_file()
    assert not (tmp_path / "out" / "00001").exists()


def test_a_plan_that_frees_gemma_encodes_every_prompt_first_and_makes_the_same_videos(batch_run, run_cli, tmp_path):
    _, _, _, videos = batch_run
    batch = _write_batch(tmp_path, [fields for fields, _ in ITEMS[:2]])
    with _videos() as offloaded:
        code, _, err = run_cli(*SMOKE, "--memory", "group-offload", "--batch", batch, "--output", tmp_path / "out")
    assert code == ExitCode.OK, err
    for name in ("fox", "00001"):
        report = json.loads((tmp_path / "out" / name / "report.json").read_text())
        assert report["memory_plan"]["free_text_encoder"] is True
        _assert_same_video(offloaded[name], videos[name], name)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--batch", "b.jsonl", "--prompt", "x"), "--batch FILE holds the prompts, images, sound tracks and videos"),
        (
            ("--batch", "b.jsonl", "--parallel", "guidance=2"),
            "--batch FILE holds the prompts, images, sound tracks and videos",
        ),
        (("--batch", "b.jsonl", "--video", "a.mp4"), "drop --prompt, --image, --keyframe, --audio, --video"),
        (("--overwrite",), "--devices, --overwrite, --ray and --ray-outputs go with --batch"),
        (("--batch", "b.jsonl", "--devices", "cpu"), "name at least 2 devices"),
    ],
    ids=["prompt", "parallel", "video", "overwrite", "one-device"],
)
def test_batch_flags_that_do_not_fit(run_cli, tmp_path, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "b.jsonl").write_text('{"prompt": "x"}\n')
    output = tmp_path / ("out" if "--batch" in argv else "out.mp4")
    code, _, err = run_cli(*SMOKE, *argv, "--output", output)
    assert code == ExitCode.USAGE and message in err, err


@pytest.mark.heavy
def test_two_ranks_share_a_batch(run_cli, tmp_path):
    batch = _write_batch(tmp_path, [{"prompt": "a", "seed": 1}, {"prompt": "b", "seed": 2}, {"prompt": "c", "seed": 3}])
    code, _, err = run_cli(*SMOKE, "--batch", batch, "--output", tmp_path / "out", "--devices", "cpu,cpu")
    assert code == ExitCode.OK, err  # --devices: one process each, RANK/WORLD_SIZE as torchrun sets them
    summary = json.loads((tmp_path / "out" / "batch.json").read_text())
    assert summary["done"] == 3 and sorted(item["rank"] for item in summary["items"]) == [0, 0, 1]
