"""Finding and importing the patched baaivision/URSA checkout (``diffnext`` is not on PyPI and is never installed).

The patched upstream imports ``ursa_npu`` (this package) and ``deliverykit``: whoever imports ``diffnext`` must
have this package's folder (``ursa-npu/``) and deliverykit on ``sys.path``. ``inference.py``, the scripts and
the tests do that; :func:`import_diffnext` adds the checkout itself.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import SimpleNamespace

DELIVERY_DIR = Path(__file__).resolve().parent.parent
ENV_VAR = "URSA_SRC"
MARKER = "diffnext/__init__.py"


def find_patched_upstream(upstream: str | os.PathLike | None = None) -> Path:
    """``--upstream`` or ``$URSA_SRC``, checked to be the pinned commit with every patch applied (else exit 3)."""
    from deliverykit.assets.patches import find_upstream_tree, require_patched

    path = find_upstream_tree(DELIVERY_DIR, upstream, env_var=ENV_VAR, marker=MARKER)
    require_patched(DELIVERY_DIR, path)
    return path


def import_diffnext(path: str | os.PathLike) -> SimpleNamespace:
    """Put the checkout first on ``sys.path`` and return the URSA classes: ``pipeline``, ``transformer``, ``vae``,
    ``scheduler`` (``URSAPipeline``, ``URSATransformer3DModel``, ``AutoencoderVQ``, ``KineticOptimalScheduler``)."""
    for folder in (str(Path(path).resolve()), str(DELIVERY_DIR)):
        if folder not in sys.path:
            sys.path.insert(0, folder)
    from diffnext.models.autoencoders.autoencoder_vq import AutoencoderVQ
    from diffnext.models.transformers.transformer_ursa import URSATransformer3DModel
    from diffnext.pipelines.ursa.pipeline_ursa import URSAPipeline
    from diffnext.schedulers.scheduling_dfm import KineticOptimalScheduler

    return SimpleNamespace(
        pipeline=URSAPipeline, transformer=URSATransformer3DModel, vae=AutoencoderVQ, scheduler=KineticOptimalScheduler
    )
