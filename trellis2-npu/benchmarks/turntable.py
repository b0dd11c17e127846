#!/usr/bin/env python3
"""What ``preview.mp4`` (the turntable, :mod:`trellis2_npu.geometry.turntable`) costs beside the GLB export it shows
(CPU).

The asset is ``glb_export.py``'s: its noisy 1.3M-face sphere and voxel shell through ``to_glb`` with upstream
``app.py``'s settings (500 000 faces, 2048² textures, no remesh), then the GLB encoding: that is the export the video
is measured against, in the same process (on a shared machine both slow down together). Then ``preview.png`` (four
512² views) and the video: the scene prepared once, ``--frames`` frames for each ``--supersample`` asked (256², the
delivery's size), and the H.264 encoding. The share is (video render + mp4 encoding) / (export + GLB encoding).

    python trellis2-npu/benchmarks/turntable.py --output trellis2-npu/results/turntable.json

A few minutes on 2 CPU cores, ~4 GB of memory. Exit code 0, or 1 with --check when the default video costs more
than :data:`TARGET_SHARE` of the export.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from glb_export import noisy_sphere  # the same stand-in asset as the export benchmark

from deliverykit.errors import run_main
from deliverykit.files import ensure_writable_dir, write_json_atomic
from deliverykit.report import delivery_report
from trellis2_npu.geometry import turntable
from trellis2_npu.geometry.export import to_glb
from trellis2_npu.geometry.glb import encode_glb
from trellis2_npu.geometry.render_preview import prepare_scene, render_preview

DELIVERY_DIR = Path(__file__).resolve().parents[1]
TARGET_SHARE = 0.25  # the default video may add at most a quarter to the export


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--subdivisions", type=int, default=8, help="icosphere subdivisions (8: 1 310 720 faces)")
    parser.add_argument("--frames", type=int, default=turntable.DEFAULT_FRAMES, help="video frames (default 60)")
    parser.add_argument(
        "--supersample", type=int, nargs="+", default=[1, 2], help="samples per pixel side to measure (default 1 2)"
    )
    parser.add_argument("--output", required=True, help="results JSON for the README")
    parser.add_argument("--video", help="also keep the default video here (an .mp4 path)")
    parser.add_argument("--check", action="store_true", help="exit 1 when the default video misses its share")
    return parser.parse_args(argv)


def timed(function, *args, **kwargs) -> tuple[object, float]:
    start = time.perf_counter()
    value = function(*args, **kwargs)
    return value, (time.perf_counter() - start) * 1000


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    ensure_writable_dir(Path(args.output).parent)
    data = noisy_sphere(args.subdivisions, 512)
    exported, export_ms = timed(to_glb, **data, resolution=512, decimation_target=500_000, texture_size=2048)
    _, encode_glb_ms = timed(encode_glb, exported.mesh)
    export_total_ms = export_ms + encode_glb_ms
    scene, prepare_ms = timed(prepare_scene, exported.mesh)
    _, preview_ms = timed(render_preview, scene)

    runs = {}
    for supersample in args.supersample:
        frames, render_ms = timed(turntable.render_turntable, scene, args.frames, supersample=supersample)
        with tempfile.TemporaryDirectory() as folder:
            keep = args.video and supersample == turntable.SUPERSAMPLE
            path = Path(args.video) if keep else Path(folder) / "preview.mp4"
            _, encode_ms = timed(turntable.write_turntable, path, frames)
            file_bytes = path.stat().st_size
        runs[supersample] = {
            "render_ms": render_ms,
            "ms_per_frame": render_ms / args.frames,
            "encode_mp4_ms": encode_ms,
            "share_of_export": (render_ms + encode_ms) / export_total_ms,
            "file_bytes": file_bytes,
        }
    default = runs.get(turntable.SUPERSAMPLE)
    faces = exported.stats["faces"]
    title = (
        f"preview.mp4 on cpu: {args.frames} frames of {turntable.SIZE}² at {turntable.FPS} fps, the GLB of "
        f"glb_export.py's noisy sphere ({faces} faces, 2048² textures)"
    )
    rows = [
        ["export: to_glb + GLB encoding", export_total_ms, "100 %", "—"],
        [
            "preview.png: scene preparation (shared with the video)",
            prepare_ms,
            f"{prepare_ms / export_total_ms:.0%}",
            "",
        ],
        ["preview.png: four 512² views", preview_ms, f"{preview_ms / export_total_ms:.0%}", ""],
    ]
    for supersample, run in runs.items():
        label = f"preview.mp4, {supersample}×{supersample} samples/pixel" + (
            " (default)" if supersample == turntable.SUPERSAMPLE else ""
        )
        total = run["render_ms"] + run["encode_mp4_ms"]
        rows.append([f"{label}: render + encode", total, f"{run['share_of_export']:.0%}", f"{run['ms_per_frame']:.0f}"])
    report = delivery_report(
        "benchmark",
        DELIVERY_DIR,
        device="cpu",
        random_weights=True,
        results={
            "faces": faces,
            "frames": args.frames,
            "size": turntable.SIZE,
            "export_total_ms": export_total_ms,
            "prepare_scene_ms": prepare_ms,
            "preview_png_ms": preview_ms,
            "videos": {str(key): value for key, value in runs.items()},
            "tables": [
                {"title": title, "columns": ["step", "ms", "share of the export", "ms per frame"], "rows": rows}
            ],
        },
    )
    write_json_atomic(args.output, report)
    for row in rows:
        print(f"{row[0]:>62}: {row[1]:10.0f} ms  {row[2]:>5}  {row[3]}")
    return 1 if args.check and default and default["share_of_export"] > TARGET_SHARE else 0


if __name__ == "__main__":
    sys.exit(run_main(main))
