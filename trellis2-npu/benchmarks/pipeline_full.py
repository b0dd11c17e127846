#!/usr/bin/env python3
"""The image → 3D pipeline at the released sizes on the CPU: time, peak RSS and token/voxel counts per stage.

What ``inference.py --smoke full --pipeline 512 --steps 1`` runs, stage by stage: every model at its released size
(trellis2_npu.full_size: 1.3 B-parameter flows, 474 M-parameter SC-VAE decoders, DINOv3 ViT-L/16) with seeded
random weights written in the released layout and dtypes and loaded back through upstream's loaders, the large
models loaded per stage and freed after (trellis2_npu.offload), then the GLB export with the CLI's defaults. The
sparse structure is pinned to a spherical shell of 9 600 voxels at 64³ (the TRELLIS.2 paper's ~9.6 K tokens per
1024³ asset), max-pooled to 32³ by the 512 pipeline, so the token and voxel counts are a real asset's, not the
half-full grid random weights decode.

    python trellis2-npu/benchmarks/pipeline_full.py --smoke full --pipeline 512 --steps 1 --upstream $TRELLIS2_SRC \
        --output trellis2-npu/results/pipeline_full.json

Peak RSS per stage is the process's high-water mark within the stage (``VmHWM``, reset at each stage's start through
``/proc/self/clear_refs``; Linux). About 11 GB of weights go to a temporary folder (``--weights-dir`` keeps them for
the next run). Tens of minutes on 2 CPU cores. A stage that fails ends the run; the results then say which and why.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import re
import resource
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from pathlib import Path

import torch

from deliverykit.errors import run_main
from deliverykit.files import ensure_writable_dir, write_json_atomic
from deliverykit.report import delivery_report
from deliverykit.timing import Stopwatch
from trellis2_npu import full_size, generate, hooks, image, loader, memory, tiny, upstream
from trellis2_npu.geometry import export, glb, render_preview

DELIVERY_DIR = Path(__file__).resolve().parents[1]
STATUS = Path("/proc/self/status")
WRITE = "write random weights"
STARTED = time.perf_counter()


def high_water_mark_mb() -> float:
    """The process's peak resident set since the last :func:`reset_high_water_mark` (VmHWM), in MiB."""
    return int(re.search(r"VmHWM:\s+(\d+) kB", STATUS.read_text()).group(1)) / 1024


def reset_high_water_mark() -> None:
    Path("/proc/self/clear_refs").write_text("5")


class MemoryStopwatch(Stopwatch):
    """A :class:`Stopwatch` that also records each stage's peak RSS; a nested stage's peak counts for its parents."""

    def __init__(self):
        super().__init__("cpu")
        self.peak_mb: dict[str, float] = {}
        self._open: list[str] = []
        self.failed: str | None = None  # the innermost stage that raised

    def _note(self) -> None:
        mark = high_water_mark_mb()
        for name in self._open:
            self.peak_mb[name] = max(self.peak_mb.get(name, 0.0), mark)

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        self._note()
        reset_high_water_mark()
        self._open.append(name)
        try:
            with super().stage(name):
                yield
        except BaseException:
            self.failed = self.failed or name
            raise
        finally:
            self._note()
            self._open.pop()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream", help="patched TRELLIS.2 checkout (default: $TRELLIS2_SRC)")
    parser.add_argument("--smoke", choices=("full",), default="full", help="the released sizes (the only choice)")
    parser.add_argument("--pipeline", default="512", choices=generate.PIPELINE_TYPES)
    parser.add_argument("--steps", type=int, default=1, help="sampler steps per flow (default 1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--weights-dir", help="write the random weights here and keep them (reused when present)")
    parser.add_argument(
        "--time-limit",
        type=float,
        help="stop after this many seconds; the results then name the stage that was running (a shared machine)",
    )
    parser.add_argument("--output", required=True, help="results JSON for the README")
    return parser.parse_args(argv)


class TimeLimit(TimeoutError):
    """Raised in the running stage when ``--time-limit`` (or SIGTERM) stops the run."""


def stop_after(seconds: float | None) -> None:
    """``--time-limit`` and SIGTERM raise :class:`TimeLimit` in the running stage, so the results are still written."""

    def handler(signum, frame):
        raise TimeLimit(f"stopped by {signal.Signals(signum).name} after {time.perf_counter() - STARTED:.0f} s")

    signal.signal(signal.SIGTERM, handler)
    if seconds:
        signal.signal(signal.SIGALRM, handler)
        signal.setitimer(signal.ITIMER_REAL, seconds)


def weights_folder(args: argparse.Namespace, stack: contextlib.ExitStack, watch: MemoryStopwatch) -> Path:
    if args.weights_dir and (Path(args.weights_dir) / tiny.MAIN_DIR / "pipeline.json").is_file():
        return Path(args.weights_dir) / tiny.MAIN_DIR
    root = args.weights_dir or stack.enter_context(tempfile.TemporaryDirectory(prefix="trellis2-full-"))
    with watch.stage(WRITE):
        return full_size.write_full_weights(root, seed=0)


