#!/usr/bin/env python3
"""Varlen attention (``trellis2_npu.attention``) against padded dense SDPA with a key mask, measured side by side.

Self-attention over 4 sequences of mixed length (default 1k, 2k, 4k and 8k tokens), 12 heads × 128 channels, fp32,
as in TRELLIS.2's SLat flows when several items share a batch. The padded alternative copies every sequence into
an ``[N, Lmax, H, C]`` batch, runs one SDPA with a boolean key mask and copies the real tokens back; ours
(``varlen_attention``, backend ``auto``) runs one SDPA per sequence on CPU/CUDA and ``npu_fusion_attention`` (TND)
on an NPU. Both run in one process, alternating round by round, so that machine noise hits both alike. The time
ratio is the median over rounds of ours/padded (target ≤ 1.0).

Memory: on an accelerator, the peak of ``max_memory_allocated`` during one call above what was allocated before
it. On the CPU torch has no allocation counter, so the script samples the process's resident set size
(``/proc/self/statm``, every millisecond) during one call and reports its growth; it also reports the bytes each
variant materialises by construction (computed, not measured) for comparison.

    python trellis2-npu/benchmarks/varlen_attention.py --output trellis2-npu/results/varlen_attention.json

About 1.5 minutes on 2 CPU cores with the defaults. Exit code 0, or 1 with --check when the target is missed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from deliverykit import device as devices
from deliverykit.errors import run_main
from deliverykit.files import ensure_writable_dir, write_json_atomic
from deliverykit.memory import peak_memory_growth
from deliverykit.report import delivery_report
from deliverykit.timing import benchmark_alternating, paired_ratio
from trellis2_npu.attention import cu_seqlens_from_lengths, varlen_attention

DELIVERY_DIR = Path(__file__).resolve().parents[1]

TARGET_RATIO = 1.0
OURS, PADDED = "ours (varlen_attention)", "padded dense SDPA + key mask"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
MIB = 2**20


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", help="device (default cpu, as the README's figures)")
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192], help="tokens per sequence")
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--rounds", type=int, default=3, help="alternating timed rounds (default 3)")
    parser.add_argument("--output", required=True, help="results JSON for the README")
    parser.add_argument("--check", action="store_true", help="exit 1 when the time ratio misses its target")
    return parser.parse_args(argv)


def padded_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """The alternative to varlen attention: pad to the longest sequence, mask padded keys, one SDPA, unpad."""
    longest = max(lengths)
    padded = [t.new_zeros(len(lengths), longest, *t.shape[1:]) for t in (q, k, v)]
    for target, source in zip(padded, (q, k, v), strict=True):
        for i, chunk in enumerate(source.split(lengths)):
            target[i, : len(chunk)] = chunk
    keep = torch.arange(longest, device=q.device)[None, :] < torch.tensor(lengths, device=q.device)[:, None]
    q_pad, k_pad, v_pad = (t.transpose(1, 2) for t in padded)
    out = F.scaled_dot_product_attention(q_pad, k_pad, v_pad, attn_mask=keep[:, None, None]).transpose(1, 2)
    return torch.cat([out[i, :length] for i, length in enumerate(lengths)])


def materialised_bytes(lengths: list[int], heads: int, head_dim: int, element_size: int) -> dict[str, int]:
    """Bytes each variant allocates by construction beyond its inputs (SDPA's internal buffers not counted)."""
    token_bytes = heads * head_dim * element_size
    output = sum(lengths) * token_bytes
    padded_tokens = len(lengths) * max(lengths)
    return {
        OURS: output + max(lengths) * token_bytes,  # the output, plus one sequence's SDPA result before its copy
        PADDED: 4 * padded_tokens * token_bytes + padded_tokens + output,  # padded q, k, v, out; bool mask; unpad
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    ensure_writable_dir(Path(args.output).parent)
    device = devices.resolve_device(args.device)
    dtype, lengths = DTYPES[args.dtype], args.lengths
    generator = torch.Generator().manual_seed(0)  # CPU noise, then moved: the same inputs on every device
    q, k, v = (
        torch.randn(sum(lengths), args.heads, args.head_dim, generator=generator).to(device=device, dtype=dtype)
        for _ in range(3)
    )
    cu_seqlens = cu_seqlens_from_lengths(lengths).tolist()  # host list: no device sync inside the timed calls
    variants = {
        OURS: lambda: varlen_attention(q, k, v, cu_seqlens, cu_seqlens),
        PADDED: lambda: padded_attention(q, k, v, lengths),
    }

    peak_bytes, outputs = {}, {}
    with torch.inference_mode():
        for name, fn in variants.items():  # the untimed warm-up call of each variant also measures its memory
            outputs[name], peak_bytes[name], memory_method = peak_memory_growth(fn, device)
        max_abs_diff = (outputs[OURS].float() - outputs[PADDED].float()).abs().max().item()
        outputs.clear()
        samples = benchmark_alternating(variants, args.rounds, device)

    medians = {name: statistics.median(values) for name, values in samples.items()}
    ratio = paired_ratio(samples, OURS, PADDED)
    theory = materialised_bytes(lengths, args.heads, args.head_dim, q.element_size())

    def mib(value: int | None) -> float | None:
        return None if value is None else value / MIB

    time_rows = [[name, medians[name], min(samples[name]), max(samples[name]), len(samples[name])] for name in variants]
    ratio_rows = [["ours / padded (median of paired rounds)", ratio, f"≤ {TARGET_RATIO}", ratio <= TARGET_RATIO]]
    memory_rows = [[name, mib(peak_bytes[name]), memory_method, mib(theory[name])] for name in variants]
    title = (
        f"varlen self-attention, lengths {lengths}, {args.heads} heads × {args.head_dim}, {args.dtype} on "
        f"{devices.device_string(device)}"
    )
    report = delivery_report(
        "benchmark",
        DELIVERY_DIR,
        device=device,
        random_weights=True,
        results={
            "lengths": lengths,
            "medians_ms": medians,
            "samples_ms": samples,
            "ratio": ratio,
            "peak_memory_bytes": peak_bytes,
            "memory_method": memory_method,
            "materialised_bytes": theory,
            "max_abs_diff_ours_vs_padded": max_abs_diff,
            "tables": [
                {"title": f"{title}: ratio", "columns": ["ratio", "measured", "target", "met"], "rows": ratio_rows},
                {
                    "title": f"{title}: times ({args.rounds} alternating rounds)",
                    "columns": ["variant", "median ms", "min ms", "max ms", "runs"],
                    "rows": time_rows,
                },
                {
                    "title": f"{title}: memory of one call",
                    "columns": ["variant", "measured peak MiB", "measured as", "materialised MiB (computed)"],
                    "rows": memory_rows,
                },
            ],
        },
    )
    write_json_atomic(args.output, report)
    for name in variants:
        measured = "n/a" if peak_bytes[name] is None else f"{mib(peak_bytes[name]):.0f} MiB"
        print(
            f"{name}: median {medians[name]:.0f} ms, peak {measured} ({memory_method}), "
            f"materialised {mib(theory[name]):.0f} MiB"
        )
    print(f"ratio ours / padded: {ratio:.3f} (target ≤ {TARGET_RATIO}) {'ok' if ratio <= TARGET_RATIO else 'MISSED'}")
    print(f"max |ours − padded|: {max_abs_diff:.2e}")
    print(f"results: {args.output}")
    return 1 if args.check and ratio > TARGET_RATIO else 0


if __name__ == "__main__":
    sys.exit(run_main(main))
