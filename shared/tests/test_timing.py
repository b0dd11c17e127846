from __future__ import annotations

import math
import time

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


class FakeClock:
    """``time.perf_counter`` that moves only when the test says: durations become exact, whatever the machine's load."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(time, "perf_counter", fake)
    return fake


def test_benchmark_synchronizes_inside_the_clock(monkeypatch, clock):
    """Work waited for by synchronize (queued accelerator kernels) must be part of each sample."""
    syncs = []

    def synchronize(device=None):
        syncs.append(device)
        clock.advance(0.005)

    monkeypatch.setattr(timing, "synchronize", synchronize)
    stats = benchmark(lambda: clock.advance(0.001), warmup=0, repeat=3)
    # one synchronize before the clock starts, the trailing one inside it: 1 ms of work + 5 ms waited for
    assert stats.samples_ms == pytest.approx([6.0] * 3) and len(syncs) == 6


def test_benchmark_samples_are_what_the_function_took(sync_calls, clock):
    durations = iter([0.02, 0.03, 0.01, 0.05, 0.04, 0.02])  # the first is the warmup run
    stats = benchmark(lambda: clock.advance(next(durations)), warmup=1, repeat=5)
    assert stats.samples_ms == pytest.approx([30.0, 10.0, 50.0, 40.0, 20.0])
    assert stats.median_ms == pytest.approx(30.0)


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


def test_stopwatch_accumulates_stages(sync_calls, clock):
    sw = Stopwatch("cpu")
    with sw.stage("load"):
        clock.advance(0.01)
    clock.advance(1.0)  # between stages: not counted
    for seconds in (0.02, 0.005):
        with sw.stage("denoise"):
            clock.advance(seconds)

    stages = sw.stages
    assert list(stages) == ["load", "denoise"]
    assert stages == pytest.approx({"load": 10.0, "denoise": 25.0})
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


class Pipeline:
    """A third-party pipeline whose ``run()`` calls its own steps: what ``Stopwatch.timed_calls`` times."""

    def __init__(self, clock: FakeClock):
        self.clock = clock
        self.decode = self.own_decode  # an attribute of the instance itself, put back afterwards

    def encode(self, x: int) -> int:
        self.clock.advance(0.002)
        return x + 1

    def own_decode(self, x: int) -> int:
        self.clock.advance(0.003)
        return 2 * x

    def run(self, x: int) -> int:
        return self.decode(self.encode(x) + self.encode(x))


def test_timed_calls_time_the_steps_inside_a_run_and_leave_the_object_as_it_was(sync_calls, clock):
    pipeline, sw, results = Pipeline(clock), Stopwatch(), {}
    decode = pipeline.decode
    with sw.timed_calls({(pipeline, "encode"): "encode", (pipeline, "decode"): "decode"}, results):
        assert pipeline.run(1) == 8
    assert sw.stages == pytest.approx({"encode": 4.0, "decode": 3.0})  # two encodes accumulate
    assert results == {"encode": 2, "decode": 8}  # the last result of each
    assert "encode" not in vars(pipeline) and pipeline.decode == decode  # the shadow deleted, the own one put back
    assert pipeline.run(1) == 8 and sw.stages == pytest.approx({"encode": 4.0, "decode": 3.0})  # untimed now


def test_shadowed_restores_on_error_and_after_a_failed_install(sync_calls, clock):
    pipeline = Pipeline(clock)

    def broken(original):
        raise RuntimeError("cannot wrap")

    with (
        pytest.raises(RuntimeError, match="cannot wrap"),
        timing.shadowed({(pipeline, "encode"): lambda original: lambda x: -x, (pipeline, "run"): broken}),
    ):
        pass
    assert "encode" not in vars(pipeline) and pipeline.encode(1) == 2
    negate = {(pipeline, "encode"): lambda original: lambda x: -x}
    with pytest.raises(ValueError, match="in the block"), timing.shadowed(negate):
        assert pipeline.run(1) == -4  # decode(-1 + -1)
        raise ValueError("in the block")
    assert "encode" not in vars(pipeline)


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
