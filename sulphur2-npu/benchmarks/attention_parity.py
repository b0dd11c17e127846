#!/usr/bin/env python3
"""Our fused NPU attention path and diffusers' stock ``_native_npu`` backend, each against SDPA, on the CPU.

Both paths run their real code (mask conversion, kernel arguments) with deliverykit's CPU reference of
``npu_fusion_attention``'s documented semantics standing in for the op, so the only difference from an NPU run is
the kernel's own rounding. Measured on the tiny LTX-2.3 pipeline loaded through the delivery's loader: video and
audio latents after 2 denoising steps with identical noise, in float32 and bfloat16.

    python sulphur2-npu/benchmarks/attention_parity.py --output sulphur2-npu/results/attention.json
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from deliverykit.errors import run_main

DELIVERY_DIR = Path(__file__).resolve().parents[1]

DTYPES = ("float32", "bfloat16")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", required=True, help="results JSON for the README")
    parser.add_argument("--seed", type=int, default=42)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    from deliverykit.compare import tensor_metrics
    from deliverykit.files import ensure_writable_dir
    from deliverykit.report import delivery_report, write_report
    from sulphur2_npu.attention import enable_npu_attention, stock_native_npu_on_cpu
    from sulphur2_npu.loader import load_pipeline
    from sulphur2_npu.tiny import TINY_CALL, write_smoke_files

    ensure_writable_dir(Path(args.output).parent)

    def latents(pipe) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(args.seed)
        with torch.no_grad():
            out = pipe(**{**TINY_CALL, "output_type": "latent"}, generator=generator)
        return out.frames.float(), out.audio.float()

    rows, raw = [], {}
    with tempfile.TemporaryDirectory(prefix="sulphur2-attention-") as scratch:
        files = write_smoke_files(Path(scratch), seed=0)
        for dtype in DTYPES:
            pipe = load_pipeline(files.checkpoint, files.text_encoder, torch_dtype=getattr(torch, dtype)).pipe
            reference = latents(pipe)  # diffusers' default dispatcher: SDPA
            outputs = {}
            with stock_native_npu_on_cpu():
                outputs["diffusers _native_npu"] = latents(pipe)
            enable_npu_attention(pipe, mode="npu")
            outputs["sulphur2_npu fused path"] = latents(pipe)
            for path, (video, audio) in outputs.items():
                video_metrics, audio_metrics = tensor_metrics(reference[0], video), tensor_metrics(reference[1], audio)
                raw[f"{path} / {dtype}"] = {"video": video_metrics, "audio": audio_metrics}
                rows.append(
                    [
                        path,
                        dtype,
                        video_metrics["rel_l2"],
                        audio_metrics["rel_l2"],
                        int(video_metrics["nonfinite"] + audio_metrics["nonfinite"]),
                    ]
                )

    table = {
        "title": "Attention paths vs SDPA: tiny LTX-2.3 latents after 2 steps (random weights, CPU, "
        "npu_fusion_attention replaced by its CPU reference; relative L2 error, NaN = non-finite values)",
        "columns": ["attention path", "dtype", "video rel. error", "audio rel. error", "non-finite values"],
        "rows": rows,
    }
    report = delivery_report(
        "accuracy", DELIVERY_DIR, device="cpu", random_weights=True, results={"paths": raw, "tables": [table]}
    )
    write_report(args.output, report)
    for row in rows:
        print(" | ".join(str(cell) for cell in row))
    print(f"results: {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
