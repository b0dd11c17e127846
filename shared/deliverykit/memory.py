"""Host and device memory measured around a call: resident set sampling, peak growth.

Kept apart from :mod:`.device` (which resolves and drives devices) because it is measurement: the benchmarks and
the loaders' memory tests use it, the runs themselves never need it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .device import backend

if TYPE_CHECKING:
    import torch

_STATUS_FIELDS = {"VmRSS": "rss", "RssAnon": "anon", "RssFile": "file", "VmHWM": "rss_peak"}


def resident_memory() -> dict[str, int] | None:
    """This process's resident set in bytes: ``rss`` = ``anon`` (heap: tensors) + ``file`` (+ shared memory).

    ``file`` counts pages of memory-mapped files, which the kernel can drop and re-read at any time: a loader that
    reads through ``mmap`` (safetensors) grows ``file`` by what it touched, while only ``anon`` is a copy the
    process owns. From ``/proc/self/status`` (Linux); None where it is missing.
    """
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            lines = status.read().splitlines()
    except OSError:
        return None
    found = {}
    for line in lines:
        key, _, value = line.partition(":")
        if key in _STATUS_FIELDS:
            found[_STATUS_FIELDS[key]] = int(value.split()[0]) * 1024  # reported in kB
    if not {"rss", "anon", "file"} <= set(found):
        return None
    found.setdefault("rss_peak", found["rss"])
    return found


def _reset_peak_rss() -> bool:
    """Reset the kernel's resident-set high-water mark (``VmHWM``) to the current size (Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as clear_refs:
            clear_refs.write("5")
        return True
    except OSError:
        return False


def peak_resident_growth(fn: Callable[[], Any], interval_s: float = 0.001) -> tuple[Any, dict[str, int] | None]:
    """Run ``fn`` once while a thread samples :func:`resident_memory`; return ``(result, peak growth per field)``.

    Fields ``rss``, ``anon``, ``file``, each peak taken on its own (those of ``anon`` and ``file`` need not
    coincide). ``rss`` is exact where the kernel's high-water mark can be reset (Linux); ``anon`` and ``file`` are
    sampled, so an allocation freed within about ``interval_s`` (or while the sampler waits for a busy CPU) can be
    missed, and the OS may reuse freed pages. None without /proc.
    """
    import threading
    import time

    exact_rss = _reset_peak_rss()
    before = resident_memory()
    if before is None:
        return fn(), None
    peak, started, done = dict(before), threading.Event(), threading.Event()

    def sample() -> None:
        while not done.is_set():
            for key, value in (resident_memory() or {}).items():
                peak[key] = max(peak[key], value)
            started.set()
            time.sleep(interval_s)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started.wait(timeout=1.0)
    try:
        result = fn()
    finally:
        done.set()
        sampler.join()
    for key, value in (resident_memory() or {}).items():
        peak[key] = max(peak[key], value)
    if exact_rss:
        peak["rss"] = max(peak["rss"], peak["rss_peak"])
    return result, {key: peak[key] - before[key] for key in ("rss", "anon", "file")}


def peak_memory_growth(fn: Callable[[], Any], device: torch.device | str) -> tuple[Any, int | None, str]:
    """Run ``fn`` once; return ``(result, peak bytes above the start, how it was measured)``.

    Accelerators report their allocator's peak. The CPU has no allocator counter in torch, so a thread samples the
    process's resident set every millisecond (:func:`peak_resident_growth`; an estimate: the OS may reuse freed
    pages); None where neither works.
    """
    runtime = backend(device)
    if runtime.type != "cpu":
        runtime.synchronize()
        runtime.empty_cache()
        runtime.reset_peak_memory_stats()
        before = runtime.max_memory_allocated()  # right after a reset, the peak is the current allocation
        result = fn()
        runtime.synchronize()
        peak = runtime.max_memory_allocated()
        growth = None if peak is None or before is None else peak - before
        return result, growth, "max_memory_allocated growth"
    result, growth = peak_resident_growth(fn)
    if growth is None:
        return result, None, "not measurable here"
    return result, growth["rss"], "RSS growth (sampled)"
