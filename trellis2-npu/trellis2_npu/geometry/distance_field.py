"""Exact distances from a triangle mesh to the corners of a grid near it, slab by slab (the remesh's UDF).

The narrow-band remesh (:mod:`trellis2_npu.geometry.remesh`) needs the unsigned distance at every grid corner within a
few
cells of the mesh; upstream queries a GPU BVH (cuBVH) for it. Here each face scatters to the corners of its
bounding box grown by the reach, and every (face, corner) pair gets the exact point-triangle distance; the
``amin`` scatter keeps each corner's nearest. Corners are not searched one by one: in a face's box the plane
height, the barycentrics, the position along each edge and the squared distance to each vertex are sums of one
term per axis, so the pairs of a box come from ``[n, kx] + [n, ky] + [n, kz]`` broadcasts (faces grouped by box
shape) with no gathers, in float32 relative to the box (coordinates of a few cells: exact to ~1e-6 cell).

The corners are held in dense slabs of planes along x, each face visiting the slabs its box meets, so memory
stays at :data:`MAX_SLAB_CORNERS` whatever the resolution. Faces longer than :data:`MAX_FACE_EDGE` cells are
split 4-way first (the distance to a face is the smallest over its pieces), so that no box is large.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch

MAX_FACE_EDGE = 2.0  # cells: longer faces are split, bounding each face's box (decoded faces are ~1 cell)
MAX_SLAB_CORNERS = 1 << 25  # corners per slab (128 MiB of float32)
PAIRS_PER_CHUNK = 1 << 18  # (face, corner) pairs evaluated at once: small enough to stay in cache
MIN_SLAB_PLANES = 16  # a face's box spans ~5 planes: thinner slabs (many workers) would compute it in many
DEGENERATE_FRAME = 1e-10  # sin² of a face's angle at corner a below which only its edges count (float32)


@dataclass(frozen=True, eq=False)  # holds tensors: identity, not elementwise comparison
class DistanceSlab:
    """The corners ``origin + (i, j, k)`` of a slab of ``shape`` and the faces ``triangles`` whose grown boxes
    ``low .. high`` (relative to ``origin``, clipped to the slab) meet it; :meth:`squared_distances` fills it."""

    origin: torch.Tensor
    shape: tuple[int, int, int]
    triangles: torch.Tensor
    low: torch.Tensor
    high: torch.Tensor

    def squared_distances(self) -> torch.Tensor:
        """``[sx, sy, sz]`` float32: each corner's squared distance to the nearest face whose box reaches it
        (compiled for the host CPU: :func:`trellis2_npu.geometry.distance_field_cpu.squared_distances_cpu`)."""
        _, size_y, size_z = self.shape
        values = torch.full((math.prod(self.shape),), torch.inf, device=self.triangles.device)
        for members, shape in _group_by_shape(self.high - self.low + 1):
            corner_keys = _box_keys(shape, size_y, size_z, self.triangles.device)
            for chunk in members.split(max(1, PAIRS_PER_CHUNK // len(corner_keys))):
                box = self.low[chunk]
                squared = _box_squared_distances(self.triangles[chunk] - (box + self.origin).unsqueeze(1), shape)
                keys = corner_keys.unsqueeze(1) + (box[:, 0] * size_y + box[:, 1]) * size_z + box[:, 2]
                values.scatter_reduce_(0, keys.reshape(-1), squared.reshape(-1), reduce="amin")
        return values.view(self.shape)


def distance_slabs(
    triangles: torch.Tensor,
    resolution: int,
    reach: float,
    max_slab_corners: int = MAX_SLAB_CORNERS,
    min_slabs: int = 1,
) -> list[DistanceSlab]:
    """The slabs along x that cover the grid corners within ``reach`` of a face's box, each independent of the
    others (consecutive slabs share their boundary plane; corners outside every slab are beyond ``reach``).

    Args:
        triangles (`torch.Tensor`): ``[F, 3, 3]`` face corners in grid units (corner ``(i, j, k)`` at ``(i, j, k)``).
        resolution (`int`): cells per side; corners run from 0 to ``resolution``.
        reach (`float`): in cells. A corner within it of the mesh gets its exact squared distance; the others get
            a value of at least ``reach²`` (``inf`` where no face comes within ``reach`` in each axis).
        max_slab_corners (`int`, *optional*): corners per slab, at least two planes of them.
        min_slabs (`int`, *optional*, defaults to 1): split into at least this many slabs where the planes allow
            (tasks for several workers), but none thinner than :data:`MIN_SLAB_PLANES` planes: a face whose box
            meets two slabs is computed in both.
    """
    triangles = _split_long_faces(triangles.to(torch.float32), MAX_FACE_EDGE)
    low = torch.ceil(triangles.amin(dim=1) - reach).long()
    high = torch.floor(triangles.amax(dim=1) + reach).long()
    meets_grid = ((high >= 0) & (low <= resolution)).all(dim=1)
    triangles, low, high = triangles[meets_grid], low[meets_grid].clamp(min=0), high[meets_grid].clamp(max=resolution)
    if not len(triangles):
        return []
    first, last = low.amin(dim=0), high.amax(dim=0)
    size_y, size_z = (last[1:] - first[1:] + 1).tolist()
    planes = max(1, max_slab_corners // (size_y * size_z) - 1)
    planes = min(planes, max(MIN_SLAB_PLANES, -(-(int(last[0]) - int(first[0])) // min_slabs)))
    slabs = []
    for x0 in range(int(first[0]), max(int(last[0]), int(first[0]) + 1), planes):
        x1 = min(x0 + planes, int(last[0]))
        origin = torch.stack([first.new_tensor(x0), first[1], first[2]])
        in_slab = ((low[:, 0] <= x1) & (high[:, 0] >= x0)).nonzero().squeeze(1)
        slab_low, slab_high = low[in_slab] - origin, high[in_slab] - origin
        slab_low[:, 0].clamp_(min=0)
        slab_high[:, 0].clamp_(max=x1 - x0)
        slabs.append(DistanceSlab(origin, (x1 - x0 + 1, size_y, size_z), triangles[in_slab], slab_low, slab_high))
    return slabs


def squared_distance_slabs(
    triangles: torch.Tensor, resolution: int, reach: float, max_slab_corners: int = MAX_SLAB_CORNERS
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Yield ``(origin, values)`` of each of :func:`distance_slabs`, one slab after the other (see there)."""
    for slab in distance_slabs(triangles, resolution, reach, max_slab_corners):
        yield slab.origin, slab.squared_distances()


