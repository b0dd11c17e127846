"""Seeded random weights that are bit-identical on every torch version, for the deliveries' smoke models.

``torch.manual_seed`` + a module's own init is not: ``trunc_normal_`` and friends draw differently across torch
releases (2.6, 2.9 and 2.13 give different tensors), so a CPU reference and an NPU run on another vendor torch would
compare two different models. Here every value comes from numpy's PCG64 bit generator (a fixed, documented
algorithm), seeded per tensor by ``(seed, sha256(name))`` so a tensor's values depend on its name only, not on
construction order, and turned into floats by plain arithmetic (no version-dependent sampling routine):

    raw u64 → (raw >> 11) · 2⁻⁵³ ∈ [0, 1) → (2x − 1)·√3: uniform, mean 0, variance 1 (:func:`unit_noise`)

:func:`randomize_` fills a module's parameters from it, keeping what the architecture's init means:

1. a tensor the constructor set to one constant ``c`` (norm weights 1, biases 0, layer scales, zero-initialised
   output layers): ``c + 0.02·u``, so norms stay near 1 and every tensor still shapes the output;
2. any other vector or scalar: ``0.02·u``;
3. any other matrix or kernel: ``std·u``, ``std`` given (a transformers config's ``initializer_range``) or
   ``1/√(3·fan_in)``: the variance of torch's default ``Linear``/``Conv`` init, ``U(±1/√fan_in)``.

Whether a constructor's value is constant does not depend on torch's random stream, so neither does the result.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence

import numpy as np

PERTURBATION = 0.02  # scale of the noise added to constant-initialised tensors and vectors


def _seed_words(seed: int, name: str) -> list[int]:
    digest = hashlib.sha256(name.encode("utf-8")).digest()
    return [seed, *(int.from_bytes(digest[i : i + 4], "little") for i in range(0, 16, 4))]


def unit_noise(seed: int, name: str, shape: Sequence[int]) -> np.ndarray:
    """float64 noise of ``shape``, uniform with mean 0 and variance 1, a function of ``(seed, name)`` only."""
    count = math.prod(shape)
    generator = np.random.PCG64(np.random.SeedSequence(_seed_words(seed, name)))
    raw = generator.random_raw(count) if count else np.zeros(0, dtype=np.uint64)
    uniform = (np.asarray(raw, dtype=np.uint64) >> np.uint64(11)).astype(np.float64) * 2.0**-53
    return ((2.0 * uniform - 1.0) * math.sqrt(3.0)).reshape(tuple(shape))


def random_values(seed: int, name: str, initial, std: float | None = None) -> np.ndarray:
    """The float64 values :func:`randomize_` gives a tensor named ``name`` whose constructor value is ``initial``."""
    values = np.asarray(initial, dtype=np.float64)
    noise = unit_noise(seed, name, values.shape)
    flat = values.reshape(-1)
    if flat.size and (flat.size == 1 or bool(np.all(flat == flat[0]))):
        return flat[0] + PERTURBATION * noise
    if values.ndim <= 1:
        return PERTURBATION * noise
    fan_in = values.size // values.shape[0]
    return (std if std is not None else 1.0 / math.sqrt(3.0 * fan_in)) * noise


def randomize_(module, seed: int, *, std: float | None = None, skip: Callable[[str], bool] | None = None) -> None:
    """Overwrite every floating-point parameter of ``module`` (a ``torch.nn.Module``) in place; rules in the
    module docstring. ``skip(name)``: parameters left as constructed (set them yourself afterwards)."""
    import torch

    with torch.no_grad():
        for name, parameter in module.named_parameters():
            if not parameter.is_floating_point() or (skip is not None and skip(name)):
                continue
            initial = parameter.detach().to("cpu", torch.float64).numpy()
            values = random_values(seed, name, initial, std)
            parameter.copy_(torch.from_numpy(values).to(parameter.dtype))


def fill_(tensor, seed: int, name: str, scale: float = 1.0) -> None:
    """``tensor ← scale·unit_noise(seed, name)``: for buffers a checkpoint fills (placeholders the module zeroes)."""
    import torch

    with torch.no_grad():
        tensor.copy_(torch.from_numpy(scale * unit_noise(seed, name, tuple(tensor.shape))).to(tensor.dtype))
