"""One tiny LTX-2.3 generation through the real loader, as ``python`` (one process) or under ``torchrun``.

``parallel_job.py OUT.npz t2v|i2v|distilled [--parallel SPEC] [--model tiny|tiny-heads8]``: rank 0 saves the frames,
the audio and the bytes received per step; tests/test_parallel.py and scripts/parallel_parity.py compare a torchrun
job with the one-process run.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from deliverykit.errors import run_main
from sulphur2_npu.options import SMOKE_MODELS

if TYPE_CHECKING:
    from sulphur2_npu.generate import GenerationRequest

WIDTH_HEADS8 = 128  # the 8-head model at 128x64x9 has 2 x 2 x 4 = 16 video tokens, which U = 2, 4 and 8 divide


def request_for(mode: str, width: int) -> GenerationRequest:
    import numpy as np
    from PIL import Image

    from sulphur2_npu.generate import GenerationRequest
    from sulphur2_npu.schedules import DISTILLED, DISTILLED_STEPS
    from sulphur2_npu.tiny import TINY_CALL, TINY_HEIGHT, TINY_NUM_FRAMES

    image = None
    if mode == "i2v":
        pixels = np.random.default_rng(3).integers(0, 256, (TINY_HEIGHT, width, 3), dtype=np.uint8)
        image = Image.fromarray(pixels)
    distilled = mode == "distilled"
    return GenerationRequest(
        prompt=TINY_CALL["prompt"],
        negative_prompt=TINY_CALL["negative_prompt"],
        width=width,
        height=TINY_HEIGHT,
        num_frames=TINY_NUM_FRAMES,
        steps=DISTILLED_STEPS if distilled else TINY_CALL["num_inference_steps"],
        guidance=1.0 if distilled else TINY_CALL["guidance_scale"],
        max_sequence_length=TINY_CALL["max_sequence_length"],
        image=image,
        **({"schedule": DISTILLED} if distilled else {}),
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("output")
    parser.add_argument("mode", choices=("t2v", "i2v", "distilled"))
    parser.add_argument("--parallel")
    parser.add_argument("--fail-on-rank", type=int)
    parser.add_argument("--model", choices=SMOKE_MODELS, default="tiny", help="tiny variant (default tiny)")
    args = parser.parse_args(argv)
    from sulphur2_npu.tiny import TINY_MODELS, write_smoke_files  # after the parse: --help without torch

    with tempfile.TemporaryDirectory() as home:
        # before the process group: transformers' save_pretrained writes on global rank 0 only once one exists
        smoke = write_smoke_files(Path(home), seed=0, model=TINY_MODELS[args.model])
        return run(args, smoke)


def run(args: argparse.Namespace, smoke) -> None:
    import numpy as np
    import torch

    from deliverykit.distributed import destroy_distributed, failure_guard, init_distributed
    from sulphur2_npu.attention import enable_npu_attention
    from sulphur2_npu.generate import generate
    from sulphur2_npu.loader import load_pipeline
    from sulphur2_npu.parallel import parse_parallel, setup_parallel
    from sulphur2_npu.tiny import TINY_WIDTH

    context = init_distributed("cpu")
    spec = parse_parallel(args.parallel, context.world_size)
    with failure_guard(context):
        loaded = load_pipeline(
            smoke.checkpoint, smoke.text_encoder, image_to_video=args.mode == "i2v", torch_dtype=torch.float32
        )
        enable_npu_attention(loaded.pipe)
        pipe = loaded.pipe
        run = setup_parallel(spec, context.rank, transformer=pipe.transformer, device=context.device, vae=pipe.vae)
        if args.fail_on_rank == context.rank:
            raise RuntimeError(f"injected failure on rank {context.rank}")
        result = generate(
            loaded.pipe,
            request_for(args.mode, WIDTH_HEADS8 if args.model == "tiny-heads8" else TINY_WIDTH),
            device=context.device,
            generator=torch.Generator().manual_seed(42),
            parallel=run,
        )
        if context.is_main:
            np.savez(args.output, video=result.video, audio=result.audio.numpy(), comm=result.comm_bytes_per_step)
    destroy_distributed(context)


if __name__ == "__main__":
    sys.exit(run_main(main))
