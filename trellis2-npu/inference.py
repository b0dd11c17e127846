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
    python trellis2-npu/inference.py --weights /data/TRELLIS.2-4B --upstream /src/TRELLIS.2 --batch photos/ \
        --output assets/    # many images, one load; resumable; torchrun / --devices 0,1,.. share it over cards

Exit codes: 0 ok, 1 unexpected error, 2 bad arguments, 3 bad input image (or a decompression bomb) or upstream
checkout (missing, other commit, patches not applied), 4 bad weights, 5 device unavailable, 6 an output cannot be
written (a folder in the way, not writable, disk full), 7 NaN/Inf in the output, 9 a --batch ran but some
requests failed (batch.json names them). Outputs are checked before any
work and appear together at the end, or not at all (no empty --output folder either).
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

from deliverykit.cli import add_batch_args, add_common_args, torch_dtype  # noqa: E402
from deliverykit.errors import ExitCode, InputError, run_main  # noqa: E402
from deliverykit.files import Outputs  # noqa: E402

DELIVERY = "trellis2-npu"
MANIFEST = HERE / "weights-manifest.json"
PIPELINE_TYPES = ("512", "1024", "1024_cascade", "1536_cascade")


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
        default=False,
        help="GLB export: upstream's narrow-band dual-contouring remesh (closed, single-sided; inner shells dropped). "
        "Off by default until it is fast: 1.3M faces take minutes on the CPU (upstream's examples turn it on)",
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
    add_batch_args(parser, inputs="one image path a line; or a folder of images")
    args = parser.parse_args(argv)
    full_mode = args.pipeline is not None or args.upstream is not None
    if args.batch and not full_mode:
        parser.error("--batch runs the image → 3D pipeline: add --upstream DIR (or --pipeline TYPE)")
    if args.batch and (args.image or args.report):
        parser.error("--batch takes the images from its file, without --image or --report")
    if not args.batch and (args.devices or args.overwrite):
        parser.error("--devices and --overwrite go with --batch")
    if full_mode:
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


ASSET_FILES = ("asset.glb", "preview.png", "mesh.ply", "voxels.safetensors")
BATCH_FIELDS = {"image": str, "seed": int, "steps": int}


def declare_outputs(
    folder: str | Path, report: str | None = None, names: tuple[str, ...] = ASSET_FILES
) -> tuple[Outputs, dict[str, Path], list[Path]]:
    """The run's output files (``names`` in ``folder``, report.json, ``--report``), checked now; creates nothing.

    Returns the :class:`~deliverykit.files.Outputs` to commit at the end, ``{name: path}`` and the report paths.
    """
    outputs = Outputs()
    files = {name: outputs.add(Path(folder) / name) for name in names}
    reports = outputs.add_reports(folder, report)
    outputs.check()
    return outputs, files, reports


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.devices:
        from deliverykit import batch

        return batch.spawn_ranks(batch.parse_devices(args.devices), sys.argv if argv is None else [__file__, *argv])
    if args.pipeline is not None or args.upstream is not None:
        return run_full_pipeline(args)

    import torch
    from safetensors.torch import save

    from deliverykit import device as devices
    from deliverykit.assets.loadcheck import check_weights_for_loading, smoke_weights, weights_record
    from deliverykit.errors import NumericsError
    from deliverykit.files import json_text
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

    outputs, files, reports = declare_outputs(args.output, args.report, ("features.safetensors", "preview.png"))
    device = devices.resolve_device(args.device)
    dtype = torch_dtype(args.dtype)
    if not args.smoke:
        # Specific messages first (missing folder, other model, truncated header), then the manifest check
        # (refuses missing/corrupt files, warns about valid ones that differ from the release), which only
        # describes the released files (not random weights written by --smoke or the tests).
        check_weights_folder(args.weights)
        if not weights_are_random(args.weights):
            weights_files = check_weights_for_loading(MANIFEST, args.weights, MODEL_ID, strict=args.strict_manifest)

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
        if random_weights:
            weights_files = smoke_weights(weights_dir)
    patched = apply_precision_patch(model) if args.precision_patch else []

    inputs = pixel_values.to(device)
    devices.reset_peak_memory_stats(device)
    computed = {}

    @torch.inference_mode()
    def forward() -> None:
        computed["features"] = extract_features(model, inputs)

    warmup, runs = (args.warmup, args.runs) if args.bench else (0, 1)
    if warmup < 0 or runs < 1:
        raise InputError(f"--warmup {warmup} / --runs {runs}: need warmup >= 0 and runs >= 1", ExitCode.USAGE)
    timing = benchmark(forward, warmup=warmup, repeat=runs, device=device)
    features = computed["features"]
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

    # The files, report.json included, appear only once all are complete; a failure leaves none of them behind.
    with outputs.commit() as temps:
        preview.save(temps[files["preview.png"]], format="PNG")
        features_bytes = save(
            {"features": features.detach().float().cpu().contiguous()},
            metadata={"model": MODEL_ID, "resolution": str(args.resolution), "random_weights": str(random_weights)},
        )
        temps[files["features.safetensors"]].write_bytes(features_bytes)
        for path in reports:
            temps[path].write_text(json_text(report), encoding="utf-8")

    for line in evidence_lines(evidence):
        print(line)
    return 0


