#!/usr/bin/env python3
"""Target device (fp16 by default) vs CPU fp32 for URSA: first-step logits, VAE decode parity, final images.

The metrics, thresholds and their reasons are in ``ursa_npu/accuracy.py``. With ``--target cpu`` it compares a
half-precision CPU run with the fp32 one: a self-check of the harness on machines without an accelerator.

    python ursa-npu/scripts/accuracy.py --upstream ~/src/URSA --weights ~/weights/URSA-1.7B-IBQ512 --target npu \\
        --output ursa-npu/results/accuracy_npu.json
    python ursa-npu/scripts/accuracy.py --upstream ~/src/URSA --smoke --target cpu --dtype fp16 \\
        --output ursa-npu/results/accuracy.json

Exit codes: 0 every prompt passes, 8 a prompt is fixable or fails, others as inference.py (2, 3, 4, 5, 6).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from deliverykit import device as devices
from deliverykit.assets.loadcheck import check_weights_for_loading, smoke_weights, weights_record
from deliverykit.cli import DTYPE_CHOICES, torch_dtype
from deliverykit.errors import ExitCode, run_main
from deliverykit.files import ensure_writable_dir
from deliverykit.report import build_report, environment_fingerprint, write_report
from ursa_npu import MODEL_ID, loader, tiny, upstream

DELIVERY_DIR = Path(__file__).resolve().parents[1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--weights", help="downloaded URSA folder")
    source.add_argument("--smoke", action="store_true", help="the tiny random URSA (ursa_npu.tiny), no weights")
    parser.add_argument("--upstream", help="patched baaivision/URSA checkout (default: $URSA_SRC)")
    parser.add_argument("--target", default="auto", help="device compared with the CPU (default auto)")
    parser.add_argument("--dtype", choices=DTYPE_CHOICES, default="fp16", help="target dtype (default fp16)")
    parser.add_argument("--prompts", type=int, default=5, help="number of prompts, at least 5 (default 5)")
    parser.add_argument("--steps", type=int, help="steps of the final-image runs (default 25; --smoke: 4)")
    parser.add_argument("--guidance", type=float, default=7.0, help="guidance scale (default 7)")
    parser.add_argument("--size", type=int, help="image height and width (default 512; --smoke: 32)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", required=True, help="results JSON (a run report; README tables come from it)")
    parser.add_argument("--dry-run", action="store_true", help="check the inputs and print the plan; run nothing")
    args = parser.parse_args(argv)
    if args.prompts < 5:
        parser.error(f"--prompts {args.prompts}: at least 5, one prompt says little about a precision")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from ursa_npu import accuracy  # imports torch: after the parse, so that --help answers at once

    ensure_writable_dir(Path(args.output).parent)
    target = devices.resolve_device(args.target)
    folder = None if args.smoke else loader.check_weights_folder(args.weights)
    checkout = upstream.find_patched_upstream(args.upstream)
    prompts = [accuracy.PROMPTS[i % len(accuracy.PROMPTS)] + ("" if i < 5 else f" {i}") for i in range(args.prompts)]
    size = args.size or (tiny.VARIANTS["tiny"].size if args.smoke else 512)
    plan = {
        "reference": "cpu fp32",
        "candidate": f"{devices.device_string(target)} {args.dtype}",
        "prompts": prompts,
        "size": size,
        "steps": args.steps or (4 if args.smoke else 25),
        "thresholds": accuracy.THRESHOLDS,
    }
    if args.dry_run:
        for key, value in plan.items():
            print(f"{key}: {value}")
        return int(ExitCode.OK)
    classes = upstream.import_diffnext(checkout)
    with tempfile.TemporaryDirectory(prefix="ursa-accuracy-") as home:
        if args.smoke:
            folder = loader.check_weights_folder(tiny.write_tiny_weights(home, classes, variant="tiny", seed=0))
        return compare(args, plan, classes, folder, target)


def compare(args: argparse.Namespace, plan: dict, classes, folder, target) -> int:
    import torch

    from ursa_npu import accuracy
    from ursa_npu.generate import ImageRequest, generate

    if folder.random_weights:
        weights_files = smoke_weights(folder.path)
    else:
        weights_files = check_weights_for_loading(DELIVERY_DIR / "weights-manifest.json", folder.path, MODEL_ID)

    cpu = torch.device("cpu")
    max_prompt_length = 16 if args.smoke else 320
    pipes = {}
    for name, device, dtype in (("reference", cpu, torch.float32), ("candidate", target, torch_dtype(args.dtype))):
        pipes[name] = weights_pipeline = loader.load_pipeline(folder, classes, dtype)
        weights_pipeline.to(device)
        weights_pipeline.set_progress_bar_config(disable=True)
    call = {
        "num_inference_steps": plan["steps"],
        "guidance_scale": args.guidance,
        "max_prompt_length": max_prompt_length,
    }
    size = plan["size"]
    samples, rows = [], []
    for prompt in plan["prompts"]:
        inputs = accuracy.first_step_inputs(
            pipes["reference"], prompt, height=plan["size"], width=plan["size"], seed=args.seed, **call
        )
        ref_logits, ref_hidden = accuracy.first_step_forward(pipes["reference"], inputs, cpu)
        cand_logits, cand_hidden = accuracy.first_step_forward(pipes["candidate"], inputs, target)
        request = ImageRequest(prompt, "", args.seed, plan["steps"], args.guidance, size, size)
        finals = {
            name: generate(pipe, request, device=device, max_prompt_length=max_prompt_length)
            for (name, pipe), device in zip(pipes.items(), (cpu, target), strict=True)
        }
        reference_ids = finals["reference"].token_ids
        vae_candidate = accuracy.decode_image(pipes["candidate"], reference_ids, target)
        sample = {
            "prompt": prompt,
            "logits": accuracy.logits_metrics(ref_logits, cand_logits, args.guidance),
            "hidden_cosine": accuracy.hidden_cosines(ref_hidden, cand_hidden),
            "vae": accuracy.image_metrics(finals["reference"].image, vae_candidate),
            "final": {
                "token_agreement": float((reference_ids == finals["candidate"].token_ids).double().mean()),
                **accuracy.image_metrics(finals["reference"].image, finals["candidate"].image),
                "note": "trajectories diverge after the first differing token: informational, no verdict",
            },
        }
        sample["verdict"] = accuracy.verdict(sample)
        samples.append(sample)
        logits, vae, final = sample["logits"], sample["vae"], sample["final"]
        rows.append(
            [
                prompt,
                logits["top1_decisive"],
                logits["decisive_tokens"],
                logits["guided_kl_mean"],
                1.0 - min(sample["hidden_cosine"].values()),
                vae["psnr_db"],
                vae["max_abs"],
                final["token_agreement"],
                final["psnr_db"],
                sample["verdict"],
            ]
        )
    verdicts = [sample["verdict"] for sample in samples]
    report = build_report(
        "accuracy",
        "ursa-npu",
        random_weights=folder.random_weights,
        environment=environment_fingerprint(target, DELIVERY_DIR),
        plan=plan,
        weights=weights_record(weights_files),
        results={
            "samples": samples,
            "verdict": "pass" if set(verdicts) == {"pass"} else ("fail" if "fail" in verdicts else "fixable"),
            "tables": [
                {
                    "title": f"{plan['candidate']} vs {plan['reference']}, {plan['size']}² px, guidance {args.guidance}"
                    f"; final images after {plan['steps']} steps (same seed, no verdict: trajectories diverge)",
                    "columns": [
                        "prompt",
                        "top-1 agree (decisive)",
                        "decisive tokens",
                        "guided KL",
                        "max 1 - hidden cos",
                        "VAE PSNR dB",
                        "VAE max abs diff (8-bit)",
                        "final token agree",
                        "final PSNR dB",
                        "verdict",
                    ],
                    "rows": rows,
                }
            ],
        },
    )
    write_report(args.output, report)
    print(f"{args.output}: verdict {report['results']['verdict']} ({', '.join(verdicts)})")
    return int(ExitCode.OK if report["results"]["verdict"] == "pass" else ExitCode.ACCURACY)


if __name__ == "__main__":
    sys.exit(run_main(main))
