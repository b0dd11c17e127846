"""Synchronized timing: benchmarks of a callable and per-stage timers for pipelines.

Accelerator kernels run asynchronously, so a clock read right after a call returns measures only the launch.
Every timed region here synchronizes the device before starting the clock and again before stopping it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .device import synchronize

if TYPE_CHECKING:
    import torch


@dataclass
class TimingStats:
    """Summary of repeated timings, in milliseconds.

    ``std_ms`` is the sample standard deviation (``ddof=1``), an estimate of the run-to-run spread; it is 0.0 for a
    single sample, where no spread can be estimated. ``p90_ms`` is the 90th percentile with linear interpolation.
    """

    median_ms: float
    mean_ms: float
    std_ms: float
    p90_ms: float
    min_ms: float
    max_ms: float
    samples_ms: list[float]
    warmup: int
    repeat: int

    @classmethod
    def from_samples(cls, samples_ms: Sequence[float], warmup: int = 0) -> TimingStats:
        """Summarize ``samples_ms`` (one timing per repetition); ``warmup`` only records how many runs preceded."""
        samples = np.asarray(samples_ms, dtype=np.float64)
        if samples.ndim != 1 or samples.size == 0:
            raise ValueError(f"samples_ms must be a non-empty sequence of numbers, got shape {samples.shape}")
        repeat = int(samples.size)
        return cls(
            median_ms=float(np.median(samples)),
            mean_ms=float(samples.mean()),
            std_ms=float(samples.std(ddof=1)) if repeat > 1 else 0.0,
            p90_ms=float(np.percentile(samples, 90, method="linear")),
            min_ms=float(samples.min()),
            max_ms=float(samples.max()),
            samples_ms=samples.tolist(),
            warmup=warmup,
            repeat=repeat,
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _check_count(name: str, value: int, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def benchmark(
    fn: Callable[[], Any],
    warmup: int = 3,
    repeat: int = 10,
    device: torch.device | str | None = None,
) -> TimingStats:
    """Time ``fn`` over ``repeat`` runs after ``warmup`` untimed runs (compilation, caches, allocator growth).

    Each run is bracketed by ``synchronize(device)`` inside the clock, so queued accelerator work is counted.
    The timed region holds only the two synchronizations, ``fn`` and two clock reads, to keep the harness
    overhead far below the duration of any kernel worth measuring.
    """
    _check_count("warmup", warmup, minimum=0)
    _check_count("repeat", repeat, minimum=1)
    for _ in range(warmup):
        fn()

    clock = time.perf_counter
    seconds = [0.0] * repeat
    for i in range(repeat):
        synchronize(device)
        start = clock()
        fn()
        synchronize(device)
        seconds[i] = clock() - start
    return TimingStats.from_samples([s * 1000.0 for s in seconds], warmup=warmup)


def repeat_runs(fn: Callable[[], Any], warmup: int = 0, runs: int = 1) -> list[Any]:
    """``fn()`` ``warmup`` times untimed, then ``runs`` times; the results of the counted runs, for --bench loops
    whose function times its own stages (a :class:`Stopwatch` inside)."""
    _check_count("warmup", warmup, minimum=0)
    _check_count("repeat", runs, minimum=1)
    for _ in range(warmup):
        fn()
    return [fn() for _ in range(runs)]


class Stopwatch:
    """Wall time per pipeline stage, synchronized with the device at each stage's entry and exit.

    ``with sw.stage("decode"): ...`` adds the elapsed milliseconds to that stage, so a stage run in a loop
    accumulates. A stage whose block raises is not recorded. ``total_ms`` is the sum of the stages, so nested
    stages are counted twice.
    """

    def __init__(self, device: torch.device | str | None = None):
        self.device = device
        self._stages: dict[str, float] = {}

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        synchronize(self.device)
        start = time.perf_counter()
        yield
        synchronize(self.device)
        elapsed_ms = (time.perf_counter() - start) * 1000.0
        self._stages[name] = self._stages.get(name, 0.0) + elapsed_ms

    @property
    def stages(self) -> dict[str, float]:
        """Milliseconds per stage, in the order the stages first ran (a copy)."""
        return dict(self._stages)

    @property
    def total_ms(self) -> float:
        return sum(self._stages.values())

    def to_dict(self) -> dict[str, Any]:
        return {"stages_ms": self.stages, "total_ms": self.total_ms}

    @contextlib.contextmanager
    def timed_calls(
        self, calls: Mapping[tuple[Any, str], str], results: dict[str, Any] | None = None
    ) -> Iterator[None]:
        """While the block runs, every call of ``obj.name`` is the stage ``calls[(obj, name)]`` (its last result in
        ``results[stage]``): how to time the steps inside a third-party ``run()`` without editing it
        (:func:`shadowed`)."""

        def timed(stage: str) -> Callable[[Callable], Callable]:
            def wrapper(original: Callable) -> Callable:
                def call(*args: Any, **kwargs: Any) -> Any:
                    with self.stage(stage):
                        value = original(*args, **kwargs)
                    if results is not None:
                        results[stage] = value
                    return value

                return call

            return wrapper

        with shadowed({target: timed(stage) for target, stage in calls.items()}):
            yield


@contextlib.contextmanager
def shadowed(wrappers: Mapping[tuple[Any, str], Callable[[Callable], Callable]]) -> Iterator[None]:
    """Shadow each ``obj.name`` by ``wrapper(original)`` on that instance only while the block runs; afterwards, even
    on error, the instance is as it was (an attribute it held itself is put back, else the shadow is deleted)."""
    missing = object()
    saved: list[tuple[Any, str, Any]] = []
    try:
        for (obj, name), wrapper in wrappers.items():
            own = vars(obj).get(name, missing)
            setattr(obj, name, wrapper(getattr(obj, name)))
            saved.append((obj, name, own))
        yield
    finally:
        for obj, name, own in reversed(saved):
            if own is missing:
                delattr(obj, name)
            else:
                setattr(obj, name, own)


def benchmark_alternating(
    variants: dict[str, Callable[[], Any]], rounds: int, device: torch.device | str | None = None
) -> dict[str, list[float]]:
    """Time every variant once per round, rotating which goes first; return the samples (ms) per variant.

    Comparing variants side by side in one process, round by round, lets slow drifts of a shared machine hit all
    of them alike; :func:`paired_ratio` then compares them round by round.
    """
    _check_count("rounds", rounds, 1)
    names = list(variants)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(rounds):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            samples[name].extend(benchmark(variants[name], warmup=0, repeat=1, device=device).samples_ms)
    return samples


def paired_ratio(samples: dict[str, list[float]], numerator: str, denominator: str) -> float:
    """Median over rounds of ``numerator / denominator`` (samples from :func:`benchmark_alternating`)."""
    pairs = zip(samples[numerator], samples[denominator], strict=True)
    return float(np.median([a / b for a, b in pairs]))
