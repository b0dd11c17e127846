"""``deliverykit upstream clone``: a delivery's upstream at its pinned commit, with the delivery's patches applied.

Exit codes: 0 when cloned and patched; ``ExitCode.INPUT`` (3) when no URL served the pinned commit, a patch does not
apply (the clone is then left at the pinned commit, unpatched), or the metadata or patch files are unusable;
``ExitCode.OUTPUT`` (6) when ``--into`` is not empty or cannot be created; 2 for bad usage (argparse).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from deliverykit.assets.patches import OK, apply_patches, clone_upstream, find_patches, load_upstream, open_tree
from deliverykit.errors import ExitCode

from .patches import not_applying_error, print_results, run_guarded, warn


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("upstream", help="clone a delivery's pinned upstream and apply its patches")
    verbs = parser.add_subparsers(dest="upstream_command", metavar="{clone}", required=True)
    clone = verbs.add_parser("clone", help="clone the pinned commit from the first reachable URL, then patch it")
    clone.add_argument("--delivery", required=True, type=Path, help="delivery folder, e.g. trellis2-npu")
    clone.add_argument("--into", required=True, type=Path, help="new or empty folder for the checkout")
    clone.add_argument(
        "--url",
        action="append",
        dest="urls",
        metavar="URL",
        help="clone from this URL instead of the ones in patches/upstream.json (repeatable, tried in order)",
    )
    clone.set_defaults(func=upstream_clone_command)
    return parser


def upstream_clone_command(args: argparse.Namespace) -> int:
    def run() -> int:
        upstream = load_upstream(args.delivery)
        patches = find_patches(args.delivery)  # a misnamed patch fails before a long clone
        print(f"cloning {upstream.name} at {upstream.commit} into {args.into}")
        clone = clone_upstream(upstream, args.into, args.urls)
        for url, reason in clone.failures:
            warn(f"{url} failed ({reason}); tried the next URL")
        print(f"cloned from {clone.url}")
        if not patches:
            print(f"no patches in {upstream.patches_dir}: {clone.path} is the pinned commit as is")
            return int(ExitCode.OK)
        tree = open_tree(clone.path)
        results = apply_patches(tree, patches)
        print_results(results)
        if any(result.state != OK for result in results):
            raise not_applying_error(results, tree, "the clone is left at the pinned commit without patches")
        print(f"{len(results)} patch(es) applied: {clone.path} is ready")
        return int(ExitCode.OK)

    return run_guarded(run)
