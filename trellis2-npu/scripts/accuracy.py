#!/usr/bin/env python3
"""CPU baseline vs a target device for the DINOv3 conditioning features, N samples, each in its own process.

For seeds 0..N-1 the delivery's own ``scripts/conditioning.py`` runs once on the CPU and once on the target (fresh
processes, so no state leaks between samples or devices), and the saved features are compared: max_abs, mean_abs,
cosine, rel_l2 and a verdict (pass / fixable / fail) against --max-abs / --mean-abs. A determinism check runs the
CPU twice on seed 0 first. With --target cpu it still runs, as a self-check of the harness (every error is 0).
When a sample does not pass and the target is usable here, --localize names the first layer that diverges.

    python trellis2-npu/scripts/accuracy.py --smoke full --target npu --precision-patch \\
        --output trellis2-npu/results/accuracy.json

Exit codes: 0 every sample passes, 8 a sample does not pass or the CPU is not deterministic, other codes as
conditioning.py (2 usage, 4 weights, 5 device).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from deliverykit.errors import DeliveryError, ExitCode, run_main

DELIVERY_DIR = Path(__file__).resolve().parents[1]
CONDITIONING = Path(__file__).with_name("conditioning.py")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--weights", help="downloaded DINOv3 folder")
    source.add_argument("--smoke", choices=("full", "tiny"), help="seeded random weights of the real architecture")
    parser.add_argument("--target", default="auto", help="device compared with the CPU (default auto)")
    parser.add_argument("--samples", type=int, default=10, help="number of samples, seeds 0..N-1 (default 10)")
    parser.add_argument("--resolution", type=int, choices=(512, 1024), default=512)
    parser.add_argument("--dtype", choices=("fp32", "fp16", "bf16"), default="fp32", help="target dtype (CPU: fp32)")
    parser.add_argument("--precision-patch", action="store_true", help="apply the patch on both sides")
    parser.add_argument("--max-abs", type=float, default=0.01)
    parser.add_argument("--mean-abs", type=float, default=0.001)
    parser.add_argument("--localize", action="store_true", help="on a failing sample, find the first diverging layer")
    parser.add_argument("--output", required=True, help="results JSON (a run report; README tables come from it)")
    parser.add_argument("--markdown", help="also write the table as Markdown here (default: next to --output)")
    parser.add_argument("--workdir", help="keep per-sample outputs here (default: a temporary folder)")
    args = parser.parse_args(argv)
    if args.samples < 1:
        parser.error(f"--samples {args.samples}: need at least 1")
    return args


def run_inference(weights: Path, device: str, seed: int, output: Path, args: argparse.Namespace, dtype: str) -> Path:
    """One sample on one device in a fresh process; returns the features file."""
    command = [
        sys.executable, str(CONDITIONING), "--weights", str(weights), "--device", device, "--seed", str(seed),
        "--resolution", str(args.resolution), "--dtype", dtype, "--output", str(output),
    ]  # fmt: skip
    if args.precision_patch:
        command.append("--precision-patch")
    from deliverykit.device import repeatable_cpu_env

    result = subprocess.run(command, capture_output=True, text=True, env=repeatable_cpu_env())
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise DeliveryError(f"inference on {device} for seed {seed} failed: {last}", ExitCode(result.returncode))
    return output / "features.safetensors"


def load_features(path: Path):
    from safetensors.torch import load_file

    return load_file(path)["features"]


def localize(weights: Path, target, seed: int, args: argparse.Namespace, max_abs: float) -> dict | None:
    """First layer whose CPU/target outputs differ by more than ``max_abs`` (hooks on every leaf module)."""
    import torch

    from deliverykit.cli import torch_dtype
    from deliverykit.compare import capture_module_outputs, first_divergence
    from trellis2_npu.dinov3 import extract_features
    from trellis2_npu.image import preprocess_image, synthetic_image, to_pixel_values
    from trellis2_npu.loader import load_dinov3
    from trellis2_npu.precision import apply_precision_patch

    pixels = to_pixel_values(preprocess_image(synthetic_image(seed)), args.resolution)
    captured = {}
    for name, device, dtype in (("cpu", "cpu", torch.float32), ("target", target, torch_dtype(args.dtype))):
        model = load_dinov3(weights, device=device, dtype=dtype)
        if args.precision_patch:
            apply_precision_patch(model)
        with torch.inference_mode(), capture_module_outputs(model) as outputs:
            extract_features(model, pixels.to(device))
        captured[name] = outputs
    return first_divergence(captured["cpu"], captured["target"], max_abs)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    from tqdm import tqdm

    from deliverykit import device as devices
    from deliverykit.assets.loadcheck import check_weights_for_loading, smoke_weights, weights_record
    from deliverykit.compare import Thresholds, tensor_metrics, verdict
    from deliverykit.files import ensure_writable_dir, write_json_atomic, write_text_atomic
    from deliverykit.report import build_report, environment_fingerprint
    from deliverykit.tools.readme import render_table
    from trellis2_npu.dinov3 import MODEL_ID
    from trellis2_npu.loader import check_weights_folder, weights_are_random
    from trellis2_npu.tiny import save_random_dinov3

    output = Path(args.output)
    ensure_writable_dir(output.parent)
    target = devices.resolve_device(args.target)
    target_name = devices.device_string(target)
    thresholds = Thresholds(max_abs=args.max_abs, mean_abs=args.mean_abs)

    with tempfile.TemporaryDirectory(prefix="dinov3-accuracy-") as scratch:
        workdir = Path(args.workdir) if args.workdir else Path(scratch)
        if args.smoke:
            weights = save_random_dinov3(Path(scratch) / "weights", variant=args.smoke, seed=0)
        else:
            weights = check_weights_folder(args.weights)

        first = run_inference(weights, "cpu", 0, workdir / "cpu-determinism-a", args, "fp32")
        second = run_inference(weights, "cpu", 0, workdir / "cpu-determinism-b", args, "fp32")
        determinism = tensor_metrics(load_features(first), load_features(second))

        samples = []
        for seed in tqdm(range(args.samples), desc=f"cpu vs {target_name}", unit="sample"):
            reference = run_inference(weights, "cpu", seed, workdir / f"cpu-{seed}", args, "fp32")
            candidate = run_inference(weights, target_name, seed, workdir / f"target-{seed}", args, args.dtype)
            metrics = tensor_metrics(load_features(reference), load_features(candidate))
            samples.append({"seed": seed, **metrics, "verdict": verdict(metrics, thresholds)})

        failing = [s for s in samples if s["verdict"] != "pass"]
        divergence = None
        if failing and args.localize:
            divergence = localize(weights, target, failing[0]["seed"], args, args.max_abs)
        random_weights = weights_are_random(weights)
        if random_weights:
            weights_files = smoke_weights(weights)
        else:
            weights_files = check_weights_for_loading(DELIVERY_DIR / "weights-manifest.json", weights, MODEL_ID)

    worst = {key: max(s[key] for s in samples) for key in ("max_abs", "mean_abs", "rel_l2")}
    overall = "pass" if not failing else ("fixable" if all(s["verdict"] != "fail" for s in samples) else "fail")
    deterministic = determinism["max_abs"] == 0.0
    self_check = target_name == "cpu"
    columns = ["seed", "max_abs", "mean_abs", "cosine", "rel_l2", "verdict"]
    rows = [[s["seed"], s["max_abs"], s["mean_abs"], s["cosine"], s["rel_l2"], s["verdict"]] for s in samples]
    summary_title = (
        f"CPU fp32 vs {target_name} {args.dtype}{' (self-check: target is the CPU)' if self_check else ''}, "
        f"{args.samples} samples at {args.resolution} px, precision patch {'on' if args.precision_patch else 'off'}"
    )
    summary_rows = [
        [
            f"{len(samples) - len(failing)}/{len(samples)}",
            worst["max_abs"],
            worst["mean_abs"],
            f"≤ {args.max_abs:g} / ≤ {args.mean_abs:g}",
            "yes" if deterministic else f"no (max_abs {determinism['max_abs']:.3g})",
            overall,
        ]
    ]
    summary_columns = ["passing", "worst max_abs", "worst mean_abs", "thresholds", "CPU deterministic", "verdict"]
    report = build_report(
        "accuracy",
        "trellis2-npu",
        random_weights=random_weights,
        environment=environment_fingerprint(target, DELIVERY_DIR),
        model={"id": MODEL_ID, "smoke": args.smoke, "dtype": args.dtype, "precision_patch": args.precision_patch},
        weights=weights_record(weights_files),
        results={
            "target": target_name,
            "self_check": self_check,
            "thresholds": {"max_abs": args.max_abs, "mean_abs": args.mean_abs},
            "determinism": {"deterministic": deterministic, **determinism},
            "samples": samples,
            "summary": {"verdict": overall, "passing": len(samples) - len(failing), **worst},
            "first_divergence": divergence,
            "tables": [
                {"title": summary_title, "columns": summary_columns, "rows": summary_rows},
                {"title": "Per sample", "columns": columns, "rows": rows},
            ],
        },
    )
    write_json_atomic(output, report)
    markdown = Path(args.markdown) if args.markdown else output.with_suffix(".md")
    write_text_atomic(
        markdown, render_table(summary_columns, summary_rows) + "\n\n" + render_table(columns, rows) + "\n"
    )

    print(render_table(summary_columns, summary_rows))
    if divergence:
        print(f"first diverging layer: {divergence['name']} (max_abs {divergence['max_abs']:.3g})")
    print(f"results: {output} and {markdown}")
    return 0 if overall == "pass" and deterministic else int(ExitCode.ACCURACY)


if __name__ == "__main__":
    sys.exit(run_main(main))
