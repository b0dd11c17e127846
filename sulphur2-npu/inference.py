#!/usr/bin/env python3
"""Sulphur-2-base (LTX-2.3) text/image → video with audio on NPU, CUDA or CPU, through diffusers' LTX2 pipelines.

    python sulphur2-npu/inference.py --model sulphur_distil_bf16.safetensors --text-encoder gemma-3-12b \
        --prompt "a red fox runs through snow" --preset balanced --output out.mp4
    python sulphur2-npu/inference.py ... --image first_frame.png --output out.mp4     # image → video
    python sulphur2-npu/inference.py --smoke --device cpu --output out.mp4
    torchrun --nproc-per-node 4 sulphur2-npu/inference.py ... --parallel guidance=4 --output out.mp4  # 4 cards

``--schedule auto`` (the default) samples a checkpoint whose file name contains "distil" (sulphur_distil_bf16) with
LTX-2.3's fixed 8-step distilled sigmas and no guidance, any other with the dev schedule, the preset's steps and
guidance (``sulphur2_npu.schedules``).

``--model`` is the single ``.safetensors`` (original LTX layout), loaded strictly and offline
(``sulphur2_npu.loader``); ``--text-encoder`` a transformers Gemma-3 folder with its tokenizer. ``--smoke`` needs
no weights: a tiny LTX-2.3 with seeded random weights is written in the same layout and loaded through the same
loader (64x96, 9 frames, 2 steps: seconds on a CPU). NPU attention with correct masks and the float32 RoPE policy
are always applied (no-ops off an NPU); ``--memory auto`` picks the memory plan from free device memory.

Outputs, all written at the end and renamed into place together (complete or not at all): ``out.mp4`` (H.264 +
AAC stereo at the vocoder's rate), ``out_first.png`` and ``out_last.png`` (first and last frame) and
``report.json`` beside them; KEY=VALUE evidence lines on stdout.

Several cards (README, "Several cards"): under ``torchrun`` each rank takes ``<device>:LOCAL_RANK``;
``--parallel ulysses=U,guidance=G`` splits every step's guidance passes over G rank groups and each pass's video
tokens over U ranks (Ulysses); Gemma-3 runs on rank 0 and its embeddings are broadcast; only rank 0 writes the
outputs and prints the evidence lines.

Exit codes: 0 ok, 1 unexpected error, 2 bad arguments (including a size the VAE cannot make, with the nearest
valid values, a size beyond the positional range, a prompt that is not UTF-8, a --parallel that does not fit the
world size or the run), 3 bad input (text encoder folder missing, --image unreadable or a decompression bomb, LoRA
for another model), 4 bad checkpoint (not LTX-2.x, fp8, LTX-2.0, corrupt or incomplete), 5 device unavailable,
6 an output cannot be written (a folder in the way, not writable, disk full), 7 NaN/Inf in the generated video or
audio, 10 another rank of a multi-card run failed or died (that rank prints the cause).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import resource
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # sulphur2_npu
try:
    import deliverykit  # noqa: F401  (installed, or vendored next to this file)
except ImportError:  # running from the monorepo without `make`: use the package in ../shared
    sys.path.insert(0, str(HERE.parent / "shared"))

from deliverykit.cli import DTYPE_CHOICES, add_common_args, check_counts, check_utf8, torch_dtype  # noqa: E402
from deliverykit.errors import DeliveryError, ExitCode, run_main  # noqa: E402
from sulphur2_npu import MODEL_ID  # noqa: E402

DELIVERY = "sulphur2-npu"
MANIFEST = HERE / "weights-manifest.json"
EXTRA_EVIDENCE_KEYS = (
    "MODE",
    "SCHEDULE",
    "CHECKPOINT_FAMILY",
    "CONFIG_SOURCE",
    "RANDOM_WEIGHTS",
    "DTYPE",
    "MEMORY_PLAN",
    "ROPE_PRECISION",
    "LOAD_S",
    "PREPARE_MS",
    "FIRST_STEP_MS",
    "PER_STEP_MS",
    "VAE_DECODE_MS",
    "TOTAL_MS",
    "AUDIO_SAMPLE_RATE",
    "AUDIO_SHAPE",
    "PEAK_HOST_RSS_MB",
    "PARALLEL",
    "WORLD_SIZE",
    "COMM_BYTES_PER_STEP",
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from sulphur2_npu.memory import CHOICES as MEMORY_CHOICES
    from sulphur2_npu.presets import DEFAULT_PRESET, PRESETS
    from sulphur2_npu.schedules import add_schedule_argument

    # "resolve": --model replaces the common --weights (a file here, not a folder; --weights stays an alias) and
    # --dtype gets this model's default.
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], conflict_handler="resolve")
    add_common_args(
        parser,
        smoke_choices=("tiny",),
        output_help="mp4 file to write; <name>_first.png, <name>_last.png and report.json go beside it",
        dtype_default=None,
    )
    parser.add_argument(
        "--model",
        "--weights",
        dest="weights",
        metavar="FILE",
        help="Sulphur-2 / LTX-2.3 single .safetensors file (bf16)",
    )
    parser.add_argument(
        "--dtype",
        choices=DTYPE_CHOICES,
        help="compute dtype (default: bf16, the dtype of the released weights, on an accelerator; fp32 on the CPU)",
    )
    parser.add_argument(
        "--text-encoder", help="Gemma-3 folder (transformers layout, tokenizer inside or in tokenizer/)"
    )
    parser.add_argument(
        "--model-config",
        metavar="JSON",
        help="ltx-core config for a --model file without __metadata__: the `config` entry of an official LTX-2.3 "
        "file's metadata, as JSON (used instead of the file's own config)",
    )
    parser.add_argument("--prompt", help="text prompt (default with --smoke: a fixed test prompt)")
    parser.add_argument("--negative-prompt", help="negative prompt, used when --guidance > 1 (default: empty)")
    parser.add_argument("--image", help="first frame for image → video (PNG/JPEG/WebP); resized to the video size")
    presets = "; ".join(f"{name} {p.width}x{p.height}x{p.num_frames}, {p.steps} steps" for name, p in PRESETS.items())
    parser.add_argument(
        "--preset",
        choices=tuple(PRESETS),
        help=f"size, length, steps and guidance ({presets}; default {DEFAULT_PRESET}, the tiny size with --smoke)",
    )
    parser.add_argument("--width", type=int, help="video width, a multiple of 32 (overrides the preset)")
    parser.add_argument("--height", type=int, help="video height, a multiple of 32 (overrides the preset)")
    parser.add_argument("--num-frames", type=int, help="frames, 8k+1 (overrides the preset)")
    add_schedule_argument(parser)
    parser.add_argument("--steps", type=int, help="denoising steps (dev schedule; overrides the preset)")
    parser.add_argument(
        "--guidance", type=float, help="video CFG scale (dev schedule); <= 1 turns all guidance off (distill LoRA)"
    )
    parser.add_argument("--fps", type=int, default=24, help="frame rate of the video and its audio (default 24)")
    parser.add_argument("--lora", help="LoRA .safetensors (diffusers, original or Kohya keys) applied to the model")
    parser.add_argument("--lora-scale", type=float, default=1.0, help="LoRA strength (default 1.0)")
    parser.add_argument(
        "--memory", choices=MEMORY_CHOICES, default="auto", help="memory plan (default auto: by free device memory)"
    )
    parser.add_argument("--report", help="also write the run report here (e.g. sulphur2-npu/results/inference.json)")
    parser.add_argument(
        "--parallel",
        metavar="ulysses=U[,guidance=G]",
        help="under torchrun: split each step over the ranks, U*G = world size (ulysses: the video tokens, U in 2|4|8; "
        "guidance: the guidance passes, G in 2|4)",
    )
    args = parser.parse_args(argv)
    if not args.weights and not args.smoke:
        parser.error("pass --model FILE and --text-encoder DIR, or --smoke")
    if args.weights and args.smoke:
        parser.error("--model and --smoke exclude each other")
    if args.weights and not (args.text_encoder and args.prompt):
        parser.error("--model needs --text-encoder DIR and --prompt TEXT")
    if Path(args.output).suffix.lower() != ".mp4":
        parser.error(f"--output {args.output}: use a .mp4 file name")
    check_counts(parser, args, positive=("steps", "fps"))
    check_utf8(args, ("prompt", "negative_prompt"))
    return args


def choose_schedule(args: argparse.Namespace):
    """The schedule of this run and why; distilled with --steps or --guidance is a usage error (its steps are fixed)."""
    from sulphur2_npu import schedules
    from sulphur2_npu.smoke import CHECKPOINT_NAME

    choice = schedules.choose_schedule(args.schedule, Path(args.weights or CHECKPOINT_NAME))
    given = [f"--{name}" for name in ("steps", "guidance") if getattr(args, name) is not None]
    if choice.name == schedules.DISTILLED and given:
        raise DeliveryError(
            f"{' and '.join(given)} cannot be used with the distilled schedule ({choice.why}): it has "
            f"{schedules.DISTILLED_STEPS} fixed sigmas and no guidance; drop {' and '.join(given)}, or pass "
            f"--schedule dev to set them (dev weights)",
            ExitCode.USAGE,
        )
    return choice


def resolve_settings(args: argparse.Namespace, schedule: str):
    """The preset (tiny size with --smoke and no --preset) with the explicit flags applied, as ``schedule`` runs it."""
    from sulphur2_npu import schedules
    from sulphur2_npu.presets import DEFAULT_PRESET, Preset, resolve_preset
    from sulphur2_npu.schedules import for_schedule
    from sulphur2_npu.tiny import TINY_CALL

    if args.smoke and not args.preset:
        base = Preset(
            width=TINY_CALL["width"],
            height=TINY_CALL["height"],
            num_frames=TINY_CALL["num_frames"],
            steps=TINY_CALL["num_inference_steps"],
            guidance=TINY_CALL["guidance_scale"],
        )
    else:
        base = args.preset or DEFAULT_PRESET
    preset = resolve_preset(
        base,
        width=args.width,
        height=args.height,
        num_frames=args.num_frames,
        steps=args.steps,
        guidance=args.guidance,
    )
    if schedule == schedules.DEV and preset.steps < 2:
        raise DeliveryError(
            f"--steps {preset.steps}: the dev schedule needs at least 2 steps (LTX-2.3 stretches its last non-zero "
            "sigma to 0.1, which one step cannot); pass --steps 2 or more",
            ExitCode.USAGE,
        )
    return for_schedule(preset, schedule)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from deliverykit.assets.loadcheck import smoke_weights, weights_record
    from deliverykit.distributed import destroy_distributed, failure_guard, init_distributed, world_size_from_env
    from deliverykit.files import Outputs
    from sulphur2_npu.checkpoint import read_model_config
    from sulphur2_npu.generate import DEFAULT_MAX_SEQUENCE_LENGTH, guidance_kwargs
    from sulphur2_npu.loader import load_pipeline
    from sulphur2_npu.parallel import check_guidance_degree, check_ulysses_lengths, guidance_rows, parse_parallel
    from sulphur2_npu.sizes import validate_size
    from sulphur2_npu.tiny import TINY_CALL
    from sulphur2_npu.video_io import frame_paths, read_image

    # Every check that needs no model comes first: a bad input fails in a second, not after reading 46 GB.
    schedule = choose_schedule(args)
    settings = resolve_settings(args, schedule.name)
    validate_size(settings.width, settings.height, settings.num_frames, args.fps)
    spec = parse_parallel(args.parallel, world_size_from_env())
    check_guidance_degree(spec, len(guidance_rows(guidance_kwargs(settings.guidance, num_layers=1))))
    text_tokens = TINY_CALL["max_sequence_length"] if args.smoke else DEFAULT_MAX_SEQUENCE_LENGTH
    check_ulysses_lengths(spec, settings.width, settings.height, settings.num_frames, text_tokens)
    outputs = Outputs()  # all written at the end, together, by rank 0; checked now (a folder in the way, not writable)
    paths = argparse.Namespace(video=outputs.add(args.output))
    paths.first, paths.last = (outputs.add(path) for path in frame_paths(paths.video))
    paths.reports = outputs.add_reports(paths.video.parent, args.report)
    outputs.check()
    image = read_image(Path(args.image)) if args.image else None
    model_config = Path(args.model_config) if args.model_config else None
    if model_config is not None:
        read_model_config(model_config)  # a bad file fails here, before any weights are read

    with contextlib.ExitStack() as stack:
        if args.smoke:  # before the process group: transformers then saves on global rank 0 only
            from sulphur2_npu.smoke import write_smoke_files

            home = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="sulphur2-smoke-")))
            smoke = write_smoke_files(home, seed=0)
            checkpoint, text_encoder = smoke.checkpoint, smoke.text_encoder
            weights_files = smoke_weights(home)
        else:
            checkpoint, text_encoder = Path(args.weights), Path(args.text_encoder)
        context = init_distributed(args.device)  # one process: resolve_device(args.device)
        stack.callback(destroy_distributed, context)
        if args.memory == "sequential" and context.device.type == "cpu":
            raise DeliveryError(
                "--memory sequential streams weights from the host to an accelerator and fails inside accelerate on "
                "the CPU; use --memory none (or auto) with --device cpu",
                ExitCode.USAGE,
            )
        dtype_name = args.dtype or ("fp32" if context.device.type == "cpu" else "bf16")
        with failure_guard(context):
            loaded = load_pipeline(
                checkpoint,
                text_encoder,
                image_to_video=image is not None,
                torch_dtype=torch_dtype(dtype_name),
                manifest=None if args.smoke else MANIFEST,
                strict_manifest=args.strict_manifest,
                model_config=model_config,
                load_text_encoder=context.is_main,  # the other ranks get the embeddings from rank 0
            )
            if not args.smoke:
                weights_files = [loaded.info.weights_file]
            weights = weights_record(weights_files)
            return run(args, settings, schedule, loaded, image, context, spec, dtype_name, outputs, paths, weights)


def run(
    args: argparse.Namespace, settings, schedule, loaded, image, context, spec, dtype_name: str, outputs, paths, weights
) -> int:
    """Attention, RoPE, LoRA, memory plan, generate (with --bench: warmup + timed runs), write outputs and report.

    Every rank runs this; with several ranks Gemma runs on rank 0 only and rank 0 alone writes and prints.
    """
    from deliverykit import device as devices
    from deliverykit.files import json_text
    from deliverykit.report import build_report, environment_fingerprint, evidence_lines
    from deliverykit.timing import Stopwatch, TimingStats
    from sulphur2_npu.attention import enable_npu_attention
    from sulphur2_npu.generate import GenerationRequest, generate
    from sulphur2_npu.lora import load_lora
    from sulphur2_npu.memory import apply_memory_plan, choose_memory_plan, encode_prompt_then_free
    from sulphur2_npu.parallel import encode_once_and_broadcast, setup_parallel
    from sulphur2_npu.precision import apply_rope_precision_policy
    from sulphur2_npu.tiny import TINY_CALL
    from sulphur2_npu.video_io import write_mp4, write_png

    pipe, info = loaded.pipe, loaded.info
    device = context.device
    parallel = setup_parallel(spec, context.rank, transformer=pipe.transformer, device=device)
    attention_processors = enable_npu_attention(pipe)
    rope_precision = apply_rope_precision_policy(pipe, device)
    lora = load_lora(pipe, Path(args.lora), args.lora_scale) if args.lora else None
    plan = choose_memory_plan(device, args.memory)
    print(f"memory plan: {plan.name} ({plan.why})", flush=True)
    print(f"schedule: {schedule.name} ({schedule.why})", flush=True)

    negative_prompt = args.negative_prompt
    if negative_prompt is None:
        negative_prompt = TINY_CALL["negative_prompt"] if args.smoke else ""
    request = GenerationRequest.from_preset(
        settings,
        args.prompt or TINY_CALL["prompt"],
        negative_prompt=negative_prompt,
        fps=args.fps,
        image=image,
        schedule=schedule.name,
        **({"max_sequence_length": TINY_CALL["max_sequence_length"]} if args.smoke else {}),
    )
    encode_ms = None
    if context.distributed:
        clock = Stopwatch(device)
        with clock.stage("encode_prompt"):
            embeds = encode_once_and_broadcast(
                pipe, request, device=device, rank=context.rank, encode=encode_prompt_then_free
            )
        encode_ms = clock.stages["encode_prompt"]
        request = dataclasses.replace(request, prompt_embeds=embeds)
    elif plan.free_text_encoder:
        clock = Stopwatch(device)  # synchronized: the embeddings are on the device when it stops
        with clock.stage("encode_prompt"):
            embeds = encode_prompt_then_free(
                pipe,
                request.prompt,
                request.negative_prompt,
                device=device,
                max_sequence_length=request.max_sequence_length,
                do_classifier_free_guidance=request.classifier_free_guidance,
            )
        encode_ms = clock.stages["encode_prompt"]
        request = dataclasses.replace(request, prompt_embeds=embeds)
    apply_memory_plan(pipe, plan, device)
    audit = devices.audit_placement(pipe.transformer, device)

    def once():
        return generate(pipe, request, device=device, generator=devices.make_generator(args.seed), parallel=parallel)

    warmup, runs = (args.warmup, args.runs) if args.bench else (0, 1)
    for _ in range(warmup):
        once()
    results = [once() for _ in range(runs)]
    result = results[-1]

    def stats(name: str) -> TimingStats:
        return TimingStats.from_samples([getattr(r.timings, name) for r in results], warmup=warmup)

    total, first_step, per_step, decode = (stats(n) for n in ("total_ms", "first_step_ms", "per_step_ms", "decode_ms"))
    prepare = stats("prepare_ms")
    peak = max((r.peak_memory_bytes for r in results if r.peak_memory_bytes is not None), default=None)
    checkpoint = info.checkpoint
    evidence = {
        "INPUT_DEVICE": devices.device_string(device),
        "MODEL_DEVICE": audit.model_device,
        "OUTPUT_DEVICE": devices.device_string(device),
        # Offload plans keep weights on the host by design; a fallback only means something when all is resident.
        "CPU_FALLBACK": audit.cpu_fallback if plan.name == "none" else False,
        "LATENT_SHAPE": [
            pipe.transformer.config.in_channels,
            (request.num_frames - 1) // pipe.vae_temporal_compression_ratio + 1,
            request.height // pipe.vae_spatial_compression_ratio,
            request.width // pipe.vae_spatial_compression_ratio,
        ],
        "OUTPUT_SHAPE": list(result.video.shape),
        "TIMING_MEDIAN_MS": total.median_ms,
        "TIMING_P90_MS": total.p90_ms,
        "PEAK_MEMORY_MB": None if peak is None else peak / 2**20,
        "MODE": "i2v" if image is not None else "t2v",
        "SCHEDULE": schedule.name,
        "CHECKPOINT_FAMILY": checkpoint.family,
        "CONFIG_SOURCE": checkpoint.config_source,
        "RANDOM_WEIGHTS": bool(args.smoke),
        "DTYPE": dtype_name,
        "MEMORY_PLAN": plan.name,
        "ROPE_PRECISION": rope_precision,
        "LOAD_S": loaded.load_seconds,
        "PREPARE_MS": prepare.median_ms,
        "FIRST_STEP_MS": first_step.median_ms,
        "PER_STEP_MS": per_step.median_ms,
        "VAE_DECODE_MS": decode.median_ms,
        "TOTAL_MS": total.median_ms,
        "AUDIO_SAMPLE_RATE": result.sample_rate,
        "AUDIO_SHAPE": list(result.audio.shape),
        "PEAK_HOST_RSS_MB": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "PARALLEL": f"ulysses={spec.ulysses},guidance={spec.guidance}",
        "WORLD_SIZE": context.world_size,
        "COMM_BYTES_PER_STEP": result.comm_bytes_per_step,
    }
    if not context.is_main:  # the other ranks computed the same result; rank 0 writes it
        return int(ExitCode.OK)
    report = build_report(
        "inference",
        DELIVERY,
        random_weights=bool(args.smoke),
        evidence=evidence,
        environment=environment_fingerprint(device, HERE),
        model={
            "id": MODEL_ID,
            "smoke": args.smoke,
            "checkpoint": None if args.smoke else str(args.weights),
            "text_encoder": None if args.smoke else str(args.text_encoder),
            "family": checkpoint.family,
            "family_evidence": checkpoint.evidence,
            "config_source": checkpoint.config_source,
            "config_sources": checkpoint.config_sources,
            "assumptions": checkpoint.assumptions,
            "checkpoint_dtypes": checkpoint.dtypes,
            "parameter_counts": info.parameter_counts,
            "attention_processors_swapped": attention_processors,
            "rope_precision": rope_precision,
            "lora": None if lora is None else dataclasses.asdict(lora),
        },
        weights=weights,
        inputs={
            "mode": evidence["MODE"],
            "prompt": request.prompt,
            "negative_prompt": request.negative_prompt,
            "image": args.image,
            "preset": args.preset or ("tiny" if args.smoke else None),
            "width": request.width,
            "height": request.height,
            "num_frames": request.num_frames,
            "schedule": schedule.name,
            "schedule_why": schedule.why,
            "steps": request.steps,
            "guidance": request.guidance,
            "fps": request.fps,
            "seed": args.seed,
            "dtype": dtype_name,
            "max_sequence_length": request.max_sequence_length,
            "parallel": spec.as_dict(),
            "world_size": context.world_size,
        },
        memory_plan=plan.as_dict(),
        timing={
            "load_s": loaded.load_seconds,
            "encode_prompt_ms": encode_ms,
            "runs": [r.timings.as_dict() for r in results],
            "prepare": prepare.to_dict(),
            "first_step": first_step.to_dict(),
            "per_step": per_step.to_dict(),
            "vae_decode": decode.to_dict(),
            "total": total.to_dict(),
        },
        placement={"model_device": audit.model_device, "off_device": audit.off_device[:20]},
        results={
            "video_file": paths.video.name,
            "first_frame_file": paths.first.name,
            "last_frame_file": paths.last.name,
            "frames": int(result.video.shape[0]),
            "sigmas": result.sigmas,
            "audio_sample_rate": result.sample_rate,
            "audio_samples": int(result.audio.shape[-1]),
            "peak_device_memory_mb": evidence["PEAK_MEMORY_MB"],
            "peak_host_rss_mb": evidence["PEAK_HOST_RSS_MB"],
            "comm_bytes_per_step": result.comm_bytes_per_step,
            "tables": [
                {
                    "title": f"{request.width}x{request.height}x{request.num_frames}, {request.steps} steps "
                    f"({schedule.name} schedule), guidance {request.guidance}, {dtype_name}, memory plan {plan.name} "
                    f"on {devices.device_string(device)} (medians of {runs} run(s) after {warmup} warmup)",
                    "columns": [
                        "load s",
                        "first step ms",
                        "per step ms",
                        "VAE decode ms",
                        "total ms",
                        "peak device MB",
                    ],
                    "rows": [
                        [
                            loaded.load_seconds,
                            first_step.median_ms,
                            per_step.median_ms,
                            decode.median_ms,
                            total.median_ms,
                            evidence["PEAK_MEMORY_MB"],
                        ]
                    ],
                }
            ],
        },
    )
    with outputs.commit() as temps:  # every file, report.json included, is renamed into place only if all were written
        write_mp4(temps[paths.video], result.video, result.audio, result.sample_rate, request.fps)
        write_png(temps[paths.first], result.video[0])
        write_png(temps[paths.last], result.video[-1])
        for path in paths.reports:
            temps[path].write_text(json_text(report), encoding="utf-8")
    print("\n".join(evidence_lines(evidence, EXTRA_EVIDENCE_KEYS)))  # deliverykit's documented keys, then ours
    return int(ExitCode.OK)


if __name__ == "__main__":
    sys.exit(run_main(main))
