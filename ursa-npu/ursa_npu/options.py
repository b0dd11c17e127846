"""The flags that load the model, shared by ``inference.py`` and ``app.py``; nothing here imports torch, so that
``--help`` and a usage error answer at once."""

from __future__ import annotations

import argparse

from deliverykit import cli

from .generate import DEFAULT_MAX_PROMPT_LENGTH

SMOKE_PROMPT = "a photo of a small cat on the red house under the sun"


def add_model_args(parser: argparse.ArgumentParser) -> None:
    cli.add_model_args(parser, smoke_choices=("tiny", "tiny512"), dtype_default=None)
    parser.add_argument("--upstream", help="patched baaivision/URSA checkout (default: $URSA_SRC)")
    parser.add_argument(
        "--max-prompt-length",
        type=int,
        help=f"prompt tokens the model reads; longer prompts are truncated, with a warning (default "
        f"{DEFAULT_MAX_PROMPT_LENGTH}; the tiny model's own with --smoke)",
    )


def check_model_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if not args.weights and not args.smoke:
        parser.error("pass --weights DIR (downloaded URSA folder) or --smoke [tiny|tiny512]")
    if args.weights and args.smoke:
        parser.error("--weights and --smoke exclude each other")
    cli.check_counts(parser, args, positive=("max_prompt_length",))
