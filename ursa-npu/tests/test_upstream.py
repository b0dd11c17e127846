"""The patched upstream (needs a checkout: URSA_SRC=/path/to/URSA at the pinned commit; skips without one).

The checkout is never modified: the patches are applied to a scratch copy (see conftest.py).
"""

from __future__ import annotations

import errno
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

from deliverykit.assets import patches
from deliverykit.errors import ExitCode
from deliverykit.tools.commands import main as deliverykit_main
from ursa_npu.generate import ImageRequest, generate
from ursa_npu.loader import check_weights_folder, load_pipeline
from ursa_npu.upstream import DELIVERY_DIR, find_patched_upstream


def _generate(pipe, seed: int = 0, prompt: str = "a photo of a cat"):
    pipe.set_progress_bar_config(disable=True)
    device = torch.device("cpu")
    request = ImageRequest(prompt, "", seed, steps=3, guidance=3.0, height=32, width=32)
    return generate(pipe, request, device=device, max_prompt_length=16)


def test_patches_apply_cleanly_to_the_pinned_commit(pristine_upstream: Path, patched_upstream: Path, capsys):
    code = deliverykit_main(["patches", "check", "--delivery", str(DELIVERY_DIR), "--upstream", str(pristine_upstream)])
    assert code == ExitCode.OK, capsys.readouterr().err

    assert find_patched_upstream(patched_upstream) == patched_upstream
    status = patches.patch_status(patches.open_tree(patched_upstream), patches.find_patches(DELIVERY_DIR))
    assert len(status) >= 6 and all(result.state == patches.APPLIED for result in status)


def test_unpatched_checkout_is_refused_with_the_fix(run_cli, pristine_upstream: Path, tmp_path: Path):
    code, _, err = run_cli(
        "--upstream", pristine_upstream, "--smoke", "--device", "cpu", "--output", tmp_path / "o.jpg"
    )
    assert code == ExitCode.INPUT and "lacks the patches 0001-" in err and "deliverykit patches apply" in err


def test_smoke_cli_writes_a_jpeg_and_a_report(run_cli, patched_upstream: Path, tmp_path: Path):
    output = tmp_path / "out" / "smoke.jpg"
    code, out, err = run_cli("--upstream", patched_upstream, "--smoke", "--device", "cpu", "--output", output)
    assert code == ExitCode.OK, err
    with Image.open(output) as image:
        assert image.format == "JPEG" and image.size == (32, 32)
    report = json.loads((output.parent / "report.json").read_text())
    assert report["random_weights"] is True and report["evidence"]["CPU_FALLBACK"] == "false"
    timing = report["timing"]
    assert timing["diffusion"]["median_ms"] > 0 and timing["vae_decode"]["median_ms"] > 0
    assert timing["iterations_per_s"] == pytest.approx(4 / (timing["diffusion"]["median_ms"] / 1000))
    assert "LATENT_SHAPE=[1, 16, 16]" in out and "OUTPUT_SHAPE=[32, 32, 3]" in out and "IT_PER_S=" in out
    weights = {w["path"]: w for w in report["weights"]}  # every random file that ran, hashed
    assert {"model_index.json", "transformer/config.json", "scheduler/scheduler_model.pth"} <= set(weights)
    assert {(w["status"], w["sha256_source"]) for w in weights.values()} == {("random", "computed")}


def test_long_prompt_is_truncated_with_a_warning(run_cli, patched_upstream: Path, tmp_path: Path):
    prompt = " ".join(["cat"] * 30)
    args = ("--upstream", patched_upstream, "--smoke", "--device", "cpu", "--steps", "1", "--prompt", prompt)
    code, out, err = run_cli(*args, "--output", tmp_path / "o.png")
    assert code == ExitCode.OK
    assert "the prompt has 30 tokens; the model reads only the first 16" in err and "PROMPT_TRUNCATED=true" in out


def test_same_seed_same_tokens_other_seed_other_tokens(diffnext_classes, tiny_weights: Path):
    pipe = load_pipeline(check_weights_folder(tiny_weights), diffnext_classes, torch.float32)
    transformer = pipe.transformer
    first, again, other = _generate(pipe, 0), _generate(pipe, 0), _generate(pipe, 1)
    assert torch.equal(first.token_ids, again.token_ids) and np.array_equal(first.image, again.image)
    assert not torch.equal(first.token_ids, other.token_ids)
    assert first.token_ids.shape == (1, 16, 16) and first.token_ids.dtype == torch.int64
    assert int(first.token_ids.min()) >= 0 and int(first.token_ids.max()) < 64
    assert first.image.shape == (32, 32, 3) and first.image.dtype == np.uint8 and first.image.std() > 0
    # memory-managed decode: the transformer was moved off the device in place, never re-assigned
    assert pipe.transformer is transformer and pipe.config["transformer"][1] == "URSATransformer3DModel"


