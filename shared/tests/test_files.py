"""deliverykit.files: the all-or-none commit of a run's outputs, its pre-flight check and the stale-temp sweep."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from deliverykit.errors import ExitCode, OutputError, run_main
from deliverykit.files import Outputs, RunOutputs, sweep_stale_temps, temp_name

SHARED = Path(__file__).resolve().parents[1]


def _dead_pid() -> int:
    """The PID of a process that has exited (a new process reusing it within the test is negligible)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _outputs(*paths: Path) -> Outputs:
    outputs = Outputs()
    for path in paths:
        outputs.add(path)
    return outputs


def test_commit_renames_every_file_together(tmp_path):
    a, b = tmp_path / "new" / "a.png", tmp_path / "new" / "report.json"
    outputs = _outputs(a, b)
    outputs.check()
    assert not (tmp_path / "new").exists()  # the check creates nothing
    with outputs.commit() as temps:
        assert temps[a].name == f".a.png.{os.getpid()}.tmp"
        temps[a].write_text("image")
        assert not a.exists()  # nothing final before the block ends
        temps[b].write_text("{}")
    assert a.read_text() == "image" and b.read_text() == "{}"
    assert sorted(p.name for p in a.parent.iterdir()) == ["a.png", "report.json"]


def test_failed_writer_leaves_no_file_and_keeps_the_previous_ones(tmp_path):
    previous = tmp_path / "report.json"
    previous.write_text("user's previous report")
    outputs = _outputs(tmp_path / "sub" / "a.png", previous)
    with pytest.raises(RuntimeError), outputs.commit() as temps:
        for temp in temps.values():
            temp.write_text("half")
        raise RuntimeError("the last writer failed")
    assert previous.read_text() == "user's previous report"
    assert list(tmp_path.iterdir()) == [previous]  # no temporaries, and the folder the run created is gone


def test_enospc_from_a_writer_is_one_exit_6_line(tmp_path, capsys):
    target = tmp_path / "out.jpg"

    def main():
        outputs = _outputs(target, tmp_path / "report.json")
        with outputs.commit() as temps:
            temps[tmp_path / "report.json"].write_text("{}")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(temps[target]))

    assert run_main(main) == ExitCode.OUTPUT
    err = capsys.readouterr().err
    assert err == f"error: cannot write {target} (No space left on device); free space or choose another --output\n"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("code", [errno.EDQUOT, errno.EROFS, errno.EACCES])
def test_other_write_location_errors_are_exit_6(tmp_path, code):
    outputs = _outputs(tmp_path / "out.jpg")
    pattern = r"cannot write .*out\.jpg .*; .*--output"
    with pytest.raises(OutputError, match=pattern) as info, outputs.commit():
        raise OSError(code, os.strerror(code))
    assert info.value.exit_code == ExitCode.OUTPUT and list(tmp_path.iterdir()) == []


def test_an_unrelated_os_error_is_not_disguised(tmp_path):
    with pytest.raises(OSError) as info, _outputs(tmp_path / "out.jpg").commit():
        raise OSError(errno.EIO, "I/O error")
    assert not isinstance(info.value, OutputError)


def test_check_names_a_folder_in_the_way_before_any_work(tmp_path):
    (tmp_path / "features.safetensors").mkdir()
    outputs = _outputs(tmp_path / "preview.png", tmp_path / "features.safetensors")
    with pytest.raises(OutputError, match=r"features\.safetensors is a folder, .*move it away or choose another"):
        outputs.check()
    with pytest.raises(OutputError), outputs.commit() as temps:
        pytest.fail(f"the block must not run: {temps}")
    assert [p.name for p in tmp_path.iterdir()] == ["features.safetensors"]


def test_check_names_a_file_where_a_folder_is_needed(tmp_path):
    (tmp_path / "out").write_text("a user's file")
    with pytest.raises(OutputError, match=r"out is a file, not a folder; choose another --report"):
        outputs = Outputs()
        outputs.add(tmp_path / "out" / "sub" / "report.json", "--report")
        outputs.check()
    assert (tmp_path / "out").read_text() == "a user's file"


def test_a_failed_rename_restores_the_files_already_replaced(tmp_path, monkeypatch):
    first, second = tmp_path / "a.png", tmp_path / "b.png"
    first.write_text("old a")
    real_replace = os.replace

    def replace(src, dst):
        if Path(dst) == second:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(dst))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(OutputError, match="No space left"), _outputs(first, second).commit() as temps:
        for temp in temps.values():
            temp.write_text("new")
    monkeypatch.setattr(os, "replace", real_replace)
    assert first.read_text() == "old a" and not second.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.png"]


def test_run_outputs_write_the_named_files_and_every_report_together(tmp_path):
    """Files by name, report.json beside the first and the --report copy: nothing before the commit, all after it,
    the report (set last, once the files are written) identical in both places."""
    image, copy = tmp_path / "out" / "image.png", tmp_path / "results" / "run.json"
    outputs = RunOutputs.declare({"image": image, "frame": tmp_path / "out" / "frame.png"}, copy)
    assert outputs["image"] == image and "frame" in outputs and "video" not in outputs
    assert outputs.reports == (tmp_path / "out" / "report.json", copy)
    assert not (tmp_path / "out").exists() and not (tmp_path / "results").exists()
    with outputs.commit() as commit:
        commit.files["image"].write_bytes(b"image")
        commit.files["frame"].write_bytes(b"frame")
        assert not image.exists()
        commit.report = {"written": sorted(commit.files)}
    assert image.read_bytes() == b"image" and (tmp_path / "out" / "frame.png").read_bytes() == b"frame"
    assert (
        copy.read_text()
        == (tmp_path / "out" / "report.json").read_text()
        == '{\n  "written": [\n    "frame",\n    "image"\n  ]\n}\n'
    )
    assert sorted(p.name for p in tmp_path.rglob("*")) == [
        "frame.png",
        "image.png",
        "out",
        "report.json",
        "results",
        "run.json",
    ]


