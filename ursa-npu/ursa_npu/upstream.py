"""Finding and importing the patched baaivision/URSA checkout (``diffnext`` is not on PyPI and is never installed).

The patched upstream imports ``ursa_npu.hooks`` (this package, installed with ``pip install -e ursa-npu``) and, through
it, ``deliverykit``; the checkout's ``diffnext`` is imported through ``deliverykit.assets.patches`` (no sys.path edit).
"""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

from deliverykit.assets import patches

DELIVERY_DIR = Path(__file__).resolve().parent.parent
ENV_VAR = "URSA_SRC"
MARKER = "diffnext/__init__.py"
# name -> (diffnext module, class), imported in this order
CLASSES = {
    "vae": ("diffnext.models.autoencoders.autoencoder_vq", "AutoencoderVQ"),
    "transformer": ("diffnext.models.transformers.transformer_ursa", "URSATransformer3DModel"),
    "pipeline": ("diffnext.pipelines.ursa.pipeline_ursa", "URSAPipeline"),
    "scheduler": ("diffnext.schedulers.scheduling_dfm", "KineticOptimalScheduler"),
}


def find_patched_upstream(upstream: str | os.PathLike | None = None) -> Path:
    """``--upstream`` or ``$URSA_SRC``, checked to be the pinned commit with every patch applied (else exit 3)."""
    return patches.find_patched_upstream(DELIVERY_DIR, upstream, env_var=ENV_VAR, marker=MARKER)


def import_diffnext(path: str | os.PathLike) -> SimpleNamespace:
    """The URSA classes of the checkout at ``path``: ``pipeline``, ``transformer``, ``vae``, ``scheduler``
    (``URSAPipeline``, ``URSATransformer3DModel``, ``AutoencoderVQ``, ``KineticOptimalScheduler``)."""
    return SimpleNamespace(
        **{name: getattr(patches.import_from_checkout(module, path), cls) for name, (module, cls) in CLASSES.items()}
    )
