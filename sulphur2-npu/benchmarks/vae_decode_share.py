#!/usr/bin/env python3
"""What share of a multi-card run the video VAE decode takes, measured on the CPU and scaled by FLOPs (README
"Several cards": why the decode is not split over the ranks).

Every rank of ``--parallel`` denoises 1/N of each step but decodes the whole video itself (redundant, like one
card). This script counts, on the meta device (no weights, exact shapes), the FLOPs of one transformer row (pass) of
the full-size LTX-2.3 transformer (18.99B) at 704x480x161 and of the full-size video VAE decoder at the same size;
the dev schedule runs ``--steps`` steps of 4 rows (CFG at batch 2, STG, modality isolation). With the transformer
split perfectly over N ranks and the decode on every rank, the decode's share of a rank's work and the Amdahl bound
on the speed-up follow.

The decoder's per-stage layer counts are not known without the real file (only a third-party header count: 170
``vae.*`` tensors and about 0.73B parameters for the whole VAE). With diffusers' LTX-2 encoder layout (4, 6, 6, 2, 2)
that leaves 16 decoder resnets; every layout of them whose VAE has 0.73B ± 2 % parameters is counted, and the
lightest and heaviest decoders bracket the estimate. Both are also run on the CPU (random weights, fp32) at a
reduced latent to measure how fast this CPU runs the decoder's convolutions, and one full-width transformer block
(at a reduced token grid) how fast it runs the transformer's matmuls and attention: the share
is given for equal efficiency (FLOPs only) and for the CPU's measured efficiencies. No NPU figure is measured.

    python sulphur2-npu/benchmarks/vae_decode_share.py --output sulphur2-npu/results/vae_decode.json
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path
from typing import Any

from deliverykit.errors import run_main

DELIVERY_DIR = Path(__file__).resolve().parents[1]
WIDTH, HEIGHT, NUM_FRAMES = 704, 480, 161
TEXT_TOKENS = 1024  # the delivery's max_sequence_length
ROWS_PER_STEP = 4  # dev schedule with full guidance: uncond + cond (one batch-2 call), STG, modality isolation
# ltx-core / diffusers LTX-2.3 widths (the loader's defaults and sulphur.md §3); the flags are the tiny model's.
FULL_TRANSFORMER = {
    "in_channels": 128,
    "out_channels": 128,
    "num_attention_heads": 32,
    "attention_head_dim": 128,
    "cross_attention_dim": 4096,
    "audio_in_channels": 128,
    "audio_out_channels": 128,
    "audio_num_attention_heads": 32,
    "audio_attention_head_dim": 64,
    "audio_cross_attention_dim": 2048,
    "num_layers": 48,
}
FULL_VAE = {
    "latent_channels": 128,
    "block_out_channels": (256, 512, 1024, 1024),
    "decoder_block_out_channels": (256, 512, 512, 1024),
    "layers_per_block": (4, 6, 6, 2, 2),  # diffusers' LTX-2 encoder
}
HEADER_VAE_TENSORS, HEADER_VAE_PARAMETERS = 170, 0.73e9


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", required=True, help="results JSON for the README")
    parser.add_argument("--steps", type=int, default=30, help="dev steps (default 30, LTX-2.3's own)")
    parser.add_argument("--ranks", default="1,2,4,8", help="world sizes to estimate (default 1,2,4,8)")
    parser.add_argument("--latent", default="2,2,4", help="reduced latent F,H,W timed on the CPU (default 2,2,4)")
    parser.add_argument("--runs", type=int, default=2, help="timed runs per CPU measurement (default 2)")
    return parser.parse_args(argv)


def latent_grid(width: int, height: int, num_frames: int) -> tuple[int, int, int]:
    """(frames, height, width) in latent units: 8x in time (+ the first frame), 32x in space."""
    return (num_frames - 1) // 8 + 1, height // 32, width // 32


def audio_tokens(num_frames: int, fps: float = 24.0) -> int:
    """The pipeline's audio latent length: 16 kHz, hop 160, 4x compressed (``LTX2Pipeline.__call__``)."""
    return round(num_frames / fps * 16000 / 160 / 4)


def transformer_inputs(grid: tuple[int, int, int], audio: int, device: Any) -> dict[str, Any]:
    import torch

    def empty(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=device) if device != "meta" else torch.empty(*shape, device="meta")

    frames, height, width = grid
    return {
        "hidden_states": empty(1, frames * height * width, 128),
        "audio_hidden_states": empty(1, audio, 128),
        "encoder_hidden_states": empty(1, TEXT_TOKENS, 4096),
        "audio_encoder_hidden_states": empty(1, TEXT_TOKENS, 2048),
        "timestep": torch.full((1,), 500.0, device=device),
        "audio_timestep": torch.full((1,), 500.0, device=device),
        "sigma": torch.full((1,), 0.5, device=device),
        "audio_sigma": torch.full((1,), 0.5, device=device),
        "encoder_attention_mask": torch.ones(1, TEXT_TOKENS, device=device),
        "audio_encoder_attention_mask": torch.ones(1, TEXT_TOKENS, device=device),
        "num_frames": frames,
        "height": height,
        "width": width,
        "audio_num_frames": audio,
        "return_dict": False,
    }


