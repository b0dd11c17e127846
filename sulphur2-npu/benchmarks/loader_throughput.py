#!/usr/bin/env python3
"""Loader throughput and memory: GB/s and peak resident growth of ``load_pipeline`` on a large synthetic file.

The tiny LTX-2.3 model with its transformer and text connectors widened to LTX-2.3's head size (8 heads x 128 = 1024
wide) and as many blocks as reach ``--gigabytes``, written in the original single-file layout with its ltx-core
metadata config (random weights) to a temporary folder, loaded through the delivery's loader, then deleted. For
fp32 and bf16 files, each loaded in its own dtype: once cold (the file's pages dropped from the page cache with
``posix_fadvise``, so the read comes from disk where the OS honours it) and once warm.

safetensors (0.8) hands out tensors that are private, lazily read memory maps of the file, and the loader keeps them
(same dtype: no cast), so ``load_pipeline`` itself reads almost nothing; the weights are read on first use. So each
measurement is ``load_pipeline`` plus one read of every weight, and GB/s is file size / that time.

Memory: the loader must not hold two copies of the weights: the peak resident growth (heap ``anon`` + mapped file
``file``) over the file size must stay near 1 (``COPY_RATIO_LIMIT``).

    python sulphur2-npu/benchmarks/loader_throughput.py --output sulphur2-npu/results/loader.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from deliverykit.errors import run_main

DELIVERY_DIR = Path(__file__).resolve().parents[1]

HEADS, HEAD_DIM = 8, 128  # LTX-2.3's head size; 8 heads keep one block at ~17M parameters
COPY_RATIO_LIMIT = 1.3  # resident growth / file size: one copy plus the working set (tiny text encoder, code)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gigabytes", type=float, default=1.5, help="target file size in GB (default 1.5)")
    parser.add_argument("--dtypes", nargs="+", choices=("fp32", "bf16"), default=["fp32", "bf16"])
    parser.add_argument("--workdir", help="where the temporary file goes (default: the system temp folder)")
    parser.add_argument("--output", required=True, help="results JSON for the README")
    parser.add_argument("--check", action="store_true", help="exit 1 when resident growth / file size > the limit")
    return parser.parse_args(argv)


def wide_configs(num_layers: int) -> tuple[dict, dict, dict]:
    """(transformer config, connectors config, ltx-core metadata) of the widened tiny model."""
    from sulphur2_npu.tiny import CONNECTORS_CONFIG, TRANSFORMER_CONFIG, tiny_ltx_metadata_config

    width = HEADS * HEAD_DIM
    transformer = TRANSFORMER_CONFIG | {
        "num_attention_heads": HEADS,
        "attention_head_dim": HEAD_DIM,
        "cross_attention_dim": width,
        "num_layers": num_layers,
    }
    connectors = CONNECTORS_CONFIG | {
        "video_connector_num_attention_heads": HEADS,
        "video_connector_attention_head_dim": HEAD_DIM,
        "video_hidden_dim": width,
    }
    metadata = tiny_ltx_metadata_config()
    metadata["transformer"] |= {
        "num_attention_heads": HEADS,
        "attention_head_dim": HEAD_DIM,
        "cross_attention_dim": width,
        "num_layers": num_layers,
        "connector_num_attention_heads": HEADS,
        "connector_attention_head_dim": HEAD_DIM,
    }
    return transformer, connectors, metadata


def parameter_counts(num_layers: int) -> tuple[int, int]:
    """(parameters of the wide transformer + connectors at ``num_layers``, parameters per extra block), on meta."""
    from accelerate import init_empty_weights
    from diffusers import LTX2VideoTransformer3DModel
    from diffusers.pipelines.ltx2.connectors import LTX2TextConnectors

    counts = []
    for layers in (num_layers, num_layers + 1):
        transformer, connectors, _ = wide_configs(layers)
        with init_empty_weights():
            modules = (LTX2VideoTransformer3DModel(**transformer), LTX2TextConnectors(**connectors))
        counts.append(sum(p.numel() for m in modules for p in m.parameters()))
    return counts[0], counts[1] - counts[0]


def write_wide_file(path: Path, gigabytes: float, dtype) -> dict:
    """The widened model as an original-layout single file of about ``gigabytes``; returns what was written."""
    import torch
    from accelerate import init_empty_weights
    from diffusers import LTX2VideoTransformer3DModel
    from diffusers.pipelines.ltx2.connectors import LTX2TextConnectors
    from safetensors.torch import save_file

    from sulphur2_npu.keymap import COMPONENTS, map_to_original
    from sulphur2_npu.tiny import tiny_components

    element = torch.tensor([], dtype=dtype).element_size()
    base, per_block = parameter_counts(1)
    num_layers = max(1, 1 + round((gigabytes * 1e9 / element - base) / per_block))
    transformer_config, connectors_config, metadata = wide_configs(num_layers)
    with init_empty_weights():
        wide = {
            "transformer": LTX2VideoTransformer3DModel(**transformer_config),
            "connectors": LTX2TextConnectors(**connectors_config),
        }
    tiny = tiny_components(seed=0)
    generator = torch.Generator().manual_seed(0)
    tensors = {}
    for name in COMPONENTS:
        module = wide[name] if name in wide else tiny[name]
        shapes = {key: tensor.shape for key, tensor in module.state_dict().items()}
        for key, original in map_to_original(name, shapes).items():
            tensors[original] = torch.empty(shapes[key], dtype=dtype).normal_(0, 0.02, generator=generator)
    save_file(tensors, str(path), metadata={"config": json.dumps(metadata)})
    return {"num_layers": num_layers, "tensors": len(tensors), "parameters": sum(t.numel() for t in tensors.values())}


def drop_from_page_cache(path: Path) -> bool:
    """Ask the OS to forget the file's cached pages (clean pages only: the file is fsynced first)."""
    if not hasattr(os, "posix_fadvise"):
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return True


