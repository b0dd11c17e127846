"""deliverykit.batch: checked before loading, one claim per item, resumable after SIGKILL, shared by ranks."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from deliverykit import batch
from deliverykit.errors import DeliveryError, ExitCode, InputError

WORKER = Path(__file__).with_name("batch_worker.py")
FIELDS = {"prompt": str, "seed": int, "steps": int, "image": str, "guidance": float}


def _jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return path


def _six(tmp_path: Path, changes: dict[int, dict] | None = None) -> Path:
    changes = changes or {}
    rows = [{"prompt": f"item {i}", "seed": i, "output": f"item{i}", **changes.get(i, {})} for i in range(6)]
    return _jsonl(tmp_path / "batch.jsonl", rows)


def _worker(*args, env=None, **kwargs) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, str(WORKER), *map(str, args)],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=120,
        **kwargs,
    )


def test_jsonl_text_and_folder_batches(tmp_path):
    items = batch.read_batch(
        _jsonl(tmp_path / "b.jsonl", [{"prompt": "a", "seed": 3}, "", {"prompt": "b", "output": "x"}]), FIELDS
    )
    assert [(i.index, i.name, i.fields) for i in items] == [
        (0, "00000", {"prompt": "a", "seed": 3}),
        (1, "x", {"prompt": "b"}),
    ]
    assert items[1].source.endswith("b.jsonl:3")  # the line number in the file, blank lines counted

    (tmp_path / "p.txt").write_text("# a comment\na cat\n\na dog\n")
    assert [i.fields for i in batch.read_batch(tmp_path / "p.txt", FIELDS)] == [
        {"prompt": "a cat"},
        {"prompt": "a dog"},
    ]

    folder = tmp_path / "photos"
    folder.mkdir()
    for name in ("b.png", "a.JPG", "notes.txt"):
        (folder / name).write_bytes(b"x")
    items = batch.read_batch(folder, FIELDS, image_field="image")
    assert [(i.name, Path(i.fields["image"]).name) for i in items] == [("a", "a.JPG"), ("b", "b.png")]


def test_relative_image_paths_are_taken_from_the_batch_files_folder(tmp_path):
    items = batch.read_batch(_jsonl(tmp_path / "b.jsonl", [{"image": "in/cat.png"}]), FIELDS, image_field="image")
    assert items[0].fields["image"] == str(tmp_path / "in" / "cat.png")


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"prompt": "a"', r"b.jsonl:2: not JSON .*write one JSON object a line"),
        ('["a"]', r"b.jsonl:2: a JSON list, not an object"),
        ('{"prompt": "a", "colour": 1}', r"b.jsonl:2: unknown field 'colour'; accepted: guidance, image, output"),
        ('{"prompt": "a", "seed": "1"}', r"b.jsonl:2: seed must be int, got \"1\""),
        ('{"prompt": "a", "seed": true}', r"b.jsonl:2: seed must be int, got true"),
        ('{"prompt": "a", "output": "../x"}', r"b.jsonl:2: output '../x' is not a plain folder name"),
        ('{"prompt": "a", "output": "one"}', r"b.jsonl:2: output 'one' is also the output of .*b.jsonl:1"),
        ('{"seed": 1}', r"b.jsonl:2: missing prompt; every request needs prompt"),
        ('{"prompt": "a", "steps": 0}', r"b.jsonl:2: steps 0: need at least 1"),
    ],
)
def test_a_bad_line_is_a_usage_error_naming_its_line(tmp_path, line, message):
    path = _jsonl(tmp_path / "b.jsonl", [{"prompt": "first", "output": "one"}, line])

    def check(fields):
        if fields.get("steps", 1) < 1:
            raise DeliveryError(f"steps {fields['steps']}: need at least 1")

    with pytest.raises(DeliveryError, match=message) as caught:
        batch.read_batch(path, FIELDS, required=("prompt",), check=check)
    assert caught.value.exit_code == ExitCode.USAGE


def test_float_fields_take_integers_and_other_inputs_are_refused(tmp_path):
    assert batch.read_batch(_jsonl(tmp_path / "b.jsonl", [{"guidance": 3}]), FIELDS)[0].fields == {"guidance": 3}
    (tmp_path / "bad.txt").write_bytes(b"fine\n\xff\xfe\n")
    with pytest.raises(DeliveryError, match=r"bad.txt:2: not valid UTF-8"):
        batch.read_batch(tmp_path / "bad.txt", FIELDS)
    with pytest.raises(DeliveryError, match="holds no request"):
        batch.read_batch(_jsonl(tmp_path / "empty.jsonl", [""]), FIELDS)
    with pytest.raises(InputError, match="cannot read --batch"):
        batch.read_batch(tmp_path / "missing.jsonl", FIELDS)
    with pytest.raises(DeliveryError, match="takes no image input"):
        batch.read_batch(tmp_path, FIELDS)


def test_ranks_take_every_nth_item():
    items = [batch.BatchItem(i, f"i{i}", {}, "") for i in range(7)]
    assert [i.index for i in batch.Ranks(1, 3).share(items)] == [1, 4]
    assert batch.Ranks.from_env({"RANK": "2", "WORLD_SIZE": "4"}) == batch.Ranks(2, 4)
    assert batch.Ranks.from_env({}) == batch.Ranks(0, 1)
    with pytest.raises(DeliveryError, match="not below WORLD_SIZE"):
        batch.Ranks.from_env({"RANK": "4", "WORLD_SIZE": "4"})


def _outputs(folder: Path) -> dict[str, np.ndarray]:
    return {p.parent.name: np.load(p) for p in sorted(folder.glob("*/out.npy"))}


def test_six_items_done_rerun_skips_them_and_overwrite_redoes_them(tmp_path):
    out = tmp_path / "out"
    done = _worker(_six(tmp_path), out)
    assert done.returncode == 0, done.stderr
    outputs = _outputs(out)
    assert sorted(outputs) == [f"item{i}" for i in range(6)]
    for i in range(6):  # what a single run with that seed gives
        np.testing.assert_array_equal(outputs[f"item{i}"], np.random.default_rng(i).standard_normal(8))
    summary = json.loads((out / "batch.json").read_text())
    assert (summary["total"], summary["done"], summary["failed"], summary["pending"]) == (6, 6, 0, 0)
    assert all(row["seconds"] >= 0 and row["rank"] == 0 for row in summary["items"])

    mtimes = {p: p.stat().st_mtime_ns for p in out.glob("item*/*")}
    again = _worker(_six(tmp_path), out)
    assert again.returncode == 0 and {p: p.stat().st_mtime_ns for p in out.glob("item*/*")} == mtimes
    redo = _worker(_six(tmp_path), out, "--overwrite")
    assert redo.returncode == 0 and all(p.stat().st_mtime_ns > mtimes[p] for p in mtimes)


def test_failing_items_are_recorded_and_the_others_done(tmp_path):
    out = tmp_path / "out"
    path = _six(tmp_path, {2: {"prompt": "make nan"}, 4: {"prompt": "boom"}})
    done = _worker(path, out)
    assert done.returncode == ExitCode.BATCH_PARTIAL
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: item2 ({path}:3): the output holds NaN; try another seed",
        f"error: item4 ({path}:5): TypeError: a bug in one item",
    ]
    assert "Traceback" in done.stderr  # the bug (TypeError), not the NaN, prints its traceback
    summary = json.loads((out / "batch.json").read_text())
    assert (summary["done"], summary["failed"]) == (4, 2)
    assert [(f["name"], f["exit_code"]) for f in summary["failures"]] == [("item2", 7), ("item4", 1)]
    assert not (out / "item2").exists() and not (out / "item4").exists()  # no partial output

    fixed = _six(tmp_path, {2: {"seed": 7}, 4: {"prompt": "fine now"}})
    rerun = _worker(fixed, out)  # the same names: failed items are retried, done ones skipped
    assert rerun.returncode == 0 and json.loads((out / "batch.json").read_text())["done"] == 6


def test_a_live_claim_is_respected_and_a_dead_ones_is_taken_over(tmp_path):
    claims = batch.Claims(tmp_path / "claims")
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        (tmp_path / "claims" / "a.claim").write_text(json.dumps({"pid": sleeper.pid, "host": socket.gethostname()}))
        assert not claims.acquire("a", rank=0)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert claims.acquire("a", rank=0)  # its owner is gone now
    assert json.loads((tmp_path / "claims" / "a.claim").read_text())["pid"] == os.getpid()
    assert not claims.acquire("a", rank=1)  # held by this live process
    claims.release("a")
    assert claims.acquire("a", rank=1)
    (tmp_path / "claims" / "b.claim").write_text(json.dumps({"pid": 1, "host": "another-host"}))
    assert not claims.acquire("b", rank=0)  # another host's process cannot be checked: left alone


def test_sigkill_in_the_middle_then_rerun_completes_without_rewriting(tmp_path):
    out = tmp_path / "out"
    path = _six(tmp_path)
    process = subprocess.Popen(
        [sys.executable, str(WORKER), str(path), str(out), "--sleep", "0.4"], stderr=subprocess.DEVNULL
    )

    def inside_an_item() -> bool:
        """Two items done and the next one claimed: killed now, the process leaves a claim behind. (Waiting for two
        reports only could kill it between releasing one claim and taking the next: on a loaded machine it did.)"""
        done = {p.parent.name for p in out.glob("*/report.json")}
        claimed = {p.stem for p in (out / ".batch" / "claims").glob("*.claim")}
        return len(done) >= 2 and bool(claimed - done)

    deadline = time.monotonic() + 60
    while not inside_an_item() and time.monotonic() < deadline:
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait()
    # the items done (report.json is committed last): one killed between its out.npy and its report may be redone
    first = {p.parent.name: (p.parent / "out.npy").stat().st_mtime_ns for p in out.glob("*/report.json")}
    assert 2 <= len(first) < 6
    assert list((out / ".batch" / "claims").glob("*.claim"))  # the killed process left its claim

    rerun = _worker(path, out)
    assert rerun.returncode == 0, rerun.stderr
    outputs = _outputs(out)
    assert len(outputs) == 6 and all(np.isfinite(v).all() for v in outputs.values())
    assert all((out / name / "out.npy").stat().st_mtime_ns == ns for name, ns in first.items())  # not redone
    assert not list((out / ".batch" / "claims").glob("*"))


def test_two_torchrun_ranks_do_each_item_once_with_the_single_process_outputs(tmp_path):
    single, shared = tmp_path / "single", tmp_path / "ranks"
    assert _worker(_six(tmp_path), single).returncode == 0
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
         "--master-port", str(port), str(WORKER), str(_six(tmp_path)), str(shared)],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((shared / "batch.json").read_text())
    assert summary["done"] == 6
    assert {row["name"]: row["rank"] for row in summary["items"]} == {f"item{i}": i % 2 for i in range(6)}
    mine, theirs = _outputs(shared), _outputs(single)
    assert mine.keys() == theirs.keys()
    for name in mine:  # the same seeded draw in another process: numpy's PCG64 is exact
        np.testing.assert_array_equal(mine[name], theirs[name])


def test_devices_spawns_one_rank_per_device(tmp_path):
    out = tmp_path / "out"
    done = _worker(_six(tmp_path), out, "--devices", "cpu,cpu")
    assert done.returncode == 0, done.stderr
    summary = json.loads((out / "batch.json").read_text())
    assert summary["done"] == 6 and sorted({row["rank"] for row in summary["items"]}) == [0, 1]
    assert {json.loads(p.read_text())["device"] for p in out.glob("item*/report.json")} == {"cpu"}


@pytest.mark.parametrize(
    ("value", "expected"),
    [("0,1", ["npu:0", "npu:1"]), ("cuda:0, cuda:3", ["cuda:0", "cuda:3"]), ("cpu,cpu", ["cpu", "cpu"])],
)
def test_devices_flag_values(value, expected):
    assert batch.parse_devices(value) == expected


@pytest.mark.parametrize(("value", "message"), [("0,0", "listed twice"), ("1", "at least 2"), ("0,gpu", "'gpu'")])
def test_bad_devices_flag_values(value, message):
    with pytest.raises(DeliveryError, match=message):
        batch.parse_devices(value)