def _split_long_faces(triangles: torch.Tensor, max_edge: float) -> torch.Tensor:
    """``[F', 3, 3]``: faces with an edge longer than ``max_edge`` split 4-way at their edge midpoints, repeatedly."""
    done = []
    while len(triangles):
        long = (triangles.roll(-1, dims=1) - triangles).norm(dim=2).amax(dim=1) > max_edge
        done.append(triangles[~long])
        a, b, c = triangles[long].unbind(dim=1)
        ab, bc, ca = (a + b) / 2, (b + c) / 2, (c + a) / 2
        triangles = torch.cat([torch.stack(corners, dim=1) for corners in ((a, ab, ca), (ab, b, bc), (ca, bc, c))])
        triangles = torch.cat([triangles, torch.stack([ab, bc, ca], dim=1)])
    return torch.cat(done)


def _group_by_shape(shapes: torch.Tensor) -> Iterator[tuple[torch.Tensor, list[int]]]:
    """``(rows, shape)`` for each distinct row of ``shapes [n, 3]`` (box sizes), the rows sorted."""
    radix = int(shapes.max()) + 1 if len(shapes) else 1
    keys = (shapes[:, 0] * radix + shapes[:, 1]) * radix + shapes[:, 2]
    keys, order = keys.sort(stable=True)
    distinct, counts = torch.unique_consecutive(keys, return_counts=True)
    for key, rows in zip(distinct.tolist(), order.split(counts.tolist()), strict=True):
        yield rows, [key // (radix * radix), key // radix % radix, key % radix]


def _box_keys(shape: list[int], size_y: int, size_z: int, device: torch.device) -> torch.Tensor:
    """``[kx·ky·kz]`` flat-index offsets of a box of corners in a slab of ``size_y × size_z`` corners per plane."""
    x, y, z = (torch.arange(count, device=device) for count in shape)
    return ((x[:, None, None] * size_y + y[None, :, None]) * size_z + z[None, None, :]).reshape(-1)


def _box_squared_distances(triangles: torch.Tensor, shape: list[int]) -> torch.Tensor:
    """``[kx·ky·kz, n]`` exact squared distance of face ``i`` (``triangles [n, 3, 3]``, relative to its box's first
    corner) to each corner ``(x, y, z)`` of its ``shape`` box.

    Each quantity below is affine or a sum of squares in ``p``, so it is built by :func:`_per_axis` from one
    term per axis. The distance is the plane height when ``p`` projects inside the face, else the distance to the
    nearest edge segment (``|p - v|² - t·(2·(p - v)·e - t·|e|²)`` with ``t`` the clamped position along ``e``):
    the closest point of a triangle lies in its interior or on its boundary. Degenerate faces only use edges.
    Faces run along the last, contiguous dimension, so that every broadcast vectorises over them.
    """
    axes = [torch.arange(count, device=triangles.device, dtype=torch.float32)[:, None] for count in shape]
    a, b, c = triangles.permute(1, 2, 0)  # each [3, n]: one row per coordinate
    ab, ac = b - a, c - a
    normal = torch.linalg.cross(ab, ac, dim=0)
    gram_aa, gram_ab, gram_cc = _dot(ab, ab), _dot(ab, ac), _dot(ac, ac)
    det = gram_aa * gram_cc - gram_ab.square()
    flat = det <= DEGENERATE_FRAME * gram_aa * gram_cc
    det = torch.where(flat, 1, det)
    dual_b = torch.where(flat, 0, (gram_cc * ab - gram_ab * ac) / det)
    dual_c = torch.where(flat, 0, (gram_aa * ac - gram_ab * ab) / det)
    unit_normal = normal / torch.where(flat, 1, normal.norm(dim=0))

    weight_b = _affine(axes, dual_b, -_dot(dual_b, a) - flat.float())  # −1 on flat faces: never inside
    weight_c = _affine(axes, dual_c, -_dot(dual_c, a))
    weight_a = _affine(axes, -dual_b - dual_c, 1 + _dot(dual_b + dual_c, a))
    inside = torch.minimum(torch.minimum(weight_a, weight_b), weight_c) >= 0
    del weight_a, weight_b, weight_c
    squared = None
    for start, edge in ((a, ab), (b, c - b), (c, a - c)):
        length2 = _dot(edge, edge).clamp_min(torch.finfo(torch.float32).tiny)
        along = _affine(axes, edge, -_dot(edge, start))  # (p - start)·e
        t = (along / length2).clamp_(0, 1)
        to_start = _per_axis([(axis - start[i]).square() for i, axis in enumerate(axes)])
        edge_squared = torch.addcmul(to_start, t, torch.sub(t * length2, along, alpha=2))  # 2·along: exact
        squared = edge_squared if squared is None else torch.minimum(squared, edge_squared)
    height = _affine(axes, unit_normal, -_dot(unit_normal, a))
    return torch.where(inside, height.square(), squared.clamp_min_(0)).reshape(-1, len(triangles))


def _affine(axes: list[torch.Tensor], gradient: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """``[kx, ky, kz, n]`` values ``gradient[:, i]·p + offset[i]`` at the box corners ``p`` (``gradient [3, n]``)."""
    terms = [axis * gradient[i] for i, axis in enumerate(axes)]
    terms[0] = terms[0] + offset
    return _per_axis(terms)


def _per_axis(terms: list[torch.Tensor]) -> torch.Tensor:
    """``[kx, ky, kz, n]`` sums ``x[i] + y[j] + z[k]`` of per-axis terms ``[kx, n]``, ``[ky, n]``, ``[kz, n]``."""
    x, y, z = terms
    return (x[:, None] + y[None, :])[:, :, None] + z[None, None]


def _dot(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Dot products of the columns of ``u``, ``v`` (``[3, n]``)."""
    return (u * v).sum(dim=0)
