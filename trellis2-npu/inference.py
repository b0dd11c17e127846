#!/usr/bin/env python3
"""TRELLIS.2-4B image conditioning (DINOv3 ViT-L/16) on NPU, CUDA or CPU.

Loads DINOv3 from a local folder (or, with --smoke, from seeded random weights of the same architecture written
to a temporary folder and loaded back through the same code), prepares the image as TRELLIS.2 does, runs the
TRELLIS.2 feature path, prints the evidence lines and writes report.json + features.safetensors to --output.

    python trellis2-npu/inference.py --weights /data/dinov3-vitl16-pretrain-lvd1689m --image cat.png --output out/
    python trellis2-npu/inference.py --smoke full --device cpu --output out/

With --pipeline (or --upstream) it runs the whole image → mesh pipeline on the patched upstream TRELLIS.2 instead
(trellis2_npu.pipeline), exports the textured asset.glb + preview.png (trellis2_npu.export) and writes mesh.ply,
voxels.safetensors and report.json:

    python trellis2-npu/inference.py --weights /data/TRELLIS.2-4B --image cat.png --pipeline 1024_cascade \
        --upstream /src/TRELLIS.2 --output out/
    python trellis2-npu/inference.py --smoke tiny --upstream /src/TRELLIS.2 --device cpu --output out/

Exit codes: 0 ok, 1 unexpected error, 2 bad arguments, 3 bad input image or upstream checkout (missing, other
commit, patches not applied), 4 bad weights, 5 device unavailable, 6 output not writable, 7 NaN/Inf in the output.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
try:
    import deliverykit  # noqa: F401  (installed, or vendored next to this file)
except ImportError:  # running from the monorepo without `make`: use the package in ../shared
    sys.path.insert(0, str(HERE.parent / "shared"))

from deliverykit.cli import add_common_args, torch_dtype  # noqa: E402
from deliverykit.errors import ExitCode, InputError, run_main  # noqa: E402

DELIVERY = "trellis2-npu"
MANIFEST = HERE / "weights-manifest.json"
PIPELINE_TYPES = ("512", "1024", "1024_cascade", "1536_cascade")
FULL_EVIDENCE_KEYS = (
    "PIPELINE",
    "VOXELS_SHAPE",
    "TOKENS",
    "TIMING_TOTAL_MS",
    "GLB_SHAPE",
    "TEXTURE_SIZE",
    "TIMING_EXPORT_MS",
    "PEAK_HOST_RSS_MB",
    "WALL_S",
)


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
    full = parser.add_argument_group("full pipeline (image -> mesh on the patched upstream TRELLIS.2)")
    full.add_argument(
        "--pipeline",
        metavar="{512,1024,1024_cascade,1536_cascade}",
        help="run the full pipeline of this type (default with --upstream: pipeline.json's, 1024_cascade)",
    )
    full.add_argument(
        "--upstream", help="patched TRELLIS.2 checkout (default: $TRELLIS2_SRC, then an installed trellis2)"
    )
    full.add_argument(
        "--steps", type=int, help="sampler steps for every flow stage (default: pipeline.json's; 2 with --smoke)"
    )
    full.add_argument(
        "--decimation-target",
        type=int,
        default=500_000,
        help="GLB export: face budget of the simplification (default 500000, as upstream's app.py; at least 4)",
    )
    full.add_argument(
        "--texture-size", type=int, default=2048, help="GLB export: texture side, a power of two <= 8192 (default 2048)"
    )
    full.add_argument(
        "--remesh",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="GLB export: upstream's narrow-band dual-contouring remesh, inner shells dropped (default; --no-remesh "
        "keeps the decoder's surface)",
    )
    full.add_argument(
        "--remesh-band", type=float, default=1.0, help="GLB export: remesh offset in voxels, 0.25 to 4 (default 1)"
    )
    full.add_argument(
        "--remesh-project",
        type=float,
        default=0.0,
        help="GLB export: fraction 0 to 1 of the way remeshed vertices move back to the decoded surface (default 0)",
    )
    args = parser.parse_args(argv)
    if args.pipeline is not None or args.upstream is not None:
        if args.pipeline is not None and args.pipeline not in PIPELINE_TYPES:
            parser.error(f"--pipeline {args.pipeline}: unsupported; pick one of {', '.join(PIPELINE_TYPES)}")
        if args.smoke == "full":
            parser.error("--smoke full is the DINOv3-only smoke; the full pipeline has --smoke tiny (or --weights)")
        if args.steps is not None and args.steps < 1:
            parser.error(f"--steps {args.steps}: need at least 1")
        if args.bench or args.precision_patch:
            parser.error("--bench and --precision-patch belong to the DINOv3-only mode (no --pipeline)")
    if not args.weights and not args.smoke:
        parser.error("pass --weights DIR (downloaded DINOv3 folder) or --smoke [full|tiny]")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.pipeline is not None or args.upstream is not None:
        return run_full_pipeline(args)

    import torch
    from safetensors.torch import save_file

    from deliverykit import device as devices
    from deliverykit.errors import NumericsError
    from deliverykit.files import atomic_path, ensure_writable_dir, write_json_atomic
    from deliverykit.manifest import verify_files_for_loading
    from deliverykit.report import build_report, environment_fingerprint, evidence_lines
    from deliverykit.timing import benchmark
    from trellis2_npu.dinov3 import (
        MODEL_ID,
        check_weights_folder,
        extract_features,
        feature_shape,
        load_dinov3,
        weights_are_random,
    )
    from trellis2_npu.image import load_image, preprocess_image, synthetic_image, to_pixel_values
    from trellis2_npu.precision import apply_precision_patch
    from trellis2_npu.preview import conditioning_preview
    from trellis2_npu.smoke import save_random_dinov3

    output_dir = ensure_writable_dir(args.output)
    if args.report:
        ensure_writable_dir(Path(args.report).parent)
    device = devices.resolve_device(args.device)
    dtype = torch_dtype(args.dtype)
    if not args.smoke:
        # Specific messages first (missing folder, other model, truncated header), then the manifest's sizes,
        # which only describe the released files (not random weights written by --smoke or the tests).
        check_weights_folder(args.weights)
        if not weights_are_random(args.weights):
            verify_files_for_loading(MANIFEST, args.weights, MODEL_ID)

    image = load_image(args.image) if args.image else synthetic_image(args.seed)
    prepared = preprocess_image(image)
    pixel_values = to_pixel_values(prepared, args.resolution)

    with contextlib.ExitStack() as stack:
        weights_dir = args.weights
        if args.smoke:
            weights_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="dinov3-smoke-"))
            save_random_dinov3(weights_dir, variant=args.smoke, seed=0)
        model = load_dinov3(weights_dir, device=device, dtype=dtype)
        random_weights = weights_are_random(weights_dir)
    patched = apply_precision_patch(model) if args.precision_patch else []

    inputs = pixel_values.to(device)
    devices.reset_peak_memory_stats(device)
    outputs = {}

    @torch.inference_mode()
    def forward() -> None:
        outputs["features"] = extract_features(model, inputs)

    warmup, runs = (args.warmup, args.runs) if args.bench else (0, 1)
    if warmup < 0 or runs < 1:
        raise InputError(f"--warmup {warmup} / --runs {runs}: need warmup >= 0 and runs >= 1", ExitCode.USAGE)
    timing = benchmark(forward, warmup=warmup, repeat=runs, device=device)
    features = outputs["features"]
    peak = devices.max_memory_allocated(device)

    expected = feature_shape(model.config, args.resolution)
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
    report = build_report(
        "inference",
        DELIVERY,
        random_weights=random_weights,
        evidence=evidence,
        environment=environment_fingerprint(device, HERE),
        model={"id": MODEL_ID, "smoke": args.smoke, "dtype": args.dtype, "precision_patch": patched},
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
                    "rows": [
                        [
                            evidence["MODEL_DEVICE"],
                            timing.median_ms,
                            timing.p90_ms,
                            timing.mean_ms,
                            timing.std_ms,
                            warmup,
                            runs,
                            evidence["PEAK_MEMORY_MB"],
                        ]
                    ],
                }
            ],
        },
    )

    preview = conditioning_preview(prepared, features, num_prefix_tokens=1 + model.config.num_register_tokens)

    # The files appear only once all are complete; a failure above leaves nothing behind.
    with (
        atomic_path(output_dir / "features.safetensors") as features_tmp,
        atomic_path(output_dir / "preview.png") as preview_tmp,
    ):
        preview.save(preview_tmp, format="PNG")
        save_file(
            {"features": features.detach().float().cpu().contiguous()},
            features_tmp,
            metadata={"model": MODEL_ID, "resolution": str(args.resolution), "random_weights": str(random_weights)},
        )
        write_json_atomic(output_dir / "report.json", report)
    if args.report:
        write_json_atomic(args.report, report)

    for line in evidence_lines(evidence):
        print(line)
    return 0


def run_full_pipeline(args: argparse.Namespace) -> int:
    """``--pipeline``/``--upstream``: image → mesh → textured GLB on the patched upstream; writes asset.glb,
    preview.png, mesh.ply, voxels.safetensors, report.json (nothing if any step fails)."""
    import resource
    import time

    import torch

    from deliverykit import device as devices
    from deliverykit.errors import NumericsError
    from deliverykit.files import atomic_path, ensure_writable_dir, write_json_atomic
    from deliverykit.report import build_report, environment_fingerprint, evidence_lines
    from deliverykit.timing import Stopwatch
    from trellis2_npu import pipeline as full
    from trellis2_npu.export import check_export_options, to_glb
    from trellis2_npu.glb import encode_glb
    from trellis2_npu.image import has_real_alpha, load_image, normalize_mode, preprocess_image
    from trellis2_npu.mesh_io import PBR_LAYOUT, save_voxels, write_ply
    from trellis2_npu.render_preview import render_preview
    from trellis2_npu.upstream_hooks import is_installed

    started = time.perf_counter()
    check_export_options(  # before minutes of pipeline
        args.decimation_target, args.texture_size, args.remesh, args.remesh_band, args.remesh_project
    )
    output_dir = ensure_writable_dir(args.output)
    if args.report:
        ensure_writable_dir(Path(args.report).parent)
    device = devices.resolve_device(args.device)
    if args.dtype != "fp32":
        raise InputError(
            "--dtype: the full pipeline runs in the checkpoints' own dtypes; pass --dtype fp32", ExitCode.USAGE
        )
    upstream = full.find_upstream(args.upstream)
    full.check_upstream(upstream)
    pipeline_class = full.import_upstream(upstream)

    if args.image:
        image = normalize_mode(load_image(args.image))
    elif args.smoke:
        from trellis2_npu.tiny import tiny_image

        image = tiny_image()
    else:
        raise InputError("the full pipeline needs --image FILE (RGBA with the object in alpha, or RGB)", ExitCode.USAGE)
    # With real alpha, upstream's preprocessing is ours (tested against it): it also names an empty alpha clearly.
    # Without alpha, upstream's own preprocessing runs background removal (BiRefNet) first.
    preprocess_upstream = not has_real_alpha(image)
    if not preprocess_upstream:
        image = preprocess_image(image)

    with contextlib.ExitStack() as stack:
        weights_dir = args.weights
        steps = args.steps
        if args.smoke:
            from trellis2_npu import tiny

            root = stack.enter_context(tempfile.TemporaryDirectory(prefix="trellis2-tiny-"))
            weights_dir = tiny.write_tiny_weights(root, seed=0)
            steps = steps or 2
        loaded = full.load_pipeline(weights_dir, device, pipeline_class)
        if args.smoke:
            tiny.add_occupancy_prior(loaded.models["sparse_structure_decoder"])
        pipeline_type = args.pipeline or loaded.default_pipeline_type
        devices.reset_peak_memory_stats(device)
        result = full.run_pipeline(
            loaded, image, pipeline_type, args.seed, steps, device, preprocess=preprocess_upstream
        )
    peak = devices.max_memory_allocated(device)
    mesh = result.mesh
    vertices, faces = mesh.vertices, mesh.faces
    if faces.shape[0] == 0:
        raise NumericsError(
            f"the {pipeline_type} pipeline produced a mesh without faces ({vertices.shape[0]} vertices)"
        )
    for name, tensor in {"vertices": vertices, "attrs": mesh.attrs}.items():
        if not torch.isfinite(tensor).all():
            raise NumericsError(f"NaN/Inf in the mesh {name} on {device}")

    exported = to_glb(
        vertices,
        faces,
        mesh.attrs,
        mesh.coords,
        result.resolution,
        decimation_target=args.decimation_target,
        texture_size=args.texture_size,
        remesh=args.remesh,
        remesh_band=args.remesh_band,
        remesh_project=args.remesh_project,
    )
    watch = Stopwatch()
    with watch.stage("preview"):
        preview = render_preview(exported.mesh)
    with watch.stage("encode_glb"):
        glb_bytes = encode_glb(exported.mesh)
    export_ms = {**exported.stages_ms, **watch.stages}
    export_total_ms = sum(export_ms.values())
    glb_stats = {**exported.stats, "file_bytes": len(glb_bytes), "texture_format": "webp"}

    peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    evidence = {
        "INPUT_DEVICE": devices.device_string(device),
        "MODEL_DEVICE": devices.device_string(loaded.device),
        "OUTPUT_DEVICE": devices.device_string(vertices.device),
        "CPU_FALLBACK": vertices.device.type != torch.device(device).type,
        "PIPELINE": pipeline_type,
        "OUTPUT_SHAPE": [int(vertices.shape[0]), int(faces.shape[0])],
        "VOXELS_SHAPE": list(mesh.attrs.shape),
        "TOKENS": ",".join(f"{key}:{count}" for key, count in result.tokens.items()),
        "TIMING_TOTAL_MS": round(result.total_ms, 1),
        "PEAK_MEMORY_MB": None if peak is None else peak / 2**20,
        "PEAK_HOST_RSS_MB": round(peak_rss_mb, 1),
        "GLB_SHAPE": [glb_stats["vertices"], glb_stats["faces"]],
        "TEXTURE_SIZE": args.texture_size,
        "TIMING_EXPORT_MS": round(export_total_ms, 1),
        "WALL_S": None,
    }
    report_sections = {
        "model": {"pipeline": pipeline_type, "smoke": args.smoke, "weights": None if args.smoke else str(args.weights)},
        "inputs": {"image": args.image or "tiny RGBA test image", "seed": args.seed, "steps": steps},
        "upstream": {"path": str(upstream)},
        "timing": {
            "stages_ms": result.stages_ms,
            "total_ms": result.total_ms,
            "export_ms": export_ms,
            "export_total_ms": export_total_ms,
        },
        "tokens": result.tokens,
        "results": {
            "glb_file": "asset.glb",
            "preview_file": "preview.png",
            "glb": glb_stats,
            "mesh_file": "mesh.ply",
            "voxels_file": "voxels.safetensors",
            "resolution": result.resolution,
            "vertices": int(vertices.shape[0]),
            "faces": int(faces.shape[0]),
            "pbr_layout": PBR_LAYOUT,
            "fill_holes": "cumesh" if vertices.device.type == "cuda" and is_installed("cumesh") else "mesh_repair",
            "tables": [
                {
                    "title": f"{pipeline_type} pipeline stages on {devices.device_string(device)}, "
                    f"{steps or 'default'} steps per flow (exclusive times)",
                    "columns": ["stage", "ms", "share"],
                    "rows": [
                        [stage, ms, f"{100 * ms / result.total_ms:.0f} %"] for stage, ms in result.stages_ms.items()
                    ]
                    + [["total", result.total_ms, "100 %"]],
                },
                {
                    "title": "Tokens per flow stage and output size",
                    "columns": ["what", "count"],
                    "rows": [
                        *([key, count] for key, count in result.tokens.items()),
                        ["mesh vertices", int(vertices.shape[0])],
                        ["mesh faces", int(faces.shape[0])],
                    ],
                },
                {
                    "title": f"GLB export on the CPU (decimation target {args.decimation_target}, "
                    f"{args.texture_size}² textures, {'remesh' if args.remesh else 'no remesh'})",
                    "columns": ["step", "ms", "share"],
                    "rows": [[step, ms, f"{100 * ms / export_total_ms:.0f} %"] for step, ms in export_ms.items()]
                    + [["total", export_total_ms, "100 %"]],
                },
                {
                    "title": "GLB contents",
                    "columns": ["what", "count"],
                    "rows": [
                        ["faces", glb_stats["faces"]],
                        ["vertices (split on UV seams)", glb_stats["vertices"]],
                        ["texture size", f"{args.texture_size}²"],
                        ["file MiB", round(len(glb_bytes) / 2**20, 2)],
                    ],
                },
            ],
        },
    }
    with (
        atomic_path(output_dir / "asset.glb") as glb_tmp,
        atomic_path(output_dir / "preview.png") as preview_tmp,
        atomic_path(output_dir / "mesh.ply") as mesh_tmp,
        atomic_path(output_dir / "voxels.safetensors") as voxels_tmp,
    ):
        glb_tmp.write_bytes(glb_bytes)
        preview.save(preview_tmp, format="PNG")
        write_ply(mesh_tmp, vertices, faces)
        save_voxels(voxels_tmp, mesh.coords, mesh.attrs, result.resolution)
        evidence["WALL_S"] = round(time.perf_counter() - started, 1)
        report = build_report(
            "inference",
            DELIVERY,
            random_weights=bool(args.smoke),
            evidence=evidence,
            environment=environment_fingerprint(device, HERE),
            **report_sections,
        )
        write_json_atomic(output_dir / "report.json", report)
    if args.report:
        write_json_atomic(args.report, report)
    print("\n".join(evidence_lines(evidence, FULL_EVIDENCE_KEYS)))  # deliverykit's documented keys, then ours
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
