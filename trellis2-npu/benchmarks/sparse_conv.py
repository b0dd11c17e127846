#!/usr/bin/env python3
"""Submanifold sparse convolution (``trellis2_npu.sparse_conv``) against spconv 2.3.8 and a dense GEMM, on the CPU.

The voxel set is surface-like, as in TRELLIS.2's decoders: a one-voxel-thick spherical shell (radius 0.35 of the
grid) in a 256³ grid, ≈ 100k sites, one batch item; kernel 3×3×3, Ci = Co = 64 and 128, fp32. Variants, timed in
one process and alternating round by round so that machine noise hits all alike:

- ours with 1 thread, and ours with the default thread count (``torch.get_num_threads()`` at start), both with the
  default CPU thread policy (single-threaded workers that share the blocks) and with torch's intra-op threads
  (``cpu_threads="intra-op"``, the policy before; the same as the default with 1 thread, so not repeated there);
- spconv's ``SubMConv3d`` with 1 thread (its CPU path is wrong with more, trellis2.md §6), neighbour indices cached;
- dense GEMMs at both thread counts: ``[N, Ci] × [Ci, Co]`` into a preallocated output (the GEMM shape the
  convolution is made of, the reference for the target) and a 1024³ GEMM (the machine's peak, for information).

Useful FLOPs are ``2·Ci·Co·pairs``, pairs = active (site, neighbour) pairs including the centre. Targets, per
thread count: time ratio ours / spconv (1 thread) ≤ 1.0 (median of per-round ratios), ours at ≥ 30 % of the
``[N, Ci] × [Ci, Co]`` GEMM's GFLOP/s, and ours at the default thread count / ours with 1 thread ≤ 1.0. The
neighbour map is timed separately, in its own alternating rounds (ours: ``build_neighbor_map``; spconv: its first
call, which builds the indices, minus a cached call, both at C = 4 so that the convolution is small next to the
map), with the target ours / spconv ≤ 1.0. Without spconv the spconv rows say "n/a".

"One core busy": the same rounds again (convolutions and maps, no GEMMs) while this script keeps one core busy
with a spinning child process pinned to it (started before, killed after). OpenMP threads that share a core with
another process stall at every parallel region (the intra-op rows); the default must stay no slower than one
thread there too. The load average before and after is recorded; on a machine shared with others, every figure
moves with their load.

    python trellis2-npu/benchmarks/sparse_conv.py --output trellis2-npu/results/sparse_conv.json

About 1-3 min on 2 CPU cores with the defaults (the intra-op rows with one core busy take most of it). Exit
code 0, or 1 with --check when a target is missed.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from deliverykit.errors import run_main
from deliverykit.files import ensure_writable_dir, write_json_atomic
from deliverykit.imports import is_package_installed, package_version
from deliverykit.report import delivery_report
from deliverykit.timing import benchmark, benchmark_alternating, paired_ratio
from trellis2_npu.sparse_conv import NeighborMap, build_neighbor_map, submanifold_conv3d

DELIVERY_DIR = Path(__file__).resolve().parents[1]
BUSY = "one core busy"
SPCONV_MAP_CHANNELS = 4
SPCONV_FIRST = f"spconv: first call (builds the indices), C={SPCONV_MAP_CHANNELS}, 1 thread"
SPCONV_CACHED = f"spconv: cached call, C={SPCONV_MAP_CHANNELS}, 1 thread"
SPCONV_MAP = "spconv: first call − cached call (median of rounds), 1 thread"
INTRA_OP = "intra-op threads"

TARGET_RATIO = 1.0
TARGET_GEMM_PERCENT = 30.0
TARGET_RATIO_TEXT, TARGET_GEMM_TEXT = f"≤ {TARGET_RATIO:g}", f"≥ {TARGET_GEMM_PERCENT:g}"
PEAK_GEMM_SIZE = 1024
PEAK_GEMM = f"GEMM {PEAK_GEMM_SIZE}³ (peak)"
DEVICE = torch.device("cpu")  # spconv 2.3.8's PyPI build is CPU-only; ours is compared where spconv runs


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--resolution", type=int, default=256, help="grid side (default 256)")
    parser.add_argument("--radius", type=float, default=0.35, help="shell radius as a fraction of the grid side")
    parser.add_argument("--channels", type=int, nargs="+", default=[64, 128], help="Ci = Co values (default 64 128)")
    parser.add_argument("--rounds", type=int, default=10, help="alternating timed rounds (default 10)")
    parser.add_argument(
        "--busy-rounds", type=int, default=5, help="alternating rounds with one core busy (default 5; 0: skip)"
    )
    parser.add_argument("--output", required=True, help="results JSON")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    return parser.parse_args(argv)


def spherical_shell(resolution: int, radius: float) -> torch.Tensor:
    """``[N, 4]`` int32 ``(0, x, y, z)``, x-major: voxels whose centre is within half a voxel of a centred sphere."""
    axis = torch.arange(resolution, dtype=torch.float32) + 0.5 - resolution / 2
    squared = axis.square()
    distance = (squared[:, None, None] + squared[None, :, None] + squared[None, None, :]).sqrt_()
    xyz = ((distance - radius).abs_() < 0.5).nonzero()
    return torch.cat([xyz.new_zeros(xyz.shape[0], 1), xyz], dim=1).int()


def with_threads(threads: int, fn: Callable[[], Any]) -> Callable[[], Any]:
    """``fn`` run with ``threads`` intra-op threads (setting the count costs microseconds, far below one call)."""

    def run() -> Any:
        torch.set_num_threads(threads)
        return fn()

    return run


def spconv_calls(
    coords: torch.Tensor, feats: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, resolution: int
) -> tuple[Callable[[], torch.Tensor], Callable[[], torch.Tensor]] | None:
    """(cached call, first call) of spconv's SubMConv3d with our weight, or None when spconv is not installed.

    spconv keeps the checkpoint layout ``[Co, K0, K1, K2, Ci]`` for ``(b, x, y, z)`` indices, so the weight is
    copied 1:1 (checked against ours in the tests). ``train()``: its ``eval()`` asserts on the CPU with a bias.
    """
    if not is_package_installed("spconv"):
        return None
    spconv = importlib.import_module("spconv.pytorch")
    conv = spconv.SubMConv3d(weight.shape[-1], weight.shape[0], 3, bias=True, indice_key="bench").train()
    with torch.no_grad():
        conv.weight.copy_(weight)
        conv.bias.copy_(bias)
    indices: dict = {}

    def first_call() -> torch.Tensor:
        out = conv(spconv.SparseConvTensor(feats, coords, [resolution] * 3, batch_size=1))
        indices.update(out.indice_dict)
        return out.features

    def cached_call() -> torch.Tensor:
        tensor = spconv.SparseConvTensor(feats, coords, [resolution] * 3, batch_size=1)
        tensor.indice_dict = indices
        return conv(tensor).features

    return cached_call, first_call


@contextlib.contextmanager
def one_core_busy() -> Iterator[int]:
    """A child process spinning on the last core this process may use, for the duration; yields that core."""
    core = max(os.sched_getaffinity(0))
    spin = f"import os\nos.sched_setaffinity(0, {{{core}}})\nwhile True:\n    pass\n"
    child = subprocess.Popen([sys.executable, "-c", spin])
    try:
        time.sleep(0.5)  # let it start spinning
        if child.poll() is not None:
            raise RuntimeError(f"the busy-loop process exited with {child.returncode}; cannot measure '{BUSY}'")
        yield core
    finally:
        child.kill()
        child.wait()


def map_variants(coords: torch.Tensor, resolution: int, thread_counts: list[int]) -> dict[str, Callable[[], Any]]:
    """``build_neighbor_map`` per thread count (and, above 1 thread, with intra-op threads)."""
    default = max(thread_counts)
    variants = {}
    for count in thread_counts:
        build = functools.partial(build_neighbor_map, coords, (resolution,) * 3)
        variants[f"ours: build_neighbor_map, {thread_label(count, default)}"] = with_threads(count, build)
        if count > 1:
            intra_op = functools.partial(build, cpu_threads="intra-op")
            variants[f"ours: build_neighbor_map, {thread_label(count, default)}, {INTRA_OP}"] = with_threads(
                count, intra_op
            )
    return variants


def time_map_builds(
    coords: torch.Tensor, resolution: int, thread_counts: list[int], rounds: int, busy_rounds: int
) -> dict[str, list[float]]:
    """Samples (ms) of every map variant, alternating; with ``busy_rounds``, also with one core busy.

    spconv builds its indices inside its first call: its first and a cached call at ``SPCONV_MAP_CHANNELS`` channels
    (so that the convolution itself is small next to the map) join the rounds; the map is their difference.
    """
    variants = map_variants(coords, resolution, thread_counts)
    gen = torch.Generator().manual_seed(0)
    channels = SPCONV_MAP_CHANNELS
    weight = torch.randn(channels, 3, 3, 3, channels, generator=gen)
    feats, bias = torch.randn(coords.shape[0], channels, generator=gen), torch.zeros(channels)
    calls = spconv_calls(coords, feats, weight, bias, resolution)
    if calls is not None:
        cached_call, first_call = calls
        variants[SPCONV_FIRST] = with_threads(1, torch.no_grad()(first_call))
        variants[SPCONV_CACHED] = with_threads(1, torch.no_grad()(cached_call))
    for fn in variants.values():
        fn()
    samples = benchmark_alternating(variants, rounds, device=DEVICE)
    if busy_rounds:
        with one_core_busy():
            busy = benchmark_alternating(variants, busy_rounds, device=DEVICE)
        samples.update({f"{name}, {BUSY}": values for name, values in busy.items()})
    torch.set_num_threads(max(thread_counts))
    return samples


def thread_label(threads: int, default: int) -> str:
    return f"{threads} thread{'s' if threads > 1 else ''}" + (" (default)" if threads == default > 1 else "")


def measure_channels(
    coords: torch.Tensor,
    neighbor_map: NeighborMap,
    channels: int,
    thread_counts: list[int],
    rounds: int,
    busy_rounds: int,
    resolution: int,
) -> dict[str, Any]:
    """Alternating timings of every variant at one channel count (idle, then one core busy), spconv's map time."""
    gen = torch.Generator().manual_seed(channels)
    feats = torch.randn(coords.shape[0], channels, generator=gen)
    weight = torch.randn(channels, 3, 3, 3, channels, generator=gen) / (27 * channels) ** 0.5
    bias = torch.randn(channels, generator=gen)
    gemm_rhs, gemm_out = torch.randn(channels, channels, generator=gen), torch.empty_like(feats)
    square = torch.randn(PEAK_GEMM_SIZE, PEAK_GEMM_SIZE, generator=gen)
    square_out = torch.empty_like(square)
    default = max(thread_counts)
    variants = {}
    for count in thread_counts:
        label = thread_label(count, default)
        variants[f"ours, {label}"] = with_threads(count, lambda: submanifold_conv3d(feats, neighbor_map, weight, bias))
        if count > 1:
            variants[f"ours, {label}, {INTRA_OP}"] = with_threads(
                count, lambda: submanifold_conv3d(feats, neighbor_map, weight, bias, cpu_threads="intra-op")
            )
        variants[f"dense GEMM, {label}"] = with_threads(count, lambda: torch.mm(feats, gemm_rhs, out=gemm_out))
        variants[f"{PEAK_GEMM}, {label}"] = with_threads(count, lambda: torch.mm(square, square, out=square_out))
    result: dict[str, Any] = {"spconv_map_ms": None, "max_abs_vs_spconv": None}
    calls = spconv_calls(coords, feats, weight, bias, resolution)
    with torch.inference_mode():
        if calls is not None:
            cached_call, first_call = calls
            torch.set_num_threads(1)
            first_ms = benchmark(first_call, warmup=0, repeat=1, device=DEVICE).median_ms
            result["spconv_map_ms"] = first_ms - benchmark(cached_call, warmup=1, repeat=3, device=DEVICE).median_ms
            variants["spconv, 1 thread"] = with_threads(1, cached_call)
            ours = variants[f"ours, {thread_label(1, default)}"]()
            result["max_abs_vs_spconv"] = (ours - cached_call()).abs().max().item()
        for fn in variants.values():  # warm every variant once before timing any
            fn()
        result["samples_ms"] = benchmark_alternating(variants, rounds, device=DEVICE)
        if busy_rounds:
            convolutions = {name: fn for name, fn in variants.items() if not name.startswith(("dense", PEAK_GEMM))}
            with one_core_busy():
                busy = benchmark_alternating(convolutions, busy_rounds, device=DEVICE)
            result["samples_ms"].update({f"{name}, {BUSY}": values for name, values in busy.items()})
    torch.set_num_threads(default)
    return result