def run_full_pipeline(args: argparse.Namespace) -> int:
    """``--pipeline``/``--upstream``: image → mesh → textured GLB on the patched upstream; writes asset.glb,
    preview.png, mesh.ply, voxels.safetensors, report.json (nothing if any step fails). With ``--batch``, every
    request of the file on one loaded pipeline, each into ``OUTPUT/<name>/``."""
    import time

    from deliverykit import batch
    from deliverykit import device as devices
    from deliverykit.assets.loadcheck import smoke_weights, weights_record
    from deliverykit.report import evidence_lines
    from trellis2_npu import pipeline as full
    from trellis2_npu.export import check_export_options
    from trellis2_npu.report import FULL_EVIDENCE_KEYS

    started = time.perf_counter()
    # 1. Every check that needs no model: the export options, the batch file, the outputs, device, upstream, image.
    check_export_options(  # before minutes of pipeline
        args.decimation_target, args.texture_size, args.remesh, args.remesh_band, args.remesh_project
    )
    items = None
    if args.batch:
        required = () if args.smoke else ("image",)
        items = batch.read_batch(
            args.batch, BATCH_FIELDS, required=required, text_field="image", image_field="image", check=_check_steps
        )
    single = None if items else declare_outputs(args.output, args.report)
    ranks = batch.Ranks.from_env()
    device = devices.resolve_device(batch.rank_device_spec(args.device, ranks))
    if args.dtype != "fp32":
        raise InputError(
            "--dtype: the full pipeline runs in the checkpoints' own dtypes; pass --dtype fp32", ExitCode.USAGE
        )
    upstream = full.find_upstream(args.upstream)
    full.check_upstream(upstream)
    pipeline_class = full.import_upstream(upstream)
    image = prepared_image(args.image, args.smoke) if single else None
    # Images without alpha go through upstream's background removal, whose weights are then needed too.
    rembg = image[1] if image else any(_lacks_alpha(item.fields.get("image")) for item in items)
    if not args.smoke:
        weights_files = full.check_weights(args.weights, rembg=rembg, strict=args.strict_manifest)

    with contextlib.ExitStack() as stack:
        # 2. The weights: the downloaded folders, or tiny random models written in the released layout.
        weights_dir = args.weights
        if args.smoke:
            from trellis2_npu import tiny

            root = stack.enter_context(tempfile.TemporaryDirectory(prefix="trellis2-tiny-"))
            weights_dir = tiny.write_tiny_weights(root, seed=0)
            weights_files = smoke_weights(root)
        # 3. Load once.
        loaded = full.load_pipeline(weights_dir, device, pipeline_class)
        if args.smoke:
            tiny.add_occupancy_prior(loaded.models["sparse_structure_decoder"])
        context = {
            "loaded": loaded,
            "device": device,
            "pipeline_type": args.pipeline or loaded.default_pipeline_type,
            "export": {
                "decimation_target": args.decimation_target,
                "texture_size": args.texture_size,
                "remesh_band": args.remesh_band,
                "remesh_project": args.remesh_project,
            },
            "remesh": args.remesh,
            "model": {"smoke": args.smoke, "weights": None if args.smoke else str(args.weights)},
            "upstream": upstream,
            "weights": weights_record(weights_files),
            "random_weights": bool(args.smoke),
        }
        steps = args.steps or (2 if args.smoke else None)

        # 4. Generate and write: all five files of a request together, or none.
        if single:
            evidence = make_asset(*image, args.image, args.seed, steps, *single, started=started, **context)
            print("\n".join(evidence_lines(evidence, FULL_EVIDENCE_KEYS)))  # deliverykit's documented keys, then ours
            return 0

        def run_item(item: batch.BatchItem, folder: Path) -> dict:
            path = item.fields.get("image")
            seed, item_steps = item.fields.get("seed", args.seed), item.fields.get("steps", steps)
            outputs = declare_outputs(folder)
            evidence = make_asset(*prepared_image(path, args.smoke), path, seed, item_steps, *outputs, **context)
            return {"wall_s": evidence["WALL_S"]}

        return batch.run_batch(items, run_item, args.output, overwrite=args.overwrite, ranks=ranks).exit_code