def test_vae_decodes_the_tokens_it_was_given(diffnext_classes, tiny_weights: Path):
    """The image is the VQ decode of the sampled ids: decoding them again reproduces it exactly."""
    pipe = load_pipeline(check_weights_folder(tiny_weights), diffnext_classes, torch.float32)
    result = _generate(pipe, 3)
    pixels = pipe.image_processor.decode_latents(pipe.vae, result.token_ids[None], vae_batch_size=1)
    assert np.array_equal(pipe.image_processor.postprocess(pixels, "np")[0], result.image)
    shifted = pipe.image_processor.decode_latents(pipe.vae, (result.token_ids[None] + 1) % 64, vae_batch_size=1)
    assert not np.array_equal(pipe.image_processor.postprocess(shifted, "np")[0], result.image)


def test_save_pretrained_round_trip_offline(diffnext_classes, tiny_weights: Path, tmp_path: Path):
    """Upstream's save_pretrained wrote bare class names and no codebook; patched, the folder loads back."""
    index = json.loads((tiny_weights / "model_index.json").read_text())
    assert index["transformer"] == ["diffnext.models.transformers.transformer_ursa", "URSATransformer3DModel"]
    assert (tiny_weights / "scheduler" / "scheduler_model.pth").is_file()
    reference = load_pipeline(check_weights_folder(tiny_weights), diffnext_classes, torch.float32)
    loaded = diffnext_classes.pipeline.from_pretrained(str(tiny_weights), dtype=torch.float32)  # diffusers' own loader
    loaded.save_pretrained(tmp_path / "again")
    reloaded = diffnext_classes.pipeline.from_pretrained(str(tmp_path / "again"), dtype=torch.float32)
    for name in ("transformer", "vae"):
        expected = getattr(reference, name).state_dict()
        for pipe in (loaded, reloaded):
            state = getattr(pipe, name).state_dict()
            assert state.keys() == expected.keys()
            assert all(torch.equal(state[key], expected[key]) for key in expected)
    torch.testing.assert_close(reloaded.scheduler.codebook, reference.scheduler.codebook, rtol=0, atol=0)
    assert torch.equal(_generate(reloaded, 5).token_ids, _generate(reference, 5).token_ids)


def test_half_precision_runs_on_the_cpu(diffnext_classes, tiny_weights: Path):
    for dtype in (torch.float16, torch.bfloat16):
        pipe = load_pipeline(check_weights_folder(tiny_weights), diffnext_classes, dtype)
        result = _generate(pipe, 0)
        assert result.token_ids.shape == (1, 16, 16) and result.image.std() > 0


def _has_cpp_compiler() -> bool:
    return any(shutil.which(cc) for cc in ("g++", "c++", "clang++"))


@pytest.mark.skipif(not _has_cpp_compiler(), reason="inductor on the CPU needs a C++ compiler (apt-get install g++)")
def test_eager_rope_rounds_in_fp16_as_upstreams_compiled_kernels(diffnext_classes):
    """Patch 0002 runs the RoPE kernels eagerly on the CPU; upstream compiles them with inductor on Linux, which
    computes fp16 in float32 and rounds once. The reference here is upstream's own kernel body compiled that way."""
    from diffnext.models import embeddings

    rope = embeddings.FlexRotaryEmbedding(dim=64)
    pos = rope.get_pos((1, 4, 8, 8))
    func = rope.get_func(pos)
    x = torch.randn(1, *pos.shape[1:2], 2, 64, generator=torch.Generator().manual_seed(0)).to(torch.float16)
    for interleaved, kernel in ((False, func.partitioned_impl), (True, func.interleaved_impl)):
        ours = func(x, interleaved=interleaved)
        shaped = x.unflatten(-1, (-1, 1, 2) if interleaved else (2, -1, 1))
        torch._dynamo.reset()
        upstream = torch.compile(kernel.__wrapped__, backend="inductor", fullgraph=True)(func, shaped, func.weight)
        eager_fp16 = kernel.__wrapped__(func, shaped, func.weight)
        assert (ours != upstream).float().mean() < 1e-3, interleaved  # float32's last bit may still tie-break
        assert (eager_fp16 != upstream).float().mean() > 0.05, interleaved  # the rounding the patch avoids


def _broken_copy(tiny_weights: Path, target: Path, damage) -> Path:
    folder = shutil.copytree(tiny_weights, target)
    (weights_file,) = (folder / "transformer").glob("*.safetensors")
    weights_file.write_bytes(damage(weights_file.read_bytes()))
    (folder / "RANDOM_WEIGHTS.txt").unlink(missing_ok=True)
    return folder


