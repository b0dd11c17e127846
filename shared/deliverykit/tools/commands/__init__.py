"""The ``deliverykit`` command line: one module per subcommand, each with a ``register(subparsers)``.

A subcommand module adds its parser and sets ``func`` (taking the parsed args, returning an exit code), so that
computing stays apart from printing and every subcommand can also be called from Python.
"""

from __future__ import annotations

import argparse
import importlib

# name -> module inside deliverykit.tools.commands; imported lazily so `deliverykit env` never pays for the others.
SUBCOMMANDS = {
    "env": "env",
    "npu-check": "npu_check",
    "patches": "patches",
    "publish": "publish",
    "readme": "readme",
    "upstream": "upstream",
    "weights": "weights",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="deliverykit", description="Tools shared by the Ascend NPU deliveries.")
    subparsers = parser.add_subparsers(dest="command", metavar="{" + ",".join(SUBCOMMANDS) + "}")
    for module_name in SUBCOMMANDS.values():
        importlib.import_module(f"{__name__}.{module_name}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 1
    return int(args.func(args) or 0)
