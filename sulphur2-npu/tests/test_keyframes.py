"""The keyframes pipeline (ltx-pipelines' ``KeyframeInterpolationPipeline``) on the tiny model: its flags, its batch
field, and the guiding latents its transformer calls get. Equality with ltx-pipelines itself, token by token and
stage by stage, is ``test_reference_ltx.py::test_keyframe_pipeline_matches_ltx_pipelines`` (needs ``LTX2_SRC``)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from deliverykit.errors import DeliveryError, ExitCode
from sulphur2_npu import ltx_peer
from sulphur2_npu.keyframes import parse_keyframe
from sulphur2_npu.options import KEYFRAMES
from sulphur2_npu.tiny import TINY_TWO_STAGE_PRESET

FPS = 24
LAST = TINY_TWO_STAGE_PRESET.num_frames - 1


@pytest.fixture(scope="module")
def keyframe_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("keyframes")
    rng = np.random.default_rng(0)
    for name, shape in (("first.png", (80, 150, 3)), ("last.png", (64, 128, 3))):  # one of them resized and cropped
        Image.fromarray(rng.integers(0, 255, shape, dtype=np.uint8)).save(folder / name)
    return folder


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("a.png:0", ("a.png", 0, 1.0)),
        ("a.png:8:0.5", ("a.png", 8, 0.5)),
        ("dir:x/a.png:8", ("dir:x/a.png", 8, 1.0)),  # a path with a colon keeps it
        ("c:/a.png:3:1", ("c:/a.png", 3, 1.0)),
    ],
)
def test_keyframe_values_parse(text, parsed):
    assert parse_keyframe(text) == parsed


@pytest.mark.parametrize("text", ["a.png", "a.png:x", ":3", "a.png:1.5"])
def test_a_keyframe_without_a_frame_is_a_usage_error(text):
    with pytest.raises(DeliveryError, match="expected IMAGE:FRAME") as raised:
        parse_keyframe(text)
    assert raised.value.exit_code == ExitCode.USAGE


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--keyframe", "{d}/first.png:0"], "--keyframe is for the keyframes pipeline, not distilled"),
        (["--pipeline", KEYFRAMES], "the keyframes pipeline needs at least one --keyframe IMAGE:FRAME[:STRENGTH]"),
        (["--pipeline", KEYFRAMES, "--keyframe", f"{{d}}/last.png:{LAST + 1}"], f"frame outside the video's 0..{LAST}"),
        (["--pipeline", KEYFRAMES, "--keyframe", "{d}/last.png:2:1.5"], "strength 1.5 outside [0, 1]"),
        (
            ["--pipeline", KEYFRAMES, "--keyframe", "{d}/a.png:2", "--keyframe", "{d}/b.png:2"],
            "two keyframes at frame 2",
        ),
        (["--pipeline", KEYFRAMES, "--keyframe", "{d}/last.png:2", "--image", "{d}/first.png"], "IMAGE:0, not --image"),
    ],
    ids=["other-pipeline", "none", "frame", "strength", "same-frame", "with-image"],
)
def test_keyframe_flags_are_checked_before_loading(run_cli, keyframe_files, tmp_path, argv, message):
    argv = [value.format(d=keyframe_files) for value in argv]
    code, _, err = run_cli("--smoke", "--device", "cpu", *argv, "--output", tmp_path / "out.mp4")
    assert code == ExitCode.USAGE and err.count("error:") == 1 and message in err, err
    assert "Traceback" not in err and not list(tmp_path.iterdir())


def test_an_unreadable_keyframe_is_bad_input(run_cli, tmp_path):
    argv = ["--pipeline", KEYFRAMES, "--keyframe", f"{tmp_path / 'missing.png'}:0"]
    code, _, err = run_cli("--smoke", "--device", "cpu", *argv, "--output", tmp_path / "out.mp4")
    assert code == ExitCode.INPUT and "--keyframe" in err and "missing.png does not exist" in err
    assert not (tmp_path / "out.mp4").exists()


def test_guiding_latents_sit_at_their_frames_and_hold_their_strength(smoke_files, keyframe_files, monkeypatch):
    """What ltx-core's ``VideoConditionByKeyframeIndex`` documents, on every transformer call of both stages: each
    keyframe's tokens follow the video's, at temporal position [frame, frame + 1) / fps (a single pixel frame, the
    one at 0 included); a full-strength keyframe stays its clean latent at every step (per-token σ 0), one of
    strength s starts at σ·(1 - s); the result has the video's tokens only."""
    from sulphur2_npu.accuracy import tiny_request
    from sulphur2_npu.generate import generate
    from sulphur2_npu.keyframes import read_keyframes
    from sulphur2_npu.loader import load_pipeline
    from sulphur2_npu.stages import load_stage_parts

    pipe = load_pipeline(smoke_files.checkpoint, smoke_files.text_encoder, torch_dtype=torch.float32).pipe
    lora = (smoke_files.distilled_lora, 1.0)
    parts = load_stage_parts(pipe, KEYFRAMES, upsampler=smoke_files.upsampler, distilled_lora=lora)
    specs = [f"{keyframe_files / 'first.png'}:0", f"{keyframe_files / 'last.png'}:{LAST}:0.6"]
    size = TINY_TWO_STAGE_PRESET
    request = dataclasses.replace(
        tiny_request(),
        width=size.width,
        height=size.height,
        fps=FPS,
        pipeline=KEYFRAMES,
        keyframes=read_keyframes(specs),
    )
    capture = ltx_peer.StageCapture(pipe)
    try:
        result = generate(pipe, request, device="cpu", generator=torch.Generator().manual_seed(0), parts=parts)
    finally:
        capture.close()
    assert result.video.shape == (size.num_frames, size.height, size.width, 3)
    stage_1, stage_2 = result.stages["stage_1"], result.stages["stage_2"]
    assert result.stages["keyframes"] == [{"frame": 0, "strength": 1.0}, {"frame": LAST, "strength": 0.6}]
    split = 1 - len(stage_2["sigmas"])  # stage 2: one call a step
    for stage, calls in ((stage_1, capture.calls[:split]), (stage_2, capture.calls[split:])):
        tokens, per_frame = stage["video_tokens"], stage["video_tokens"] // 2  # 2 latent frames
        for call in calls:
            coords = call["video_coords"][0, 0]  # temporal [start, end) of every token, in seconds
            assert call["hidden_states"].shape[1] == tokens + 2 * per_frame
            keyframe_times = coords[tokens:].reshape(2, per_frame, 2)
            torch.testing.assert_close(keyframe_times[0], torch.tensor([0.0, 1.0 / FPS]).expand(per_frame, 2))
            torch.testing.assert_close(
                keyframe_times[1], torch.tensor([LAST, LAST + 1.0]).div(FPS).expand(per_frame, 2)
            )
            sigma = call["sigma"].reshape(-1)[0]
            timestep = call["timestep"].reshape(call["timestep"].shape[0], -1)[0]
            assert bool((timestep[:tokens] == sigma).all()) and bool((timestep[tokens : tokens + per_frame] == 0).all())
            torch.testing.assert_close(timestep[tokens + per_frame :], (sigma * 0.4).expand(per_frame))
        clean = calls[0]["hidden_states"][0, tokens : tokens + per_frame]
        for call in calls[1:]:
            torch.testing.assert_close(call["hidden_states"][0, tokens : tokens + per_frame], clean, rtol=0, atol=1e-6)
    assert list(capture.seen["decode"][1].shape[2:]) == [2, 2, 4]  # the keyframe tokens cut off


