"""Load each pipeline model from disk when a stage uses it and free it after (``load_pipeline(offload=True)``).

The eight models of ``pipeline.json`` are 6.2 B parameters (≈ 17 GB in host memory with DINOv3): upstream's
``low_vram`` path keeps only the active model on the accelerator but all of them in host memory, and on a CPU-only
host that is everything at once. Upstream brackets every use with ``model.to(device)`` … ``model.cpu()``; an
:class:`OffloadedModel` builds the model (upstream's ``models.from_pretrained``, strict) on first use and drops it at
``cpu()``, so only the active stage's model is held; each load is a ``load:<checkpoint>`` stage (:func:`.stages.timed`).
The pipeline code is unchanged: :func:`lazy_model_loading` makes upstream's ``Pipeline.from_pretrained`` create these
stand-ins instead of loading every checkpoint.
"""

from __future__ import annotations

import contextlib
import gc
import inspect
import json
import os
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import torch

from . import stages

# the flows (2.6 GB) and SC-VAE decoders (0.95 GB) are offloaded; the sparse-structure decoder (0.15 GB) stays
# loaded (the smoke runs hook its output, and a hook would not survive a reload)
MIN_BYTES = 512 * 2**20


class OffloadedModel:
    """Stands for an upstream model loaded by ``load()``; built on first use, freed by ``cpu()``.

    Methods of ``model_class`` (``forward``, ``upsample``, ...) resolve at call time, so wrapping them (as
    :mod:`.generate` times them) does not load the model; other attributes build it. ``loads`` counts the builds.
    Forward hooks registered on the built model are lost when it is freed: hook models that are not offloaded.
    """

    def __init__(self, load: Callable[[], torch.nn.Module], model_class: type, name: str = "model"):
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_load", load)
        object.__setattr__(self, "_class", model_class)
        object.__setattr__(self, "_model", None)
        object.__setattr__(self, "_device", torch.device("cpu"))
        object.__setattr__(self, "loads", 0)

    def _built(self) -> torch.nn.Module:
        if self._model is None:
            with stages.timed(f"load:{self._name}"):
                model = self._load().eval().to(self._device)
            object.__setattr__(self, "_model", model)
            object.__setattr__(self, "loads", self.loads + 1)
        return self._model

    @property
    def is_loaded(self) -> bool:
        return self._model is not None

    def to(self, device: torch.device | str) -> OffloadedModel:
        object.__setattr__(self, "_device", torch.device(device))
        self._built().to(device)
        return self

    def cpu(self) -> OffloadedModel:
        """Upstream's "done with this model": free it (its weights are reloaded from disk on the next use)."""
        object.__setattr__(self, "_model", None)
        object.__setattr__(self, "_device", torch.device("cpu"))
        gc.collect()
        return self

    def eval(self) -> OffloadedModel:
        return self

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    @property
    def __class__(self) -> type:
        """The model's class, so that upstream's ``isinstance(flow_model, nn.Module)`` checks hold."""
        return self._class

    def _is_method(self, name: str) -> bool:
        return inspect.isfunction(inspect.getattr_static(self._class, name, None))

    def __getattr__(self, name: str) -> Any:
        if name == "forward":  # through the module's __call__, so its forward hooks run
            return lambda *args, **kwargs: self._built()(*args, **kwargs)
        if self._is_method(name):
            return lambda *args, **kwargs: getattr(self._built(), name)(*args, **kwargs)
        return getattr(self._built(), name)

    def __setattr__(self, name: str, value: Any) -> None:
        """A method shadowed on this instance (a timing wrapper) stays here; any other attribute goes to the model."""
        if self._is_method(name):
            object.__setattr__(self, name, value)
        else:
            setattr(self._built(), name, value)

    def __delattr__(self, name: str) -> None:
        if name in self.__dict__:
            object.__delattr__(self, name)
        else:
            delattr(self._built(), name)


@contextlib.contextmanager
def lazy_model_loading(models: ModuleType, min_bytes: int = MIN_BYTES) -> Iterator[None]:
    """Within: upstream's ``models.from_pretrained(path)`` returns an :class:`OffloadedModel` for a local checkpoint
    of at least ``min_bytes`` instead of loading it (the class is read from ``<path>.json``); smaller ones load."""
    original = models.from_pretrained

    def offloaded(path: str, **kwargs: Any) -> Any:
        if not os.path.isfile(f"{path}.safetensors") or os.path.getsize(f"{path}.safetensors") < min_bytes:
            return original(path, **kwargs)
        with open(f"{path}.json", encoding="utf-8") as handle:
            model_class = getattr(models, json.load(handle)["name"])
        return OffloadedModel(lambda: original(path, **kwargs), model_class, os.path.basename(path))

    models.from_pretrained = offloaded
    try:
        yield
    finally:
        models.from_pretrained = original
