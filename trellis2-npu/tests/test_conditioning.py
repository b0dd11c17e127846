"""The DINOv3 conditioning CLI (``scripts/conditioning.py``) end to end on tiny random weights: evidence lines,
report, features, and bad input."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from deliverykit.errors import ExitCode
from deliverykit.report import EVIDENCE_KEYS, SCHEMA_PATH, parse_evidence
from deliverykit.testing import assert_equal_up_to_reordering, header_only_png
from trellis2_npu.dinov3 import extract_features
from trellis2_npu.image import load_image, preprocess_image, synthetic_image, to_pixel_values
from trellis2_npu.loader import load_dinov3

from .conftest import DELIVERY_DIR, assert_failed_cleanly

CONDITIONING = DELIVERY_DIR / "scripts" / "conditioning.py"

jsonschema = pytest.importorskip("jsonschema")


@pytest.fixture
def run_cli(run_conditioning):
    """This module's CLI: ``scripts/conditioning.py`` in process."""
    return run_conditioning


def _env_without_accelerator_override() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("DELIVERY_DEVICE", None)
    return env


@pytest.mark.heavy
def test_smoke_tiny_subprocess_end_to_end(tmp_path):
    """The command a user types, in a fresh process: evidence lines, report.json and features.safetensors."""
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, str(CONDITIONING), "--smoke", "tiny", "--device", "cpu", "--output", out],
        capture_output=True,
        text=True,
        timeout=300,
        env=_env_without_accelerator_override(),
    )
    assert result.returncode == 0, result.stderr
    evidence = parse_evidence(result.stdout)
    assert set(EVIDENCE_KEYS) - {"OUTPUT_SHAPE"} <= set(evidence)
    assert evidence["EXIT_CODE"] == "0"
    assert evidence["LATENT_SHAPE"] == "[1, 1029, 64]"
    assert evidence["CPU_FALLBACK"] == "false"
    assert evidence["INPUT_DEVICE"] == evidence["MODEL_DEVICE"] == evidence["OUTPUT_DEVICE"] == "cpu"
    assert evidence["PEAK_MEMORY_MB"] == "n/a"
    head = json.loads(evidence["EMBEDDING_HEAD"])
    assert len(head) == 4 and all(np.isfinite(head))
    float(evidence["TIMING_MEDIAN_MS"]), float(evidence["TIMING_P90_MS"])

    report = json.loads((out / "report.json").read_text())
    jsonschema.validate(report, json.loads(SCHEMA_PATH.read_text()))
    assert report["random_weights"] is True and report["evidence"]["LATENT_SHAPE"] == "[1, 1029, 64]"
    features = load_file(out / "features.safetensors")["features"]
    assert features.shape == (1, 1029, 64)
    np.testing.assert_allclose(features[0, 0, :4].numpy(), head, atol=5e-5)


def test_features_file_equals_in_process_computation(run_cli, tiny_weights, tmp_path):
    image_path = tmp_path / "object.png"
    rgba = np.zeros((80, 120, 4), dtype=np.uint8)
    rgba[10:70, 30:90] = (200, 120, 40, 255)
    Image.fromarray(rgba).save(image_path)
    code, stdout, _ = run_cli(
        "--weights", tiny_weights, "--image", image_path, "--device", "cpu", "--output", tmp_path / "o"
    )
    assert code == 0 and "EXIT_CODE=0" in stdout
    saved = load_file(tmp_path / "o" / "features.safetensors")["features"]
    with torch.inference_mode():
        expected = extract_features(
            load_dinov3(tiny_weights), to_pixel_values(preprocess_image(load_image(image_path)), 512)
        )
    assert_equal_up_to_reordering(saved, expected, "features")  # the CLI's process may run other kernels


def test_bench_and_precision_patch_and_resolution(run_cli, tiny_weights, tmp_path):
    report_copy = tmp_path / "results" / "performance.json"
    code, stdout, _ = run_cli(
        "--weights", tiny_weights, "--device", "cpu", "--output", tmp_path / "o", "--bench", "--warmup", "1",
        "--runs", "3", "--precision-patch", "--resolution", "1024", "--report", report_copy,
    )  # fmt: skip
    assert code == 0
    assert parse_evidence(stdout)["LATENT_SHAPE"] == "[1, 4101, 64]"
    report = json.loads(report_copy.read_text())
    assert report["timing"]["repeat"] == 3 and len(report["timing"]["samples_ms"]) == 3
    assert report["model"]["precision_patch"][0] == "embeddings.patch_embeddings"
    assert report["results"]["tables"][0]["rows"][0][6] == 3


