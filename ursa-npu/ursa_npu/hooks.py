"""Every call the patched diffnext makes into ursa-npu: the one module ``patches/*.patch`` import.

Each patched file has one added import, ``from ursa_npu import hooks``, and calls ``hooks.<name>``:

- ``swiglu``, ``rms_norm`` (0001, ``models/flash_attention.py``): upstream's SwiGLU is a CUDA jiterator kernel and
  its RMSNorm fallback plain torch; both go through ``deliverykit.ops`` (fused on an NPU), see :mod:`.fused_ops`.
- ``compile_per_device`` (0002, ``models/embeddings.py``): the RoPE kernels' ``torch.compile`` backend chosen per
  device, from ``deliverykit.compile``.
- ``sdpa`` (0003, ``models/text_encoders/qwen3.py``): attention with fewer KV heads than query heads, see
  :mod:`.attention`.
- ``rope_theta`` (0004, ``qwen3.py``, ``embeddings.py``): transformers ≥ 5 moved ``Qwen3Config.rope_theta`` into
  ``rope_parameters``; diffnext reads the attribute.
- ``load_codebook``, ``save_codebook`` (0005, ``schedulers/scheduling_dfm.py``): ``KineticOptimalScheduler`` keeps
  its codebook in ``scheduler_model.pth``, which upstream loads with a pickle (``weights_only=False``) and never
  writes: ``save_pretrained`` produced a folder ``from_pretrained`` cannot load. The file is a plain
  ``{"path.emb": tensor}``, so it is read with ``weights_only=True`` and written here.

The maths stays in its own modules (tested there); what is defined here exists only for the pinned diffnext to run on
the transformers / diffusers versions of the lock.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from deliverykit.compile import compile_per_device

from .attention import sdpa
from .fused_ops import rms_norm, swiglu

__all__ = ["compile_per_device", "load_codebook", "rms_norm", "rope_theta", "save_codebook", "sdpa", "swiglu"]

SCHEDULER_MODEL_FILE = "scheduler_model.pth"
CODEBOOK_KEY = "path.emb"


def rope_theta(config: Any) -> float:
    """RoPE base of a Qwen3 config: ``rope_theta`` (transformers 4) or ``rope_parameters["rope_theta"]`` (5)."""
    theta = getattr(config, "rope_theta", None)
    if theta is None:
        theta = (getattr(config, "rope_parameters", None) or {}).get("rope_theta")
    if theta is None:
        raise ValueError(f"{type(config).__name__} has neither rope_theta nor rope_parameters['rope_theta']")
    return float(theta)


def load_codebook(scheduler_dir: str | os.PathLike) -> torch.Tensor:
    """The codebook embeddings from ``scheduler_model.pth``, loaded without unpickling arbitrary objects."""
    path = Path(scheduler_dir) / SCHEDULER_MODEL_FILE
    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or not isinstance(state.get(CODEBOOK_KEY), torch.Tensor):
        raise ValueError(f"{path} must hold {{'{CODEBOOK_KEY}': tensor}}, found {type(state).__name__}")
    return state[CODEBOOK_KEY]


def save_codebook(scheduler_dir: str | os.PathLike, codebook: torch.Tensor) -> Path:
    """Write ``scheduler_model.pth`` next to ``scheduler_config.json`` (what ``load_codebook`` reads)."""
    path = Path(scheduler_dir) / SCHEDULER_MODEL_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({CODEBOOK_KEY: codebook.detach().cpu().contiguous()}, path)
    return path
