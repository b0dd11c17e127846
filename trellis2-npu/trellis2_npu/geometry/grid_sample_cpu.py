"""The sparse trilinear sampling of :mod:`trellis2_npu.grid_sample` compiled for the host CPU (numba).

:func:`trellis2_npu.grid_sample.grid_sample_3d` runs on any device as tensor ops over ``[P, 8]`` corners: on the CPU,
building those temporaries and binary-searching every corner in the sorted voxel keys were most of the bake's
sampling. Here each query walks its 8 corners in FlexGEMM's order, finds each in the same sorted keys
(:func:`trellis2_npu.voxel_lookup.build_voxel_index`: the first of duplicate rows, absent outside the grid) and sums the
renormalised weights and features one corner after the other, in float32 as FlexGEMM's kernel; chunks of queries run
on ``deliverykit.cpu_tasks``' workers (the kernel releases the GIL). The kernel compiles on first use and is cached
on disk by numba.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numba
import numpy as np
import torch

from deliverykit.cpu_tasks import task_runner

from ..grid_sample import MIN_WEIGHT_SUM
from ..voxel_lookup import build_voxel_index

QUERIES_PER_TASK = 1 << 16  # queries a worker samples at a time
COLUMNS_PER_VOXEL = 4  # at most this many (batch, x, y) column starts per voxel (8 bytes each)


def applies(feats: torch.Tensor, grid: torch.Tensor) -> bool:
    """Whether :func:`grid_sample_3d_cpu` takes these inputs: float32 features and queries on the CPU."""
    return feats.device.type == grid.device.type == "cpu" and feats.dtype == grid.dtype == torch.float32


@numba.njit(inline="always")
def _find(sorted_keys: np.ndarray, key: int, low: int, end: int) -> int:
    """The first slot of ``low .. end`` holding ``key`` (``np.searchsorted(side="left")``), -1 when it is absent."""
    high = end
    while low < high:
        middle = (low + high) >> 1
        if sorted_keys[middle] < key:
            low = middle + 1
        else:
            high = middle
    return low if low < end and sorted_keys[low] == key else -1


@numba.njit(nogil=True, cache=True)
def _sample(points, first_query, queries_per_item, index, grid_shape, feats, out):
    """``out[i]``: the sample at ``points[i]``, query ``first_query + i`` of the flattened ``[B, L, 3]`` grid.
    ``index``: ``(sorted_keys, order, origin, extent, strides)`` over ``(batch, x, y, z)`` rows, then ``(starts,
    width)``: key ``k`` is searched from slot ``starts[k // width]`` to ``starts[k // width + 1]``."""
    (sorted_keys, order, origin, extent, strides), (starts, width) = index
    half, one = np.float32(0.5), np.float32(1.0)
    weights, rows = np.empty(8, np.float32), np.empty(8, np.int64)
    for i in range(points.shape[0]):
        batch = (first_query + i) // queries_per_item
        qx, qy, qz = points[i, 0], points[i, 1], points[i, 2]
        bx, by, bz = math.floor(qx - half), math.floor(qy - half), math.floor(qz - half)
        total = np.float32(0.0)
        for k in range(8):  # corner k at (k & 1, k >> 1 & 1, k >> 2 & 1), FlexGEMM's order
            corner = (batch, bx + (k & 1), by + (k >> 1 & 1), bz + (k >> 2 & 1))
            rows[k], weights[k] = -1, 0.0
            key, inside = 0, True
            for axis in range(4):
                offset = corner[axis] - origin[axis]
                inside &= 0 <= offset < extent[axis] and (axis == 0 or 0 <= corner[axis] < grid_shape[axis - 1])
                key += offset * strides[axis]
            if not inside:  # outside the grid or the voxels' box: absent
                continue
            column = key // width
            slot = _find(sorted_keys, key, starts[column], starts[column + 1])
            if slot < 0:
                continue
            dx = abs(qx - np.float32(corner[1]) - half)
            dy = abs(qy - np.float32(corner[2]) - half)
            dz = abs(qz - np.float32(corner[3]) - half)
            rows[k], weights[k] = order[slot], (one - dx) * (one - dy) * (one - dz)
            total += weights[k]
        total = max(total, np.float32(MIN_WEIGHT_SUM))
        for channel in range(feats.shape[1]):
            value = np.float32(0.0)
            for k in range(8):
                if rows[k] >= 0:
                    value += weights[k] / total * feats[rows[k], channel]
            out[i, channel] = value


def _column_starts(sorted_keys: np.ndarray, count: int, width: int) -> tuple[np.ndarray, int]:
    """Where each ``(batch, x, y)`` column's keys start (its z run: a binary search of a few slots instead of all);
    one column of every key when there would be far more columns than voxels (a sparse, wide box)."""
    if count > COLUMNS_PER_VOXEL * len(sorted_keys):
        return np.array([0, len(sorted_keys)], np.int64), count * width
    return np.searchsorted(sorted_keys, np.arange(count + 1, dtype=np.int64) * width), width


def grid_sample_3d_cpu(
    feats: torch.Tensor, coords: torch.Tensor, shape: Sequence[int], grid: torch.Tensor
) -> torch.Tensor:
    """:func:`trellis2_npu.grid_sample.grid_sample_3d` (trilinear) for float32 CPU tensors: ``[B, L, C]`` samples of
    ``feats [N, C]`` at ``(batch, x, y, z)`` rows ``coords [N, 4]``, grid ``shape[-3:]``, queries ``grid [B, L, 3]``."""
    if not applies(feats, grid):
        raise ValueError("grid_sample_3d_cpu takes float32 CPU tensors; use grid_sample.grid_sample_3d otherwise")
    num_items, num_queries = grid.shape[:2]
    index = build_voxel_index(coords)
    arrays = (index.sorted_keys, index.order, index.origin, index.extent, index.strides)
    index_arrays = tuple(np.ascontiguousarray(array.numpy()) for array in arrays)
    grid_shape = np.array(tuple(shape[-3:]), np.int64)
    values = np.ascontiguousarray(feats.detach().numpy())
    points = np.ascontiguousarray(grid.detach().reshape(-1, 3).numpy())
    out = np.zeros((len(points), feats.shape[1]), np.float32)

    def sample(start: int) -> None:
        rows = slice(start, start + QUERIES_PER_TASK)
        _sample(points[rows], start, num_queries, (index_arrays, columns), grid_shape, values, out[rows])

    if index.num_voxels:
        columns = _column_starts(index_arrays[0], int(index.extent[:3].prod()), int(index.extent[3]))
        task_runner(grid.device)(sample, range(0, len(points), QUERIES_PER_TASK))
    return torch.from_numpy(out).reshape(num_items, num_queries, feats.shape[1])
