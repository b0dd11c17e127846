"""The bake's bounded closest-point search compiled for the host CPU (numba): one grid walk per point.

:func:`trellis2_npu.geometry.closest_points.closest_points_within` answers the same question in torch, on any device, as
batched gathers over (point, face) pairs; on the CPU those gathers are most of its time. Here each point walks the cells
of a uniform grid of face bounding boxes within the search distance (its own cell first, then the others while they can
still hold a nearer face), skips every face whose box is farther than the best distance so far, and runs Ericson's
closest-point test (Real-Time Collision Detection, 5.1.5; the same region order and float32 arithmetic as
:func:`~trellis2_npu.geometry.closest_points._closest_points_on_triangles`) on the rest; chunks of points run on
``deliverykit.cpu_tasks``' workers (the kernel releases the GIL). Of faces at the same distance the lowest index wins,
as there.

The kernels compile on first use and are cached on disk by numba (next to this file, or in the user's cache when that is
read-only).
"""

from __future__ import annotations

import math

import numba
import numpy as np
import torch

from deliverykit.cpu_tasks import task_runner

from .closest_points import ClosestPoints

CELL_FRACTION = 1.5  # grid cells of this many search distances (fastest of 1, 1.5 and 2 on the export benchmark)
MAX_CELLS = 1 << 24  # at most this many grid cells (the cells grow for a search distance tiny against the mesh)
LIMIT_SLACK = 1e-6  # a face exactly at the search distance still counts, as in closest_points_within
POINTS_PER_TASK = 1 << 16  # points a worker walks at a time (deliverykit.cpu_tasks: as many workers as torch threads)


@numba.njit(inline="always")
def _ratio(numerator: float, denominator: float) -> float:
    return numerator if denominator == 0 else numerator / denominator


@numba.njit(inline="always")
def _closest_on_triangle(px, py, pz, corners):
    """Ericson's closest point of triangle ``corners [3, 3]`` to ``(px, py, pz)``, float32 throughout."""
    ax, ay, az = corners[0, 0], corners[0, 1], corners[0, 2]
    bx, by, bz = corners[1, 0], corners[1, 1], corners[1, 2]
    cx, cy, cz = corners[2, 0], corners[2, 1], corners[2, 2]
    abx, aby, abz = bx - ax, by - ay, bz - az
    acx, acy, acz = cx - ax, cy - ay, cz - az
    d1 = abx * (px - ax) + aby * (py - ay) + abz * (pz - az)
    d2 = acx * (px - ax) + acy * (py - ay) + acz * (pz - az)
    d3 = abx * (px - bx) + aby * (py - by) + abz * (pz - bz)
    d4 = acx * (px - bx) + acy * (py - by) + acz * (pz - bz)
    d5 = abx * (px - cx) + aby * (py - cy) + abz * (pz - cz)
    d6 = acx * (px - cx) + acy * (py - cy) + acz * (pz - cz)
    one, zero = np.float32(1.0), np.float32(0.0)
    vc = d1 * d4 - d3 * d2
    vb = d5 * d2 - d1 * d6
    va = d3 * d6 - d5 * d4
    if d1 <= zero and d2 <= zero:  # vertex a
        wa, wb, wc = one, zero, zero
    elif d3 >= zero and d4 <= d3:  # vertex b
        wa, wb, wc = zero, one, zero
    elif vc <= zero and d1 >= zero and d3 <= zero:  # edge ab
        t = _ratio(d1, d1 - d3)
        wa, wb, wc = one - t, t, zero
    elif d6 >= zero and d5 <= d6:  # vertex c
        wa, wb, wc = zero, zero, one
    elif vb <= zero and d2 >= zero and d6 <= zero:  # edge ac
        t = _ratio(d2, d2 - d6)
        wa, wb, wc = one - t, zero, t
    elif va <= zero and d4 >= d3 and d5 >= d6:  # edge bc
        t = _ratio(d4 - d3, (d4 - d3) + (d5 - d6))
        wa, wb, wc = zero, one - t, t
    else:  # interior
        total = va + vb + vc
        v, w = _ratio(vb, total), _ratio(vc, total)
        wa, wb, wc = one - v - w, v, w
    return wa * ax + wb * bx + wc * cx, wa * ay + wb * by + wc * cy, wa * az + wb * bz + wc * cz


@numba.njit(cache=True)
def _cell_range(low: float, high: float, origin: float, cell: float, size: int) -> tuple[int, int]:
    return max(0, math.floor((low - origin) / cell)), min(size - 1, math.floor((high - origin) / cell))


@numba.njit(cache=True)
def _visit_cells(boxes, origin, cell, dims, starts, entries, count):
    """Every (cell, face) pair of a face's box ``(low xyz, high xyz)``: counted into ``starts[cell + 1]``
    (``count``), else written at ``starts[cell]``, which advances (a copy of the counts' running totals)."""
    for face in range(boxes.shape[0]):
        x0, x1 = _cell_range(boxes[face, 0], boxes[face, 3], origin[0], cell, dims[0])
        y0, y1 = _cell_range(boxes[face, 1], boxes[face, 4], origin[1], cell, dims[1])
        z0, z1 = _cell_range(boxes[face, 2], boxes[face, 5], origin[2], cell, dims[2])
        for x in range(x0, x1 + 1):
            for y in range(y0, y1 + 1):
                for z in range(z0, z1 + 1):
                    key = (x * dims[1] + y) * dims[2] + z
                    if count:
                        starts[key + 1] += 1
                    else:
                        entries[starts[key]] = face
                        starts[key] += 1


