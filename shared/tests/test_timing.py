from __future__ import annotations

import math
import statistics
import time

import numpy as np
import pytest

from deliverykit import timing
from deliverykit.timing import Stopwatch, TimingStats, benchmark


@pytest.fixture
def sync_calls(monkeypatch):
    """Replace the device synchronization with a recorder of the devices it was called with."""
    calls = []
    monkeypatch.setattr(timing, "synchronize", lambda device=None: calls.append(device))
    return calls


def test_stats_from_known_samples():
    stats = TimingStats.from_samples([float(v) for v in range(10, 0, -1)], warmup=2)

    assert stats.median_ms == 5.5
    assert stats.mean_ms == 5.5
    # sample std of 1..10: sqrt(sum((v - 5.5)^2) / 9) = sqrt(82.5 / 9)
    assert stats.std_ms == pytest.approx(math.sqrt(82.5 / 9))
    # linear percentile: position 0.9 * (10 - 1) = 8.1 between sorted values 9 and 10
    assert stats.p90_ms == pytest.approx(9.1)
    assert (stats.min_ms, stats.max_ms) == (1.0, 10.0)
    assert stats.samples_ms == [float(v) for v in range(10, 0, -1)]
    assert (stats.warmup, stats.repeat) == (2, 10)


def test_stats_single_sample_has_zero_std():
    stats = TimingStats.from_samples([4.0])
    assert stats.std_ms == 0.0
    assert stats.p90_ms == stats.median_ms == 4.0


def test_stats_rejects_empty_samples():
    with pytest.raises(ValueError, match="non-empty"):
        TimingStats.from_samples([])


def test_stats_to_dict_is_json_ready():
    data = TimingStats.from_samples([1.0, 3.0]).to_dict()
    assert data == {
        "median_ms": 2.0,
        "mean_ms": 2.0,
        "std_ms": pytest.approx(math.sqrt(2.0)),
        "p90_ms": pytest.approx(2.8),
        "min_ms": 1.0,
        "max_ms": 3.0,
        "samples_ms": [1.0, 3.0],
        "warmup": 0,
        "repeat": 2,
    }


def test_benchmark_call_counts(sync_calls):
    calls = []
    stats = benchmark(lambda: calls.append(len(sync_calls)), warmup=3, repeat=5, device="cpu")

    assert len(calls) == 3 + 5
    assert len(sync_calls) == 2 * 5
    assert set(sync_calls) == {"cpu"}
    # warmup runs are not synchronized; every timed run sees one synchronize before it
    assert calls == [0, 0, 0, 1, 3, 5, 7, 9]
    assert (stats.warmup, stats.repeat, len(stats.samples_ms)) == (3, 5, 5)


def test_benchmark_synchronizes_inside_the_clock(monkeypatch):
    """Work waited for by synchronize (queued accelerator kernels) must be part of each sample."""
    monkeypatch.setattr(timing, "synchronize", lambda device=None: time.sleep(0.005))
    stats = benchmark(lambda: None, warmup=0, repeat=3)
    # only the trailing synchronize is inside the clock
    assert stats.min_ms >= 4.5
    assert stats.median_ms < 9.0


def test_benchmark_sleep_median():
    stats = benchmark(lambda: time.sleep(0.02), warmup=1, repeat=5)
    assert 19.5 <= stats.median_ms < 35.0
    assert stats.min_ms >= 19.5


def test_benchmark_overhead_is_tiny():
    """The harness may add at most 1% of a 10 ms function, i.e. 0.1 ms, to each sample."""
    inner_ms = []

    def fn():
        start = time.perf_counter()
        sum(range(1000))
        inner_ms.append((time.perf_counter() - start) * 1000.0)

    stats = benchmark(fn, warmup=0, repeat=50, device="cpu")  # the real (CPU no-op) synchronize
    overhead_ms = np.asarray(stats.samples_ms) - np.asarray(inner_ms)
    assert statistics.median(overhead_ms) < 0.1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"warmup": -1}, r"warmup must be an integer >= 0, got -1"),
        ({"repeat": 0}, r"repeat must be an integer >= 1, got 0"),
        ({"repeat": 2.5}, r"repeat must be an integer >= 1, got 2.5"),
    ],
)
def test_benchmark_validates_counts(kwargs, message):
    calls = []
    with pytest.raises(ValueError, match=message):
        benchmark(lambda: calls.append(1), **kwargs)
    assert calls == []


def test_stopwatch_accumulates_stages(sync_calls):
    sw = Stopwatch("cpu")
    with sw.stage("load"):
        time.sleep(0.01)
    for _ in range(2):
        with sw.stage("denoise"):
            time.sleep(0.01)

    stages = sw.stages
    assert list(stages) == ["load", "denoise"]
    assert 9.5 <= stages["load"] < 30.0
    assert 19.0 <= stages["denoise"] < 50.0
    assert sw.total_ms == pytest.approx(stages["load"] + stages["denoise"])
    assert sync_calls == ["cpu"] * 6
    assert sw.to_dict() == {"stages_ms": stages, "total_ms": sw.total_ms}


def test_stopwatch_stages_is_a_copy_and_failed_stage_is_not_recorded(sync_calls):
    sw = Stopwatch()
    with pytest.raises(RuntimeError), sw.stage("broken"):
        raise RuntimeError("boom")
    sw.stages["injected"] = 1.0
    assert sw.stages == {}
    assert sw.total_ms == 0.0


def test_benchmark_alternating_rotates_and_pairs(monkeypatch):
    calls = []
    variants = {name: (lambda name=name: calls.append(name)) for name in ("a", "b", "c")}
    samples = timing.benchmark_alternating(variants, rounds=3)
    assert calls == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]  # who goes first rotates
    assert {name: len(values) for name, values in samples.items()} == {"a": 3, "b": 3, "c": 3}
    ratio = timing.paired_ratio({"x": [2.0, 9.0, 4.0], "y": [1.0, 3.0, 1.0]}, "x", "y")
    assert ratio == 3.0  # median of the per-round ratios 2, 3, 4 (the ratio of the medians would be 4/1)
    with pytest.raises(ValueError, match="rounds"):
        timing.benchmark_alternating(variants, rounds=0)
