#!/usr/bin/env python3
"""Sulphur-2-base (LTX-2.3) text/image → video with audio on NPU, CUDA or CPU, through diffusers' LTX2 pipelines.

    python sulphur2-npu/inference.py --model sulphur_distil_bf16.safetensors --text-encoder gemma-3-12b \
        --prompt "a red fox runs through snow" --preset balanced --output out.mp4
    python sulphur2-npu/inference.py ... --image first_frame.png --output out.mp4     # image → video
    python sulphur2-npu/inference.py ... --pipeline keyframes --keyframe a.png:0 --keyframe b.png:120 --output out.mp4
    python sulphur2-npu/inference.py ... --pipeline a2v --audio song.wav --output out.mp4     # audio → video
    python sulphur2-npu/inference.py ... --pipeline retake --video in.mp4 --retake-start 1 --retake-end 2.5 \
        --prompt "..." --output out.mp4     # remake seconds 1 to 2.5 of in.mp4, keep the rest
    python sulphur2-npu/inference.py --smoke --device cpu --output out.mp4
    torchrun --nproc-per-node 4 sulphur2-npu/inference.py ... --parallel guidance=4 --output out.mp4  # 4 cards
    python sulphur2-npu/inference.py --model FILE --text-encoder DIR --batch requests.jsonl --output videos/

``--pipeline`` takes ltx-pipelines' pipelines by name (``sulphur2_npu.stages``): ``distilled`` (two stages: half size
with the 8 distilled sigmas, the latent upsampled x2 by ``--spatial-upsampler``, refined at full size; the default for
a distilled checkpoint and ``--smoke``), ``two-stage`` (stage 1 with the dev model and guidance, stage 2 with
``--distilled-lora``; the default for a dev checkpoint given that LoRA), ``two-stage-hq`` (``two-stage`` with the
res_2s sampler, 15 steps, the LoRA in both stages), ``keyframes`` (``two-stage`` through the
``--keyframe IMAGE:FRAME[:STRENGTH]`` images, each at its pixel frame), ``a2v`` (``two-stage`` following the
``--audio FILE`` sound track, which the video keeps), ``retake`` (one call at the ``--video FILE``'s own size, frame
count and rate, remaking its picture and sound between ``--retake-start`` and ``--retake-end`` seconds and keeping the
rest; 8k+1 frames, sides multiples of 32) and ``one-stage`` (one call at full size).
``--schedule auto`` (the default) samples a checkpoint whose file name contains "distil" (sulphur_distil_bf16) with
LTX-2.3's fixed 8-step distilled sigmas and no guidance, any other with the dev schedule, the preset's steps and
guidance (``sulphur2_npu.schedules``); in a two-stage pipeline this is stage 1's.

``--model`` is the single ``.safetensors`` (original LTX layout), loaded strictly and offline (``sulphur2_npu.loader``);
``--text-encoder`` a transformers Gemma-3 folder with its tokenizer. ``--smoke`` needs no weights: a tiny LTX-2.3 with
seeded random weights is written in the same layout and loaded through the same loader, with a tiny upsampler and
distilled LoRA (128x64, 9 frames, distilled two-stage; 96x64 and 2 dev steps with ``--pipeline one-stage``: seconds on a
CPU; ``--smoke tiny-heads8``: its 8-head variant, for Ulysses 4 and 8). NPU attention with correct masks and the float32
RoPE policy are always applied (no-ops off an NPU); ``--memory auto`` picks the memory plan from free device memory.

Outputs, all written at the end and renamed into place together (complete or not at all): ``out.mp4`` (H.264 + AAC
stereo at the vocoder's rate; a2v: the --audio file's sound at its rate), ``out_first.png`` and ``out_last.png``
(first and last frame) and ``report.json`` beside them; KEY=VALUE evidence lines on stdout.

``--batch FILE``: JSON Lines with the flags' fields (``prompt``, ``image``, ``keyframes`` (a list of --keyframe values),
``audio``, ``video``, ``retake_start``, ``retake_end``, ``seed``, ``width``, ``steps``, ..., ``output``; the flags give
the defaults), or plain text, one prompt a line. The model loads once; each request writes ``OUTPUT/<name>/<name>.mp4``,
its frames and ``report.json``; a rerun skips completed requests (``--overwrite`` redoes them); ranks (torchrun, or
``--devices 0,1,2,3``) share them; ``OUTPUT/batch.json`` lists what failed. With ``--ray ADDRESS`` (``auto``: this
host's cluster) every device of a Ray cluster takes requests, one actor each (``deliverykit.cluster``; README, "Many
hosts").

Several cards for one video (README, "Several cards"): under ``torchrun`` each rank takes ``<device>:LOCAL_RANK``;
``--parallel ulysses=U,guidance=G`` splits every step's guidance passes over G rank groups and each pass's video
tokens over U ranks (Ulysses); Gemma-3 runs on rank 0 and its embeddings are broadcast; only rank 0 writes the
outputs and prints the evidence lines.

Exit codes: 0 ok, 1 unexpected error, 2 bad arguments (including a size the VAE cannot make, with the nearest valid
values, a size beyond the positional range, a prompt that is not UTF-8, a --parallel that does not fit the world size or
the run, a bad --batch line, named FILE:LINE), 3 bad input (text encoder folder missing, --image or a --keyframe image
unreadable or a decompression bomb, --audio unreadable or shorter than the video, --video unreadable, not 8k+1 frames
with sides multiples of 32 or with a sound too short to encode, LoRA for another model), 4 bad checkpoint (not LTX-2.x,
fp8, LTX-2.0, corrupt or incomplete; the pipeline's upsampler or distilled LoRA missing or not fitting), 5 device
unavailable, 6 an output cannot be written (a folder in the way, not writable, disk full), 7 NaN/Inf in the generated
video or audio, 9 a batch ran but some requests failed (batch.json), 10 another rank of a multi-card run failed or died
(that rank prints the cause).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable
from pathlib import Path

from deliverykit import batch
from deliverykit.cli import add_batch_args, add_run_args, check_batch_args, check_counts, check_utf8
from deliverykit.errors import ExitCode, run_main
from deliverykit.report import evidence_lines
from sulphur2_npu.options import add_load_args, add_parallel_argument, add_pipeline_inputs, check_load_args
from sulphur2_npu.presets import add_preset_arguments


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
    add_pipeline_inputs(parser)
    add_preset_arguments(parser)
    parser.add_argument(
        "--fps", type=int, default=24, help="frame rate of the video and its audio (default 24; a retake: its source's)"
    )
    parser.add_argument("--report", help="also write the run report here (e.g. sulphur2-npu/results/inference.json)")
    add_parallel_argument(parser)
    args = parser.parse_args(argv)
    check_load_args(parser, args, prompts=bool(args.prompt or args.batch))
    given = (args.prompt, args.image, args.keyframes, args.audio, args.video, args.bench, args.report, args.parallel)
    if args.batch and any(given):
        parser.error(
            "--batch FILE holds the prompts, images, sound tracks and videos; drop --prompt, --image, --keyframe, "
            "--audio, --video, --bench, --report, --parallel"
        )
    check_batch_args(parser, args)
    if not args.batch and Path(args.output).suffix.lower() != ".mp4":
        parser.error(f"--output {args.output}: use a .mp4 file name")
    check_counts(parser, args, positive=("steps", "fps"))
    check_utf8(args, ("prompt", "negative_prompt"))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.devices:  # one process per device, each a rank of the batch
        return batch.spawn_ranks(batch.parse_devices(args.devices), sys.argv if argv is None else [__file__, *argv])
    # after the parse, so that --help and a usage error answer without importing torch and diffusers
    from deliverykit.distributed import destroy_distributed, init_distributed, world_size_from_env
    from sulphur2_npu import stages
    from sulphur2_npu.configs import read_model_config
    from sulphur2_npu.generate import ModelFiles
    from sulphur2_npu.parallel import parse_parallel
    from sulphur2_npu.report import EVIDENCE_KEYS
    from sulphur2_npu.request import BatchRequests, build_request, with_inputs
    from sulphur2_npu.session import Request, Session, video_outputs

    # 1. check inputs: all that needs no model comes first; a bad input fails in seconds, not after reading 46 GB.
    smoke = bool(args.smoke)
    schedule = stages.choose_from_args(args)
    items = BatchRequests.read(vars(args), smoke=smoke, schedule=schedule) if args.batch else None
    if args.ray:  # the cluster's actors load the model, each on its device
        from deliverykit import cluster

        return cluster.run_from_args(items.items, args, __file__, argv)
    spec = parse_parallel(args.parallel, 1 if items else world_size_from_env())
    call = single = None  # one video (--batch: the items' requests)
    if not items:
        call = build_request(vars(args), smoke=smoke, schedule=schedule, spec=spec)
        single = video_outputs(Path(args.output), args.report)
        span = (args.retake_start, args.retake_end)
        call = with_inputs(call, args.image, args.keyframes, args.audio, args.video, smoke=smoke, span=span)
    if args.model_config:
        read_model_config(Path(args.model_config))  # a bad file fails here, before any weights are read

    with contextlib.ExitStack() as stack:
        # 2. load: the single file (or the tiny random model written in its layout) and Gemma-3, strictly, offline.
        files = ModelFiles.from_args(args, stack)  # before the process group: transformers saves on rank 0 only
        context = items.context(args.device) if items else init_distributed(args.device)  # one process: a device
        stack.callback(destroy_distributed, context)
        image_to_video = items.image_to_video if items else call.image is not None
        session = Session.load(args, files, context, stack, spec=spec, schedule=schedule, image_to_video=image_to_video)

        # 3. prepare: ranks, NPU attention, RoPE precision, LoRA, memory plan; prompts first where the plan says so.
        print(f"pipeline: {schedule.pipeline} ({schedule.pipeline_why})", flush=True)
        print(f"schedule: {schedule.name} ({schedule.why})", flush=True)
        if items and session.prepared.plan.free_text_encoder:  # Gemma leaves the device for good: all prompts first
            items.encode_ahead(session.prepared.pipe, device=context.device)
        if single:
            request = session.encode_ahead(Request(call, args.seed, args.image, args.preset))
        session.place()

        # 4. generate and 5. write all outputs or none: each video with its frames and report.json, or nothing.
        if single:
            result = session.run(request, **({"warmup": args.warmup, "runs": args.runs} if args.bench else {}))
            if context.is_main:  # every rank computes the video, rank 0 writes it and prints the evidence lines
                print("\n".join(evidence_lines(session.write(result, single), EVIDENCE_KEYS)))
            return int(ExitCode.OK)

        return items.run(item_maker(items, session))


def item_maker(items, session) -> Callable[[batch.BatchItem, Path], dict]:
    """One --batch request (its line's fields over the flags') into its folder: the video, its frames, report.json."""
    from sulphur2_npu.session import Request, video_outputs

    def run_item(item: batch.BatchItem, folder: Path) -> dict:
        fields = item.fields
        asked = Request(items.request(item, session.device), fields["seed"], fields["image"], fields["preset"])
        evidence = session.write(session.run(asked), video_outputs(folder / f"{item.name}.mp4"))
        return {"total_ms": evidence["TOTAL_MS"]}

    return run_item


def batch_worker(argv: list[str], device: str, stack: contextlib.ExitStack) -> Callable[[batch.BatchItem, Path], dict]:
    """What a Ray actor runs for ``--batch --ray`` (``deliverykit.cluster``): the model of ``argv`` on ``device``,
    encoding each prompt when its request runs (as the server does: a plan that frees Gemma-3 becomes model-offload)."""
    from deliverykit.device import resolve_device
    from sulphur2_npu import stages
    from sulphur2_npu.generate import ModelFiles
    from sulphur2_npu.memory import plan_keeping_text_encoder
    from sulphur2_npu.parallel import parse_parallel
    from sulphur2_npu.request import BatchRequests
    from sulphur2_npu.session import Session

    args = parse_args(argv)
    schedule = stages.choose_from_args(args)
    items = BatchRequests.read(vars(args), smoke=bool(args.smoke), schedule=schedule)
    args.memory, _ = plan_keeping_text_encoder(args.memory, resolve_device(device), "a Ray actor")
    files = ModelFiles.from_args(args, stack)
    options = {"spec": parse_parallel(None, 1), "schedule": schedule, "image_to_video": items.image_to_video}
    session = Session.load(args, files, items.context(device), stack, **options)
    session.place()
    return item_maker(items, session)


if __name__ == "__main__":
    sys.exit(run_main(main))
