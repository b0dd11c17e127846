#!/usr/bin/env python3
"""Sulphur-2-base (LTX-2.3) text/image → video with audio as an HTTP API in OpenAI's videos shape (``/v1/videos``).

    python sulphur2-npu/serve.py --model sulphur_distil_bf16.safetensors --text-encoder gemma-3-12b --port 8000
    python sulphur2-npu/serve.py --smoke --device cpu --port 8000                      # tiny random model
    python sulphur2-npu/serve.py ... --devices 0,1,2,3 --api-key-env SULPHUR_API_KEY --host 0.0.0.0
    python sulphur2-npu/serve.py ... --ray auto --port 8000   # one worker per NPU of a Ray cluster, no model here

The model loads once per ``--devices`` entry (default: ``--device``), before the port opens, with the same checks,
``error:`` lines and exit codes as ``inference.py``; it prints ``URL=http://HOST:PORT/``. ``POST /v1/videos`` (JSON or
multipart: ``prompt``, ``size`` "WxH", ``seconds``, an ``input_reference`` image for image → video, and as extra
fields ``negative_prompt``, ``seed``, ``preset``, ``num_frames``, ``steps``, ``guidance``, ``fps``, and with
``--pipeline keyframes`` the ``keyframes``: ``--keyframe`` values whose images are data URLs, with ``--pipeline a2v``
the ``audio``: the sound track as a data URL) queues a job in ``--jobs DIR`` (SQLite; the files beside it) and answers
the video object; ``GET /v1/videos/{id}`` follows it, ``GET /v1/videos/{id}/content`` is the mp4 with its audio
(``variant=thumbnail``: the first frame), ``GET /v1/videos`` lists, ``DELETE`` removes. One worker per device takes
jobs from one queue that servers on the same folder share; a server killed mid-job runs the job again when restarted.
Gemma-3 stays loaded (a memory plan that frees it after one prompt becomes model-offload under ``--memory auto``).
Also ``GET /v1/models``, ``/health``, ``/ready``, ``/metrics``.

Exit codes: 0 stopped by SIGTERM or Ctrl-C (the running jobs finished), 1 unexpected error, 2 bad arguments (a
non-loopback --host without --api-key-env or --insecure-no-auth, a --memory plan that frees Gemma-3), 3 text
encoder folder missing or LoRA for another model, 4 bad checkpoint, 5 device unavailable, 6 the port or --jobs
cannot be used.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from deliverykit import cli
from deliverykit.errors import run_main
from sulphur2_npu.options import add_load_args, check_load_args


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], conflict_handler="resolve")
    add_load_args(parser)
    cli.add_server_args(parser)
    args = parser.parse_args(argv)
    check_load_args(parser, args, prompts=True)
    cli.check_server_args(parser, args)
    return args


def build_service(args: argparse.Namespace) -> Any:
    """The videos API over the model of ``args`` (``serve.py --ray``'s actors build theirs with it too)."""
    # after the parse, so that --help and a usage error answer without importing torch, diffusers or fastapi
    from sulphur2_npu import stages
    from sulphur2_npu.serving import service

    schedule = stages.choose_from_args(args)
    return service(args, schedule)


def main(argv: list[str] | None = None) -> int:
    return cli.serve_script(__file__, argv, parse_args, build_service)


if __name__ == "__main__":
    sys.exit(run_main(main))