def _bucket_faces(boxes: np.ndarray, origin: np.ndarray, cell: float, dims: np.ndarray) -> tuple[np.ndarray, ...]:
    """Counting sort of the faces into every cell their box touches: ``starts [cells + 1]`` and the face ids, cell
    by cell."""
    starts = np.zeros(int(np.prod(dims)) + 1, np.int64)
    _visit_cells(boxes, origin, cell, dims, starts, starts[:0], True)
    np.cumsum(starts, out=starts)
    entries = np.empty(int(starts[-1]), np.int64)
    _visit_cells(boxes, origin, cell, dims, starts[:-1].copy(), entries, False)
    return starts, entries


@numba.njit(inline="always")
def _outside_squared(px, py, pz, box):
    """Squared distance from the point to the box ``(low xyz, high xyz)`` (0 inside)."""
    zero = np.float32(0.0)
    dx = max(box[0] - px, zero, px - box[3])
    dy = max(box[1] - py, zero, py - box[4])
    dz = max(box[2] - pz, zero, pz - box[5])
    return dx * dx + dy * dy + dz * dz


@numba.njit(nogil=True, cache=True)
def _walk(points, corners, boxes, grid, limit, found):
    """Each point's nearest face within ``limit`` (-1: none), its squared distance and its closest point there (the
    point itself if none), into ``found``: ``(closest, nearest, squared)`` rows of ``points``. ``grid``: ``(starts,
    entries, origin, cell, dims)`` of :func:`_bucket_faces`' cells. Without the GIL: chunks run on threads."""
    starts, entries, origin, cell, dims = grid
    closest, nearest, squared_distances = found
    start_best = np.float32(limit * limit * (1 + LIMIT_SLACK))
    for i in range(points.shape[0]):
        px, py, pz = points[i, 0], points[i, 1], points[i, 2]
        x0, x1 = _cell_range(px - limit, px + limit, origin[0], cell, dims[0])
        y0, y1 = _cell_range(py - limit, py + limit, origin[1], cell, dims[1])
        z0, z1 = _cell_range(pz - limit, pz + limit, origin[2], cell, dims[2])
        own = (
            math.floor((px - origin[0]) / cell),
            math.floor((py - origin[1]) / cell),
            math.floor((pz - origin[2]) / cell),
        )
        best, face_of_best = start_best, -1
        for sweep in range(2):  # its own cell first: a near face found there lets the box test skip the rest
            for x in range(x0, x1 + 1):
                for y in range(y0, y1 + 1):
                    for z in range(z0, z1 + 1):
                        mine = x == own[0] and y == own[1] and z == own[2]
                        if mine != (sweep == 0):
                            continue
                        low = (origin[0] + x * cell, origin[1] + y * cell, origin[2] + z * cell)
                        box = (low[0], low[1], low[2], low[0] + cell, low[1] + cell, low[2] + cell)
                        if not mine and _outside_squared(px, py, pz, box) > best:
                            continue
                        key = (x * dims[1] + y) * dims[2] + z
                        for k in range(starts[key], starts[key + 1]):
                            face = entries[k]
                            if _outside_squared(px, py, pz, boxes[face]) > best:
                                continue
                            qx, qy, qz = _closest_on_triangle(px, py, pz, corners[face])
                            squared = (qx - px) * (qx - px) + (qy - py) * (qy - py) + (qz - pz) * (qz - pz)
                            if squared < best or (squared == best and face < face_of_best):
                                best, face_of_best = squared, face
                                closest[i, 0], closest[i, 1], closest[i, 2] = qx, qy, qz
        nearest[i], squared_distances[i] = face_of_best, best


def closest_points_within_cpu(
    points: torch.Tensor, vertices: torch.Tensor, faces: torch.Tensor, max_distance: float
) -> ClosestPoints:
    """:func:`~trellis2_npu.geometry.closest_points.closest_points_within` for float32 CPU tensors: the nearest face
    of each point within ``max_distance`` (face ``-1``, distance ``+inf`` and the point itself where none is)."""
    if points.device.type != "cpu" or points.dtype != torch.float32 or vertices.dtype != torch.float32:
        raise ValueError("closest_points_within_cpu takes float32 CPU tensors; use closest_points_within otherwise")
    if not max_distance > 0:
        raise ValueError(f"max_distance must be positive, got {max_distance}")
    corners = np.ascontiguousarray(vertices.numpy()[faces.long().numpy()])
    boxes = np.concatenate([corners.min(axis=1), corners.max(axis=1)], axis=1)
    origin = boxes[:, :3].min(axis=0)
    extent = boxes[:, 3:].max(axis=0) - origin
    cell = max(CELL_FRACTION * max_distance, float(np.prod(extent) / MAX_CELLS) ** (1 / 3))
    dims = (np.floor(extent / cell).astype(np.int64) + 1).clip(1)
    starts, entries = _bucket_faces(boxes, origin, np.float32(cell), dims)
    query = np.ascontiguousarray(points.numpy())
    walked = (query.copy(), np.full(len(query), -1, np.int64), np.empty(len(query), np.float32))
    grid = (starts, entries, origin, np.float32(cell), dims)

    def walk(rows: slice) -> None:
        _walk(query[rows], corners, boxes, grid, max_distance, tuple(array[rows] for array in walked))

    task_runner(points.device)(
        walk, [slice(start, start + POINTS_PER_TASK) for start in range(0, len(query), POINTS_PER_TASK)]
    )
    closest, nearest, squared = (torch.from_numpy(array) for array in walked)
    near = (nearest >= 0) & (squared <= max_distance**2)  # the slack only let a face at the limit itself in
    closest = torch.where(near.unsqueeze(1), closest, points)
    return ClosestPoints(
        points=closest,
        face_ids=torch.where(near, nearest, -1),
        distances=torch.where(near, (points - closest).norm(dim=1), math.inf),
    )
