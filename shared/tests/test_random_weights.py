"""Smoke weights from numpy's PCG64: a hand-computed draw, golden values, and independence from torch's RNG."""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest

from deliverykit.random_weights import fill_, randomize_, unit_noise

torch = pytest.importorskip("torch")


def _by_hand(seed: int, name: str, count: int) -> np.ndarray:
    """The documented recipe, written out: SeedSequence(seed, 4 LE words of sha256(name)) → PCG64 → 53-bit floats."""
    digest = hashlib.sha256(name.encode()).digest()
    words = [seed] + [int.from_bytes(digest[4 * i : 4 * i + 4], "little") for i in range(4)]
    raw = np.random.PCG64(np.random.SeedSequence(words)).random_raw(count)
    return ((raw >> np.uint64(11)) / 2.0**53 * 2.0 - 1.0) * math.sqrt(3.0)


def test_unit_noise_is_the_documented_pcg64_draw() -> None:
    np.testing.assert_array_equal(
        unit_noise(7, "blocks.0.weight", (3, 4)), _by_hand(7, "blocks.0.weight", 12).reshape(3, 4)
    )
    # Golden values: pinned so that a numpy (or deliverykit) change of the stream fails here, not in an NPU comparison.
    assert unit_noise(0, "weight", (3,)).tolist() == [-0.7304222966891691, 1.6590732894686482, 1.4455068035232261]
    assert not np.array_equal(unit_noise(0, "weight", (3,)), unit_noise(1, "weight", (3,)))
    assert not np.array_equal(unit_noise(0, "weight", (3,)), unit_noise(0, "bias", (3,)))


class _Small(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(5, 3)  # random weight and bias
        self.norm = torch.nn.LayerNorm(3)  # ones and zeros
        self.gate = torch.nn.Parameter(torch.zeros(2, 2))  # a zero-initialised matrix


def test_randomize_equals_a_hand_computed_draw_whatever_torch_seed() -> None:
    built = []
    for torch_seed in (0, 123):
        torch.manual_seed(torch_seed)  # changes the constructor's draws, must not change the result
        module = _Small()
        randomize_(module, seed=3)
        built.append({name: p.detach().clone() for name, p in module.named_parameters()})
    first, second = built
    assert all(torch.equal(first[name], second[name]) for name in first)

    def expected(name, count, scale=1.0, offset=0.0):  # in float64, then rounded once to float32, like the code
        return torch.from_numpy(offset + scale * _by_hand(3, name, count)).float()

    # matrix: U(±1/sqrt(fan_in)) like torch's Linear init, i.e. std 1/sqrt(3·5)
    assert torch.equal(first["proj.weight"], expected("proj.weight", 15, 1 / math.sqrt(3 * 5)).reshape(3, 5))
    assert torch.equal(first["proj.bias"], expected("proj.bias", 3, 0.02))  # a random vector: 0.02 noise
    assert torch.equal(first["norm.weight"], expected("norm.weight", 3, 0.02, 1.0))  # ones: kept near 1
    assert torch.equal(first["norm.bias"], expected("norm.bias", 3, 0.02))
    assert torch.equal(first["gate"], expected("gate", 4, 0.02).reshape(2, 2))  # constant 0: kept near it


def test_randomize_std_skip_and_dtype() -> None:
    module = _Small().to(torch.bfloat16)
    before = module.norm.bias.detach().clone()
    randomize_(module, seed=0, std=0.5, skip=lambda name: name == "norm.bias")
    assert torch.equal(module.norm.bias, before)
    want = torch.from_numpy(0.5 * _by_hand(0, "proj.weight", 15)).reshape(3, 5).to(torch.bfloat16)
    assert module.proj.weight.dtype == torch.bfloat16 and torch.equal(module.proj.weight, want)


def test_fill_writes_scaled_noise() -> None:
    buffer = torch.zeros(2, 3)
    fill_(buffer, 4, "stft.forward_basis", scale=0.3)
    assert torch.equal(buffer, torch.from_numpy(0.3 * _by_hand(4, "stft.forward_basis", 6)).float().reshape(2, 3))