def load_in_fresh_process(checkpoint: Path, text_encoder: Path, dtype_name: str) -> dict:
    """Time and watch one load in a new process: in this one, freed pages of the file writer would be reused."""
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(measure, (checkpoint, text_encoder, dtype_name))


def read_every_weight(pipe) -> int:
    """Touch every parameter and buffer once (a sum each); returns how many bytes that read."""
    import torch

    total = 0
    with torch.no_grad():
        for name in ("transformer", "connectors", "vae", "audio_vae", "vocoder", "text_encoder"):
            for tensor in [*getattr(pipe, name).parameters(), *getattr(pipe, name).buffers()]:
                tensor.sum()
                total += tensor.numel() * tensor.element_size()
    return total


def measure(checkpoint: Path, text_encoder: Path, dtype_name: str) -> dict:
    """``load_pipeline`` alone, then until every weight has been read once (safetensors maps the file lazily)."""
    from deliverykit.cli import torch_dtype
    from deliverykit.memory import peak_resident_growth
    from sulphur2_npu.loader import load_pipeline

    def load_and_read() -> tuple[float, int]:
        start = time.perf_counter()
        loaded = load_pipeline(checkpoint, text_encoder, torch_dtype=torch_dtype(dtype_name))
        lazy_seconds = time.perf_counter() - start
        return lazy_seconds, read_every_weight(loaded.pipe)

    start = time.perf_counter()
    (lazy_seconds, bytes_read), growth = peak_resident_growth(load_and_read)
    seconds = time.perf_counter() - start
    size = checkpoint.stat().st_size

    def per_file(key: str) -> float | None:
        return None if growth is None else growth[key] / size

    return {
        "load_pipeline_seconds": lazy_seconds,
        "seconds": seconds,
        "gb_per_s": size / 1e9 / seconds,
        "bytes_read": bytes_read,
        "growth_bytes": growth,
        "rss_per_file": per_file("rss"),
        "anon_per_file": per_file("anon"),
        "file_per_file": per_file("file"),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from deliverykit.cli import torch_dtype
    from deliverykit.files import ensure_writable_dir
    from deliverykit.report import delivery_report, write_report
    from sulphur2_npu.tiny import write_smoke_files

    ensure_writable_dir(Path(args.output).parent)
    runs = {}
    with tempfile.TemporaryDirectory(prefix="sulphur2-loader-", dir=args.workdir) as scratch:
        text_encoder = write_smoke_files(Path(scratch) / "smoke", seed=0).text_encoder
        for name in args.dtypes:
            dtype = torch_dtype(name)
            checkpoint = Path(scratch) / f"wide-{name}.safetensors"
            written = write_wide_file(checkpoint, args.gigabytes, dtype)
            size = checkpoint.stat().st_size
            dropped = drop_from_page_cache(checkpoint)
            cold = load_in_fresh_process(checkpoint, text_encoder, name)
            warm = load_in_fresh_process(checkpoint, text_encoder, name)
            checkpoint.unlink()
            runs[name] = {"file_bytes": size, **written, "page_cache_dropped": dropped, "cold": cold, "warm": warm}
            print(f"{name}: {size / 1e9:.2f} GB, cold {cold['gb_per_s']:.2f} GB/s, warm {warm['gb_per_s']:.2f} GB/s, "
                  f"resident growth / file {cold['rss_per_file']:.2f}", flush=True)  # fmt: skip

    rows = []
    for name, run in runs.items():
        for state in ("cold", "warm"):
            m = run[state]
            growth = m["growth_bytes"] or {}
            rows.append([
                f"{name} → {name}", state, run["file_bytes"] / 1e9, m["load_pipeline_seconds"], m["seconds"],
                m["gb_per_s"], growth.get("anon", 0) / 1e9, growth.get("file", 0) / 1e9, m["rss_per_file"],
                m["rss_per_file"] is not None and m["rss_per_file"] <= COPY_RATIO_LIMIT,
            ])  # fmt: skip
    report = delivery_report(
        "benchmark",
        DELIVERY_DIR,
        device="cpu",
        random_weights=True,
        results={
            "runs": runs,
            "copy_ratio_limit": COPY_RATIO_LIMIT,
            "tables": [
                {
                    "title": f"load_pipeline on a {args.gigabytes:g} GB synthetic LTX-2.3 single file "
                    f"(transformer {HEADS}x{HEAD_DIM} wide), CPU; cold = page cache dropped first",
                    "columns": [
                        "file → model", "page cache", "file GB", "load_pipeline s", "+ read every weight s", "GB/s",
                        "heap growth GB", "mapped-file growth GB", "resident growth / file",
                        f"one copy (≤ {COPY_RATIO_LIMIT})",
                    ],
                    "rows": rows,
                }
            ],
        },
    )  # fmt: skip
    write_report(args.output, report)
    print(f"results: {args.output}")
    over = [row for row in rows if not row[-1]]
    return 1 if args.check and over else 0


if __name__ == "__main__":
    sys.exit(run_main(main))
