"""Finding and importing the patched microsoft/TRELLIS.2 checkout, through :mod:`deliverykit.assets.patches`.

The checkout is ``--upstream DIR`` or ``$TRELLIS2_SRC``, at the commit pinned in ``patches/upstream.json`` with every
patch applied; anything else is refused with exit code 3 and a message naming the command that fixes it. The
patched upstream imports this package's :mod:`.hooks`, so ``trellis2_npu`` must be importable (it is installed).
"""

from __future__ import annotations

import os
from pathlib import Path

from deliverykit.assets import patches

DELIVERY_DIR = Path(__file__).resolve().parent.parent
ENV_VAR = "TRELLIS2_SRC"
MARKER = "trellis2/__init__.py"


def find_patched_upstream(upstream: str | os.PathLike | None = None) -> Path:
    """``upstream`` (``--upstream``) or ``$TRELLIS2_SRC``, refused unless pinned and patched (exit 3)."""
    return patches.find_patched_upstream(DELIVERY_DIR, upstream, env_var=ENV_VAR, marker=MARKER)


def import_pipeline_class(path: str | os.PathLike):
    """The patched ``Trellis2ImageTo3DPipeline`` of the checkout at ``path`` (its packages found first)."""
    return patches.import_from_checkout("trellis2.pipelines", path).Trellis2ImageTo3DPipeline


def import_texturing_pipeline_class(path: str | os.PathLike):
    """The patched ``Trellis2TexturingPipeline`` of the checkout at ``path`` (mesh + image → textured mesh)."""
    return patches.import_from_checkout("trellis2.pipelines", path).Trellis2TexturingPipeline
