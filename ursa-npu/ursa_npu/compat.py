"""What the pinned diffnext needs to run on the transformers / diffusers versions of the lock.

- transformers ≥ 5 moved ``Qwen3Config.rope_theta`` into ``rope_parameters``; diffnext reads the attribute.
- ``KineticOptimalScheduler`` keeps its codebook in ``scheduler_model.pth``, which upstream loads with a pickle
  (``weights_only=False``) and never writes: ``save_pretrained`` produced a folder ``from_pretrained`` cannot load.
  The file is a plain ``{"path.emb": tensor}``, so it is read with ``weights_only=True`` and written here.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

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
