#!/usr/bin/env python3
"""TRELLIS.2-4B image → textured 3D asset (GLB) as an HTTP API: ``/v1/assets`` jobs in OpenAI's videos shape, and
Hunyuan3D-2.1's ``/generate``, ``/send`` and ``/status/{uid}`` for the 3D clients that call those.

    python trellis2-npu/serve.py --upstream ~/src/TRELLIS.2 --weights ~/weights/TRELLIS.2-4B --port 8000
    python trellis2-npu/serve.py --upstream ~/src/TRELLIS.2 --smoke --device cpu --port 8000    # tiny random models
    python trellis2-npu/serve.py ... --devices 0,1,2,3 --api-key-env TRELLIS2_API_KEY --host 0.0.0.0
    python trellis2-npu/serve.py ... --ray auto --port 8000   # one worker per NPU of a Ray cluster, no model here

The pipeline loads once per ``--devices`` entry (default: ``--device``), before the port opens, with the same
checks, ``error:`` lines and exit codes as ``inference.py``; it prints ``URL=http://HOST:PORT/``. ``POST
/v1/assets`` (multipart: the ``image`` file, or ``input_reference``; or JSON with the image in base64; fields
``seed``, ``steps``, ``pipeline_type``, ``faces`` (or ``decimation_target``), ``texture_size``, ``remesh``,
``remove_background``) queues a job in ``--jobs DIR`` (SQLite; each job's upload and files beside it) and answers
the asset object; ``GET /v1/assets/{id}`` follows it, ``GET /v1/assets/{id}/content`` is asset.glb
(``variant=preview``: preview.png, ``variant=video``: the turntable preview.mp4), ``GET /v1/assets`` lists,
``DELETE`` removes. ``POST /generate`` answers the GLB once made, ``POST /send`` a ``uid`` for ``GET
/status/{uid}``. A bad request is a 400 with ``inference.py``'s message. The export flags, ``--pipeline`` and
``--steps`` are the requests' defaults. One worker per device takes jobs from one queue that servers on the same
folder share; a server killed mid-job runs the job again when restarted. Also ``GET /v1/models``, ``/health``,
``/ready``, ``/metrics``.

Exit codes: 0 stopped by SIGTERM or Ctrl-C (the running jobs finished), 1 unexpected error, 2 bad arguments (an
export flag out of range, a non-loopback --host without --api-key-env or --insecure-no-auth), 3 upstream checkout
missing, at another commit or unpatched, 4 weights folder incomplete or unloadable (the background-removal folder's
too), 5 device unavailable, 6 the port or --jobs cannot be used.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from deliverykit import cli
from deliverykit.errors import run_main
from trellis2_npu import options


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cli.add_model_args(parser, smoke_choices=("tiny", "full"))
    options.add_pipeline_args(parser)
    options.add_memory_args(parser)
    parser.add_argument("--steps", type=int, help=options.STEPS_HELP)
    options.add_rembg_args(parser)
    options.add_export_args(parser)
    cli.add_server_args(parser)
    args = parser.parse_args(argv)
    options.check_model_args(parser, args)
    cli.check_server_args(parser, args)
    return args


def build_service(args: argparse.Namespace) -> Any:
    """The asset APIs over the models of ``args``, checked (``serve.py --ray``'s actors build theirs with it too)."""
    # after the parse, so that --help and a usage error answer without importing torch or fastapi
    from trellis2_npu.geometry import turntable
    from trellis2_npu.serving import service
    from trellis2_npu.session import Checked

    options.export_options(args).check()
    turntable.check_preview_frames(args.preview_frames)
    options.check_dtype(args)
    return service(args, Checked.before_serving(args))


def main(argv: list[str] | None = None) -> int:
    return cli.serve_script(__file__, argv, parse_args, build_service)


if __name__ == "__main__":
    sys.exit(run_main(main))
