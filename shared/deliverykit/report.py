"""Run reports (JSON) and the evidence lines every delivery prints.

The evidence lines are ``KEY=VALUE``, one per line, so that a log can be checked with ``grep``; the JSON report
holds the same values plus an environment fingerprint, so every figure in a README traces back to a file that
says which device, which versions, which commit and whether the weights were random.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
import platform
import re
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from . import __version__
from .files import write_json_atomic
from .imports import package_version

SCHEMA_VERSION = 1
SCHEMA_PATH = Path(__file__).with_name("schemas") / "run_report.schema.json"

# Printed in this order; EXIT_CODE is printed by errors.run_main on every path, success or not.
EVIDENCE_KEYS = (
    "INPUT_DEVICE",
    "MODEL_DEVICE",
    "OUTPUT_DEVICE",
    "CPU_FALLBACK",
    "LATENT_SHAPE",
    "OUTPUT_SHAPE",
    "EMBEDDING_HEAD",
    "TIMING_MEDIAN_MS",
    "TIMING_P90_MS",
    "PEAK_MEMORY_MB",
)

# Environment variables worth recording; never the whole environment (tokens live there).
_ENV_PREFIXES = ("ASCEND_", "PYTORCH_NPU_", "HCCL_", "TORCH_NPU_")
_ENV_NAMES = ("TASK_QUEUE_ENABLE", "CPU_AFFINITY_CONF", "DELIVERY_DEVICE", "TORCH_DEVICE_BACKEND_AUTOLOAD")
_PACKAGES = ("torch", "torch_npu", "transformers", "diffusers", "accelerate", "safetensors", "numpy")

# Where a report may name an absolute path as it is: system locations, the same on every host that has them.
SYSTEM_PREFIXES = ("/usr/", "/etc/", "/dev/", "/proc/", "/sys/", "/bin/", "/sbin/", "/lib/", "/lib64/")
# The variables a user sets for upstream checkouts (TRELLIS2_SRC, URSA_SRC, LTX2_SRC) end so.
_SOURCE_VARIABLE_SUFFIX = "_SRC"
_PATH_START = re.compile(r"(?<![\w:/.~$-])/(?=[\w.+@-])")  # a "/" that starts a path, not one inside a URL or word


def format_evidence_value(value: Any) -> str:
    """``true``/``false`` for booleans, ``[1, 2]`` for shapes, 4 decimals for floats, ``n/a`` for None."""
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.4f}"
    if isinstance(value, Sequence) and not isinstance(value, str):
        return "[" + ", ".join(format_evidence_value(v) if isinstance(v, float) else str(v) for v in value) + "]"
    return str(value)


def evidence_lines(evidence: Mapping[str, Any], extra_keys: Sequence[str] = ()) -> list[str]:
    """The ``KEY=VALUE`` lines for the known keys present in ``evidence``, in the documented order.

    ``extra_keys``: a delivery's own keys (all must be present), printed after the documented ones.
    """
    keys = [key for key in EVIDENCE_KEYS if key in evidence] + list(extra_keys)
    return [f"{key}={format_evidence_value(evidence[key])}" for key in keys]


def parse_evidence(text: str) -> dict[str, str]:
    """Read ``KEY=VALUE`` evidence lines back from a log (later lines win)."""
    known = (*EVIDENCE_KEYS, "EXIT_CODE")
    found = {}
    for line in text.splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and key in known:
            found[key] = value
    return found


def cann_version() -> str | None:
    """CANN version: from torch_npu when it is loaded, else from the toolkit's version file."""
    torch = sys.modules.get("torch")
    cann = getattr(getattr(torch, "version", None), "cann", None) if torch else None
    if cann:
        return str(cann)
    home = os.environ.get("ASCEND_HOME_PATH") or "/usr/local/Ascend/ascend-toolkit/latest"
    for candidate in (Path(home) / "version.cfg", Path(home) / "compiler" / "version.info"):
        try:
            for line in candidate.read_text(encoding="utf-8").splitlines():
                if "version" in line.lower() and "=" in line:
                    return line.split("=", 1)[1].strip()
        except OSError:
            continue
    return None


def git_commit(path: str | os.PathLike | None = None) -> str | None:
    """Commit of the checkout holding ``path`` (None outside git), with ``-dirty`` when it has local changes."""
    cwd = Path(path or ".").resolve()
    cwd = cwd if cwd.is_dir() else cwd.parent
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("-dirty" if dirty else "")


