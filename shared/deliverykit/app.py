"""Web demos: what every delivery's Gradio ``app.py`` shares.

An app loads its model once at start (the same checks, errors and exit codes as ``inference.py``), then serves
requests one at a time per device (Gradio's queue with a concurrency limit of 1), each written with the delivery's
own output code into a new folder under ``--output`` (all outputs together, or none). A bad input is a message on
the page (:func:`shown_on_page`), never a traceback; the URL it serves is printed as ``URL=...``.

Gradio is pinned in each delivery's ``requirements-app.txt``, not in its inference lock: it is imported only here,
when an app runs.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import shlex
import sys
import threading
import uuid
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

from .errors import DeliveryError, ExitCode, OutputError

logger = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 7860
# Gradio's usage analytics and update check would reach the internet: a delivery's app never does.
OFFLINE_ENV = {"GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_OFFLINE": "1"}
# A ModelScope Studio starts `python app.py` with no arguments; its ms_deploy.json passes them in this variable.
APP_ARGS_ENV = "DELIVERY_APP_ARGS"
F = TypeVar("F", bound=Callable[..., Any])


def app_argv(argv: list[str] | None = None) -> list[str]:
    """The app's arguments: ``argv``, else the command line's, else ``$DELIVERY_APP_ARGS`` split as a shell would."""
    if argv is not None:
        return argv
    return sys.argv[1:] or shlex.split(os.environ.get(APP_ARGS_ENV, ""))


def add_app_args(parser: argparse.ArgumentParser, *, output_default: str = "outputs/app") -> None:
    """``--host --port --output``: where the app listens and where request folders go."""
    parser.add_argument(
        "--host",
        default=DEFAULT_HOST,
        help=f"address to listen on (default {DEFAULT_HOST}; 0.0.0.0 "
        "in a ModelScope Studio or to reach it from another machine)",
    )
    parser.add_argument(
        "--port",
        type=int,
        default=int(os.environ.get("GRADIO_SERVER_PORT", DEFAULT_PORT)),
        help=f"port (default $GRADIO_SERVER_PORT or {DEFAULT_PORT}; 0 picks a free one)",
    )
    parser.add_argument(
        "--output",
        default=output_default,
        help=f"folder that receives one sub-folder per request (default {output_default})",
    )


def request_folder(root: str | os.PathLike) -> Path:
    """A new, unused folder name under ``root`` for one request: time-ordered, unique across processes.

    Not created here: the delivery's :class:`deliverykit.files.Outputs` creates it when the outputs commit.
    """
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    return Path(root) / f"{stamp}-{uuid.uuid4().hex[:8]}"


def shown_on_page(fn: F) -> F:
    """Turn a request's failure into a message on the page.

    A :class:`DeliveryError` (bad input, NaN output, an output that cannot be written) shows its one-line message,
    as ``inference.py`` prints it; anything else is a bug: its traceback goes to the server's log, and the page
    says so without it.
    """
    import gradio as gr

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except DeliveryError as err:
            raise gr.Error(f"error: {err}", print_exception=False) from None
        except gr.Error:
            raise
        except Exception as err:
            logger.exception("request failed")
            raise gr.Error(
                f"error: internal error ({type(err).__name__}); see the server log", print_exception=False
            ) from None

    return wrapper  # type: ignore[return-value]


def step_progress(progress: Any, total: int, desc: str = "denoising") -> Callable[[int], None]:
    """A callback ``(step) -> None`` that moves a ``gr.Progress`` bar through ``total`` steps."""
    progress(0, desc=desc)

    def update(step: int) -> None:
        progress(min(step, total) / max(total, 1), desc=f"{desc} {min(step, total)}/{total}")

    return update


def serve(demo: Any, args: argparse.Namespace, *, stop: threading.Event | None = None) -> int:
    """Queue requests one at a time, listen on ``--host``/``--port``, print ``URL=...``, serve until interrupted.

    A port already in use is exit 6 (an output that cannot be written: pick another ``--port``), before any request.
    """
    for key, value in OFFLINE_ENV.items():
        os.environ.setdefault(key, value)
    demo.queue(default_concurrency_limit=1)
    try:
        demo.launch(
            server_name=args.host,
            server_port=args.port or None,
            prevent_thread_lock=True,
            show_error=True,
            quiet=True,
            allowed_paths=[str(Path(args.output).resolve())],
        )
    except OSError as err:
        raise OutputError(f"cannot listen on {args.host}:{args.port} ({err}); pass another --port") from None
    print(f"URL={demo.local_url}", flush=True)
    try:
        (stop or threading.Event()).wait()
    except KeyboardInterrupt:
        pass
    finally:
        demo.close()
    return int(ExitCode.OK)
