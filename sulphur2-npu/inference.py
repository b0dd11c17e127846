#!/usr/bin/env python3
"""Sulphur-2-base (LTX-2.3) text/image → video with audio on NPU, CUDA or CPU, through diffusers' LTX2 pipelines.

    python sulphur2-npu/inference.py --model sulphur_distil_bf16.safetensors --text-encoder gemma-3-12b \
        --prompt "a red fox runs through snow" --preset balanced --output out.mp4
    python sulphur2-npu/inference.py ... --image first_frame.png --output out.mp4     # image → video
    python sulphur2-npu/inference.py --smoke --device cpu --output out.mp4
    torchrun --nproc-per-node 4 sulphur2-npu/inference.py ... --parallel guidance=4 --output out.mp4  # 4 cards
    python sulphur2-npu/inference.py --model FILE --text-encoder DIR --batch requests.jsonl --output videos/

``--schedule auto`` (the default) samples a checkpoint whose file name contains "distil" (sulphur_distil_bf16) with
LTX-2.3's fixed 8-step distilled sigmas and no guidance, any other with the dev schedule, the preset's steps and
guidance (``sulphur2_npu.schedules``).

``--model`` is the single ``.safetensors`` (original LTX layout), loaded strictly and offline
(``sulphur2_npu.loader``); ``--text-encoder`` a transformers Gemma-3 folder with its tokenizer. ``--smoke`` needs
no weights: a tiny LTX-2.3 with seeded random weights is written in the same layout and loaded through the same
loader (64x96, 9 frames, 2 steps: seconds on a CPU; ``--smoke tiny-heads8``: its 8-head variant, for Ulysses 4
and 8). NPU attention with correct masks and the float32 RoPE policy are always applied (no-ops off an NPU);
``--memory auto`` picks the memory plan from free device memory.

Outputs, all written at the end and renamed into place together (complete or not at all): ``out.mp4`` (H.264 +
AAC stereo at the vocoder's rate), ``out_first.png`` and ``out_last.png`` (first and last frame) and
``report.json`` beside them; KEY=VALUE evidence lines on stdout.

``--batch FILE``: JSON Lines with the flags' fields (``prompt``, ``image``, ``seed``, ``width``, ``steps``, ...,
``output``; the flags give the defaults), or plain text, one prompt a line. The model loads once; each request writes
``OUTPUT/<name>/<name>.mp4``, its frames and ``report.json``; a rerun skips completed requests (``--overwrite`` redoes
them); ranks (torchrun, or ``--devices 0,1,2,3``) share them; ``OUTPUT/batch.json`` lists what failed.

Several cards for one video (README, "Several cards"): under ``torchrun`` each rank takes ``<device>:LOCAL_RANK``;
``--parallel ulysses=U,guidance=G`` splits every step's guidance passes over G rank groups and each pass's video
tokens over U ranks (Ulysses); Gemma-3 runs on rank 0 and its embeddings are broadcast; only rank 0 writes the
outputs and prints the evidence lines.

Exit codes: 0 ok, 1 unexpected error, 2 bad arguments (including a size the VAE cannot make, with the nearest
valid values, a size beyond the positional range, a prompt that is not UTF-8, a --parallel that does not fit the
world size or the run, a bad --batch line, named FILE:LINE), 3 bad input (text encoder folder missing, --image
unreadable or a decompression bomb, LoRA for another model), 4 bad checkpoint (not LTX-2.x, fp8, LTX-2.0, corrupt or
incomplete), 5 device unavailable, 6 an output cannot be written (a folder in the way, not writable, disk full), 7
NaN/Inf in the generated video or audio, 9 a batch ran but some requests failed (batch.json), 10 another rank of a
multi-card run failed or died (that rank prints the cause).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
from pathlib import Path

from deliverykit import batch
from deliverykit.cli import DTYPE_CHOICES, add_batch_args, add_model_args, add_run_args, check_counts, check_utf8
from deliverykit.distributed import destroy_distributed, init_distributed, world_size_from_env
from deliverykit.errors import ExitCode, run_main
from deliverykit.files import Outputs, json_text
from deliverykit.report import evidence_lines
from deliverykit.timing import repeat_runs
from sulphur2_npu import memory, schedules, tiny
from sulphur2_npu.configs import read_model_config
from sulphur2_npu.generate import ModelFiles, load_prepared
from sulphur2_npu.loader import add_model_arguments
from sulphur2_npu.lora import add_lora_arguments
from sulphur2_npu.parallel import add_parallel_argument, parse_parallel
from sulphur2_npu.presets import add_preset_arguments
from sulphur2_npu.report import EVIDENCE_KEYS, generation_report
from sulphur2_npu.request import BatchRequests, build_request
from sulphur2_npu.video_io import frame_paths, read_image, write_mp4, write_png

HERE = Path(__file__).resolve().parent
MANIFEST = HERE / "weights-manifest.json"


def add_load_args(parser: argparse.ArgumentParser) -> None:
    """What loads and prepares the model, the same here and in ``app.py``. ``--model`` replaces the common
    ``--weights`` (a file here, not a folder; ``--weights`` stays an alias): ``parser`` resolves conflicts."""
    add_model_args(parser, smoke_choices=tuple(tiny.TINY_MODELS), dtype_default=None)
    add_model_arguments(parser)
    parser.add_argument(
        "--dtype",
        choices=DTYPE_CHOICES,
        help="compute dtype (default: bf16, the dtype of the released weights, on an accelerator; fp32 on the CPU)",
    )
    schedules.add_schedule_argument(parser)
    add_lora_arguments(parser)
    memory.add_memory_argument(parser)


def check_load_args(parser: argparse.ArgumentParser, args: argparse.Namespace, *, prompts: bool) -> None:
    """``prompts``: the run has its prompts (``--prompt``, ``--batch``, or the page's)."""
    if not args.weights and not args.smoke:
        parser.error("pass --model FILE and --text-encoder DIR, or --smoke")
    if args.weights and args.smoke:
        parser.error("--model and --smoke exclude each other")
    if args.weights and not (args.text_encoder and prompts):
        parser.error("--model needs --text-encoder DIR and --prompt TEXT (or --batch FILE)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], conflict_handler="resolve")
    add_load_args(parser)
    add_run_args(
        parser,
        output_help="mp4 file to write (<name>_first.png, <name>_last.png and report.json go beside it); with "
        "--batch, a folder",
    )
    add_batch_args(parser)
    parser.add_argument("--prompt", help="text prompt (default with --smoke: a fixed test prompt)")
    parser.add_argument("--negative-prompt", help="negative prompt, used when --guidance > 1 (default: empty)")
    parser.add_argument("--image", help="first frame for image → video (PNG/JPEG/WebP); resized to the video size")
    add_preset_arguments(parser)
    parser.add_argument("--fps", type=int, default=24, help="frame rate of the video and its audio (default 24)")
    parser.add_argument("--report", help="also write the run report here (e.g. sulphur2-npu/results/inference.json)")
    add_parallel_argument(parser)
    args = parser.parse_args(argv)
    check_load_args(parser, args, prompts=bool(args.prompt or args.batch))
    if args.batch and (args.prompt or args.image or args.bench or args.report or args.parallel):
        parser.error("--batch FILE holds the prompts and images; drop --prompt, --image, --bench, --report, --parallel")
    if not args.batch and (args.devices or args.overwrite):
        parser.error("--devices and --overwrite go with --batch")
    if not args.batch and Path(args.output).suffix.lower() != ".mp4":
        parser.error(f"--output {args.output}: use a .mp4 file name")
    check_counts(parser, args, positive=("steps", "fps"))
    check_utf8(args, ("prompt", "negative_prompt"))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.devices:  # one process per device, each a rank of the batch
        return batch.spawn_ranks(batch.parse_devices(args.devices), sys.argv if argv is None else [__file__, *argv])

    # 1. check inputs: all that needs no model comes first; a bad input fails in seconds, not after reading 46 GB.
    smoke = bool(args.smoke)
    schedule = schedules.choose_schedule(args.schedule, Path(args.weights or tiny.CHECKPOINT_NAME))
    items = BatchRequests.read(vars(args), smoke=smoke, schedule=schedule) if args.batch else None
    spec = parse_parallel(args.parallel, 1 if items else world_size_from_env())
    request = build_request(vars(args), smoke=smoke, schedule=schedule, spec=spec)
    single = None if items else video_outputs(Path(args.output), args.report)
    if args.image:
        request = dataclasses.replace(request, image=read_image(Path(args.image)))
    model_config = Path(args.model_config) if args.model_config else None
    if model_config:
        read_model_config(model_config)  # a bad file fails here, before any weights are read

    with contextlib.ExitStack() as stack:
        # 2. load: the single file (or the tiny random model written in its layout) and Gemma-3, strictly, offline.
        files = ModelFiles.from_args(args, stack)  # before the process group: transformers saves on rank 0 only
        context = items.context(args.device) if items else init_distributed(args.device)  # one process: a device
        stack.callback(destroy_distributed, context)
        image_to_video = items.image_to_video if items else request.image is not None
        options = {"image_to_video": image_to_video, "manifest": MANIFEST, "model_config": model_config}
        prepared, weights = load_prepared(args, files, context, spec, stack, **options)

        # 3. prepare: ranks, NPU attention, RoPE precision, LoRA, memory plan; prompts first where the plan says so.
        print(f"schedule: {schedule.name} ({schedule.why})", flush=True)
        if items and prepared.plan.free_text_encoder:  # Gemma leaves the device for good: all prompts first
            items.encode_ahead(prepared.pipe, device=context.device)
        request, encode_ms = (request, None) if items else prepared.encode_ahead(request)
        prepared.place()
        report = {
            "prepared": prepared,
            "schedule": schedule,
            "model": {"smoke": args.smoke, "checkpoint": args.weights, "text_encoder": args.text_encoder},
            "weights": weights,
        }

        # 4. generate and 5. write all outputs or none: each video with its frames and report.json, or nothing.
        if single:
            outputs, paths = single if context.is_main else (None, None)  # every rank computes it, rank 0 writes it
            inputs = {"image": args.image, "preset": args.preset, "seed": args.seed}
            bench = {"warmup": args.warmup, "runs": args.runs} if args.bench else {}
            make_video(request, outputs, paths, inputs, encode_ms=encode_ms, **bench, **report)
            return int(ExitCode.OK)

        def run_item(item: batch.BatchItem, folder: Path) -> dict:
            inputs = {name: item.fields[name] for name in ("image", "preset", "seed")}
            request = items.request(item, context.device)
            return make_video(request, *video_outputs(folder / f"{item.name}.mp4"), inputs, quiet=True, **report)

        return items.run(run_item)


def video_outputs(video: Path, report: str | None = None) -> tuple[Outputs, argparse.Namespace]:
    """The video, its first and last frames and the report(s), declared and checked (exit 6) before any work."""
    outputs = Outputs()
    paths = argparse.Namespace(video=outputs.add(video))
    paths.first, paths.last = (outputs.add(path) for path in frame_paths(paths.video))
    paths.reports = outputs.add_reports(paths.video.parent, report)
    paths.files = {"video_file": paths.video, "first_frame_file": paths.first, "last_frame_file": paths.last}
    outputs.check()
    return outputs, paths


def make_video(request, outputs, paths, inputs, *, warmup=0, runs=1, quiet=False, prepared, **report) -> dict:
    """Generate ``request`` (with --bench: warmup + timed runs); write the video, its frames and report.json together
    (``outputs`` None: another rank writes them); print the evidence lines unless ``quiet``."""
    results = repeat_runs(lambda: prepared.generate(request, inputs["seed"]), warmup, runs)
    if outputs is None:
        return {}
    files = {name: path.name for name, path in paths.files.items()}
    evidence, report = generation_report(
        request, results, prepared=prepared, warmup=warmup, inputs=inputs, files=files, source=HERE, **report
    )
    with outputs.commit() as temps:
        result = results[-1]
        write_mp4(temps[paths.video], result.video, result.audio, result.sample_rate, request.fps)
        write_png(temps[paths.first], result.video[0])
        write_png(temps[paths.last], result.video[-1])
        for path in paths.reports:
            temps[path].write_text(json_text(report), encoding="utf-8")
    if not quiet:
        print("\n".join(evidence_lines(evidence, EVIDENCE_KEYS)))  # deliverykit's documented keys, then ours
    return {"total_ms": evidence["TOTAL_MS"]}


if __name__ == "__main__":
    sys.exit(run_main(main))
