#!/usr/bin/env python3
"""URSA-1.7B-IBQ512 text → image on NPU, CUDA or CPU, through the patched baaivision/URSA (``diffnext``).

    python ursa-npu/inference.py --upstream ~/src/URSA --weights /data/URSA-1.7B-IBQ512 \
        --prompt "a red fox in the snow" --output out.jpg
    python ursa-npu/inference.py --upstream ~/src/URSA --smoke --device cpu --output out.jpg

``--upstream`` (or ``$URSA_SRC``) is a checkout of the pinned commit with ``ursa-npu/patches`` applied
(``python -m deliverykit upstream clone --delivery ursa-npu --into DIR`` makes one). ``--smoke [tiny|tiny512]``
needs no weights: a tiny URSA with seeded random weights is written in the real layout and loaded back. The image
is written atomically (complete or not at all), with ``report.json`` beside it and KEY=VALUE evidence lines.

Exit codes: 0 ok, 1 unexpected error, 2 bad arguments (including a height/width the VQ model cannot make, such as
0, and a prompt that is not UTF-8), 3 upstream checkout missing, at another commit or unpatched, 4 weights folder
incomplete or unloadable, 5 device unavailable, 6 an output cannot be written (a folder in the way, not writable,
disk full).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # ursa_npu, which the patched diffnext imports too
try:
    import deliverykit  # noqa: F401  (installed, or vendored next to this file)
except ImportError:  # running from the monorepo without `make`: use the package in ../shared
    sys.path.insert(0, str(HERE.parent / "shared"))

from deliverykit.cli import add_common_args, check_counts, check_utf8, torch_dtype  # noqa: E402
from deliverykit.errors import ExitCode, run_main  # noqa: E402

DELIVERY = "ursa-npu"
MANIFEST = HERE / "weights-manifest.json"
IMAGE_FORMATS = {".jpg": "JPEG", ".jpeg": "JPEG", ".png": "PNG"}
SMOKE_PROMPT = "a photo of a small cat on the red house under the sun"
DEFAULT_STEPS, SMOKE_STEPS = 50, 4
DEFAULT_SIZE = 512  # URSA-1.7B-IBQ512 is trained at 512x512
DEFAULT_MAX_PROMPT_LENGTH = 320  # upstream's default, the real tokenizer window
URSA_EVIDENCE_KEYS = (
    "DTYPE",
    "STEPS",
    "DIFFUSION_MS",
    "IT_PER_S",
    "VAE_DECODE_MS",
    "TOTAL_MS",
    "PROMPT_TOKENS",
    "PROMPT_TRUNCATED",
    "PEAK_HOST_RSS_MB",
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(
        parser,
        smoke_choices=("tiny", "tiny512"),
        output_help="image file to write (.jpg, .jpeg or .png); report.json is written in the same folder",
        dtype_default=None,
    )
    parser.add_argument("--upstream", help="patched baaivision/URSA checkout (default: $URSA_SRC)")
    parser.add_argument("--prompt", help="text prompt (default with --smoke: a fixed test prompt)")
    parser.add_argument("--negative-prompt", default="", help="negative prompt (default: empty, as upstream)")
    parser.add_argument(
        "--steps", type=int, help=f"sampling steps (default {DEFAULT_STEPS}, {SMOKE_STEPS} with --smoke)"
    )
    parser.add_argument("--guidance", type=float, default=7.0, help="classifier-free guidance scale (default 7)")
    for side in ("height", "width"):
        parser.add_argument(
            f"--{side}", type=int, help=f"image {side}, a multiple of the VQ stride (default {DEFAULT_SIZE})"
        )
    parser.add_argument(
        "--max-prompt-length",
        type=int,
        help=f"prompt tokens the model reads; longer prompts are truncated, with a warning (default "
        f"{DEFAULT_MAX_PROMPT_LENGTH}; the tiny model's own with --smoke)",
    )
    parser.add_argument("--report", help="also write the run report here (e.g. ursa-npu/results/inference_tiny.json)")
    args = parser.parse_args(argv)
    if not args.weights and not args.smoke:
        parser.error("pass --weights DIR (downloaded URSA folder) or --smoke [tiny|tiny512]")
    if args.weights and args.smoke:
        parser.error("--weights and --smoke exclude each other")
    if not args.prompt and not args.smoke:
        parser.error("--prompt is required with --weights")
    if Path(args.output).suffix.lower() not in IMAGE_FORMATS:
        parser.error(f"--output {args.output}: use a .jpg, .jpeg or .png file name")
    check_counts(parser, args, positive=("steps", "max_prompt_length"))
    check_utf8(args, ("prompt", "negative_prompt"))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from deliverykit import device as devices
    from deliverykit.files import Outputs
    from deliverykit.loadcheck import check_weights_for_loading, smoke_weights, weights_record
    from ursa_npu import MODEL_ID, pipeline, upstream, weights
    from ursa_npu.tiny import VARIANTS

    # Every check that needs no model comes first: a bad input fails in a second, not after loading 4 GB.
    outputs = Outputs()  # the image and report.json(s), written together at the end; checked now
    image_path = outputs.add(args.output)
    report_paths = outputs.add_reports(image_path.parent, args.report)
    outputs.check()
    device = devices.resolve_device(args.device)
    variant = VARIANTS.get(args.smoke)
    folder = None if args.smoke else weights.check_weights_folder(args.weights)
    weights_files = []
    if folder is not None and not folder.random_weights:
        weights_files = check_weights_for_loading(MANIFEST, folder.path, MODEL_ID, strict=args.strict_manifest)
    default_size = variant.size if variant else DEFAULT_SIZE
    settings = argparse.Namespace(
        dtype=args.dtype or ("fp32" if device.type == "cpu" else "fp16"),
        height=default_size if args.height is None else args.height,  # --height 0 is an error, not the default
        width=default_size if args.width is None else args.width,
        steps=args.steps or (SMOKE_STEPS if args.smoke else DEFAULT_STEPS),
        max_prompt_length=args.max_prompt_length
        or (variant.max_prompt_length if variant else DEFAULT_MAX_PROMPT_LENGTH),
        prompt=args.prompt or SMOKE_PROMPT,
        outputs=outputs,
        image_path=image_path,
        report_paths=report_paths,
    )
    pipeline.check_image_size(
        settings.height, settings.width, variant.spatial_stride if variant else folder.spatial_stride
    )
    checkout = upstream.find_patched_upstream(args.upstream)
    classes = upstream.import_diffnext(checkout)

    with contextlib.ExitStack() as stack:
        if args.smoke:
            from ursa_npu import tiny

            home = stack.enter_context(tempfile.TemporaryDirectory(prefix="ursa-smoke-"))
            os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here comes from the hub
            folder = weights.check_weights_folder(tiny.write_tiny_weights(home, classes, variant=args.smoke, seed=0))
        if folder.random_weights:
            weights_files = smoke_weights(folder.path)
        return run(args, settings, classes, folder, device, checkout, weights_record(weights_files))


def run(
    args: argparse.Namespace, settings: argparse.Namespace, classes, folder, device, checkout: Path, weights_files: list
) -> int:
    """Load, generate (with --bench: warmup + timed runs), write the image, report.json and evidence lines."""
    from PIL import Image

    from deliverykit import device as devices
    from deliverykit.files import json_text
    from deliverykit.report import build_report, environment_fingerprint, evidence_lines
    from deliverykit.timing import TimingStats
    from ursa_npu import MODEL_ID, pipeline, weights

    output = settings.image_path
    dtype_name, height, width, steps = settings.dtype, settings.height, settings.width, settings.steps
    max_prompt_length, prompt = settings.max_prompt_length, settings.prompt

    pipe = weights.load_pipeline(folder, classes, torch_dtype(dtype_name))
    pipe.set_progress_bar_config(disable=True)
    pipe.to(device)
    audit = devices.audit_placement(pipe.transformer, device)
    vae_audit = devices.audit_placement(pipe.vae, device)

    prompt_tokens = pipeline.prompt_token_count(pipe.tokenizer, prompt)
    truncated = prompt_tokens > max_prompt_length
    if truncated:
        print(
            f"warning: the prompt has {prompt_tokens} tokens; the model reads only the first {max_prompt_length} "
            "(--max-prompt-length), the rest is ignored",
            file=sys.stderr,
        )

    def once() -> pipeline.Generation:
        return pipeline.generate(
            pipe,
            prompt,
            negative_prompt=args.negative_prompt,
            steps=steps,
            guidance=args.guidance,
            height=height,
            width=width,
            seed=args.seed,
            device=device,
            max_prompt_length=max_prompt_length,
        )

    warmup, runs = (args.warmup, args.runs) if args.bench else (0, 1)
    for _ in range(warmup):
        once()
    results = [once() for _ in range(runs)]
    result = results[-1]
    total = TimingStats.from_samples([r.total_ms for r in results], warmup=warmup)
    diffusion = TimingStats.from_samples([r.diffusion_ms for r in results], warmup=warmup)
    decode = TimingStats.from_samples([r.decode_ms for r in results], warmup=warmup)
    peak = max((r.peak_memory_bytes for r in results if r.peak_memory_bytes is not None), default=None)

    evidence = {
        "INPUT_DEVICE": devices.device_string(device),
        "MODEL_DEVICE": audit.model_device,
        "OUTPUT_DEVICE": devices.device_string(device),
        "CPU_FALLBACK": audit.cpu_fallback or vae_audit.cpu_fallback,
        "LATENT_SHAPE": list(result.token_ids.shape),
        "OUTPUT_SHAPE": list(result.image.shape),
        "TIMING_MEDIAN_MS": total.median_ms,
        "TIMING_P90_MS": total.p90_ms,
        "PEAK_MEMORY_MB": None if peak is None else peak / 2**20,
        "DTYPE": dtype_name,
        "STEPS": steps,
        "DIFFUSION_MS": diffusion.median_ms,
        "IT_PER_S": steps / (diffusion.median_ms / 1000.0),
        "VAE_DECODE_MS": decode.median_ms,
        "TOTAL_MS": total.median_ms,
        "PROMPT_TOKENS": prompt_tokens,
        "PROMPT_TRUNCATED": truncated,
        "PEAK_HOST_RSS_MB": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    device_label = devices.device_string(device)
    report = build_report(
        "inference",
        DELIVERY,
        random_weights=folder.random_weights,
        evidence=evidence,
        environment=environment_fingerprint(device, HERE),
        model={"id": MODEL_ID, "smoke": args.smoke, "weights": None if args.smoke else str(args.weights)},
        weights=weights_files,
        upstream={"path": str(checkout)},
        inputs={
            "prompt": prompt,
            "negative_prompt": args.negative_prompt,
            "prompt_tokens": prompt_tokens,
            "max_prompt_length": max_prompt_length,
            "prompt_truncated": truncated,
            "steps": steps,
            "guidance": args.guidance,
            "height": height,
            "width": width,
            "seed": args.seed,
            "dtype": dtype_name,
        },
        timing={
            "stages_ms": result.stages_ms,
            "diffusion": diffusion.to_dict(),
            "vae_decode": decode.to_dict(),
            "total": total.to_dict(),
            "iterations_per_s": evidence["IT_PER_S"],
        },
        placement={"off_device": audit.off_device + vae_audit.off_device},
        results={
            "image_file": output.name,
            "token_ids_head": result.token_ids.flatten()[:16].tolist(),
            "tables": [
                {
                    "title": f"{height}x{width}, {steps} steps, guidance {args.guidance}, {dtype_name} on "
                    f"{device_label} (medians of {runs} run(s) after {warmup} warmup)",
                    "columns": ["diffusion ms", "it/s", "VAE decode ms", "total ms", "peak device MB"],
                    "rows": [
                        [
                            diffusion.median_ms,
                            evidence["IT_PER_S"],
                            decode.median_ms,
                            total.median_ms,
                            evidence["PEAK_MEMORY_MB"],
                        ]
                    ],
                }
            ],
        },
    )
    image_format = IMAGE_FORMATS[output.suffix.lower()]
    with settings.outputs.commit() as temps:  # the image and report.json appear complete and together, or not at all
        options = {"quality": 95} if image_format == "JPEG" else {}
        Image.fromarray(result.image).save(temps[output], format=image_format, **options)
        for path in settings.report_paths:
            temps[path].write_text(json_text(report), encoding="utf-8")
    print("\n".join(evidence_lines(evidence, URSA_EVIDENCE_KEYS)))  # deliverykit's documented keys, then ours
    return int(ExitCode.OK)


if __name__ == "__main__":
    sys.exit(run_main(main))
