"""Command-line flags shared by every delivery's ``inference.py``, defined once so they cannot drift."""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import os
from collections.abc import Callable, Sequence
from typing import Any

from .device import DEVICE_CHOICES, DEVICE_ENV_VAR

DTYPE_CHOICES = ("fp32", "fp16", "bf16")


def add_common_args(
    parser: argparse.ArgumentParser,
    *,
    smoke_choices: tuple[str, ...] = ("full", "tiny"),
    output_help: str = "folder for the outputs and report.json",
    dtype_default: str | None = "fp32",
) -> None:
    """Add ``--weights --strict-manifest --device --dtype --smoke`` (:func:`add_model_args`) and
    ``--seed --output --bench --warmup --runs``.

    ``output_help`` says what ``--output`` names (a folder, or a file such as ``out.jpg``); ``dtype_default=None``
    leaves ``--dtype`` unset so the delivery picks a per-device default (say fp16 on an NPU, fp32 on the CPU).
    """
    add_model_args(parser, smoke_choices=smoke_choices, dtype_default=dtype_default)
    add_run_args(parser, output_help=output_help)


def add_run_args(
    parser: argparse.ArgumentParser, *, output_help: str = "folder for the outputs and report.json"
) -> None:
    """Add what one command-line run takes besides its model: ``--seed --output --bench --warmup --runs``."""
    parser.add_argument("--seed", type=int, default=42, help="random seed (default 42)")
    parser.add_argument("--output", required=True, help=output_help)
    parser.add_argument("--bench", action="store_true", help="time the forward (synchronized warmup + repeats)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed warmup runs with --bench (default 3)")
    parser.add_argument("--runs", type=int, default=10, help="timed runs with --bench (default 10)")


def add_model_args(
    parser: argparse.ArgumentParser,
    *,
    smoke_choices: tuple[str, ...] = ("full", "tiny"),
    dtype_default: str | None = "fp32",
) -> None:
    """Add what loads a model, the same for ``inference.py`` and ``app.py``: ``--weights --strict-manifest
    --device --dtype --smoke``."""
    parser.add_argument("--weights", help="folder with the downloaded weights (not needed with --smoke)")
    parser.add_argument(
        "--strict-manifest",
        action="store_true",
        help="refuse complete weights that differ from the pinned release (default: load them with a warning; "
        "also $DELIVERYKIT_STRICT_MANIFEST=1)",
    )
    parser.add_argument(
        "--device",
        default=None,
        help=f"{DEVICE_CHOICES}; default ${DEVICE_ENV_VAR} or auto (npu, then cuda, then cpu)",
    )
    dtype_help = f"default {dtype_default}" if dtype_default else "default: fp16 on an accelerator, fp32 on the CPU"
    parser.add_argument("--dtype", choices=DTYPE_CHOICES, default=dtype_default, help=f"compute dtype ({dtype_help})")
    parser.add_argument(
        "--smoke",
        nargs="?",
        const=smoke_choices[0],
        choices=smoke_choices,
        help="no weights needed: build the real architecture with seeded random weights, save it and load it back",
    )


def check_counts(parser: argparse.ArgumentParser, args: argparse.Namespace, positive: Sequence[str] = ()) -> None:
    """``parser.error`` (exit 2) unless ``--warmup`` ≥ 0, ``--runs`` ≥ 1 (where the parser has them) and each
    ``positive`` flag given is ≥ 1.

    ``positive`` holds argparse destinations (``max_prompt_length`` for ``--max-prompt-length``).
    """
    for name in positive:
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} {value}: need at least 1")
    if getattr(args, "warmup", 0) < 0 or getattr(args, "runs", 1) < 1:
        parser.error(f"--warmup {args.warmup} / --runs {args.runs}: need warmup >= 0 and runs >= 1")


def add_batch_args(parser: argparse.ArgumentParser, *, inputs: str = "one prompt a line") -> None:
    """Add ``--batch FILE --overwrite --devices LIST`` (see :mod:`deliverykit.batch`)."""
    parser.add_argument(
        "--batch",
        help=f"many requests, one model load: a .jsonl file (one JSON object a line, fields as the flags) or a .txt "
        f"file ({inputs}); --output is then a folder with one subfolder per request",
    )
    parser.add_argument("--overwrite", action="store_true", help="with --batch: redo requests already completed")
    parser.add_argument(
        "--devices",
        help="with --batch: one process per device, e.g. 0,1,2,3 (npu) or cuda:0,cuda:1; under torchrun, not needed",
    )
    parser.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="with --batch: spread the requests over every device of a Ray cluster, one actor per device "
        "(auto: the cluster this host belongs to; or HOST:PORT of its head)",
    )
    parser.add_argument(
        "--ray-outputs",
        choices=("shared", "driver"),
        default="shared",
        help="with --ray: each actor writes into --output, storage every host sees (shared, the default), or sends "
        "its files back for this process to write (driver)",
    )
    parser.add_argument(
        "--retries", type=int, default=2, help="with --ray: runs of a request whose actor died, beyond the first (2)"
    )


def check_batch_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Usage errors of the batch flags (exit 2): they need ``--batch``; ``--ray`` uses the cluster's devices."""
    if not args.batch and (args.devices or args.overwrite or args.ray or args.ray_outputs != "shared"):
        parser.error("--devices, --overwrite, --ray and --ray-outputs go with --batch")
    if args.ray and args.devices:
        parser.error("--ray and --devices exclude each other: the cluster's devices are used")
    if args.retries < 0:
        parser.error(f"--retries {args.retries}: need 0 or more")


