"""README backfill: figures in a README are rendered from results JSON, never typed by hand.

A README marks each generated section with ``<!-- NAME:BEGIN -->`` and ``<!-- NAME:END -->``. A results file is a
run report (see ``report.py``) whose ``results.tables`` lists ``{"title", "columns", "rows"}``; the section gets
those tables plus one provenance line (device, versions, weights, date, command, file). Running the backfill twice
changes nothing; a README with missing or unbalanced markers is refused untouched.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from deliverykit.errors import DeliveryError, ExitCode
from deliverykit.files import write_text_atomic
from deliverykit.report import SCHEMA_VERSION, load_report


class ReadmeError(DeliveryError):
    exit_code = ExitCode.INPUT


def _markers(name: str) -> tuple[str, str]:
    return f"<!-- {name}:BEGIN -->", f"<!-- {name}:END -->"


def _format_cell(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e5):
            return f"{value:.3g}"
        return f"{value:.4g}" if abs(value) < 10 else f"{value:.2f}"
    return str(value).replace("|", "\\|")


def render_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        if len(row) != len(columns):
            raise ReadmeError(f"a results row has {len(row)} cells for {len(columns)} columns; regenerate the results")
        lines.append("| " + " | ".join(_format_cell(cell) for cell in row) + " |")
    return "\n".join(lines)


def provenance_line(report: Mapping[str, Any], results_path: str) -> str:
    env = report.get("environment", {})
    packages = env.get("packages", {})
    versions = ", ".join(f"{name} {version}" for name, version in packages.items() if version)
    weights = "random weights (architecture-faithful)" if report.get("random_weights") else "real weights"
    device = env.get("device") or "?"
    name = env.get("device_name")
    device_text = f"{device} ({name})" if name else device
    cann = f", CANN {env['cann']}" if env.get("cann") else ""
    commit = env.get("git_commit") or "n/a"
    command = " ".join(report.get("command", []))
    return (
        f"*Measured on {device_text}, {weights}; {versions}{cann}; commit {commit}; "
        f"{report.get('created_utc', '?')}. Source: [`{results_path}`]({results_path}), made by `{command}`.*"
    )


def render_section(report: Mapping[str, Any], results_path: str) -> str:
    """The Markdown that goes between one section's markers."""
    if not isinstance(report, Mapping):
        raise ReadmeError(
            f"{results_path} holds a JSON {type(report).__name__}, not a run report object; pass the results file "
            "the delivery's command writes (or regenerate it)"
        )
    if report.get("schema_version") != SCHEMA_VERSION or not isinstance(report.get("results"), Mapping):
        raise ReadmeError(
            f"{results_path} is not a run report of schema_version {SCHEMA_VERSION} with a 'results' object; "
            "regenerate it with the delivery's command"
        )
    tables = report["results"].get("tables")
    if not tables:
        raise ReadmeError(f"{results_path} has no results.tables to render; regenerate it with the delivery's command")
    parts = []
    for table in tables:
        if table.get("title"):
            parts.append(f"**{table['title']}**\n")
        parts.append(render_table(table["columns"], table["rows"]) + "\n")
    parts.append(provenance_line(report, results_path))
    return "\n".join(parts)


def replace_section(text: str, name: str, body: str) -> str:
    """Replace what lies between the markers of ``name``; refuse missing, repeated or out-of-order markers."""
    begin, end = _markers(name)
    if text.count(begin) != 1 or text.count(end) != 1:
        raise ReadmeError(
            f"README needs exactly one '{begin}' and one '{end}' (found {text.count(begin)} and {text.count(end)}); "
            "add the marker pair where the table should go"
        )
    start, stop = text.index(begin) + len(begin), text.index(end)
    if stop < start:
        raise ReadmeError(f"'{end}' comes before '{begin}' in the README; swap them")
    return text[:start] + "\n" + body.strip("\n") + "\n" + text[stop:]


def backfill(readme: str | os.PathLike, results: Mapping[str, str | os.PathLike]) -> bool:
    """Fill each section ``name -> results file`` of ``readme``; return True when the file changed.

    Every section is rendered before anything is written, so an error leaves the README untouched.
    """
    readme = Path(readme)
    if not readme.is_file():
        raise ReadmeError(f"README {readme} does not exist; pass the delivery's README.md with --readme")
    try:
        original = readme.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ReadmeError(
            f"README {readme} is not UTF-8 text (byte 0x{err.object[err.start]:02x} at offset {err.start}); "
            "convert it to UTF-8 (e.g. iconv -t UTF-8) and run again"
        ) from None
    text = original
    for name, results_file in results.items():
        results_file = Path(results_file)
        if not results_file.is_file():
            raise ReadmeError(f"results file {results_file} does not exist; run the command that writes it first")
        try:
            report = load_report(results_file)
        except ValueError as err:
            raise ReadmeError(f"results file {results_file} is not valid JSON ({err}); regenerate it") from err
        relative = os.path.relpath(results_file.resolve(), readme.resolve().parent).replace(os.sep, "/")
        text = replace_section(text, name, render_section(report, relative))
    if text == original:
        return False
    write_text_atomic(readme, text)
    return True


_SECTION_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


def section_name_for(results_file: str | os.PathLike) -> str:
    """Default section name of a results file: its stem (``results/accuracy.json`` → ``accuracy``)."""
    name = Path(results_file).stem
    if not _SECTION_NAME.match(name):
        raise ReadmeError(f"cannot use {name!r} as a section name; pass --section NAME")
    return name
