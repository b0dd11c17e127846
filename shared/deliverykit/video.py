"""Frames → H.264 mp4 with PyAV, written under any path (also the temporary names :class:`files.Outputs` hands out).

PyAV picks the container from the file suffix, while a run writes its outputs to temporaries such as
``.clip.mp4.<pid>.tmp`` (:func:`deliverykit.files.temp_name`). :func:`mp4_staging` bridges the two: the encoder
writes ``<path>.mp4`` beside ``path``, which is renamed onto ``path``, or removed if the encoder fails (a staging
file a killed run leaves behind matches :func:`deliverykit.files.sweep_stale_temps`' pattern and is swept later).
PyAV (``av``) is imported on use: each delivery that writes video pins it in its own lock.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

H264_CRF = 18  # visually near-lossless (x264's scale: 0 lossless, 23 default, 51 worst)


@contextlib.contextmanager
def mp4_staging(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a ``.mp4``-suffixed path to encode to; it becomes ``path`` when the block succeeds, else it is removed."""
    path = Path(path)
    target = path if path.suffix.lower() == ".mp4" else path.with_name(path.name + ".mp4")
    try:
        yield target
        if target != path:
            os.replace(target, path)
    finally:
        if target != path:
            target.unlink(missing_ok=True)


def write_mp4(path: str | os.PathLike, frames: np.ndarray, fps: int, crf: int = H264_CRF) -> None:
    """``frames`` (uint8 ``[N, H, W, 3]`` RGB, ``H`` and ``W`` even for yuv420p) as an H.264 mp4 at ``fps``.

    yuv420p is what browsers and players decode; it halves the chroma resolution, so sharp colour edges blur a little
    on top of the (small, at ``crf`` 18) quantisation loss.
    """
    frames = np.asarray(frames)
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3 or len(frames) == 0:
        raise ValueError(f"frames: need uint8 [N >= 1, H, W, 3], got {frames.dtype} {list(frames.shape)}")
    height, width = frames.shape[1:3]
    if height % 2 or width % 2:
        raise ValueError(f"frames of {width}×{height}: yuv420p needs an even width and height")
    try:
        import av
    except ImportError:
        raise ImportError(
            "deliverykit.video needs PyAV: pip install av==18.1.0 (a delivery that writes video pins it in its "
            "requirements.txt)"
        ) from None

    with mp4_staging(path) as target, av.open(str(target), mode="w") as container:
        stream = container.add_stream("libx264", rate=int(fps))
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"crf": str(crf)}
        for frame in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        container.mux(stream.encode())  # flush the encoder's delayed frames