def test_a_batch_line_takes_keyframes_relative_to_its_file(run_cli, keyframe_files, tmp_path):
    batch = keyframe_files / "b.jsonl"
    batch.write_text(json.dumps({"prompt": "a", "keyframes": ["first.png:0", f"last.png:{LAST}:0.8"]}) + "\n")
    argv = ["--smoke", "--device", "cpu", "--pipeline", KEYFRAMES, "--batch", batch, "--output", tmp_path / "out"]
    code, _, err = run_cli(*argv)
    assert code == ExitCode.OK, err
    report = json.loads((tmp_path / "out" / "00000" / "report.json").read_text())
    assert report["inputs"]["pipeline"] == KEYFRAMES
    assert report["timing"]["stages"]["keyframes"] == [{"frame": 0, "strength": 1.0}, {"frame": LAST, "strength": 0.8}]


def test_the_page_pairs_keyframe_images_with_their_frames(tmp_path):
    """The web app's keyframe field: one ``FRAME[:STRENGTH]`` per uploaded image, in upload order, or a message."""
    import importlib.util

    from deliverykit.errors import InputError

    spec = importlib.util.spec_from_file_location("sulphur2_app", Path(__file__).resolve().parents[1] / "app.py")
    page = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(page)
    assert page.keyframe_specs(["a.png", "b.png"], " 0, 8:0.5 ") == ["a.png:0", "b.png:8:0.5"]
    with pytest.raises(InputError, match=r"2 keyframe image\(s\) but 1 frame\(s\)"):
        page.keyframe_specs(["a.png", "b.png"], "0")
    with pytest.raises(InputError, match=r"0 keyframe image\(s\) but 1 frame\(s\)"):
        page.keyframe_specs(None, "0")
