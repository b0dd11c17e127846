"""The accuracy harness on the tiny URSA (needs URSA_SRC): identical sides agree exactly, a broken side fails."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from deliverykit.errors import ExitCode
from deliverykit.testing import CliRunner
from ursa_npu import accuracy
from ursa_npu.loader import check_weights_folder, load_pipeline

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "accuracy.py"


def _pipes(diffnext_classes, tiny_weights):
    folder = check_weights_folder(tiny_weights)
    return [load_pipeline(folder, diffnext_classes, torch.float32) for _ in range(2)]


def _sample(reference, candidate, prompt: str = "a red cat on the mountain") -> dict:
    cpu = torch.device("cpu")
    call = {"num_inference_steps": 2, "guidance_scale": 3.0, "max_prompt_length": 16}
    inputs = accuracy.first_step_inputs(reference, prompt, height=32, width=32, seed=0, **call)
    assert inputs["input_ids"].shape == (2, 16 + 1 + 256)  # [cond; uncond] x [prompt | bov | 16x16 image tokens]
    ref_logits, ref_hidden = accuracy.first_step_forward(reference, inputs, cpu)
    cand_logits, cand_hidden = accuracy.first_step_forward(candidate, inputs, cpu)
    assert ref_logits.shape == (2, 256, 64)
    ids = torch.randint(0, 64, (1, 16, 16), generator=torch.Generator().manual_seed(0))
    sample = {
        "logits": accuracy.logits_metrics(ref_logits, cand_logits, 3.0),
        "hidden_cosine": accuracy.hidden_cosines(ref_hidden, cand_hidden),
        "vae": accuracy.image_metrics(
            accuracy.decode_image(reference, ids, cpu), accuracy.decode_image(candidate, ids, cpu)
        ),
    }
    sample["verdict"] = accuracy.verdict(sample)
    return sample


def test_identical_sides_agree_exactly(diffnext_classes, tiny_weights):
    sample = _sample(*_pipes(diffnext_classes, tiny_weights))
    assert sample["logits"]["top1_agreement"] == 1.0 and sample["logits"]["guided_kl_mean"] == 0.0
    assert set(sample["hidden_cosine"]) == {"model.layers.0", "model.layers.1", "model.norm"}
    assert min(sample["hidden_cosine"].values()) > 1 - 1e-12 and sample["vae"]["max_abs"] == 0
    assert sample["verdict"] == "pass"


def test_a_broken_candidate_fails(diffnext_classes, tiny_weights):
    reference, candidate = _pipes(diffnext_classes, tiny_weights)
    with torch.no_grad():
        candidate.transformer.model.layers[1].mlp.down_proj.weight.mul_(-20)  # a wrong kernel, not rounding
        candidate.vae.decoder.conv_out.bias.add_(0.5)
    sample = _sample(reference, candidate)
    assert sample["hidden_cosine"]["model.layers.0"] > 1 - 1e-12  # the error enters at layer 1, not before
    assert sample["hidden_cosine"]["model.norm"] < accuracy.THRESHOLDS["hidden_cosine"]
    assert sample["vae"]["psnr_db"] < accuracy.THRESHOLDS["vae_psnr_db"]
    assert sample["verdict"] == "fail"


def test_guided_kl_is_the_kl_of_the_cfg_distribution():
    cond, uncond = torch.tensor([[[2.0, 0.0, 0.0]]]), torch.tensor([[[1.0, 0.0, 0.0]]])
    reference = torch.cat([cond, uncond])
    candidate = torch.cat([cond + torch.tensor([0.0, 0.1, 0.0]), uncond])
    metrics = accuracy.logits_metrics(reference, candidate, guidance=3.0)
    p = torch.tensor([4.0, 0.0, 0.0]).double().softmax(-1)  # uncond + 3·(cond − uncond)
    q = torch.tensor([4.0, 0.3, 0.0]).double().softmax(-1)
    assert np.isclose(metrics["guided_kl_mean"], float((p * (p / q).log()).sum()), rtol=1e-12)
    assert metrics["top1_decisive"] == 1.0 and metrics["decisive_tokens"] == 1


def test_dry_run_checks_inputs_and_runs_nothing(patched_upstream, tmp_path):
    script = CliRunner(SCRIPT)
    argv = ["--upstream", patched_upstream, "--smoke", "--target", "cpu", "--dry-run"]
    code, out, _ = script(*argv, "--output", tmp_path / "acc.json")
    assert code == ExitCode.OK and "candidate: cpu fp16" in out and "thresholds:" in out
    assert not (tmp_path / "acc.json").exists()
    assert script(*argv, "--prompts", "3", "--output", tmp_path / "a.json")[0] == 2
