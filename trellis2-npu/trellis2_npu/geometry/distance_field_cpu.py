"""The remesh's distance slabs compiled for the host CPU (numba): one loop over each face's box of corners.

:meth:`trellis2_npu.geometry.distance_field.DistanceSlab.squared_distances` builds, in torch, every (face, corner)
pair of a box shape at once from per-axis terms; on the CPU those broadcasts and the ``amin`` scatter were most of
the remesh. Here each face's terms are computed once and its box's corners are visited in turn, with the same
quantities in float32 relative to the box (:func:`trellis2_npu.geometry.distance_field._box_squared_distances`: the
plane height where the corner projects inside the face, else the nearest edge segment; degenerate faces only use
their edges), each corner keeping its smallest value. The kernel releases the GIL: the remesh runs slabs on
``deliverykit.cpu_tasks``' workers. It compiles on first use and is cached on disk by numba.
"""

from __future__ import annotations

import math

import numba
import numpy as np
import torch

from .distance_field import DEGENERATE_FRAME, DistanceSlab

TINY = np.float32(np.finfo(np.float32).tiny)  # the smallest edge length² (a zero-length edge's position is 0)


def applies(triangles: torch.Tensor) -> bool:
    """Whether :func:`squared_distances_cpu` takes these faces: float32 on the CPU."""
    return triangles.device.type == "cpu" and triangles.dtype == torch.float32


@numba.njit(inline="always")
def _dot(u, v):
    """As ``distance_field._dot``: the three products summed in order."""
    return (u[0] * v[0] + u[1] * v[1]) + u[2] * v[2]


@numba.njit(inline="always")
def _affine(gradient, offset, x, y, z):
    """As ``distance_field._affine`` at one corner: ``((x·g0 + offset) + y·g1) + z·g2``."""
    return ((x * gradient[0] + offset) + y * gradient[1]) + z * gradient[2]


@numba.njit(inline="always")
def _edge_squared(start, edge, x, y, z):
    """Squared distance from corner ``(x, y, z)`` to the segment ``start + t·edge``, ``t`` in ``[0, 1]``."""
    length2 = max(_dot(edge, edge), TINY)
    along = _affine(edge, -_dot(edge, start), x, y, z)
    t = min(max(along / length2, np.float32(0.0)), np.float32(1.0))
    to_start = ((x - start[0]) ** 2 + (y - start[1]) ** 2) + (z - start[2]) ** 2
    return to_start + t * (t * length2 - np.float32(2.0) * along)


@numba.njit(inline="always")
def _minus(u, v):
    return (u[0] - v[0], u[1] - v[1], u[2] - v[2])


@numba.njit(inline="always")
def _divided(u, scale):
    return (u[0] / scale, u[1] / scale, u[2] / scale)


@numba.njit(inline="always")
def _dual(s, u, t, v, det):
    """``(s·u - t·v) / det``: a dual basis vector of the face's plane, as ``distance_field``."""
    return _divided((s * u[0] - t * v[0], s * u[1] - t * v[1], s * u[2] - t * v[2]), det)


@numba.njit(nogil=True, cache=True)
def _scatter_boxes(triangles, boxes, size_yz, values):
    """``values`` (a slab's corners, flat) lowered to each face's squared distance over the corners of its box
    (``boxes``: ``(low, high, origin)``, the boxes inclusive and relative to the slab's first corner ``origin``;
    ``size_yz``: corners per row and per plane)."""
    low, high, origin = boxes
    size_y, size_z = size_yz
    zero, one = np.float32(0.0), np.float32(1.0)
    for face in range(triangles.shape[0]):
        box = (
            np.float32(low[face, 0] + origin[0]),
            np.float32(low[face, 1] + origin[1]),
            np.float32(low[face, 2] + origin[2]),
        )
        a, b, c = _minus(triangles[face, 0], box), _minus(triangles[face, 1], box), _minus(triangles[face, 2], box)
        ab, ac = _minus(b, a), _minus(c, a)
        normal = (ab[1] * ac[2] - ab[2] * ac[1], ab[2] * ac[0] - ab[0] * ac[2], ab[0] * ac[1] - ab[1] * ac[0])
        gram_aa, gram_ab, gram_cc = _dot(ab, ab), _dot(ab, ac), _dot(ac, ac)
        det = gram_aa * gram_cc - gram_ab * gram_ab
        flat = det <= np.float32(DEGENERATE_FRAME) * gram_aa * gram_cc
        if flat:  # nothing is inside (weight_b's offset is lowered by one): only the edges count
            dual_b, dual_c, unit_normal = (zero, zero, zero), (zero, zero, zero), normal
        else:
            dual_b, dual_c = _dual(gram_cc, ab, gram_ab, ac, det), _dual(gram_aa, ac, gram_ab, ab, det)
            unit_normal = _divided(normal, np.float32(math.sqrt(_dot(normal, normal))))
        dual_a = (-dual_b[0] - dual_c[0], -dual_b[1] - dual_c[1], -dual_b[2] - dual_c[2])
        offset_a = one + _dot((dual_b[0] + dual_c[0], dual_b[1] + dual_c[1], dual_b[2] + dual_c[2]), a)
        offset_b, offset_c = -_dot(dual_b, a) - (one if flat else zero), -_dot(dual_c, a)
        offset_height = -_dot(unit_normal, a)
        for i in range(high[face, 0] - low[face, 0] + 1):
            for j in range(high[face, 1] - low[face, 1] + 1):
                row = ((low[face, 0] + i) * size_y + low[face, 1] + j) * size_z + low[face, 2]
                x, y = np.float32(i), np.float32(j)
                for k in range(high[face, 2] - low[face, 2] + 1):
                    z = np.float32(k)
                    inside = (
                        min(
                            _affine(dual_a, offset_a, x, y, z),
                            _affine(dual_b, offset_b, x, y, z),
                            _affine(dual_c, offset_c, x, y, z),
                        )
                        >= zero
                    )
                    if inside:
                        height = _affine(unit_normal, offset_height, x, y, z)
                        squared = height * height
                    else:
                        squared = min(
                            _edge_squared(a, ab, x, y, z), _edge_squared(b, _minus(c, b), x, y, z),
                            _edge_squared(c, _minus(a, c), x, y, z),
                        )  # fmt: skip
                        squared = max(squared, zero)
                    values[row + k] = min(values[row + k], squared)


def squared_distances_cpu(slab: DistanceSlab) -> torch.Tensor:
    """:meth:`~trellis2_npu.geometry.distance_field.DistanceSlab.squared_distances` of a slab of float32 CPU faces."""
    if not applies(slab.triangles):
        raise ValueError("squared_distances_cpu takes float32 CPU faces; use DistanceSlab.squared_distances otherwise")
    values = np.full(math.prod(slab.shape), np.inf, np.float32)
    boxes = tuple(np.ascontiguousarray(part.numpy().astype(np.int64)) for part in (slab.low, slab.high, slab.origin))
    _scatter_boxes(np.ascontiguousarray(slab.triangles.numpy()), boxes, np.array(slab.shape[1:], np.int64), values)
    return torch.from_numpy(values).view(slab.shape)
