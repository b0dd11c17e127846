"""The flags of the front ends (``inference.py``, ``app.py``, ``scripts/accuracy.py``): what loads and prepares the
model and how it samples. Nothing here imports torch or diffusers, so that ``--help`` and a usage error answer at
once; the modules that act on a flag take its values from here."""

from __future__ import annotations

import argparse

from deliverykit.cli import DTYPE_CHOICES, add_model_args

SMOKE_MODELS = ("tiny", "tiny-heads8")  # the names of tiny.TINY_MODELS
DEV, DISTILLED = "dev", "distilled"
SCHEDULES = (DEV, DISTILLED)
ONE_STAGE, TWO_STAGE, KEYFRAMES, A2V, RETAKE = "one-stage", "two-stage", "keyframes", "a2v", "retake"
TWO_STAGE_HQ = "two-stage-hq"
# ltx-pipelines' DistilledPipeline, TI2VidTwoStages-, TI2VidTwoStagesHQ-, KeyframeInterpolation-, A2VidPipelineTwoStage,
# RetakePipeline, TI2VidOneStage-
PIPELINES = (DISTILLED, TWO_STAGE, TWO_STAGE_HQ, KEYFRAMES, A2V, RETAKE, ONE_STAGE)
ONE_CALL = (ONE_STAGE, RETAKE)  # one pipeline call at the output size: no upsampler
# the dev model in stage 1 and the distilled LoRA (two-stage-hq: in both stages, stages.HQ_LORA_STRENGTHS)
LORA_STAGE_2 = (TWO_STAGE, TWO_STAGE_HQ, KEYFRAMES, A2V)
DISTILLED_NAME_MARK = "distil"  # Sulphur's naming: sulphur_distil_bf16; LTX's: ltx-2.3-22b-distilled
MEMORY_PLANS = ("none", "model-offload", "group-offload", "sequential")
MEMORY_CHOICES = ("auto", *MEMORY_PLANS)


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """``--model FILE`` (alias ``--weights``), ``--text-encoder DIR`` and ``--model-config JSON``: what
    ``loader.load_pipeline`` loads."""
    parser.add_argument(
        "--model",
        "--weights",
        dest="weights",
        metavar="FILE",
        help="Sulphur-2 / LTX-2.3 single .safetensors file (bf16)",
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


def add_schedule_argument(parser: argparse.ArgumentParser) -> None:
    """``--schedule auto|dev|distilled`` (``schedules.choose_schedule``)."""
    parser.add_argument(
        "--schedule",
        choices=("auto", *SCHEDULES),
        default="auto",
        help="sigma schedule: distilled = LTX-2.3's fixed 8 steps, no guidance; dev = the preset's steps and guidance "
        f"(default auto: distilled when the --model file name contains {DISTILLED_NAME_MARK!r})",
    )


def add_pipeline_arguments(parser: argparse.ArgumentParser) -> None:
    """``--pipeline``, ``--spatial-upsampler`` and ``--distilled-lora`` (``stages.choose_pipeline``)."""
    parser.add_argument(
        "--pipeline",
        choices=("auto", *PIPELINES),
        default="auto",
        help="ltx-pipelines' pipeline: distilled = two stages with the distilled model (half size, then x2 "
        "upsampled and refined); two-stage = dev model with guidance, then the distilled LoRA refines at full size; "
        "two-stage-hq = two-stage with ltx-pipelines' res_2s sampler (2 model calls a step, 15 steps by default) "
        "and the distilled LoRA at 0.25 in stage 1, 0.5 in stage 2; keyframes = two-stage through the --keyframe "
        "images; a2v = two-stage following the --audio sound; retake = "
        "one pass over the --video source, remaking --retake-start..--retake-end; one-stage = one pass at full size "
        "(default auto: "
        "distilled for a distilled checkpoint and --smoke, two-stage for a dev one with --distilled-lora, else "
        "one-stage)",
    )
    parser.add_argument(
        "--spatial-upsampler",
        metavar="FILE",
        help="ltx-2.3-spatial-upscaler-x2-1.1.safetensors (Lightricks/LTX-2.3): the two-stage pipelines' x2 upsampler",
    )
    parser.add_argument(
        "--distilled-lora",
        nargs="+",
        metavar=("FILE", "STRENGTH"),
        help="the distilled LoRA of --pipeline two-stage/keyframes/a2v (stage 2) and two-stage-hq (both stages) "
        "(Sulphur-2-base distill_loras/...), optionally its strength (default 1.0, as ltx-pipelines; its README uses "
        "0.8; two-stage-hq: 0.25 and 0.5, ltx-pipelines' HQ defaults)",
    )


def add_pipeline_inputs(parser: argparse.ArgumentParser) -> None:
    """What the keyframes, a2v and retake pipelines take: ``--keyframe``, ``--audio``, ``--video`` and the span."""
    parser.add_argument(
        "--keyframe",
        dest="keyframes",
        action="append",
        metavar="IMAGE:FRAME[:STRENGTH]",
        help="--pipeline keyframes: an image the video passes through at pixel frame FRAME (0-based), held with "
        "STRENGTH (default 1); repeat for each keyframe",
    )
    parser.add_argument(
        "--audio",
        metavar="FILE",
        help="--pipeline a2v: the sound the video follows and keeps (WAV, MP3, FLAC or a video's track; mono or "
        "stereo, at least as long as the video; with --smoke: a test tone by default)",
    )
    parser.add_argument(
        "--video",
        metavar="FILE",
        help="--pipeline retake: the video to remake a span of (8k+1 frames, sides multiples of 32; its size, length "
        "and rate are the output's; with --smoke: a made-up clip by default)",
    )
    parser.add_argument("--retake-start", type=float, metavar="S", help="--pipeline retake: the span's start (s)")
    parser.add_argument(
        "--retake-end",
        type=float,
        metavar="E",
        help="--pipeline retake: the span's end (s); the picture and sound from S to E are made anew (with --smoke: "
        "the middle third by default)",
    )


def check_pipeline_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``--distilled-lora FILE [STRENGTH]`` becomes ``(FILE, strength)``; the parts come with --smoke."""
    if args.smoke and (args.spatial_upsampler or args.distilled_lora):
        parser.error("--smoke writes its own upsampler and distilled LoRA; drop --spatial-upsampler/--distilled-lora")
    if args.distilled_lora:
        if len(args.distilled_lora) > 2:
            parser.error("--distilled-lora takes FILE and at most one STRENGTH")
        try:
            strength = float(args.distilled_lora[1]) if len(args.distilled_lora) == 2 else 1.0
        except ValueError:
            parser.error(f"--distilled-lora strength {args.distilled_lora[1]!r} is not a number")
        if len(args.distilled_lora) == 2 and args.pipeline == TWO_STAGE_HQ:
            parser.error(
                f"--pipeline {TWO_STAGE_HQ} uses the distilled LoRA at ltx-pipelines' HQ strengths (0.25 in stage 1, "
                "0.5 in stage 2); drop the STRENGTH after --distilled-lora FILE"
            )
        args.distilled_lora = (args.distilled_lora[0], strength)


def add_parallel_argument(parser: argparse.ArgumentParser) -> None:
    """``--parallel ulysses=U[,guidance=G]`` (``parallel.parse_parallel``)."""
    parser.add_argument(
        "--parallel",
        metavar="ulysses=U[,guidance=G]",
        help="under torchrun: split each step over the ranks, U*G = world size (ulysses: the video tokens, U in 2|4|8; "
        "guidance: the guidance passes, G in 2|4)",
    )


def add_load_args(parser: argparse.ArgumentParser) -> None:
    """What loads and prepares the model, the same in ``inference.py`` and ``app.py``. ``--model`` replaces the common
    ``--weights`` (a file here, not a folder; ``--weights`` stays an alias): ``parser`` resolves conflicts."""
    add_model_args(parser, smoke_choices=SMOKE_MODELS, dtype_default=None)
    add_model_arguments(parser)
    parser.add_argument(
        "--dtype",
        choices=DTYPE_CHOICES,
        help="compute dtype (default: bf16, the dtype of the released weights, on an accelerator; fp32 on the CPU)",
    )
    add_schedule_argument(parser)
    add_pipeline_arguments(parser)
    parser.add_argument("--lora", help="LoRA .safetensors (diffusers, original or Kohya keys) applied to the model")
    parser.add_argument("--lora-scale", type=float, default=1.0, help="LoRA strength (default 1.0)")
    parser.add_argument(
        "--memory", choices=MEMORY_CHOICES, default="auto", help="memory plan (default auto: by free device memory)"
    )


def check_load_args(parser: argparse.ArgumentParser, args: argparse.Namespace, *, prompts: bool) -> None:
    """``prompts``: the run has its prompts (``--prompt``, ``--batch``, or the page's)."""
    if not args.weights and not args.smoke:
        parser.error("pass --model FILE and --text-encoder DIR, or --smoke")
    if args.weights and args.smoke:
        parser.error("--model and --smoke exclude each other")
    if args.weights and not (args.text_encoder and prompts):
        parser.error("--model needs --text-encoder DIR and --prompt TEXT (or --batch FILE)")
    check_pipeline_args(parser, args)
