"""``deliverykit publish {stage,push}``: one delivery as a standalone tree, and that tree on ModelScope or GitCode.

    deliverykit publish stage --delivery trellis2-npu --out staged/trellis2-npu --hub modelscope
    deliverykit publish push --staged staged/trellis2-npu --to modelscope --repo my-org/trellis2-npu --dry-run

Tokens are read from ``MODELSCOPE_API_TOKEN`` or ``GITCODE_TOKEN`` only (``--dry-run`` needs none); GitCode pushes
authenticate as ``$GITCODE_USER``, by default the owner in ``--repo``.

Exit codes: 0 when staged, pushed, or the remote already held the tree; ``ExitCode.INPUT`` (3) for unusable delivery
metadata, an import of deliverykit that the delivery's requirements do not pin, a bad ``--repo``, a folder that is
not a staged tree, a missing token or a missing ModelScope SDK; ``ExitCode.OUTPUT`` (6) when ``--out`` is not empty
or cannot be written, or the hub refused or could not be reached; 2 for bad usage (argparse).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from deliverykit.errors import ExitCode
from deliverykit.tools.publish import (
    GITCODE_USER_ENV,
    HUBS,
    PUSH_TARGETS,
    PublishError,
    check_repo_id,
    check_staged,
    gitcode_url,
    load_hub_metadata,
    push_gitcode,
    push_modelscope,
    stage_delivery,
    token_from_env,
)

from .patches import run_guarded, warn


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("publish", help="stage one delivery as a standalone tree, or push a staged tree")
    verbs = parser.add_subparsers(dest="publish_command", metavar="{stage,push}", required=True)

    stage = verbs.add_parser("stage", help="build a standalone tree of a delivery (deliverykit vendored)")
    stage.add_argument("--delivery", required=True, type=Path, help="delivery folder, e.g. trellis2-npu")
    stage.add_argument("--out", required=True, type=Path, help="new or empty folder for the staged tree")
    stage.add_argument("--hub", choices=HUBS, default="modelscope", help="README front matter for this hub")
    stage.set_defaults(func=publish_stage_command)

    push = verbs.add_parser("push", help="upload a staged tree to ModelScope or push it to GitCode")
    push.add_argument("--staged", required=True, type=Path, help="folder made by publish stage")
    push.add_argument("--to", required=True, choices=PUSH_TARGETS, help="the hub")
    push.add_argument("--repo", required=True, help="repository id on the hub, owner/name")
    push.add_argument("--dry-run", action="store_true", help="print the target and the files; send nothing")
    push.add_argument("--branch", default="main", help="GitCode branch to push to (default main)")
    push.add_argument("--remote-url", help="GitCode only: push to this git URL instead of https://gitcode.com/ID.git")
    push.add_argument("--message", help="commit message (default: Publish <folder name> with deliverykit)")
    push.set_defaults(func=publish_push_command)
    return parser


def publish_stage_command(args: argparse.Namespace) -> int:
    def run() -> int:
        staged = stage_delivery(args.delivery, args.out, args.hub)
        if staged.untracked:
            shown = ", ".join(staged.untracked[:5]) + (", ..." if len(staged.untracked) > 5 else "")
            warn(
                f"{len(staged.untracked)} untracked file(s) in {args.delivery} were not staged ({shown}); "
                "git add them to ship them"
            )
        print(f"staged {args.delivery} for {staged.hub}: {len(staged.files)} file(s) in {staged.path}")
        print(f"try it: cd {staged.path} && pip install -r requirements.txt -r requirements-test.txt")
        smoke = " && ".join(load_hub_metadata(args.delivery).smoke)
        print(f"        {smoke} && python -m pytest")
        print(f"then: deliverykit publish push --staged {staged.path} --to <hub> --repo <owner/name> --dry-run")
        return int(ExitCode.OK)

    return run_guarded(run)


def publish_push_command(args: argparse.Namespace) -> int:
    def run() -> int:
        if args.remote_url and args.to != "gitcode":
            raise PublishError(f"--remote-url is for --to gitcode only; drop it to push to {args.to}")
        check_repo_id(args.repo)
        files = check_staged(args.staged)
        if args.dry_run:
            target = args.repo
            if args.to == "gitcode":
                target = f"{args.remote_url or gitcode_url(args.repo)} ({args.branch})"
            print(f"dry run: would push {len(files)} file(s) from {args.staged} to {args.to} {target}; nothing sent")
            for path in files:
                print(f"  {path}")
            return int(ExitCode.OK)
        token = token_from_env(args.to)
        message = args.message or f"Publish {args.staged.resolve().name} with deliverykit"
        if args.to == "modelscope":
            result = push_modelscope(args.staged, args.repo, token=token, message=message)
        else:
            result = push_gitcode(
                args.staged,
                args.repo,
                token=token,
                message=message,
                branch=args.branch,
                remote_url=args.remote_url,
                username=os.environ.get(GITCODE_USER_ENV) or None,
            )
        if args.to == "gitcode" and result.commit is None:
            print(f"{result.target} already holds these {result.files} file(s): nothing pushed")
        else:
            commit = f" as {result.commit}" if result.commit else ""
            print(f"pushed {result.files} file(s) to {result.target}{commit}")
        return int(ExitCode.OK)

    return run_guarded(run)
