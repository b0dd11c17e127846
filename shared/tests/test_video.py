"""Frames → mp4 (deliverykit.video): decoded back with PyAV, under temporary names, and nothing left by a failure."""

from __future__ import annotations

import numpy as np
import pytest

from deliverykit.video import mp4_staging, write_mp4

av = pytest.importorskip("av")  # pinned by the deliveries that write video (sulphur2-npu, trellis2-npu)
FRAMES, HEIGHT, WIDTH, FPS = 6, 48, 64, 12


def gradient_frames() -> np.ndarray:
    """Smooth, moving content: H.264 at crf 18 reproduces it within a few levels."""
    y, x = np.mgrid[0:HEIGHT, 0:WIDTH]
    frames = [np.stack([x * 4 % 256, y * 5, np.full_like(x, 40 * t)], axis=-1) for t in range(FRAMES)]
    return np.stack(frames).astype(np.uint8)


def decode(path) -> tuple[np.ndarray, str, float]:
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        frames = np.stack([frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)])
        return frames, stream.codec_context.name, float(stream.average_rate)


def test_frames_come_back_from_an_h264_mp4_under_a_temporary_name(tmp_path):
    target = tmp_path / ".clip.mp4.123.tmp"  # what files.Outputs hands out
    frames = gradient_frames()
    write_mp4(target, frames, FPS)
    decoded, codec, rate = decode(target)
    assert codec == "h264" and rate == FPS and decoded.shape == frames.shape
    # lossy (yuv420p chroma, crf 18), but the same pictures in the same order: each decoded frame is nearest its own
    error = np.abs(decoded.astype(float)[:, None] - frames.astype(float)[None]).mean(axis=(2, 3, 4))
    assert (error.argmin(axis=1) == np.arange(FRAMES)).all() and error.diagonal().max() < 3.0, error.diagonal()
    assert [p.name for p in tmp_path.iterdir()] == [target.name]  # the .mp4 staging name is gone


def test_a_failed_encode_leaves_nothing(tmp_path):
    target = tmp_path / ".clip.mp4.123.tmp"
    with pytest.raises(OSError, match="disk full"), mp4_staging(target) as staged:
        staged.write_bytes(b"partial")
        raise OSError("disk full")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "frames, message",
    [
        (np.zeros((2, 48, 64, 3), np.float32), "uint8"),
        (np.zeros((0, 48, 64, 3), np.uint8), "N >= 1"),
        (np.zeros((2, 47, 64, 3), np.uint8), "even"),
    ],
)
def test_bad_frames_are_refused_before_writing(tmp_path, frames, message):
    with pytest.raises(ValueError, match=message):
        write_mp4(tmp_path / "clip.mp4", frames, FPS)
    assert list(tmp_path.iterdir()) == []