def count_flops(fn: Any) -> int:
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        fn()
    return int(counter.get_total_flops())


def build(cls: Any, config: dict[str, Any], device: str) -> Any:
    import torch

    with torch.device(device):
        return cls(**config).eval()


def decoder_layouts(grid: tuple[int, ...]) -> list[dict[str, Any]]:
    """Every decoder layout (1-6 resnets per block) whose VAE has the header's 170 tensors and 0.73B ± 2 %
    parameters, with its FLOPs at ``grid``, lightest first.

    Parameters and FLOPs are linear in the resnets per block (a resnet of a block has that block's width and
    resolution), so six meta models give every layout's: all blocks at 1, and each block at 2.
    """
    import torch
    from diffusers import AutoencoderKLLTX2Video

    from sulphur2_npu.keymap import map_to_original
    from sulphur2_npu.tiny import VAE_CONFIG

    def config(layers: tuple[int, ...]) -> dict[str, Any]:
        return VAE_CONFIG | FULL_VAE | {"decoder_layers_per_block": layers}

    def measure(layers: tuple[int, ...]) -> tuple[int, int, int]:
        vae = build(AutoencoderKLLTX2Video, config(layers), "meta")
        flops = count_flops(lambda: vae.decoder(torch.empty(1, 128, *grid, device="meta"), None))
        return len(map_to_original("vae", vae.state_dict())), sum(p.numel() for p in vae.parameters()), flops

    blocks = len(VAE_CONFIG["decoder_layers_per_block"])
    ones = (1,) * blocks
    tensors, base_parameters, base_flops = measure(ones)
    per_resnet = []  # (parameters, flops) of one more resnet in each block
    for block in range(blocks):
        _, parameters, flops = measure(tuple(2 if i == block else 1 for i in range(blocks)))
        per_resnet.append((parameters - base_parameters, flops - base_flops))
    resnets = blocks + (HEADER_VAE_TENSORS - tensors) // 4  # a resnet has 4 tensors (2 convs, weight + bias)
    layouts = []
    for layers in itertools.product(range(1, 7), repeat=blocks):
        if sum(layers) != resnets:
            continue
        extra = [n - 1 for n in layers]
        parameters = base_parameters + sum(n * p for n, (p, _) in zip(extra, per_resnet, strict=True))
        if abs(parameters / HEADER_VAE_PARAMETERS - 1) <= 0.02:
            flops = base_flops + sum(n * f for n, (_, f) in zip(extra, per_resnet, strict=True))
            layouts.append({"config": config(layers), "parameters": parameters, "flops": flops})
    return sorted(layouts, key=lambda layout: layout["flops"])


def timed_ms(fn: Any, runs: int) -> float:
    import torch

    from deliverykit.timing import benchmark

    with torch.no_grad():
        return benchmark(fn, warmup=1, repeat=runs).median_ms


