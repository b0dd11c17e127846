"""Shared command-line flags: defaults every delivery relies on, and the per-delivery knobs."""

from __future__ import annotations

import argparse

import pytest

from deliverykit.cli import add_common_args, check_counts, check_utf8
from deliverykit.errors import DeliveryError, ExitCode


def _parse(*argv: str, **options) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_common_args(parser, **options)
    return parser.parse_args(list(argv))


def test_defaults_are_unchanged_for_existing_deliveries():
    args = _parse("--output", "out")
    assert (args.dtype, args.seed, args.smoke, args.warmup, args.runs) == ("fp32", 42, None, 3, 10)
    assert _parse("--output", "out", "--smoke").smoke == "full"
    assert args.strict_manifest is False and _parse("--output", "out", "--strict-manifest").strict_manifest is True


def test_output_help_and_per_device_dtype_default(capsys):
    parser = argparse.ArgumentParser()
    add_common_args(parser, output_help="image file (out.jpg)", dtype_default=None, smoke_choices=("tiny",))
    assert parser.parse_args(["--output", "x.jpg"]).dtype is None
    assert parser.parse_args(["--output", "x.jpg", "--dtype", "bf16", "--smoke"]).smoke == "tiny"
    parser.print_help()
    help_text = " ".join(capsys.readouterr().out.split())
    assert "image file (out.jpg)" in help_text and "fp16 on an accelerator, fp32 on the CPU" in help_text
    with pytest.raises(SystemExit):
        parser.parse_args(["--output", "x.jpg", "--smoke", "full"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--runs", "0"], "--warmup 3 / --runs 0: need warmup >= 0 and runs >= 1"),
        (["--warmup", "-1"], "--warmup -1 / --runs 10"),
        (["--max-prompt-length", "0"], "--max-prompt-length 0: need at least 1"),
    ],
)
def test_check_counts_refuses_with_exit_2(argv, message, capsys):
    parser = argparse.ArgumentParser()
    add_common_args(parser)
    parser.add_argument("--max-prompt-length", type=int)
    args = parser.parse_args(["--output", "out", *argv])
    with pytest.raises(SystemExit) as exit_info:
        check_counts(parser, args, positive=["max_prompt_length"])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_check_counts_accepts_defaults_and_unset_flags():
    parser = argparse.ArgumentParser()
    add_common_args(parser)
    parser.add_argument("--max-prompt-length", type=int)
    check_counts(parser, parser.parse_args(["--output", "out"]), positive=["max_prompt_length"])


def test_check_utf8_names_the_flag_and_the_first_bad_byte():
    """Linux hands non-UTF-8 argv bytes to Python as surrogate escapes: b"caf\\xe9" arrives as "caf\\udce9"."""
    args = argparse.Namespace(prompt=b"caf\xe9".decode("utf-8", "surrogateescape"), negative_prompt=None)
    with pytest.raises(DeliveryError) as caught:
        check_utf8(args, ("prompt", "negative_prompt"))
    assert caught.value.exit_code == ExitCode.USAGE
    assert str(caught.value).startswith("--prompt is not valid UTF-8 text (byte 0xe9 at position 3); pass it in UTF-8")
    check_utf8(argparse.Namespace(prompt="un café, 猫", negative_prompt=""), ("prompt", "negative_prompt"))
