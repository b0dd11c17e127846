"""Image input exactly as TRELLIS.2 prepares it for DINOv3.

Adapted from: microsoft/TRELLIS.2 @ 5565d240, ``trellis2/pipelines/trellis2_image_to_3d.py::preprocess_image``
(lines 127-162) and ``trellis2/modules/image_feature_extractor.py::DinoV3FeatureExtractor.__call__``.
Changes: background removal (BiRefNet) is not run here — an image without real alpha is used whole; 16-bit,
grayscale and palette images are converted explicitly instead of failing or clipping; errors are one-line
:class:`InputError` messages.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw, UnidentifiedImageError

from deliverykit.errors import DeliveryError, InputError
from deliverykit.images import open_image

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
MAX_INPUT_SIDE = 1024  # upstream shrinks the long side to 1024 before cropping
ALPHA_THRESHOLD = 0.8 * 255  # upstream's foreground threshold for the crop box


def load_image(path: str | os.PathLike) -> Image.Image:
    """Open an image file as RGB or RGBA, 8 bits per channel.

    Pillow opens 16-bit grayscale PNGs as mode ``I;16``/``I``, whose ``convert("RGB")`` clips to white; they are
    scaled to 8 bits here instead. Palette and grayscale+alpha images keep their transparency.
    """
    path = Path(path)
    if not path.exists():
        raise InputError(f"input image {path} does not exist; pass an existing file to --image")
    if not path.is_file():
        raise InputError(f"input image {path} is not a file; pass an image file to --image")
    try:
        image = open_image(path)  # a decompression bomb is an InputError naming its size and the limit
    except (UnidentifiedImageError, OSError, ValueError) as err:
        raise InputError(f"cannot read {path} as an image ({err}); pass a PNG, JPEG or WebP file to --image") from err
    return normalize_mode(image)


def normalize_mode(image: Image.Image) -> Image.Image:
    """Any Pillow mode → ``RGB`` or ``RGBA`` with 8-bit channels."""
    if image.mode in ("RGB", "RGBA"):
        return image
    if image.mode.startswith("I"):  # 16/32-bit integer grayscale: full 16-bit range → 8 bits
        gray = np.asarray(image, dtype=np.float64) / 257.0
        return Image.fromarray(np.clip(np.rint(gray), 0, 255).astype(np.uint8)).convert("RGB")
    if image.mode == "F":  # float grayscale, taken as [0, 1]
        gray = np.asarray(image, dtype=np.float64) * 255.0
        return Image.fromarray(np.clip(np.rint(gray), 0, 255).astype(np.uint8)).convert("RGB")
    has_transparency = image.mode in ("LA", "PA", "La", "RGBa") or "transparency" in image.info
    return image.convert("RGBA" if has_transparency else "RGB")


def has_real_alpha(image: Image.Image) -> bool:
    """Upstream's rule: RGBA and not every alpha value 255."""
    return image.mode == "RGBA" and not bool(np.all(np.asarray(image)[:, :, 3] == 255))


def preprocess_image(image: Image.Image) -> Image.Image:
    """Shrink to a 1024 long side; with real alpha, crop to the alpha box and premultiply.

    Returns an RGB image. Without real alpha the whole image is used (background removal comes with the full
    pipeline).
    """
    image = normalize_mode(image)
    scale = min(1.0, MAX_INPUT_SIDE / max(image.size))
    if scale < 1:
        image = image.resize((int(image.width * scale), int(image.height * scale)), Image.Resampling.LANCZOS)
    if not has_real_alpha(image):
        return image.convert("RGB")
    alpha = np.asarray(image)[:, :, 3]
    foreground = np.argwhere(alpha > ALPHA_THRESHOLD)
    if foreground.size == 0:
        raise InputError(
            "the image's alpha channel has no pixel above 80% opacity; pass an image with a visible object"
        )
    left, top = np.min(foreground[:, 1]), np.min(foreground[:, 0])
    right, bottom = np.max(foreground[:, 1]), np.max(foreground[:, 0])
    center = (left + right) / 2, (top + bottom) / 2
    size = int(max(right - left, bottom - top))
    box = center[0] - size // 2, center[1] - size // 2, center[0] + size // 2, center[1] + size // 2
    cropped = np.asarray(image.crop(box)).astype(np.float32) / 255
    premultiplied = cropped[:, :, :3] * cropped[:, :, 3:4]
    return Image.fromarray((premultiplied * 255).astype(np.uint8))


def pipeline_input(image: Image.Image, remove_background: bool = True) -> tuple[Image.Image, bool]:
    """What the full pipeline is given: ``(image, preprocess_upstream)``. With real alpha, our preprocessing (tested
    equal to upstream's, and it names an empty alpha clearly); without, the image as is, for upstream's own
    preprocessing with background removal, or (``remove_background=False``, ``--no-rembg``) upstream's preprocessing
    without that step: the long side shrunk to 1024 and the whole image used, with no crop."""
    image = normalize_mode(image)
    if not has_real_alpha(image):
        return (image, True) if remove_background else (preprocess_image(image), False)
    return preprocess_image(image), False


def needs_background_removal(path: str | os.PathLike | None) -> bool:
    """Whether the image at ``path`` has no real alpha (an unreadable one: False, it fails later as its request)."""
    if path is None:
        return False
    try:
        return not has_real_alpha(load_image(path))
    except DeliveryError:
        return False


def to_pixel_values(image: Image.Image, resolution: int) -> torch.Tensor:
    """Resize to ``resolution``² with LANCZOS, scale to [0, 1] and ImageNet-normalise → ``[1, 3, R, R]`` float32."""
    resized = image.resize((resolution, resolution), Image.Resampling.LANCZOS)
    array = np.asarray(resized.convert("RGB")).astype(np.float32) / 255
    pixels = torch.from_numpy(array).permute(2, 0, 1).unsqueeze(0)
    mean = torch.tensor(IMAGENET_MEAN, dtype=torch.float32).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD, dtype=torch.float32).view(1, 3, 1, 1)
    return (pixels - mean) / std


def synthetic_image(seed: int = 42, size: int = 512) -> Image.Image:
    """The deterministic input used when no ``--image`` is given: seeded shapes on a transparent background.

    RGBA with real alpha, so the demo exercises TRELLIS.2's crop-and-premultiply path; textured with seeded noise so
    that no two patches are alike.
    """
    rng = np.random.default_rng(seed)
    image = Image.new("RGBA", (size, size), (0, 0, 0, 0))
    draw = ImageDraw.Draw(image)
    for _ in range(4):
        x0, y0 = rng.integers(size // 8, size // 2, size=2)
        x1, y1 = x0 + rng.integers(size // 6, size // 2, size=2)
        colour = (*(int(c) for c in rng.integers(40, 256, size=3)), 255)
        shape = draw.ellipse if rng.random() < 0.5 else draw.rectangle
        shape((int(x0), int(y0), int(x1), int(y1)), fill=colour)
    pixels = np.asarray(image).astype(np.int16)
    texture = rng.integers(-24, 25, size=(size, size, 3))
    pixels[:, :, :3] = np.clip(pixels[:, :, :3] + texture * (pixels[:, :, 3:4] > 0), 0, 255)
    return Image.fromarray(pixels.astype(np.uint8))