def add_steps_and_report_args(parser: argparse.ArgumentParser, steps_help: str, example_report: str) -> None:
    """Add ``--steps N`` and ``--report FILE`` (a copy of the run report, e.g. for a results folder)."""
    parser.add_argument("--steps", type=int, help=steps_help)
    parser.add_argument("--report", help=f"also write the run report here (e.g. {example_report})")


def check_utf8(args: argparse.Namespace, names: Sequence[str]) -> None:
    """Exit 2 with one line if a text flag (``prompt`` for ``--prompt``) holds bytes that are not UTF-8.

    On Linux such argv bytes arrive as surrogate escapes and would fail later, inside the tokenizer.
    """
    from .errors import DeliveryError, ExitCode

    for name in names:
        value = getattr(args, name)
        if not isinstance(value, str):
            continue
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as err:
            char = ord(value[err.start])
            byte = f"byte 0x{char - 0xDC00:02x}" if 0xDC80 <= char <= 0xDCFF else f"character U+{char:04X}"
            flag = f"--{name.replace('_', '-')}"
            raise DeliveryError(
                f"{flag} is not valid UTF-8 text ({byte} at position {err.start}); pass it in UTF-8 (convert it, "
                f"e.g. with iconv -t UTF-8, or set a UTF-8 locale)",
                ExitCode.USAGE,
            ) from None


def torch_dtype(name: str):
    """``fp32|fp16|bf16`` → ``torch.float32|float16|bfloat16``."""
    import torch

    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[name]


SERVER_HOST = "127.0.0.1"
SERVER_PORT = 8000
MAX_BODY_MB = 32
MAX_QUEUE = 64


def add_server_args(parser: argparse.ArgumentParser) -> None:
    """``--host --port --jobs --devices --api-key-env --insecure-no-auth --max-body-mb --max-queue``."""
    parser.add_argument("--host", default=SERVER_HOST, help=f"address to listen on (default {SERVER_HOST})")
    parser.add_argument("--port", type=int, default=SERVER_PORT, help=f"port (default {SERVER_PORT}; 0: a free one)")
    parser.add_argument(
        "--jobs",
        default="outputs/jobs",
        help="folder of the job database and each job's files "
        "(default outputs/jobs); servers on one folder share its queue",
    )
    parser.add_argument(
        "--devices",
        help="one worker per device, each with its own loaded model, e.g. npu:0,npu:1 or 0,1,2,3 (default: --device)",
    )
    parser.add_argument(
        "--api-key-env",
        metavar="NAME",
        help="require 'Authorization: Bearer <key>', the key read from the environment variable NAME (never logged)",
    )
    parser.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="no model here: one worker per device of a Ray cluster (auto: this host's), each on --jobs, which every "
        "host must see",
    )
    parser.add_argument(
        "--insecure-no-auth", action="store_true", help="allow a non-loopback --host without --api-key-env"
    )
    parser.add_argument(
        "--max-body-mb",
        type=float,
        default=MAX_BODY_MB,
        help=f"largest request body accepted, in MB (default {MAX_BODY_MB}; over it: 413)",
    )
    parser.add_argument(
        "--max-queue",
        type=int,
        default=MAX_QUEUE,
        help=f"jobs that may wait (default {MAX_QUEUE}; over it: 429 with Retry-After)",
    )


def check_server_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Usage errors of the server flags (exit 2), before anything loads; the key itself is never printed."""
    if args.api_key_env and not os.environ.get(args.api_key_env):
        parser.error(f"--api-key-env {args.api_key_env}: ${args.api_key_env} is empty; export the key first")
    if not args.api_key_env and not args.insecure_no_auth and not is_loopback(args.host):
        parser.error(
            f"--host {args.host} is reachable from other machines; pass --api-key-env NAME "
            "(or --insecure-no-auth behind a proxy that authenticates)"
        )
    if args.ray and args.devices:
        parser.error("--ray and --devices exclude each other: the cluster's devices are used")
    if args.max_body_mb <= 0 or args.max_queue < 1 or not 0 <= args.port < 65536:
        parser.error("--max-body-mb must be > 0, --max-queue >= 1 and --port 0-65535")
    server_devices(args)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def server_devices(args: argparse.Namespace) -> list[str | None]:
    """One entry per worker: ``--devices`` (indices are NPUs, as for ``--batch``), else ``--device``."""
    if not args.devices:
        return [args.device]
    from .batch import parse_devices

    return list(parse_devices(args.devices, minimum=1))


def serve_script(
    script: str,
    argv: list[str] | None,
    parse_args: Callable[[list[str] | None], argparse.Namespace],
    build_service: Callable[[argparse.Namespace], Any],
) -> int:
    """A ``serve.py``'s ``main``: its flags parsed (usage errors before any heavy import), its service built and
    served (:func:`deliverykit.server.serve`; ``--ray``'s actors build theirs from the same ``script`` and flags)."""
    args = parse_args(argv)
    from .server import serve

    with contextlib.ExitStack() as stack:
        return serve(build_service(args), args, stack=stack, devices=server_devices(args), origin=(script, argv))
