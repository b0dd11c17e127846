#!/usr/bin/env python3
"""CPU fp32 reference vs a target device for Sulphur-2 / LTX-2.3: hidden states, frames, audio, heatmaps, verdicts.

The metrics, thresholds and stages are in ``sulphur2_npu/accuracy.py``. Both sides load the same weights through the
delivery's loader (the tiny smoke model unless --model/--text-encoder are given), run the delivery's pipeline
arguments (``generate.pipeline_kwargs``) and draw their noise from a CPU generator, so the latents are identical.
Without an accelerator the target is the CPU too: a determinism self-check; ``--target-dtype bf16`` then compares
fp32 with bf16 on the CPU, a check that the tooling sees a real precision change.

    python sulphur2-npu/scripts/accuracy.py --target npu --output sulphur2-npu/results/accuracy_npu.json
    python sulphur2-npu/scripts/accuracy.py --output sulphur2-npu/results/accuracy.json
    python sulphur2-npu/scripts/accuracy.py --target-dtype bf16 --output sulphur2-npu/results/accuracy_bf16.json

A device-only machine: ``--skip-cpu --save DIR`` runs the target alone and saves it; elsewhere, ``--reference
DIR/target.safetensors`` (a saved run) replaces the CPU run and its first-forward inputs are replayed.

Exit codes: 0 every check passes, 8 a check is fixable or fails, 3 bad input, 4 weights, 5 device, 6 output.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from deliverykit.cli import DTYPE_CHOICES
from deliverykit.errors import ExitCode, run_main

DELIVERY_DIR = Path(__file__).resolve().parents[1]
SMOKE = "smoke"
PROMPT = "a red fox runs through fresh snow at dawn, its breath visible, birds calling in the distance"
NEGATIVE_PROMPT = "blurry, distorted, low quality"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from sulphur2_npu.options import add_schedule_argument
    from sulphur2_npu.presets import PRESETS

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="Sulphur-2 / LTX-2.3 single .safetensors (default: the tiny smoke model)")
    parser.add_argument("--text-encoder", help="Gemma-3 folder with its tokenizer (with --model)")
    parser.add_argument(
        "--preset",
        choices=(SMOKE, *PRESETS),
        help=f"size, frames, steps (default {SMOKE} for the smoke model: 96x64, 9 frames, 2 steps; mini otherwise)",
    )
    add_schedule_argument(parser)
    parser.add_argument("--target", default="auto", help="auto|npu|npu:N|cuda|cpu (default auto)")
    parser.add_argument("--target-dtype", choices=DTYPE_CHOICES, default="fp32", help="target dtype (default fp32)")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--prompt", default=PROMPT)
    parser.add_argument("--output", required=True, help="results JSON (a run report; README tables come from it)")
    parser.add_argument("--heatmap", help="per-frame |Δ| heatmap PNG (default sulphur2-npu/docs/<output>_diff.png)")
    parser.add_argument("--save", help="folder for the runs as safetensors (reference.safetensors, target.safetensors)")
    parser.add_argument("--reference", help="a saved run to compare with instead of running the CPU")
    parser.add_argument("--skip-cpu", action="store_true", help="run the target only and --save it; no comparison")
    parser.add_argument("--dry-run", action="store_true", help="print the plan; load nothing")
    args = parser.parse_args(argv)
    if (args.model is None) != (args.text_encoder is None):
        parser.error("--model and --text-encoder go together (neither: the tiny smoke model)")
    if args.skip_cpu and not args.save:
        parser.error("--skip-cpu needs --save DIR: the target run is only useful saved")
    if args.skip_cpu and args.reference:
        parser.error("--skip-cpu runs no comparison; drop --reference (or --skip-cpu to compare with it)")
    args.preset = args.preset or (SMOKE if args.model is None else "mini")
    if args.preset == SMOKE and args.model is not None:
        parser.error(f"--preset {SMOKE} is the tiny model's size; pick one of {', '.join(PRESETS)} for real weights")
    return args


def request_for(args: argparse.Namespace):
    """The generation request of ``--preset`` (the smoke size is the tiny model's TINY_CALL) and ``--schedule``."""
    from sulphur2_npu.accuracy import tiny_request
    from sulphur2_npu.generate import GenerationRequest
    from sulphur2_npu.presets import resolve_preset
    from sulphur2_npu.schedules import choose_schedule, for_schedule
    from sulphur2_npu.tiny import CHECKPOINT_NAME

    if args.preset == SMOKE:
        request = tiny_request(args.prompt, NEGATIVE_PROMPT)
    else:
        request = GenerationRequest.from_preset(
            resolve_preset(args.preset), args.prompt, negative_prompt=NEGATIVE_PROMPT
        )
    return for_schedule(request, choose_schedule(args.schedule, Path(args.model or CHECKPOINT_NAME)).name)


def plan_for(args: argparse.Namespace, target) -> dict:
    """What will run, from the arguments and the checkpoint header only (nothing heavy is read)."""
    from deliverykit import device as devices
    from sulphur2_npu.accuracy import FRAME_THRESHOLDS, HIDDEN_THRESHOLDS, LPIPS_NOTE, hooked_block_names

    if args.model is None:
        from sulphur2_npu.tiny import TRANSFORMER_CONFIG

        num_layers = TRANSFORMER_CONFIG["num_layers"]
    else:
        from sulphur2_npu.checkpoint import inspect_checkpoint
        from sulphur2_npu.loader import read_text_encoder_config

        info = inspect_checkpoint(
            Path(args.model), text_encoder_config=read_text_encoder_config(Path(args.text_encoder))
        )
        num_layers = info.configs["transformer"]["num_layers"]
    request = request_for(args)
    if args.skip_cpu:
        reference = "none (--skip-cpu)"
    else:
        reference = f"saved run {args.reference}" if args.reference else "cpu fp32"
    return {
        "weights": args.model or "tiny smoke model (random weights, written and loaded like the real file)",
        "reference": reference,
        "target": f"{devices.device_string(target)} {args.target_dtype}",
        "self_check": devices.device_string(target) == "cpu" and not args.reference,
        "preset": args.preset,
        "size": f"{request.width}x{request.height}, {request.num_frames} frames, {request.steps} steps",
        "guidance": request.guidance,
        "schedule": request.schedule,
        "seed": args.seed,
        "hooked_blocks": hooked_block_names(num_layers),
        "thresholds": {
            "hidden": {"min_cosine": HIDDEN_THRESHOLDS.min_cosine, "max_abs": HIDDEN_THRESHOLDS.max_abs},
            "frames": {"min_psnr_db": FRAME_THRESHOLDS.min_psnr_db, "min_ssim": FRAME_THRESHOLDS.min_ssim},
            "audio": {"min_cosine": 0.9999},
        },
        "lpips": LPIPS_NOTE,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from deliverykit import device as devices
    from deliverykit.files import ensure_writable_dir

    target = devices.resolve_device(args.target)
    plan = plan_for(args, target)
    if args.dry_run:
        for key, value in plan.items():
            print(f"{key}: {value}")
        return int(ExitCode.OK)
    ensure_writable_dir(Path(args.output).parent)
    args.heatmap = Path(args.heatmap or DELIVERY_DIR / "docs" / f"{Path(args.output).stem}_diff.png")
    ensure_writable_dir(args.heatmap.parent)
    if args.save:
        ensure_writable_dir(args.save)
    with tempfile.TemporaryDirectory(prefix="sulphur2-accuracy-") as scratch:
        checkpoint, text_encoder = weights(args, Path(scratch))
        return run(args, plan, target, checkpoint, text_encoder)


def weights(args: argparse.Namespace, scratch: Path) -> tuple[Path, Path]:
    if args.model is not None:
        return Path(args.model), Path(args.text_encoder)
    from sulphur2_npu.tiny import write_smoke_files

    files = write_smoke_files(scratch / "smoke", seed=0)
    return files.checkpoint, files.text_encoder


def load(checkpoint: Path, text_encoder: Path, device, dtype: str):
    """The pipeline as the delivery runs it: loader, fused NPU attention, RoPE precision policy, on ``device``."""
    from deliverykit.cli import torch_dtype
    from sulphur2_npu.attention import enable_npu_attention
    from sulphur2_npu.loader import load_pipeline
    from sulphur2_npu.precision import apply_rope_precision_policy

    pipe = load_pipeline(checkpoint, text_encoder, torch_dtype=torch_dtype(dtype)).pipe
    enable_npu_attention(pipe)
    rope = apply_rope_precision_policy(pipe, device)
    return pipe.to(device), rope


def run(args: argparse.Namespace, plan: dict, target, checkpoint: Path, text_encoder: Path) -> int:
    import torch

    from deliverykit.assets.loadcheck import same_weights
    from deliverykit.errors import WeightsError
    from sulphur2_npu.accuracy import SideRun, run_side
    from sulphur2_npu.generate import pipeline_kwargs
    from sulphur2_npu.schedules import use_schedule

    request = request_for(args)
    ran = weights_record(checkpoint, args.model is None)
    reference = None
    if args.reference:
        reference = SideRun.load(Path(args.reference))
        if not same_weights(reference.info.get("weights", []), ran):
            raise WeightsError(
                f"the reference run {args.reference} ran other weights than this one (its report's weights: "
                f"{reference.info.get('weights') or 'not recorded'}): compare runs of the same weights files"
            )
    elif not args.skip_cpu:
        pipe, rope = load(checkpoint, text_encoder, torch.device("cpu"), "fp32")
        use_schedule(pipe, request.schedule)
        reference = run_side(pipe, pipeline_kwargs(pipe, request), args.seed)
        reference.info["rope_precision"] = rope
        reference.info["weights"] = ran
        del pipe
    pipe, rope = load(checkpoint, text_encoder, target, args.target_dtype)
    use_schedule(pipe, request.schedule)
    inputs = None if reference is None else (reference.inputs, reference.inputs_meta)
    candidate = run_side(pipe, pipeline_kwargs(pipe, request), args.seed, inputs)
    candidate.info["rope_precision"] = rope
    candidate.info["weights"] = ran
    if args.save:
        candidate.save(Path(args.save) / "target.safetensors")
        if reference is not None and not args.reference:
            reference.save(Path(args.save) / "reference.safetensors")
    if reference is None:
        print(f"target run saved to {Path(args.save) / 'target.safetensors'}; compare it elsewhere with --reference")
        return int(ExitCode.OK)
    return report(args, plan, target, reference, candidate)


def weights_record(checkpoint: Path, smoke: bool) -> list[dict]:
    """What ran, for the report and the saved runs: every smoke file (hashed), or the checkpoint checked against the
    manifest (:mod:`deliverykit.assets.loadcheck`)."""
    from deliverykit.assets import loadcheck
    from sulphur2_npu import MODEL_ID

    if smoke:
        return loadcheck.weights_record(loadcheck.smoke_weights(checkpoint.parent))
    manifest = DELIVERY_DIR / "weights-manifest.json"
    return loadcheck.weights_record([loadcheck.check_file_for_loading(manifest, checkpoint, MODEL_ID)])


def report(args: argparse.Namespace, plan: dict, target, reference, candidate) -> int:
    from deliverykit.report import delivery_report, write_report
    from deliverykit.tools.readme import render_table
    from sulphur2_npu.accuracy import compare_runs, write_diff_heatmap

    results = compare_runs(reference, candidate)
    output = Path(args.output)
    heatmap = write_diff_heatmap(reference.frames, candidate.frames, args.heatmap)
    heatmap["path"] = os.path.relpath(args.heatmap, DELIVERY_DIR)  # as the README links it
    tables = result_tables(plan, results, reference, candidate)
    report_data = delivery_report(
        "accuracy",
        DELIVERY_DIR,
        device=target,
        random_weights=args.model is None,
        plan=plan,
        weights=candidate.info["weights"],
        results={
            **results,
            "reference": {"device": reference.device, "dtype": reference.dtype, **reference.info},
            "target": {"device": candidate.device, "dtype": candidate.dtype, **candidate.info},
            "heatmap": heatmap,
            "tables": tables,
        },
    )
    write_report(output, report_data)
    for table in tables:
        print(f"{table['title']}\n{render_table(table['columns'], table['rows'])}\n")
    print(f"verdict: {results['verdict']}; results: {output}; heatmap: {args.heatmap}")
    return int(ExitCode.OK if results["verdict"] == "pass" else ExitCode.ACCURACY)


def result_tables(plan: dict, results: dict, reference, candidate) -> list[dict]:
    """README tables: one summary row per output, then the hooked hidden states."""
    frames, audio = results["frames"], results["audio"]
    worst_hidden = min(results["hidden"], key=lambda row: row["cosine"])
    self_check = " (self-check: the target is the CPU)" if plan["self_check"] else ""
    title = (
        f"{candidate.device} {candidate.dtype} vs {reference.device} {reference.dtype}{self_check}, "
        f"{plan['size']}, seed {plan['seed']}, RoPE {reference.info.get('rope_precision')} vs "
        f"{candidate.info.get('rope_precision')}; {results['lpips']}"
    )
    summary = [
        ["hidden states (lowest cosine)", worst_hidden["name"], worst_hidden["max_abs"], 1 - worst_hidden["cosine"],
         "1 - cos ≤ 1e-4, max |Δ| ≤ 1e-3", combine(results["hidden"])],
        ["frames", f"PSNR {frames['psnr_db']:.2f} dB, SSIM {frames['ssim']:.4f}", frames["max_abs"], None,
         "PSNR ≥ 30 dB, SSIM ≥ 0.95", frames["verdict"]],
        ["audio", f"SNR {audio['snr_db']:.2f} dB", audio["max_abs"], 1 - audio["cosine"], "1 - cos ≤ 1e-4",
         audio["verdict"]],
    ]  # fmt: skip
    hidden_rows = [[r["name"], r["max_abs"], r["mse"], 1 - r["cosine"], r["verdict"]] for r in results["hidden"]]
    return [
        {
            "title": title,
            "columns": ["output", "measure", "max abs", "1 - cosine", "threshold", "verdict"],
            "rows": summary,
        },
        {
            "title": "First transformer forward, identical inputs: hooked blocks and output",
            "columns": ["hidden state", "max abs", "MSE", "1 - cosine", "verdict"],
            "rows": hidden_rows,
        },
    ]


def combine(rows: list[dict]) -> str:
    from deliverykit.compare import combine_verdicts

    return combine_verdicts(row["verdict"] for row in rows)


if __name__ == "__main__":
    sys.exit(run_main(main))
