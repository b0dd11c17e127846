#!/usr/bin/env python3
"""TRELLIS.2-4B image conditioning (DINOv3 ViT-L/16) on NPU, CUDA or CPU.

Loads DINOv3 from a local folder (or, with --smoke, from seeded random weights of the same architecture written
to a temporary folder and loaded back through the same code), prepares the image as TRELLIS.2 does, runs the
TRELLIS.2 feature path, prints the evidence lines and writes report.json + features.safetensors + preview.png to
--output. The whole image → 3D pipeline is ``inference.py``.

    python trellis2-npu/scripts/conditioning.py --weights ~/weights/dinov3-vitl16-pretrain-lvd1689m --image cat.png \
        --output out/
    python trellis2-npu/scripts/conditioning.py --smoke full --device cpu --output out/

Exit codes: 0 ok, 1 unexpected error, 2 bad arguments, 3 bad input image (or a decompression bomb), 4 bad weights,
5 device unavailable, 6 an output cannot be written (a folder in the way, not writable, disk full), 7 NaN/Inf in
the output. Outputs are checked before any work and appear together at the end, or not at all (no empty --output
folder either).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from pathlib import Path

from deliverykit import device as devices
from deliverykit.assets.loadcheck import check_weights_for_loading, smoke_weights, weights_record
from deliverykit.cli import add_common_args, check_counts, torch_dtype
from deliverykit.errors import NumericsError, run_main
from deliverykit.files import RunOutputs
from deliverykit.report import RunRecord, evidence_lines
from deliverykit.timing import benchmark

DELIVERY_DIR = Path(__file__).resolve().parents[1]
MANIFEST = DELIVERY_DIR / "weights-manifest.json"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(parser)
    parser.add_argument("--image", help="input image (RGB, RGBA, grayscale, 8 or 16 bit); default: seeded noise")
    parser.add_argument("--resolution", type=int, choices=(512, 1024), default=512, help="DINOv3 input size")
    parser.add_argument(
        "--precision-patch",
        action="store_true",
        help="fp32-matmul patch embedding + erf GELU (the public port's symmetric NPU precision patches)",
    )
    parser.add_argument("--report", help="also write the run report to this path (e.g. results/performance.json)")
    args = parser.parse_args(argv)
    if args.bench:
        check_counts(parser, args)
    if not args.weights and not args.smoke:
        parser.error("pass --weights DIR (downloaded DINOv3 folder) or --smoke [full|tiny]")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # torch and the model: imported once the arguments are known good, so usage errors come at once
    import torch
    from safetensors.torch import save

    from trellis2_npu import dinov3, image, loader, precision, preview, tiny

    # 1. Check inputs: the outputs, the device, the weights folder and the image (prepared as TRELLIS.2 does), before
    # loading anything.
    names = ("features.safetensors", "preview.png")
    outputs = RunOutputs.declare({name: Path(args.output) / name for name in names}, args.report, folder=args.output)
    device = devices.resolve_device(args.device)
    dtype = torch_dtype(args.dtype)
    if not args.smoke:
        # Specific messages first (missing folder, other model, truncated header), then the manifest check
        # (refuses missing/corrupt files, warns about valid ones that differ from the release), which only
        # describes the released files (not random weights written by --smoke or the tests).
        loader.check_weights_folder(args.weights)
        if not loader.weights_are_random(args.weights):
            weights_files = check_weights_for_loading(
                MANIFEST, args.weights, dinov3.MODEL_ID, strict=args.strict_manifest
            )
    prepared = image.preprocess_image(image.load_image(args.image) if args.image else image.synthetic_image(args.seed))
    pixel_values = image.to_pixel_values(prepared, args.resolution)

    # 2. Load: the downloaded folder, or random weights of the same architecture written in the hub layout.
    with contextlib.ExitStack() as stack:
        weights_dir = args.weights
        if args.smoke:
            weights_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="dinov3-smoke-"))
            tiny.save_random_dinov3(weights_dir, variant=args.smoke, seed=0)
        model = loader.load_dinov3(weights_dir, device=device, dtype=dtype)
        random_weights = loader.weights_are_random(weights_dir)
        if random_weights:
            weights_files = smoke_weights(weights_dir)

    # 3. Prepare: the precision patch (--precision-patch), the input on the device.
    patched = precision.apply_precision_patch(model) if args.precision_patch else []
    inputs = pixel_values.to(device)

    # 4. Generate the features (with --bench: warmup + timed runs).
    devices.reset_peak_memory_stats(device)
    computed = {}

    @torch.inference_mode()
    def forward() -> None:
        computed["features"] = dinov3.extract_features(model, inputs)

    warmup, runs = (args.warmup, args.runs) if args.bench else (0, 1)
    timing = benchmark(forward, warmup=warmup, repeat=runs, device=device)
    features = computed["features"]
    peak = devices.max_memory_allocated(device)
    expected = dinov3.feature_shape(model.config, args.resolution)
    if list(features.shape) != expected:
        raise RuntimeError(f"features shape {list(features.shape)} != expected {expected}")
    if not torch.isfinite(features).all():
        bad = int((~torch.isfinite(features)).sum())
        raise NumericsError(f"{bad} NaN/Inf values in the features on {device}; try --dtype fp32 or --precision-patch")

    audit = devices.audit_placement(model, device, {"input": inputs, "output": features})
    evidence = {
        "INPUT_DEVICE": devices.device_string(inputs.device),
        "MODEL_DEVICE": audit.model_device,
        "OUTPUT_DEVICE": devices.device_string(features.device),
        "CPU_FALLBACK": audit.cpu_fallback,
        "LATENT_SHAPE": list(features.shape),
        "EMBEDDING_HEAD": [round(v, 4) for v in features[0, 0, :4].float().cpu().tolist()],
        "TIMING_MEDIAN_MS": timing.median_ms,
        "TIMING_P90_MS": timing.p90_ms,
        "PEAK_MEMORY_MB": None if peak is None else peak / 2**20,
    }
    row = [evidence["MODEL_DEVICE"], timing.median_ms, timing.p90_ms, timing.mean_ms, timing.std_ms, warmup, runs]
    run_report = RunRecord(DELIVERY_DIR, device, random_weights).report(
        "inference",
        evidence,
        model={"id": dinov3.MODEL_ID, "smoke": args.smoke, "dtype": args.dtype, "precision_patch": patched},
        weights=weights_record(weights_files),
        inputs={"image": args.image or f"synthetic noise, seed {args.seed}", "resolution": args.resolution},
        timing=timing.to_dict(),
        placement={"off_device": audit.off_device, "tensors": audit.tensor_devices},
        results={
            "features_file": "features.safetensors",
            "preview_file": "preview.png",
            "tables": [
                {
                    "title": f"DINOv3 conditioning forward at {args.resolution} px ({args.dtype})",
                    "columns": ["device", "median ms", "p90 ms", "mean ms", "std ms", "warmup", "runs", "peak MB"],
                    "rows": [[*row, evidence["PEAK_MEMORY_MB"]]],
                }
            ],
        },
    )
    picture = preview.conditioning_preview(prepared, features, num_prefix_tokens=1 + model.config.num_register_tokens)

    # 5. Write: the files, report.json included, appear only once all are complete; a failure leaves none behind.
    with outputs.commit() as commit:
        picture.save(commit.files["preview.png"], format="PNG")
        features_bytes = save(
            {"features": features.detach().float().cpu().contiguous()},
            metadata={
                "model": dinov3.MODEL_ID,
                "resolution": str(args.resolution),
                "random_weights": str(random_weights),
            },
        )
        commit.files["features.safetensors"].write_bytes(features_bytes)
        commit.report = run_report

    for line in evidence_lines(evidence):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