@pytest.mark.parametrize(
    "damage",
    [lambda data: data[: len(data) // 2], lambda data: b"\xff" * 8 + b"not a safetensors header" + data[32:]],
    ids=["truncated", "bogus-header"],
)
def test_a_damaged_transformer_names_the_fix(run_cli, patched_upstream, tiny_weights, tmp_path, damage):
    folder = _broken_copy(tiny_weights, tmp_path / "URSA", damage)
    out = tmp_path / "out"
    args = ("--upstream", patched_upstream, "--weights", folder, "--prompt", "x", "--device", "cpu")
    code, _, err = run_cli(*args, "--output", out / "o.jpg")
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == ExitCode.WEIGHTS and "Traceback" not in err, err
    assert len(lines) == 1 and lines[0].startswith("error: cannot load component 'transformer'"), err
    assert "deliverykit weights download --manifest ursa-npu/weights-manifest.json" in lines[0]
    assert not out.exists()


def test_a_full_disk_while_writing_leaves_neither_image_nor_report(run_cli, patched_upstream, tmp_path, monkeypatch):
    def full_disk(self, fp, *args, **kwargs):
        with open(fp, "wb") as handle:  # as a real writer: the file exists, then the disk fills
            handle.write(b"\xff\xd8")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(Image.Image, "save", full_disk)
    out = tmp_path / "out"
    code, _, err = run_cli("--upstream", patched_upstream, "--smoke", "--device", "cpu", "--output", out / "o.jpg")
    assert code == ExitCode.OUTPUT and err.count("error:") == 1 and "Traceback" not in err, err
    assert (
        f"error: cannot write {out / 'o.jpg'} (No space left on device); free space or choose another --output" in err
    )
    assert not out.exists()


def test_a_batch_makes_what_single_runs_make_and_a_rerun_skips_it(run_cli, patched_upstream: Path, tmp_path: Path):
    requests = [{"prompt": f"a photo of thing {i}", "seed": i, "output": f"thing{i}"} for i in range(6)]
    requests[3]["steps"] = 3
    batch_file = tmp_path / "batch.jsonl"
    batch_file.write_text("".join(json.dumps(r) + "\n" for r in requests))
    out = tmp_path / "out"
    code, _, err = run_cli("--upstream", patched_upstream, "--smoke", "--device", "cpu", "--batch", batch_file,
                           "--output", out)  # fmt: skip
    assert code == ExitCode.OK, err
    summary = json.loads((out / "batch.json").read_text())
    assert (summary["total"], summary["done"], summary["failed"]) == (6, 6, 0)
    for request in requests[:4]:  # each equals a single run with the same seed and steps
        single = tmp_path / "single" / f"{request['output']}.jpg"
        extra = ["--steps", str(request["steps"])] if "steps" in request else []
        code, _, err = run_cli("--upstream", patched_upstream, "--smoke", "--device", "cpu", "--prompt",
                               request["prompt"], "--seed", request["seed"], *extra, "--output", single)  # fmt: skip
        assert code == ExitCode.OK, err
        mine = json.loads((out / request["output"] / "report.json").read_text())
        theirs = json.loads((single.parent / "report.json").read_text())
        assert mine["inputs"] == theirs["inputs"]
        # sampled tokens are discrete: equal unless a probability sits within float32 rounding of a draw
        assert mine["results"]["token_ids_head"] == theirs["results"]["token_ids_head"]
        with Image.open(out / request["output"] / f"{request['output']}.jpg") as a, Image.open(single) as b:
            assert np.abs(np.asarray(a, dtype=np.int16) - np.asarray(b, dtype=np.int16)).max() <= 2  # JPEG of the same
    mtimes = {p: p.stat().st_mtime_ns for p in out.glob("thing*/*")}
    code, _, _ = run_cli("--upstream", patched_upstream, "--smoke", "--device", "cpu", "--batch", batch_file,
                         "--output", out)  # fmt: skip
    assert code == ExitCode.OK and {p: p.stat().st_mtime_ns for p in out.glob("thing*/*")} == mtimes


def test_two_ranks_share_a_batch(patched_upstream: Path, tmp_path: Path):
    batch_file = tmp_path / "prompts.txt"
    batch_file.write_text("a red cat\na blue dog\na green tree\n")
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, str(DELIVERY_DIR / "inference.py"), "--upstream", str(patched_upstream), "--smoke",
         "--batch", str(batch_file), "--devices", "cpu,cpu", "--output", str(out)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "batch.json").read_text())
    assert summary["done"] == 3 and [row["rank"] for row in summary["items"]] == [0, 1, 0]
    assert sorted(p.name for p in out.glob("*/*.jpg")) == ["00000.jpg", "00001.jpg", "00002.jpg"]
