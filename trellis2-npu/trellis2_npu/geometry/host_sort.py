"""A stable argsort of non-negative integer keys compiled for the host CPU (numba): the mesh repair sorts every
half-edge by its edge several times an export, where NumPy's stable sort of int64 (a merge sort) took most of a
second on the export benchmark. A stable order is unique, so this is ``np.argsort(keys, kind="stable")`` exactly.
"""

from __future__ import annotations

import numba
import numpy as np

DIGIT_BITS = 16  # a least-significant-digit radix sort, 16 bits a pass (3 passes for keys below 2^48)


@numba.njit(cache=True)
def _radix_argsort(keys: np.ndarray) -> np.ndarray:
    count = len(keys)
    order, keys = np.arange(count), keys.copy()
    spare_order, spare_keys = np.empty_like(order), np.empty_like(keys)
    top, shift, mask = keys.max(), 0, (1 << DIGIT_BITS) - 1
    while shift == 0 or (shift < 64 and top >> shift):  # (a shift of 64 would wrap round to 0)
        starts = np.zeros((1 << DIGIT_BITS) + 1, np.int64)
        for i in range(count):
            starts[((keys[i] >> shift) & mask) + 1] += 1
        for digit in range(1 << DIGIT_BITS):
            starts[digit + 1] += starts[digit]
        for i in range(count):
            digit = (keys[i] >> shift) & mask
            spare_order[starts[digit]], spare_keys[starts[digit]] = order[i], keys[i]
            starts[digit] += 1
        order, spare_order, keys, spare_keys = spare_order, order, spare_keys, keys
        shift += DIGIT_BITS
    return order


def stable_argsort(keys: np.ndarray) -> np.ndarray:
    """``np.argsort(keys, kind="stable")`` of a 1-D array of non-negative integers."""
    if keys.ndim != 1 or keys.dtype.kind not in "iu":
        raise ValueError(f"stable_argsort takes a 1-D integer array, got {keys.dtype} of shape {keys.shape}")
    if not len(keys):
        return np.zeros(0, dtype=np.int64)
    if keys.min() < 0:
        raise ValueError("stable_argsort takes non-negative keys")
    return _radix_argsort(keys.astype(np.int64, copy=False))
