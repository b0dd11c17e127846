"""``deliverykit readme backfill``: render results JSON into a README's marked sections."""

from __future__ import annotations

import argparse
import sys

from deliverykit.errors import DeliveryError


def backfill_command(args: argparse.Namespace) -> int:
    from deliverykit.tools.readme import backfill, section_name_for

    if args.section and len(args.results) != 1:
        print("error: --section names one section; pass a single --results with it", file=sys.stderr)
        return 2
    try:
        sections = {args.section or section_name_for(path): path for path in args.results}
        changed = backfill(args.readme, sections)
    except DeliveryError as err:
        print(f"error: {err}", file=sys.stderr)
        return int(err.exit_code)
    print(f"{args.readme}: {'updated' if changed else 'already up to date'} ({', '.join(sections)})")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("readme", help="generate README sections from results JSON")
    verbs = parser.add_subparsers(dest="verb", metavar="{backfill}")
    backfill = verbs.add_parser("backfill", help="replace <!-- NAME:BEGIN --> ... <!-- NAME:END --> with tables")
    backfill.add_argument("--readme", required=True, help="README.md to update")
    backfill.add_argument(
        "--results", required=True, action="append", help="results JSON (repeatable); section = file stem"
    )
    backfill.add_argument("--section", help="section NAME when it differs from the results file's stem")
    backfill.set_defaults(func=backfill_command)
