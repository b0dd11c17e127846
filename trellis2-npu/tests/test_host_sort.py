"""The compiled stable argsort of the mesh repair against NumPy's own stable sort (a stable order is unique)."""

from __future__ import annotations

import numpy as np
import pytest

from trellis2_npu.geometry.host_sort import stable_argsort


@pytest.mark.parametrize("top", [1, 2, 2**16, 2**16 + 1, 2**47, 2**48 + 5, 2**63 - 1])
def test_the_order_is_numpys_stable_one(top):
    """Keys below ``top`` (one radix pass up to every pass of a 64-bit key), each value twice so that ties meet."""
    keys = np.random.default_rng(top).integers(0, top, 5000, dtype=np.int64)
    keys[1::2] = keys[0::2]
    np.testing.assert_array_equal(stable_argsort(keys), np.argsort(keys, kind="stable"))


def test_other_inputs():
    assert stable_argsort(np.zeros(0, dtype=np.int64)).shape == (0,)
    np.testing.assert_array_equal(stable_argsort(np.array([3, 1, 2], dtype=np.int32)), [1, 2, 0])
    for bad in (np.array([1, -1]), np.array([0.5, 1.0]), np.zeros((2, 2), dtype=np.int64)):
        with pytest.raises(ValueError, match="stable_argsort takes"):
            stable_argsort(bad)