def _check_steps(fields: dict) -> None:
    if fields.get("steps", 1) < 1:
        raise InputError(f"steps {fields['steps']}: need at least 1", ExitCode.USAGE)


def _lacks_alpha(path: str | None) -> bool:
    """Whether the image at ``path`` has no real alpha (unreadable ones fail later, as their request)."""
    from deliverykit.errors import DeliveryError
    from trellis2_npu.image import has_real_alpha, load_image

    if path is None:
        return False
    try:
        return not has_real_alpha(load_image(path))
    except DeliveryError:  # a bad image is that request's failure, reported when it runs
        return False


def prepared_image(path: str | None, smoke: str | None):
    """``(image, preprocess_upstream)``: with real alpha our preprocessing (tested equal to upstream's, and it names
    an empty alpha clearly); without alpha, upstream's own preprocessing with background removal."""
    from trellis2_npu.image import has_real_alpha, load_image, normalize_mode, preprocess_image

    if path:
        image = normalize_mode(load_image(path))
    elif smoke:
        from trellis2_npu.tiny import tiny_image

        image = tiny_image()
    else:
        raise InputError("the full pipeline needs --image FILE (RGBA with the object in alpha, or RGB)", ExitCode.USAGE)
    if not has_real_alpha(image):
        return image, True
    return preprocess_image(image), False


def make_asset(image, preprocess_upstream: bool, image_name: str | None, seed: int, steps: int | None, outputs,
               files: dict, reports: list, *, loaded, device, pipeline_type: str, export: dict, remesh,
               started: float | None = None, **report_context) -> dict:  # fmt: skip
    """Run the pipeline on one image, export the GLB and preview, write the five files together; the evidence."""
    import time

    import torch

    from deliverykit import device as devices
    from deliverykit.errors import NumericsError
    from deliverykit.files import json_text
    from deliverykit.timing import Stopwatch
    from trellis2_npu import pipeline as full
    from trellis2_npu.export import to_glb
    from trellis2_npu.glb import encode_glb
    from trellis2_npu.mesh_io import save_voxels, write_ply
    from trellis2_npu.render_preview import render_preview
    from trellis2_npu.report import asset_report

    started = time.perf_counter() if started is None else started
    devices.reset_peak_memory_stats(device)
    result = full.run_pipeline(loaded, image, pipeline_type, seed, steps, device, preprocess=preprocess_upstream)
    peak = devices.max_memory_allocated(device)
    mesh = result.mesh
    if mesh.faces.shape[0] == 0:
        raise NumericsError(
            f"the {pipeline_type} pipeline produced a mesh without faces ({mesh.vertices.shape[0]} vertices)"
        )
    for name, tensor in {"vertices": mesh.vertices, "attrs": mesh.attrs}.items():
        if not torch.isfinite(tensor).all():
            raise NumericsError(f"NaN/Inf in the mesh {name} on {device}")
    exported = to_glb(mesh.vertices, mesh.faces, mesh.attrs, mesh.coords, result.resolution, **export, remesh=remesh)
    watch = Stopwatch()
    with watch.stage("preview"):
        preview = render_preview(exported.mesh)
    with watch.stage("encode_glb"):
        glb_bytes = encode_glb(exported.mesh)
    with outputs.commit() as temps:  # all five files appear together, or none
        temps[files["asset.glb"]].write_bytes(glb_bytes)
        preview.save(temps[files["preview.png"]], format="PNG")
        write_ply(temps[files["mesh.ply"]], mesh.vertices, mesh.faces)
        save_voxels(temps[files["voxels.safetensors"]], mesh.coords, mesh.attrs, result.resolution)
        evidence, report = asset_report(
            result,
            exported,
            glb_bytes,
            {**exported.stages_ms, **watch.stages},
            inputs={"image": image_name or "tiny RGBA test image", "seed": seed, "steps": steps},
            device=device,
            model_device=loaded.device,
            pipeline_type=pipeline_type,
            export=export,
            peak=peak,
            wall_s=round(time.perf_counter() - started, 1),
            remesh=remesh,
            source=HERE,
            **report_context,
        )
        for path in reports:
            temps[path].write_text(json_text(report), encoding="utf-8")
    return evidence


if __name__ == "__main__":
    sys.exit(run_main(main))