@pytest.mark.parametrize("mode", ["L", "RGBA", "I;16", "P"])
def test_image_modes_work(run_cli, tiny_weights, tmp_path, mode):
    path = tmp_path / "in.png"
    image = synthetic_image(1, size=48)
    if mode == "I;16":
        Image.fromarray(np.asarray(image.convert("L")).astype(np.uint16) * 257).save(path)
    else:
        image.convert(mode).save(path)
    code, _, err = run_cli("--weights", tiny_weights, "--image", path, "--device", "cpu", "--output", tmp_path / "o")
    assert code == 0, err


def test_bad_weights(run_cli, tiny_weights, tmp_path):
    out = tmp_path / "o"
    assert_failed_cleanly(
        run_cli("--weights", tmp_path / "nowhere", "--device", "cpu", "--output", out),
        ExitCode.WEIGHTS, "does not exist", out,
    )  # fmt: skip
    broken = shutil.copytree(tiny_weights, tmp_path / "broken")
    (broken / "model.safetensors").write_bytes((tiny_weights / "model.safetensors").read_bytes()[:-10])
    assert_failed_cleanly(
        run_cli("--weights", broken, "--device", "cpu", "--output", out), ExitCode.WEIGHTS, "truncated or corrupt", out
    )
    other = shutil.copytree(tiny_weights, tmp_path / "other")
    (other / "config.json").write_text(json.dumps({"model_type": "clip_vision_model"}))
    assert_failed_cleanly(
        run_cli("--weights", other, "--device", "cpu", "--output", out), ExitCode.WEIGHTS, "expected 'dinov3_vit'", out
    )


