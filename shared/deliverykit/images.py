"""Reading a user's image file: fully decoded now, and never a decompression bomb.

Pillow refuses images above twice ``Image.MAX_IMAGE_PIXELS`` with ``DecompressionBombError``, which is not an
``OSError`` (so a reader catching ``OSError`` printed a traceback), and between one and two times the limit only
warns and then allocates gigabytes. Here both are one :class:`InputError` line naming the pixel count and the limit.
Pillow is imported on first use: it comes with the requirements of the deliveries that read images.
"""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path

from .errors import InputError


def max_image_pixels() -> int:
    """The largest image (width × height) :func:`open_image` decodes: Pillow's ``MAX_IMAGE_PIXELS`` (~89 M)."""
    from PIL import Image

    return int(Image.MAX_IMAGE_PIXELS)


def open_image(path: str | os.PathLike, flag: str = "--image"):
    """Open and fully decode ``path`` (a truncated file fails here, not later); returns a detached ``Image``.

    Raises :class:`InputError` for a decompression bomb; other read errors are the caller's to word.
    """
    from PIL import Image

    path = Path(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            with Image.open(path) as opened:
                opened.load()
                return opened.copy()
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as err:
            found = re.search(r"\((\d+) pixels\)", str(err))
            size = f"{int(found.group(1)):,} pixels" if found else "more pixels than the limit"
            raise InputError(
                f"{flag} {path} has {size}, over the {max_image_pixels():,} this tool decodes (a decompression-bomb "
                f"guard); pass a smaller image (downscale it, e.g. to 4096 px on the long side)"
            ) from None