def variant_flops(name: str, channels: int, num_voxels: int, num_pairs: int) -> int:
    """Useful FLOPs of one call: the convolution's active pairs, or the GEMM's own size."""
    if name.startswith(PEAK_GEMM):
        return 2 * PEAK_GEMM_SIZE**3
    return 2 * channels * channels * (num_voxels if name.startswith("dense GEMM") else num_pairs)


def summarise(
    channels: int, samples: dict[str, list[float]], num_voxels: int, num_pairs: int, thread_counts: list[int]
) -> tuple[list[list], list[list]]:
    """(time rows, target rows) of one channel count: medians, GFLOP/s, and the ratios against their targets."""
    gflops = {
        name: variant_flops(name, channels, num_voxels, num_pairs) / statistics.median(values) / 1e6
        for name, values in samples.items()
    }
    time_rows = [
        [channels, name, statistics.median(values), min(values), max(values), gflops[name]]
        for name, values in samples.items()
    ]
    target_rows = []
    for count in thread_counts:
        label = thread_label(count, max(thread_counts))
        ours = f"ours, {label}"
        percent = 100.0 * gflops[ours] / gflops[f"dense GEMM, {label}"]
        target_rows.append(
            [
                f"C={channels}: {ours}, % of dense GEMM GFLOP/s",
                percent,
                TARGET_GEMM_TEXT,
                percent >= TARGET_GEMM_PERCENT,
            ]
        )
        peak_percent = 100.0 * gflops[ours] / gflops[f"{PEAK_GEMM}, {label}"]
        target_rows.append([f"C={channels}: {ours}, % of {PEAK_GEMM} GFLOP/s", peak_percent, "info", None])
        name = f"C={channels}: {ours} / spconv, 1 thread (time)"
        if "spconv, 1 thread" in samples:
            ratio = paired_ratio(samples, ours, "spconv, 1 thread")
            target_rows.append([name, ratio, TARGET_RATIO_TEXT, ratio <= TARGET_RATIO])
        else:
            target_rows.append([name, "n/a (spconv not installed)", TARGET_RATIO_TEXT, None])
    one = f"ours, {thread_label(1, max(thread_counts))}"
    for count in thread_counts[1:]:
        ours = f"ours, {thread_label(count, max(thread_counts))}"
        gemm = f"dense GEMM, {thread_label(count, max(thread_counts))}"  # what the machine gives a 2nd thread now
        ratio = paired_ratio(samples, gemm, f"dense GEMM, {thread_label(1, max(thread_counts))}")
        target_rows.append([f"C={channels}: {gemm} / dense GEMM, 1 thread (time)", ratio, "info", None])
        for suffix in ("", f", {BUSY}"):
            for policy in ("", f", {INTRA_OP}"):
                if ours + policy + suffix in samples:
                    ratio = paired_ratio(samples, ours + policy + suffix, one + suffix)
                    name = f"C={channels}: {ours}{policy} / {one} (time){suffix}"
                    target_rows.append([name, ratio, TARGET_RATIO_TEXT if not policy else "info", _met(ratio, policy)])
    return time_rows, target_rows