def environment_fingerprint(device: Any = None, source_path: str | os.PathLike | None = None) -> dict[str, Any]:
    """Python, platform, package versions, CANN, device name, git commit and the relevant environment variables."""
    from .device import device_name

    env = {
        key: value for key, value in sorted(os.environ.items()) if key.startswith(_ENV_PREFIXES) or key in _ENV_NAMES
    }
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "packages": {name: package_version(name.replace("_", "-")) or package_version(name) for name in _PACKAGES},
        "deliverykit": __version__,
        "cann": cann_version(),
        "device": None if device is None else str(device),
        "device_name": None if device is None else device_name(device),
        "git_commit": git_commit(source_path),
        "env": env,
    }


def _checkout_root(start: Path) -> Path:
    """The git checkout holding ``start`` (a ``.git`` entry above it), else ``start`` itself."""
    return next((folder for folder in (start, *start.parents) if (folder / ".git").exists()), start)


def _is_flag(word: str) -> bool:
    """``--upstream`` or ``-o``: a word whose value may follow it (not ``--``, not ``--flag=value``, not ``-1``)."""
    return bool(re.fullmatch(r"--?[A-Za-z][\w-]*", word))


def _flag_placeholder(flag: str) -> str:
    """``--weights-dir`` -> ``WEIGHTS_DIR``: argparse's metavar for the flag a path came from."""
    return flag.lstrip("-").replace("-", "_").upper()


class _PortablePaths:
    """What :func:`portable_paths` does to one path string, given the root and the source variables."""

    def __init__(self, root: Path, environ: Mapping[str, str]) -> None:
        self.root = os.path.normpath(root)
        sources = [
            (name, os.path.normpath(value))
            for name, value in environ.items()
            if name.endswith(_SOURCE_VARIABLE_SUFFIX) and os.path.isabs(value)
        ]
        self.sources = sorted(sources, key=lambda source: -len(source[1]))  # the deepest checkout first

    def path(self, text: str, flag: str | None) -> str:
        name = text.split("/", 2)[1]
        if not name or text.startswith(SYSTEM_PREFIXES) or not os.path.isdir("/" + name):
            return text  # a system location, or no path on this machine (an API route such as /v1/videos)
        path = os.path.normpath(text)
        for base, replacement in ((self.root, None), *((value, f"${name}") for name, value in self.sources)):
            if path == base or path.startswith(base.rstrip("/") + "/"):
                rest = path[len(base) :].lstrip("/")
                if replacement is None:
                    return rest or "."
                return f"{replacement}/{rest}" if rest else replacement
        if flag is not None:
            return _flag_placeholder(flag)
        base_name = os.path.basename(path.rstrip("/"))
        return base_name if base_name.startswith("python") else f"DIR/{base_name}"

    def token(self, token: str, previous: str | None) -> str:
        """One command-line word: ``/abs``, ``--flag=/abs``, or words with paths inside (``PATH=/a:/b``)."""
        flag, equals, value = token.partition("=")
        if token.startswith("--") and equals and value.startswith("/"):
            return f"{flag}={self.path(value, flag)}"
        if token.startswith("/") and previous is not None and _is_flag(previous):
            return self.path(token, previous)
        pieces = _PATH_START.split(token)
        if len(pieces) == 1:
            return token
        words = [pieces[0]]
        for piece in pieces[1:]:
            end = re.search(r"[\s'\"`:;,)\]]", piece)
            head, tail = (piece[: end.start()], piece[end.start() :]) if end else (piece, "")
            words.append(self.path("/" + head, None) + tail)
        return "".join(words)

    def words(self, words: list[Any]) -> list[Any]:
        """A command (or any list): each string seen with the string before it, so a path after a flag becomes it."""
        out, previous = [], None
        for word in words:
            if isinstance(word, str) and not word.strip():
                out.append(word)  # the spaces between a text's words
            elif isinstance(word, str):
                out.append(self.text(word) if any(space in word for space in " \t\n") else self.token(word, previous))
                previous = word
            else:
                out.append(self.value(word))
                previous = None
        return out

    def text(self, text: str) -> str:
        if "/" not in text:
            return text
        pieces = re.split(r"(\s+)", text)
        return "".join(self.words(pieces))

    def value(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, Mapping):
            return {key: self.value(item) for key, item in value.items()}
        if isinstance(value, (list, tuple)):
            return self.words(list(value))
        return value


