"""Media in and out: the I2V input image, the mp4 with its audio track, and the first/last frames as PNG.

The mp4 is H.264 (yuv420p) + AAC stereo, muxed by diffusers' ``encode_video`` (PyAV; the LTX-2 reference muxing,
ltx-pipelines ``media_io``), so the audio the vocoder made is in the file, which ``export_to_video`` would drop.
Writers take the path they write to; ``inference.py`` hands them temporary paths and renames everything at the end,
so a failed run leaves no partial file.

Naming: ``out.mp4`` → ``out_first.png`` and ``out_last.png`` beside it (:func:`frame_paths`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from diffusers.utils import encode_video
from PIL import Image, UnidentifiedImageError

from deliverykit.errors import InputError
from deliverykit.images import open_image
from deliverykit.video import mp4_staging


def frame_paths(output: Path) -> tuple[Path, Path]:
    """``dir/name.mp4`` → (``dir/name_first.png``, ``dir/name_last.png``)."""
    output = Path(output)
    return output.with_name(f"{output.stem}_first.png"), output.with_name(f"{output.stem}_last.png")


def read_image(path: Path, flag: str = "--image") -> Image.Image:
    """The ``flag`` file as RGB, fully decoded now so that a truncated file fails here, not in the pipeline."""
    path = Path(path)
    try:
        return open_image(path).convert("RGB")  # a decompression bomb is an InputError naming its size and the limit
    except FileNotFoundError:
        raise InputError(f"{flag} {path} does not exist; pass an existing PNG/JPEG/WebP file") from None
    except (UnidentifiedImageError, OSError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise InputError(f"{flag} {path} is not a readable image ({reason}); pass a PNG, JPEG or WebP file") from None


def to_uint8(frame: np.ndarray) -> np.ndarray:
    """A float frame in [0, 1] → uint8, rounded as ``encode_video`` rounds, so PNG and mp4 start from equal pixels."""
    return (np.clip(frame, 0.0, 1.0) * 255).round().astype(np.uint8)


def write_png(path: Path, frame: np.ndarray) -> None:
    """One ``[height, width, 3]`` float frame in [0, 1] as PNG (format given: ``path`` may be a temporary name)."""
    Image.fromarray(to_uint8(frame)).save(path, format="PNG")


def write_mp4(path: Path, video: np.ndarray, audio: torch.Tensor | None, sample_rate: int, fps: int) -> None:
    """``video`` (float ``[frames, height, width, 3]`` in [0, 1]) and ``audio`` (``[channels, samples]``) as an mp4.

    Written through :func:`deliverykit.video.mp4_staging`, so a temporary ``path`` without ``.mp4`` works (PyAV
    chooses the container by the file suffix) and a failed encode leaves nothing behind.
    """
    with mp4_staging(path) as target:
        encode_video(
            np.clip(video, 0.0, 1.0),
            fps=fps,
            output_path=str(target),
            audio=audio,
            audio_sample_rate=sample_rate if audio is not None else None,
        )