def _unmarked_copy(tiny_weights, folder):
    """The tiny weights without the random marker: checked against the manifest like a download."""
    from safetensors.torch import save_file

    folder = shutil.copytree(tiny_weights, folder)
    save_file(load_file(folder / "model.safetensors"), folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def test_weights_that_differ_from_the_release_load_with_one_warning(run_cli, tiny_weights, tmp_path, monkeypatch):
    """Complete, valid files of other sizes (a fine-tune, a re-serialised config) load after one warning line naming
    them; --strict-manifest or DELIVERYKIT_STRICT_MANIFEST=1 refuse them with exit 4, leaving no output."""
    monkeypatch.delenv("DELIVERYKIT_STRICT_MANIFEST", raising=False)
    folder = _unmarked_copy(tiny_weights, tmp_path / "my-dinov3")
    code, _, err = run_cli("--weights", folder, "--device", "cpu", "--output", tmp_path / "o")
    assert code == 0, err
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "config.json (" in warnings[0] and "model.safetensors (" in warnings[0]
    assert "preprocessor_config.json" not in warnings[0]  # byte-identical to the release
    report = json.loads((tmp_path / "o" / "report.json").read_text())
    jsonschema.validate(report, json.loads(SCHEMA_PATH.read_text()))
    assert report["random_weights"] is False
    assert {Path(w["path"]).name: w["status"] for w in report["weights"]} == {
        "config.json": "differs",
        "model.safetensors": "differs",
        "preprocessor_config.json": "release",
    }

    out = tmp_path / "strict"
    assert_failed_cleanly(
        run_cli("--weights", folder, "--device", "cpu", "--output", out, "--strict-manifest"),
        ExitCode.WEIGHTS, "differ from the pinned release", out,
    )  # fmt: skip
    monkeypatch.setenv("DELIVERYKIT_STRICT_MANIFEST", "1")
    assert_failed_cleanly(
        run_cli("--weights", folder, "--device", "cpu", "--output", out),
        ExitCode.WEIGHTS, "differ from the pinned release", out,
    )  # fmt: skip


def test_missing_release_file_names_the_download_into_that_folder(run_cli, tiny_weights, tmp_path):
    folder = _unmarked_copy(tiny_weights, tmp_path / "my-dinov3")
    (folder / "preprocessor_config.json").unlink()
    out = tmp_path / "o"
    assert_failed_cleanly(
        run_cli("--weights", folder, "--device", "cpu", "--output", out),
        ExitCode.WEIGHTS, "preprocessor_config.json is missing; download with: deliverykit weights download", out,
    )  # fmt: skip
    _, _, err = run_cli("--weights", folder, "--device", "cpu", "--output", out)
    assert f"--model-dir {folder} " in err and f"{folder}/dinov3-vitl16" not in err


def test_smoke_report_records_the_random_weights_it_ran(run_cli, tmp_path):
    """Two runs on any torch build can tell from their reports that they ran the same model."""
    code, _, err = run_cli("--smoke", "tiny", "--device", "cpu", "--output", tmp_path / "o")
    assert code == 0, err
    weights = json.loads((tmp_path / "o" / "report.json").read_text())["weights"]
    assert [w["path"] for w in weights] == ["config.json", "model.safetensors", "preprocessor_config.json"]
    assert all(w["status"] == "random" and w["sha256_source"] == "computed" for w in weights)


def test_bad_image(run_cli, tiny_weights, tmp_path):
    out = tmp_path / "o"
    assert_failed_cleanly(
        run_cli("--weights", tiny_weights, "--image", tmp_path / "none.png", "--device", "cpu", "--output", out),
        ExitCode.INPUT, "does not exist", out,
    )  # fmt: skip
    text = tmp_path / "readme.txt"
    text.write_text("hello")
    assert_failed_cleanly(
        run_cli("--weights", tiny_weights, "--image", text, "--device", "cpu", "--output", out),
        ExitCode.INPUT, "as an image", out,
    )  # fmt: skip


@pytest.mark.parametrize("device", ["npu", "npu:1", "cuda"])
def test_missing_accelerator(run_cli, tiny_weights, tmp_path, device):
    if device.startswith("cuda") and torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    out = tmp_path / "o"
    assert_failed_cleanly(
        run_cli("--weights", tiny_weights, "--device", device, "--output", out), ExitCode.DEVICE, "--device cpu", out
    )


def test_unwritable_output(run_cli, tiny_weights, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("a user's file")
    code, _, err = run_cli("--weights", tiny_weights, "--device", "cpu", "--output", blocker / "sub")
    assert code == ExitCode.OUTPUT and "--output" in err
    code, _, err = run_cli("--weights", tiny_weights, "--device", "cpu", "--output", blocker)
    assert code == ExitCode.OUTPUT and "not a folder" in err
    assert blocker.read_text() == "a user's file"


def test_usage_errors(run_cli, tmp_path):
    code, _, err = run_cli("--output", tmp_path / "o")
    assert code == ExitCode.USAGE and "--weights" in err
    code, _, _ = run_cli("--smoke", "tiny", "--device", "gpu", "--output", tmp_path / "o")
    assert code == ExitCode.USAGE


def test_decompression_bomb_image_is_refused_before_decoding(run_cli, tiny_weights, tmp_path):
    bomb = header_only_png(tmp_path / "bomb.png", 40000, 40000)
    out = tmp_path / "o"
    assert_failed_cleanly(
        run_cli("--weights", tiny_weights, "--image", bomb, "--device", "cpu", "--output", out),
        ExitCode.INPUT, "has 1,600,000,000 pixels, over the 89,478,485", out,
    )  # fmt: skip


def test_an_output_name_taken_by_a_folder_fails_before_any_work(run_cli, tiny_weights, tmp_path):
    out = tmp_path / "o"
    (out / "features.safetensors").mkdir(parents=True)
    (out / "notes.txt").write_text("a user's file")
    code, stdout, err = run_cli("--weights", tiny_weights, "--device", "cpu", "--output", out)
    assert code == ExitCode.OUTPUT and "EXIT_CODE=6" in stdout and "Traceback" not in err
    assert err.count("error:") == 1 and "features.safetensors is a folder" in err and "move it away" in err
    assert sorted(p.name for p in out.iterdir()) == ["features.safetensors", "notes.txt"]  # no preview/report
    assert (out / "notes.txt").read_text() == "a user's file"


def test_a_full_disk_while_writing_leaves_no_output(run_cli, tiny_weights, tmp_path, monkeypatch):
    """ENOSPC injected into the PNG writer: the other outputs, report.json included, must not appear either."""
    import errno

    def full_disk(self, fp, *args, **kwargs):
        with open(fp, "wb") as handle:  # as a real writer: the file exists, then the disk fills
            handle.write(b"\x89PNG")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(Image.Image, "save", full_disk)
    out, report = tmp_path / "o", tmp_path / "results" / "run.json"
    assert_failed_cleanly(
        run_cli("--weights", tiny_weights, "--device", "cpu", "--output", out, "--report", report),
        ExitCode.OUTPUT, "preview.png (No space left on device); free space or choose another --output", out,
    )  # fmt: skip
    assert not report.parent.exists()


def test_a_dead_writers_temporaries_are_swept_and_others_kept(run_cli, tiny_weights, tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    stale = out / f".preview.png.{child.pid}.tmp"  # what a SIGKILLed run leaves behind
    stale.write_bytes(b"half")
    mine = out / ".preview.png.backup.tmp"  # a user's file that only looks similar
    mine.write_text("keep")
    code, _, err = run_cli("--weights", tiny_weights, "--device", "cpu", "--output", out)
    assert code == 0, err
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [".preview.png.backup.tmp", "features.safetensors", "preview.png", "report.json"]
    )
