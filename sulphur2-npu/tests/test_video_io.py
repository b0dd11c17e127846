"""Media I/O: mp4 with an audio track (probed with PyAV), PNG frames, I2V image reading errors, no staging leftovers."""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np
import pytest
import torch
from PIL import Image

from deliverykit.errors import ExitCode, InputError
from sulphur2_npu import video_io
from sulphur2_npu.video_io import frame_paths, read_image, to_uint8, write_mp4, write_png

FRAMES, HEIGHT, WIDTH, RATE, FPS = 9, 64, 96, 48000, 24


def _smooth_video() -> np.ndarray:
    """A moving gradient: H.264 reproduces it closely, so decoded pixels can be checked."""
    y, x = np.mgrid[0:HEIGHT, 0:WIDTH].astype(np.float32)
    frames = [np.stack([x / WIDTH, y / HEIGHT, np.full_like(x, t / FRAMES)], axis=-1) for t in range(FRAMES)]
    return np.stack(frames)


def probe(path: Path) -> dict:
    """Streams of an mp4 as PyAV sees them, with the decoded video frames."""
    with av.open(str(path)) as container:
        video = [s for s in container.streams if s.type == "video"]
        audio = [s for s in container.streams if s.type == "audio"]
        info = {
            "video_streams": len(video),
            "audio_streams": len(audio),
            "format": container.format.name,
        }
        if audio:
            info |= {"sample_rate": audio[0].sample_rate, "channels": audio[0].codec_context.channels}
        frames = [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
    return info | {"frames": np.stack(frames), "codec": video[0].codec_context.name}


def test_mp4_has_the_video_and_the_audio_track_even_under_a_temporary_name(tmp_path):
    video = _smooth_video()
    audio = torch.sin(torch.linspace(0, 200, FRAMES * RATE // FPS)).repeat(2, 1) * 0.5
    target = tmp_path / ".out.mp4.abc.tmp"  # what atomic_path hands out
    write_mp4(target, video, audio, RATE, FPS)
    info = probe(target)
    assert info["video_streams"] == 1 and info["audio_streams"] == 1 and "mp4" in info["format"]
    assert info["codec"] == "h264" and info["frames"].shape == (FRAMES, HEIGHT, WIDTH, 3)
    assert info["sample_rate"] == RATE and info["channels"] == 2
    error = np.abs(info["frames"].astype(np.float32) - to_uint8(video).astype(np.float32)).mean()
    assert error < 4.0, error  # lossy, but the same picture
    assert sorted(p.name for p in tmp_path.iterdir()) == [target.name]  # the .mp4 staging name is gone


def test_mp4_without_audio_has_one_stream(tmp_path):
    write_mp4(tmp_path / "silent.mp4", _smooth_video(), None, RATE, FPS)
    info = probe(tmp_path / "silent.mp4")
    assert (info["video_streams"], info["audio_streams"]) == (1, 0)


def test_a_failed_encode_leaves_no_staging_file(tmp_path, monkeypatch):
    def broken(video, fps, output_path, **kwargs):
        Path(output_path).write_bytes(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(video_io, "encode_video", broken)
    with pytest.raises(OSError, match="disk full"):
        write_mp4(tmp_path / ".out.mp4.x.tmp", _smooth_video(), None, RATE, FPS)
    assert list(tmp_path.iterdir()) == []


def test_png_holds_the_exact_rounded_pixels(tmp_path):
    frame = np.random.default_rng(0).random((HEIGHT, WIDTH, 3), dtype=np.float32)
    write_png(tmp_path / "frame.tmp", frame)
    pixels = np.asarray(Image.open(tmp_path / "frame.tmp"))
    assert np.array_equal(pixels, np.round(frame * 255).astype(np.uint8))


def test_frame_paths_sit_beside_the_video():
    assert frame_paths(Path("/x/clip.v2.mp4")) == (Path("/x/clip.v2_first.png"), Path("/x/clip.v2_last.png"))


def test_read_image_returns_rgb(tmp_path):
    Image.new("RGBA", (20, 10), (10, 20, 30, 128)).save(tmp_path / "a.png")
    image = read_image(tmp_path / "a.png")
    assert image.mode == "RGB" and image.size == (20, 10) and image.getpixel((0, 0)) == (10, 20, 30)


@pytest.mark.parametrize("kind", ["missing", "text", "truncated", "folder"])
def test_unreadable_image_is_an_input_error(tmp_path, kind):
    path = tmp_path / "in.png"
    if kind == "text":
        path.write_text("not an image")
    elif kind == "truncated":
        Image.new("RGB", (64, 64), (200, 0, 0)).save(path)
        path.write_bytes(path.read_bytes()[:60])
    elif kind == "folder":
        path.mkdir()
    with pytest.raises(InputError) as caught:
        read_image(path)
    message = str(caught.value)
    assert message.startswith(f"--image {path} ") and "\n" not in message and caught.value.exit_code == ExitCode.INPUT
