"""``deliverykit patches {check,apply,status}``: a delivery's patches on an upstream source tree.

``--upstream`` is a git checkout (patched with ``git apply``, its ``HEAD`` compared with the pin) or a tree without
git such as an extracted tarball (patched with ``patch -p1``; its commit is unknown, which is warned about).

Exit codes: 0 when every patch applies (check), was applied or already was (check, apply), and for status, which only
reports; ``ExitCode.INPUT`` (3) when the checkout is at another commit than the pin (without ``--force``), a patch
does not apply, or the metadata, patch files or tree are unusable; ``ExitCode.OUTPUT`` (6) when the patched files
cannot be written; 2 for bad usage (argparse).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from deliverykit.assets.patches import (
    APPLIED,
    OK,
    PatchError,
    PatchResult,
    Tree,
    Upstream,
    apply_patches,
    check_patches,
    check_pin,
    find_patches,
    load_upstream,
    open_tree,
    patch_status,
    pin_mismatch,
)
from deliverykit.errors import DeliveryError, ExitCode


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("patches", help="check, apply or show a delivery's patches on its upstream")
    verbs = parser.add_subparsers(dest="patches_command", metavar="{check,apply,status}", required=True)

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--delivery", required=True, type=Path, help="delivery folder, e.g. trellis2-npu")
    common.add_argument(
        "--upstream", required=True, type=Path, help="upstream source tree: a git checkout or an extracted tarball"
    )
    forcing = argparse.ArgumentParser(add_help=False)
    forcing.add_argument(
        "--force", action="store_true", help="go on when the checkout is at another commit than the pin (warns)"
    )

    check = verbs.add_parser("check", parents=[common, forcing], help="check that every patch applies, in order")
    check.set_defaults(func=patches_check_command)
    apply = verbs.add_parser("apply", parents=[common, forcing], help="apply every patch, or none if one fails")
    apply.set_defaults(func=patches_apply_command)
    status = verbs.add_parser("status", parents=[common], help="show which patches are applied")
    status.set_defaults(func=patches_status_command)
    return parser


def patches_check_command(args: argparse.Namespace) -> int:
    return run_guarded(lambda: _check_or_apply(args, apply=False))


def patches_apply_command(args: argparse.Namespace) -> int:
    return run_guarded(lambda: _check_or_apply(args, apply=True))


def patches_status_command(args: argparse.Namespace) -> int:
    def run() -> int:
        upstream, patches, tree = _open(args)
        warn(pin_mismatch(tree, upstream))
        results = patch_status(tree, patches)
        print_results(results)
        applied = sum(result.state == APPLIED for result in results)
        print(f"{applied} of {len(results)} patch(es) applied to {tree.path}")
        return int(ExitCode.OK)

    return run_guarded(run)


def _check_or_apply(args: argparse.Namespace, *, apply: bool) -> int:
    upstream, patches, tree = _open(args)
    warn(check_pin(tree, upstream, force=args.force))
    if not patches:
        print(f"no patches in {upstream.patches_dir}: nothing to do")
        return int(ExitCode.OK)
    results = apply_patches(tree, patches) if apply else check_patches(tree, patches)
    if all(result.state == OK for result in results):
        print_results(results)
        print(f"{len(results)} patch(es) {'applied to' if apply else 'apply to'} {tree.path}")
        return int(ExitCode.OK)
    status = patch_status(tree, patches)
    if all(result.state == APPLIED for result in status):
        print_results(status)
        print(f"{len(status)} patch(es) already applied to {tree.path}: nothing to do")
        return int(ExitCode.OK)
    print_results(results)
    raise not_applying_error(results, tree, "nothing was applied" if apply else "the tree was not changed")


def not_applying_error(results: Sequence[PatchResult], tree: Tree, outcome: str) -> PatchError:
    failed = next(result for result in results if result.state != OK)
    return PatchError(
        f"{failed.name} does not apply to {tree.path} ({failed.reason}); {outcome}: check that the tree is an "
        f"unmodified copy of the pinned commit, else fix the patch"
    )


def _open(args: argparse.Namespace) -> tuple[Upstream, list[Path], Tree]:
    upstream = load_upstream(args.delivery)
    patches = find_patches(args.delivery)
    tree = open_tree(args.upstream)
    how = f"git checkout at {tree.commit}" if tree.commit else "no git, patched with patch -p1"
    print(f"{upstream.name} pinned at {upstream.commit}, {len(patches)} patch(es) in {upstream.patches_dir}")
    print(f"upstream tree {tree.path} ({how})")
    return upstream, patches, tree


def run_guarded(run: Callable[[], int]) -> int:
    """One-line ``error: ...`` and the error's exit code for anything the user can fix."""
    try:
        return run()
    except DeliveryError as err:
        print(f"error: {err}", file=sys.stderr)
        return int(err.exit_code)


def warn(message: str | None) -> None:
    if message:
        print(f"warning: {message}", file=sys.stderr)


def print_results(results: Sequence[PatchResult]) -> None:
    rows = [(result.name, result.state, result.reason) for result in results]
    widths = [max(len(row[i]) for row in [("PATCH", "STATE", ""), *rows]) for i in range(2)]
    for name, state, reason in [("PATCH", "STATE", "DETAIL"), *rows]:
        print(f"{name.ljust(widths[0])}  {state.ljust(widths[1])}  {reason}".rstrip())