def _met(ratio: float, policy: str) -> bool | None:
    """Targets apply to the default policy; the intra-op rows are there for comparison."""
    return None if policy else ratio <= TARGET_RATIO


def spconv_map_ms(map_samples: dict[str, list[float]], suffix: str = "") -> float | None:
    """spconv's map time: the median over rounds of its first call minus its cached call, or None without it."""
    if SPCONV_FIRST + suffix not in map_samples:
        return None
    pairs = zip(map_samples[SPCONV_FIRST + suffix], map_samples[SPCONV_CACHED + suffix], strict=True)
    return statistics.median(first - cached for first, cached in pairs)


def map_rows_and_targets(map_samples: dict[str, list[float]]) -> tuple[list[list], list[list]]:
    """The map table (medians) and the median time of our map over spconv's, per variant (same pass)."""
    map_rows = [["all", name, statistics.median(values)] for name, values in map_samples.items()]
    for suffix in ("", f", {BUSY}"):
        spconv_ms = spconv_map_ms(map_samples, suffix)
        if spconv_ms is not None:
            map_rows.append(["all", SPCONV_MAP + suffix, spconv_ms])
    rows = []
    for name, values in map_samples.items():
        if name.startswith("spconv"):
            continue
        label = f"neighbour map: {name.removeprefix('ours: build_neighbor_map, ')} / spconv, 1 thread (time)"
        spconv_ms = spconv_map_ms(map_samples, f", {BUSY}" if name.endswith(BUSY) else "")
        if spconv_ms is None:
            rows.append([label, "n/a (spconv not installed)", TARGET_RATIO_TEXT, None])
            continue
        ratio = statistics.median(values) / spconv_ms
        rows.append([label, ratio, "info" if INTRA_OP in name else TARGET_RATIO_TEXT, _met(ratio, INTRA_OP in name)])
    return map_rows, rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    ensure_writable_dir(Path(args.output).parent)
    default_threads = torch.get_num_threads()
    thread_counts = sorted({1, default_threads})
    load_before = os.getloadavg()
    coords = spherical_shell(args.resolution, args.resolution * args.radius)
    neighbor_map = build_neighbor_map(coords, (args.resolution,) * 3)
    num_voxels, num_pairs = coords.shape[0], neighbor_map.num_pairs
    map_samples = time_map_builds(coords, args.resolution, thread_counts, args.rounds, args.busy_rounds)
    map_rows, map_targets = map_rows_and_targets(map_samples)

    time_rows, target_rows, per_channels = [], [], {}
    for channels in args.channels:
        measured = measure_channels(
            coords, neighbor_map, channels, thread_counts, args.rounds, args.busy_rounds, args.resolution
        )
        rows = summarise(channels, measured["samples_ms"], num_voxels, num_pairs, thread_counts)
        time_rows += rows[0]
        target_rows += rows[1]
        spconv_map = measured["spconv_map_ms"]
        map_rows.append(
            [channels, "spconv: one first call − cached call, 1 thread", "n/a" if spconv_map is None else spconv_map]
        )
        per_channels[str(channels)] = measured
    target_rows += map_targets

    title = (
        f"Submanifold conv 3×3×3, spherical shell in {args.resolution}³ (N = {num_voxels}, {num_pairs} active pairs "
        f"incl. centre), CPU fp32, {default_threads} threads by default"
    )
    report = delivery_report(
        "benchmark",
        DELIVERY_DIR,
        device=DEVICE,
        random_weights=True,
        results={
            "num_voxels": num_voxels,
            "num_pairs": num_pairs,
            "default_threads": default_threads,
            "machine_shared": "2 CPU cores shared with other people's test runs: figures move with their load",
            "map_samples_ms": map_samples,
            "load_average_before_after": [list(load_before), list(os.getloadavg())],
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
            "spconv": package_version("spconv"),
            "per_channels": per_channels,
            "tables": [
                {"title": f"{title}: targets", "columns": ["ratio", "measured", "target", "met"], "rows": target_rows},
                {
                    "title": f"{title}: times, {args.rounds} alternating rounds ({args.busy_rounds} with {BUSY}; "
                    "GFLOP/s: useful, GEMM: its own)",
                    "columns": ["channels", "variant", "median ms", "min ms", "max ms", "GFLOP/s"],
                    "rows": time_rows,
                },
                {
                    "title": f"{title}: neighbour map, median of {args.rounds} alternating rounds "
                    f"({args.busy_rounds} with {BUSY}); per channel count: one first call of the timed spconv",
                    "columns": ["channels", "what", "ms"],
                    "rows": map_rows,
                },
            ],
        },
    )
    write_json_atomic(args.output, report)
    print_summary(target_rows, map_rows, args.output)
    missed = [row[0] for row in target_rows if row[3] is False]
    return 1 if args.check and missed else 0


def print_summary(target_rows: list[list], map_rows: list[list], output: str) -> None:
    for name, value, target, met in target_rows:
        verdict = {True: " ok", False: " MISSED", None: ""}[met]
        print(f"{name}: {value:.3f} (target {target}){verdict}" if isinstance(value, float) else f"{name}: {value}")
    for _, name, value in map_rows:
        print(
            f"neighbour map, {name}: {value:.1f} ms" if isinstance(value, float) else f"neighbour map, {name}: {value}"
        )
    print(f"results: {output}")


if __name__ == "__main__":
    sys.exit(run_main(main))