def measure_transformer(config: dict[str, Any], grid: tuple[int, ...], audio: int, runs: int) -> dict[str, Any]:
    """FLOPs of one row at ``grid`` (meta), and the CPU's GFLOP/s on one full-width block at a quarter of its frames
    and half its height and width (385 video tokens: enough for the per-token matmuls to dominate)."""
    import torch
    from diffusers import LTX2VideoTransformer3DModel

    meta = build(LTX2VideoTransformer3DModel, config, "meta")
    row_flops = count_flops(lambda: meta(**transformer_inputs(grid, audio, "meta")))
    block_grid = (max(1, grid[0] // 4), max(1, grid[1] // 2), max(1, grid[2] // 2))
    block_config = config | {"num_layers": 1}
    block_meta = build(LTX2VideoTransformer3DModel, block_config, "meta")
    block_flops = count_flops(lambda: block_meta(**transformer_inputs(block_grid, audio // 4, "meta")))
    torch.manual_seed(0)
    block = build(LTX2VideoTransformer3DModel, block_config, "cpu")
    inputs = transformer_inputs(block_grid, audio // 4, "cpu")
    block_ms = timed_ms(lambda: block(**inputs), runs)
    return {
        "parameters": sum(p.numel() for p in meta.parameters()),
        "tflop_per_row": row_flops / 1e12,
        "cpu_block_grid": list(block_grid),
        "cpu_block_ms": block_ms,
        "cpu_gflop_per_s": block_flops / block_ms / 1e6,
    }


def measure_decoder(
    layout: dict[str, Any], grid: tuple[int, ...], latent: tuple[int, ...], runs: int
) -> dict[str, Any]:
    """One decoder layout: its FLOPs at ``grid`` (checked against the linear count) and the CPU's GFLOP/s on it at
    ``latent``."""
    import torch
    from diffusers import AutoencoderKLLTX2Video

    meta = build(AutoencoderKLLTX2Video, layout["config"], "meta")
    full = count_flops(lambda: meta.decoder(torch.empty(1, 128, *grid, device="meta"), None))
    if full != layout["flops"]:
        raise RuntimeError(f"decoder FLOPs {full} != {layout['flops']} of the per-block count: layers interact")
    flops = count_flops(lambda: meta.decoder(torch.empty(1, 128, *latent, device="meta"), None))
    torch.manual_seed(0)
    vae = build(AutoencoderKLLTX2Video, layout["config"], "cpu")
    z = torch.randn(1, 128, *latent)
    ms = timed_ms(lambda: vae.decoder(z, None), runs)
    return {
        "decoder_layers_per_block": list(layout["config"]["decoder_layers_per_block"]),
        "vae_parameters": layout["parameters"],
        "decoder_parameters": sum(p.numel() for p in meta.decoder.parameters()),
        "full_size_tflop": layout["flops"] / 1e12,
        "cpu_latent": list(latent),
        "cpu_ms": ms,
        "cpu_gflop_per_s": flops / ms / 1e6,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    from deliverykit.files import ensure_writable_dir
    from deliverykit.report import delivery_report, write_report
    from sulphur2_npu.tiny import TRANSFORMER_CONFIG

    ensure_writable_dir(Path(args.output).parent)
    ranks = [int(n) for n in args.ranks.split(",")]
    grid, audio = latent_grid(WIDTH, HEIGHT, NUM_FRAMES), audio_tokens(NUM_FRAMES)
    small = tuple(int(n) for n in args.latent.split(","))

    # 1. FLOPs of one transformer row at full size, and of one block at a reduced grid (then timed on the CPU).
    transformer = measure_transformer(TRANSFORMER_CONFIG | FULL_TRANSFORMER, grid, audio, args.runs)
    row_flops, transformer_rate = transformer["tflop_per_row"] * 1e12, transformer["cpu_gflop_per_s"]
    run_flops = args.steps * ROWS_PER_STEP * row_flops
    print(f"transformer: {transformer['parameters'] / 1e9:.2f}B, {transformer['tflop_per_row']:.1f} TFLOP/row, "
          f"CPU {transformer_rate:.1f} GFLOP/s")  # fmt: skip

    # 2. The decoder layouts the header count allows: FLOPs at full size, the lightest and heaviest timed on the CPU.
    layouts = decoder_layouts(grid)
    bracket = {"lightest": layouts[0], "heaviest": layouts[-1]}
    decoders = {name: measure_decoder(layout, grid, small, args.runs) for name, layout in bracket.items()}
    for name, decoder in decoders.items():
        print(f"decoder {name}: {decoder['full_size_tflop']:.1f} TFLOP at full size, CPU "
              f"{decoder['cpu_gflop_per_s']:.1f} GFLOP/s ({decoder['cpu_ms']:.0f} ms)")  # fmt: skip

    # 3. The decode's share of a rank's work, decoded on every rank; Amdahl's bound on the speed-up.
    rows = []
    for name, decoder in decoders.items():
        decode = decoder["full_size_tflop"] * 1e12
        slowdown = transformer_rate / decoder["cpu_gflop_per_s"]  # decoder time per FLOP vs transformer's, CPU
        for n in ranks:
            share = decode / (decode + run_flops / n)
            cpu_share = decode * slowdown / (decode * slowdown + run_flops / n)
            speedup = (run_flops + decode) / (run_flops / n + decode)
            cpu_speedup = (run_flops + decode * slowdown) / (run_flops / n + decode * slowdown)
            rows.append([name, n, 100 * share, speedup, 100 * cpu_share, cpu_speedup])
    columns = ["decoder", "N ranks", "decode share % (FLOPs)", "speed-up bound (FLOPs)"]
    columns += ["decode share % (CPU efficiencies)", "speed-up bound (CPU efficiencies)"]
    title = (
        f"Video VAE decode on every rank vs the transformer split over N ranks: LTX-2.3 at {WIDTH}x{HEIGHT}x"
        f"{NUM_FRAMES} (latent {'x'.join(map(str, grid))}, {audio} audio tokens, {TEXT_TOKENS} text tokens), dev "
        f"{args.steps} steps x {ROWS_PER_STEP} rows; transformer {row_flops / 1e12:.1f} TFLOP per row, decoder "
        f"{decoders['lightest']['full_size_tflop']:.1f} to {decoders['heaviest']['full_size_tflop']:.1f} TFLOP "
        "(FLOPs counted on the meta device; CPU efficiencies: random weights, fp32, one block and the decoder timed "
        "at reduced sizes; not an NPU measurement)"
    )
    report = delivery_report(
        "benchmark",
        DELIVERY_DIR,
        device="cpu",
        random_weights=True,
        results={
            "size": {"width": WIDTH, "height": HEIGHT, "num_frames": NUM_FRAMES, "latent_grid": list(grid)},
            "transformer": transformer
            | {"rows_per_step": ROWS_PER_STEP, "steps": args.steps, "run_tflop": run_flops / 1e12},
            "decoder_layouts_counted": len(layouts),
            "decoders": decoders,
            "tables": [{"title": title, "columns": columns, "rows": rows}],
        },
    )
    write_report(args.output, report)
    for row in rows:
        print(" | ".join(f"{v:.3g}" if isinstance(v, float) else str(v) for v in row))
    print(f"results: {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