def portable_paths(
    value: Any, *, root: str | os.PathLike | None = None, environ: Mapping[str, str] | None = None
) -> Any:
    """``value`` (a report, a command, a string) with no absolute path of this machine left in it.

    Reports are committed and published, so a checkout, work tree or temp folder of the machine that made them
    would show to every reader, and the command could not be rerun as written. Each absolute path becomes:
    relative to ``root`` (default: the git checkout holding the working directory) when under it; ``$TRELLIS2_SRC``-
    style when under the folder of a ``*_SRC`` variable in ``environ`` (default ``os.environ``); after a flag, the
    flag's metavar (``--weights-dir`` and a temp folder -> ``--weights-dir WEIGHTS_DIR``); else ``DIR/<its name>`` (an
    interpreter keeps just its name). System locations (:data:`SYSTEM_PREFIXES`) and strings that are no path here
    stay. Applying it twice changes nothing.
    """
    root_path = Path(root) if root is not None else _checkout_root(Path.cwd())
    return _PortablePaths(root_path, os.environ if environ is None else environ).value(value)


def build_report(
    kind: str,
    delivery: str,
    *,
    random_weights: bool,
    evidence: Mapping[str, Any] | None = None,
    environment: Mapping[str, Any] | None = None,
    command: Iterable[str] | None = None,
    **sections: Any,
) -> dict[str, Any]:
    """A JSON-ready run report. ``sections`` (e.g. ``timing=``, ``results=``) are stored with :func:`portable_paths`."""
    return portable_paths(
        {
            "schema_version": SCHEMA_VERSION,
            "kind": kind,
            "delivery": delivery,
            "created_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "command": list(command if command is not None else sys.argv),
            "random_weights": bool(random_weights),
            "environment": dict(environment or {}),
            "evidence": {key: format_evidence_value(value) for key, value in (evidence or {}).items()},
            **sections,
        }
    )


def peak_host_rss_mb() -> float:
    """This process's peak resident memory so far (``getrusage``; Linux reports KiB), the evidence key
    ``PEAK_HOST_RSS_MB``: what offloading a model to the host costs."""
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


@dataclasses.dataclass(frozen=True)
class RunRecord:
    """What every delivery's run report holds alike, built in one place: the documented evidence head of a run
    (:data:`EVIDENCE_KEYS`) and the report around the delivery's own sections, fingerprinted on the run's device and
    the delivery's checkout (its git commit)."""

    delivery_dir: Path
    device: Any
    random_weights: bool

    def evidence_head(
        self,
        *,
        model_device: Any,
        output_device: Any = None,
        cpu_fallback: bool,
        output_shape: Sequence[int],
        latent_shape: Sequence[int] | None = None,
        total_ms: Sequence[float] = (),
        peak_memory_bytes: int | None = None,
    ) -> dict[str, Any]:
        """The documented keys of one run: devices (``output_device`` defaults to the run's), shapes, the median and
        p90 of ``total_ms`` (one time per timed run; omitted when empty) and the device's peak memory."""
        from .device import device_string
        from .timing import TimingStats

        head: dict[str, Any] = {
            "INPUT_DEVICE": device_string(self.device),
            "MODEL_DEVICE": model_device if isinstance(model_device, str) else device_string(model_device),
            "OUTPUT_DEVICE": device_string(self.device if output_device is None else output_device),
            "CPU_FALLBACK": bool(cpu_fallback),
        }
        if latent_shape is not None:
            head["LATENT_SHAPE"] = list(latent_shape)
        head["OUTPUT_SHAPE"] = list(output_shape)
        if total_ms:
            total = TimingStats.from_samples(total_ms)
            head |= {"TIMING_MEDIAN_MS": total.median_ms, "TIMING_P90_MS": total.p90_ms}
        head["PEAK_MEMORY_MB"] = None if peak_memory_bytes is None else peak_memory_bytes / 2**20
        return head

    def report(self, kind: str, evidence: Mapping[str, Any], **sections: Any) -> dict[str, Any]:
        """:func:`delivery_report` of this run, with its evidence."""
        return delivery_report(
            kind,
            self.delivery_dir,
            device=self.device,
            random_weights=self.random_weights,
            evidence=evidence,
            **sections,
        )


def delivery_report(
    kind: str, delivery_dir: str | os.PathLike, *, device: Any, random_weights: bool, **sections: Any
) -> dict[str, Any]:
    """:func:`build_report` for the delivery in ``delivery_dir`` (named by its folder), fingerprinted on ``device``.

    What a delivery's scripts and benchmarks write: the git commit is read from the delivery's own checkout.
    """
    delivery_dir = Path(delivery_dir)
    return build_report(
        kind,
        delivery_dir.name,
        random_weights=random_weights,
        environment=environment_fingerprint(device, delivery_dir),
        **sections,
    )


def write_report(path: str | os.PathLike, report: Mapping[str, Any]) -> Path:
    """Write a report atomically (a reader never sees half a file), with :func:`portable_paths` (also what was added
    after :func:`build_report`)."""
    return write_json_atomic(path, portable_paths(report))


def load_report(path: str | os.PathLike) -> dict[str, Any]:
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)