def stage_rows(stages: dict[str, float], peak_mb: dict[str, float], tokens: dict[str, int]) -> list[list]:
    total_ms = sum(stages.values())
    counts = {f"flow:{key}": count for key, count in tokens.items()}
    return [
        [
            stage,
            round(ms / 1000, 1),
            f"{100 * ms / total_ms:.0f} %",
            round(peak_mb.get(stage, 0.0)),
            counts.get(stage, ""),
        ]
        for stage, ms in stages.items()
    ]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    ensure_writable_dir(Path(args.output).parent)
    stop_after(args.time_limit)
    checkout = upstream.find_patched_upstream(args.upstream)
    device = torch.device("cpu")
    hooks.set_pipeline_device(device)
    pipeline_class = upstream.import_pipeline_class(checkout)
    watch = MemoryStopwatch()
    tokens: dict[str, int] = {}
    results: dict = {"failed": None}
    with contextlib.ExitStack() as stack:
        try:
            folder = weights_folder(args, stack, watch)
            with watch.stage("load (DINOv3, sparse-structure decoder; the rest per stage)"):
                pipeline = loader.load_pipeline(folder, device, pipeline_class, offload=True)
                full_size.pin_occupancy(pipeline.models["sparse_structure_decoder"])
            picture, preprocess = image.pipeline_input(tiny.tiny_image(), remove_background=False)
            # the CLI's defaults: upstream app.py's budget and texture, the remesh on
            options = export.ExportOptions(decimation_target=500_000, texture_size=2048, remesh=True)
            request = generate.AssetRequest(picture, preprocess, args.seed, args.steps, args.pipeline, options)
            # the CLI's cascade budget on this host: what MemAvailable holds under its plan, stage-offload
            plan = memory.choose_memory_plan(device, pipeline_types=(args.pipeline,))
            budget = memory.token_budget(plan, args.pipeline, device)
            results["token_budget"] = dataclasses.asdict(budget)
            result = generate.run_pipeline(pipeline, request, device, watch=watch, tokens=tokens, budget=budget)
            results["token_budget"]["degraded"] = result.degraded
            if result.degraded:
                print(f"warning: {result.degraded}", file=sys.stderr, flush=True)
            mesh = generate.check_mesh(result, device)
            with watch.stage("export (to_glb, GLB encoding, preview)"):
                exported = export.to_glb(
                    mesh.vertices, mesh.faces, mesh.attrs, mesh.coords, result.resolution,
                    **dataclasses.asdict(options),
                )  # fmt: skip
                glb_bytes = glb.encode_glb(exported.mesh)
                render_preview.render_preview(render_preview.prepare_scene(exported.mesh))
            results.update(
                mesh={"vertices": int(mesh.vertices.shape[0]), "faces": int(mesh.faces.shape[0])},
                resolution=result.resolution,
                glb={**exported.stats, "file_bytes": len(glb_bytes)},
                export_steps_ms=exported.stages_ms,
            )
        except Exception as err:  # the results say which stage failed (or was running at the time limit) and why
            results["failed"] = {"stage": watch.failed or "between stages", "error": f"{type(err).__name__}: {err}"}
            traceback.print_exc()
    stages = watch.stages  # exclusive, as generate.run_pipeline reports them; writing the weights is not a stage
    write_ms = stages.pop(WRITE, None)
    if "mesh_extraction" in stages and "decoder:shape_slat_decoder" in stages:
        stages["decoder:shape_slat_decoder"] -= stages["mesh_extraction"]
    total_ms = sum(stages.values())
    # clear_refs resets ru_maxrss too: the process peak is the largest stage peak
    peak_mb = max([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, *watch.peak_mb.values()])
    title = (
        f"Released sizes, {args.pipeline} pipeline, {args.steps} step(s) per flow, on the CPU (random weights; sparse "
        f"structure pinned to a {full_size.SHELL_VOXELS}-voxel sphere shell at 64³, the paper's ~9.6 K tokens per "
        "1024³ asset)"
    )
    failure = results["failed"]
    rows = stage_rows(stages, watch.peak_mb, tokens)
    if failure:
        rows.append([f"FAILED in {failure['stage']}", "", "", "", failure["error"][:200]])
    report = delivery_report(
        "benchmark",
        DELIVERY_DIR,
        device="cpu",
        random_weights=True,
        results={
            **results,
            "pipeline": args.pipeline,
            "steps": args.steps,
            "stages_ms": stages,
            "write_weights_ms": write_ms,
            "peak_rss_mb": watch.peak_mb,
            "tokens": tokens,
            "total_s": total_ms / 1000,
            "wall_s": time.perf_counter() - STARTED,
            "process_peak_rss_mb": peak_mb,
            "tables": [
                {
                    "title": f"{title}: stages (exclusive times; a model's load is its own stage)",
                    "columns": ["stage", "s", "share", "peak RSS MiB", "tokens"],
                    "rows": [
                        *rows,
                        ["total", round(total_ms / 1000, 1), "100 %", round(peak_mb), ""],
                        *(
                            [[WRITE, round(write_ms / 1000, 1), "not in total", round(watch.peak_mb[WRITE]), ""]]
                            if write_ms is not None
                            else []
                        ),
                    ],
                },
                {
                    "title": f"{title}: sizes",
                    "columns": ["what", "count"],
                    "rows": [
                        *([key, count] for key, count in tokens.items()),
                        *([["output grid", f"{results['resolution']}³"]] if "resolution" in results else []),
                        *(
                            [["max_num_tokens", f"{budget['max_num_tokens']} ({budget['why']})"]]
                            if (budget := results.get("token_budget"))
                            else []
                        ),
                        *([f"mesh {k}", v] for k, v in results.get("mesh", {}).items()),
                        *([f"GLB {k}", results["glb"][k]] for k in ("faces", "vertices") if "glb" in results),
                    ],
                },
            ],
        },
    )
    write_json_atomic(args.output, report)
    for row in rows:
        print(*row, sep="\t")
    print(f"total {total_ms / 1000:.1f} s, process peak RSS {peak_mb:.0f} MiB")
    return 1 if failure else 0


if __name__ == "__main__":
    sys.exit(run_main(main))
