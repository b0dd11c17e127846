#!/usr/bin/env python3
"""URSA-1.7B-IBQ512 text → image as an HTTP API in OpenAI's images shape (``POST /v1/images/generations``).

    python ursa-npu/serve.py --upstream ~/src/URSA --weights ~/weights/URSA-1.7B-IBQ512 --port 8000
    python ursa-npu/serve.py --upstream ~/src/URSA --smoke --device cpu --port 8000    # tiny random model
    python ursa-npu/serve.py ... --devices 0,1,2,3 --api-key-env URSA_API_KEY --host 0.0.0.0
    python ursa-npu/serve.py ... --ray auto --port 8000   # one worker per NPU of a Ray cluster, no model here

The model loads once per ``--devices`` entry (default: ``--device``), before the port opens, with the same checks,
``error:`` lines and exit codes as ``inference.py``; it prints ``URL=http://HOST:PORT/``. Every request is a job in
``--jobs DIR`` (SQLite; the images beside it), run by one worker per device from one queue that servers on the same
folder share; a server killed mid-job runs the job again when restarted. Body fields: ``prompt``, ``n``, ``size``
("WxH"), ``response_format`` (``b64_json`` PNG or ``url``) and, as extra body fields, ``negative_prompt``, ``seed``
(image i gets seed + i), ``steps``, ``guidance``. Also ``GET /v1/models``, ``/health``, ``/ready``, ``/metrics``.

Exit codes: 0 stopped by SIGTERM or Ctrl-C (the running jobs finished), 1 unexpected error, 2 bad arguments (a
non-loopback --host without --api-key-env or --insecure-no-auth), 3 upstream checkout missing, at another commit or
unpatched, 4 weights folder incomplete or unloadable, 5 device unavailable, 6 the port or --jobs cannot be used.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from deliverykit import cli
from deliverykit.errors import run_main
from ursa_npu import options
from ursa_npu.loader import ModelSource


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    options.add_model_args(parser)
    cli.add_server_args(parser)
    args = parser.parse_args(argv)
    options.check_model_args(parser, args)
    cli.check_server_args(parser, args)
    return args


def build_service(args: argparse.Namespace) -> Any:
    """The images API over the model of ``args``, checked (``serve.py --ray``'s actors build theirs with it too)."""
    from ursa_npu.serving import service  # after the parse: --help and a usage error answer at once

    return service(ModelSource.check(args))


def main(argv: list[str] | None = None) -> int:
    return cli.serve_script(__file__, argv, parse_args, build_service)


if __name__ == "__main__":
    sys.exit(run_main(main))
