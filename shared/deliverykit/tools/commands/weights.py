"""``deliverykit weights {verify,pin,download}``: check, complete and fetch a delivery's model files.

Exit codes: 0 when every required file passed, ``ExitCode.WEIGHTS`` (4) when one did not or when the manifest or
the weights root is unusable, 2 for bad usage (argparse).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from deliverykit.assets.manifest import (
    HUBS,
    MISSING,
    STATUSES,
    FileCheck,
    PinReport,
    download,
    download_command,
    pin,
    summarize_checks,
    verify,
)
from deliverykit.errors import DeliveryError, ExitCode


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("weights", help="verify, pin or download a delivery's model files")
    verbs = parser.add_subparsers(dest="weights_command", metavar="{verify,pin,download}", required=True)

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--manifest", required=True, type=Path, help="the delivery's weights-manifest.json")
    where = common.add_mutually_exclusive_group(required=True)
    where.add_argument("--root", type=Path, help="weights root; model folders are its children")
    where.add_argument(
        "--model-dir", type=Path, help="instead of --root: the folder of one model (--model ID), whatever its name"
    )
    common.add_argument("--model", action="append", dest="models", metavar="ID", help="only this model id (repeatable)")

    verify_parser = verbs.add_parser("verify", parents=[common], help="check sizes and sha256 of the files")
    verify_parser.add_argument("--quick", action="store_true", help="compare sizes only; hashes are not checked")
    verify_parser.add_argument(
        "--file", action="append", dest="files", metavar="PATH", help="only this repo path (repeatable)"
    )
    verify_parser.set_defaults(func=weights_verify_command)

    pin_parser = verbs.add_parser("pin", parents=[common], help="fill unknown sizes and sha256 from local files")
    pin_parser.set_defaults(func=weights_pin_command)

    download_parser = verbs.add_parser("download", parents=[common], help="download the files, then verify them")
    download_parser.add_argument("--hub", choices=sorted(HUBS), default="hf", help="where to download from")
    download_parser.add_argument("--all-files", action="store_true", help="also download optional files")
    download_parser.add_argument("--quick", action="store_true", help="verify sizes only after downloading")
    download_parser.set_defaults(func=weights_download_command)
    return parser


def weights_verify_command(args: argparse.Namespace) -> int:
    return _guarded(
        lambda: _report_checks(
            verify(args.manifest, args.root, args.quick, args.models, args.files, model_dir=args.model_dir), args
        )
    )


def weights_download_command(args: argparse.Namespace) -> int:
    def run() -> int:
        checks = download(
            args.manifest,
            args.root,
            args.hub,
            models=args.models,
            include_optional=args.all_files,
            quick=args.quick,
            model_dir=args.model_dir,
        )
        return _report_checks(checks, args)

    return _guarded(run)


def weights_pin_command(args: argparse.Namespace) -> int:
    if args.root is None:
        print("error: weights pin reads a weights root: pass --root (not --model-dir)", file=sys.stderr)
        return int(ExitCode.USAGE)
    return _guarded(lambda: _report_pin(pin(args.manifest, args.root, models=args.models)))


def _guarded(run: Callable[[], int]) -> int:
    """One-line ``error: ...`` and the error's exit code for anything the user can fix."""
    try:
        return run()
    except DeliveryError as err:
        print(f"error: {err}", file=sys.stderr)
        return int(err.exit_code)


def _value(nbytes: int | None, sha256: str | None) -> str:
    size = "?" if nbytes is None else str(nbytes)
    return f"{size} B {sha256[:16] if sha256 else '-'}"


def _table(header: Sequence[str], rows: list[Sequence[str]]) -> None:
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows, strict=True)]
    for row in [header, *rows]:
        print("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())


def _report_checks(checks: list[FileCheck], args: argparse.Namespace) -> int:
    root = Path(args.model_dir or args.root)
    rows = []
    for check in checks:
        actual = "-" if check.status == MISSING else _value(check.actual_bytes, check.actual_sha256)
        rows.append(
            (
                check.status,
                "yes" if check.required else "no",
                _relative(check.local_path, root),
                _value(check.expected_bytes, check.expected_sha256),
                actual,
            )
        )
    if rows:
        _table(("STATUS", "REQUIRED", "PATH", "EXPECTED", "ACTUAL"), rows)

    summary = summarize_checks(checks)
    counts = ", ".join(f"{summary.counts[s]} {s}" for s in STATUSES if summary.counts[s])
    print(f"\n{summary.total} file(s): {counts or 'none'}")
    if summary.unchecked_hashes:
        why = "quick mode" if args.quick else "no known sha256 in the manifest"
        print(f"sha256 NOT checked for {summary.unchecked_hashes} file(s) ({why}): sizes only")
    if summary.optional_failures:
        print(f"{len(summary.optional_failures)} optional file(s) not ok (not needed by the pipeline)")
    if summary.ok:
        print("weights OK: every required file passed")
        return int(ExitCode.OK)
    print(f"weights NOT OK: {len(summary.required_failures)} required file(s) failed")
    print(f"fix with: {download_command(args.manifest, args.root, model_ids=args.models, model_dir=args.model_dir)}")
    return int(ExitCode.WEIGHTS)


def _report_pin(report: PinReport) -> int:
    rows = [(e.action, e.model_id, e.path, _value(e.bytes, e.sha256), e.detail) for e in report.entries]
    if rows:
        _table(("ACTION", "MODEL", "PATH", "ON DISK", "DETAIL"), rows)
    missing = sum(e.action == "missing" for e in report.entries)
    print(f"\n{len(report.filled)} file(s) filled, {len(report.conflicts)} conflict(s), {missing} missing on disk")
    if report.conflicts:
        print(f"manifest {report.manifest_path} left unchanged: re-download the file or fix the manifest")
        return int(ExitCode.WEIGHTS)
    if report.written:
        print(f"manifest {report.manifest_path} updated")
    else:
        print(f"manifest {report.manifest_path} unchanged: nothing to fill")
    return int(ExitCode.OK)


def _relative(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)
