"""A stand-in delivery for the server tests: ``/v1/echoes`` jobs in the shape of OpenAI's videos API.

    python server_app.py --port 0 --jobs DIR [server flags] [--load-s S]

A job's body: ``text`` (required), ``delay`` (seconds the job takes), ``fail`` (a ``DeliveryError``), ``boom`` (a
bug), an optional ``attachment`` file. It writes ``out.txt`` (the text and the attachment's size) with its
``report.json`` through ``RunOutputs``, and appends one line to ``runs.log`` in its folder each time it starts, so
that a test can count how often a job ran.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path
from typing import Any

from deliverykit import cli
from deliverykit.errors import DeliveryError, InputError, run_main

KIND = "echo"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="toy server")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--load-s", type=float, default=0.0, help="seconds loading a session takes")
    cli.add_server_args(parser)
    args = parser.parse_args(argv)
    cli.check_server_args(parser, args)
    return args


def accept(fields: dict[str, Any], files: dict[str, bytes]) -> tuple[dict[str, Any], dict[str, bytes]]:
    from deliverykit.server import ApiError, form_value

    text = fields.get("text")
    if not text:
        raise ApiError(400, "text is required", param="text")
    if text == "refuse":
        raise DeliveryError("--text refuse: the CLI refuses this; pass another text")
    request = {
        "text": text,
        "delay": form_value(fields, "delay", float, 0.0),
        "fail": form_value(fields, "fail", bool, False),
        "boom": form_value(fields, "boom", bool, False),
        "attachment": "attachment" in files,
    }
    return request, {"attachment.bin": files["attachment"]} if "attachment" in files else {}


def run(session: dict[str, Any], job: Any, folder: Path) -> dict[str, Any]:
    from deliverykit.files import RunOutputs

    with open(folder / "runs.log", "a", encoding="utf-8") as log:
        log.write(f"{os.getpid()} {session['device']}\n")
    time.sleep(job.request["delay"])
    if job.request["fail"]:
        raise InputError("asked to fail; send fail=false")
    if job.request["boom"]:
        raise TypeError("a bug")
    attached = (folder / "attachment.bin").stat().st_size if job.request["attachment"] else 0
    outputs = RunOutputs.declare({"text": folder / "out.txt"})
    with outputs.commit() as commit:
        commit.files["text"].write_text(f"{job.request['text']} {attached}\n", encoding="utf-8")
        commit.report = {"text": job.request["text"], "device": session["device"]}
    return {"stages_s": {"echo": job.request["delay"]}}


def build_service(args: argparse.Namespace) -> Any:
    """The stand-in's service (``serve.py --ray``'s actors build theirs with it too)."""
    from deliverykit import server

    def load(device: str | None, stack: contextlib.ExitStack) -> dict[str, Any]:
        time.sleep(args.load_s)
        return {"device": device}

    def routes(api: server.Api) -> None:
        def describe(job: Any) -> dict[str, Any]:
            return {"text": job.request["text"], "size": "1x1", "seconds": "1"}

        variants = {"text": ("out.txt", "text/plain"), "report": ("report.json", "application/json")}
        server.JobRoutes("/v1/echoes", KIND, accept, describe, variants).add_to(api)

    return server.Service("toy/echo-1", (KIND,), load, run, routes)


def main(argv: list[str] | None = None) -> int:
    return cli.serve_script(__file__, argv, parse_args, build_service)


if __name__ == "__main__":
    sys.exit(run_main(main))