@pytest.mark.parametrize("fails", ["in the block", "no report"])
def test_run_outputs_leave_nothing_when_the_block_fails_or_sets_no_report(tmp_path, fails):
    outputs = RunOutputs.declare({"image": tmp_path / "out" / "image.png"}, folder=tmp_path / "reports")
    expected = "no report" if fails == "no report" else "writer broke"
    with pytest.raises((RuntimeError, ValueError), match=expected), outputs.commit() as commit:
        commit.files["image"].write_bytes(b"image")
        if fails == "in the block":
            raise ValueError("writer broke")
    assert list(tmp_path.iterdir()) == []


def test_run_outputs_are_checked_when_declared(tmp_path):
    (tmp_path / "image.png").mkdir()
    with pytest.raises(OutputError, match=r"image\.png is a folder"):
        RunOutputs.declare({"image": tmp_path / "image.png"})


def test_sweep_removes_only_dead_writers_temporaries(tmp_path):
    target = tmp_path / "out.jpg"
    dead = _dead_pid()
    names = (f".out.jpg.{dead}.tmp", f".out.jpg.old.{dead}.tmp", f".out.jpg.{dead}.tmp.mp4")
    stale = [tmp_path / name for name in names]
    kept = [
        tmp_path / f".out.jpg.{os.getppid()}.tmp",  # a live writer (our parent)
        tmp_path / ".out.jpg.notes.tmp",  # not our name pattern
        tmp_path / f"out.jpg.{dead}.tmp",  # no leading dot: not ours
        tmp_path / f".other.jpg.{dead}.tmp",  # another target's
    ]
    for path in stale + kept:
        path.write_text("x")
    assert sorted(sweep_stale_temps(target)) == sorted(stale)
    assert sorted(tmp_path.iterdir()) == sorted(kept)


def test_a_sigkilled_writers_temporaries_are_removed_by_the_next_run(tmp_path):
    target = tmp_path / "out.jpg"
    script = (
        "import os, signal, sys\n"
        "from deliverykit.files import Outputs\n"
        "outputs = Outputs(); target = outputs.add(sys.argv[1])\n"
        "with outputs.commit() as temps:\n"
        "    temps[target].write_text('half')\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(SHARED)}
    killed = subprocess.run([sys.executable, "-c", script, str(target)], env=env, check=False)
    assert killed.returncode == -signal.SIGKILL
    assert [p.name for p in tmp_path.iterdir()] == [f".out.jpg.{killed_pid(tmp_path)}.tmp"]
    with _outputs(target).commit() as temps:
        temps[target].write_text("done")
    assert [p.name for p in tmp_path.iterdir()] == ["out.jpg"]


def killed_pid(folder: Path) -> int:
    (name,) = [p.name for p in folder.iterdir()]
    return int(name.split(".")[-2])


def test_temp_name_carries_the_pid():
    assert temp_name(Path("/x/out.mp4")) == Path(f"/x/.out.mp4.{os.getpid()}.tmp")


def test_real_enospc_on_a_small_tmpfs():
    """A real full disk (1 MiB tmpfs); skips where mounting is not permitted (not root, or in a container)."""
    mount_point = Path(tempfile.mkdtemp(prefix="deliverykit-tmpfs-"))
    mounted = shutil.which("mount") and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount_point)], capture_output=True, check=False
    )
    if not mounted or mounted.returncode != 0:
        mount_point.rmdir()
        pytest.skip("needs permission to mount a tmpfs (run as root outside a restricted container)")
    try:
        target = mount_point / "out.bin"
        full = pytest.raises(OutputError, match=r"out\.bin \(No space left on device\); free space")
        with full, _outputs(target, mount_point / "report.json").commit() as temps:
            temps[mount_point / "report.json"].write_text("{}")
            temps[target].write_bytes(b"\0" * (4 << 20))
        assert list(mount_point.iterdir()) == []
    finally:
        subprocess.run(["umount", str(mount_point)], check=False)
        mount_point.rmdir()


def test_open_image_refuses_decompression_bombs_before_decoding(tmp_path):
    """Both Pillow levels: over 2x the limit (an error in Pillow) and between 1x and 2x (only a warning there)."""
    from deliverykit.errors import InputError
    from deliverykit.images import max_image_pixels, open_image
    from deliverykit.testing import header_only_png

    for side, pixels in ((40000, "1,600,000,000"), (10000, "100,000,000")):
        bomb = header_only_png(tmp_path / f"bomb{side}.png", side, side)
        assert bomb.stat().st_size < 100
        with pytest.raises(InputError, match=rf"--image .* has {pixels} pixels, over the {max_image_pixels():,} "):
            open_image(bomb)
    from PIL import Image

    Image.new("RGB", (4, 3), (1, 2, 3)).save(tmp_path / "ok.png")
    image = open_image(tmp_path / "ok.png")
    assert image.size == (4, 3) and image.getpixel((0, 0)) == (1, 2, 3)
