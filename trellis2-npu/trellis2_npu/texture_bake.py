"""UV unwrapping and PBR texture baking for the textured GLB, without nvdiffrast, cuBVH or CuMesh.

Adapted from: microsoft/TRELLIS.2 @ 5565d240, ``o-voxel/o_voxel/postprocess.py::to_glb``, the steps after
simplification ("UV Parameterization", "Texture Baking", "Texture Post-Processing"), and JeffreyXiang/CuMesh @
cf1a2f0 ``cumesh/cumesh.py::CuMesh.uv_unwrap``. Upstream's steps and what stands in for them here:

1. ``uv_unwrap``: drop degenerate faces, cluster faces on the GPU (normal cones), then xatlas ``compute_charts`` +
   ``pack_charts`` per cluster → :func:`unwrap_uv` (faces grouped by the dominant axis of their normal, then xatlas
   with the same default options).
2. nvdiffrast ``rasterize`` of the UVs at ``texture_size²`` in 100k-face chunks, later chunks overwriting earlier
   ones → :func:`rasterize_uv` (vectorised barycentric test over each face's texel box; the highest face id wins).
3. nvdiffrast ``interpolate`` of the vertex positions → the same barycentric sum in torch.
4. cuBVH ``unsigned_distance`` on the mesh *before* simplification → :func:`closest_points_on_mesh` (a uniform grid
   of faces and an exact point-triangle distance, in chunks).
5. FlexGEMM ``grid_sample_3d`` at ``(p - aabb_min) / voxel_size`` → :func:`trellis2_npu.grid_sample.grid_sample_3d`.
6. ``uint8`` by ``clip(x · 255)``, ``cv2.inpaint(TELEA)`` of the texels no face covers (radius 3 for the base colour,
   1 for the rest), PBR packing → :func:`pack_pbr_textures`.

Texel ``(row y, column x)`` is centred at ``u = (x + 0.5) / T``, ``v = (y + 0.5) / T``: rows grow with ``v``, as in
upstream's nvdiffrast raster of ``(2u - 1, 2v - 1)``. The GLB writer flips ``v`` (``1 - v``) as upstream does.

Tensors may live on any device; each function computes on its inputs' device, except xatlas and OpenCV, which run
on the host (:func:`unwrap_uv` returns its tensors on the input device).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import cv2
import numpy as np
import torch
import xatlas

from .grid_sample import grid_sample_3d
from .mesh_io import PBR_LAYOUT

logger = logging.getLogger(__name__)

MAX_TEXTURE_SIZE = 8192
DEGENERATE_ABS_AREA = 1e-24  # CuMesh remove_degenerate_faces defaults: a face goes when its area is below both
DEGENERATE_REL_AREA = 1e-12  # the absolute threshold and this fraction of its longest edge squared
INPAINT_RADIUS_BASE_COLOR = 3  # upstream's cv2.inpaint radii
INPAINT_RADIUS_OTHER = 1
DEFAULT_PAIRS_PER_CHUNK = 1 << 18  # (face, texel) or (point, face) pairs tested at once: small enough to stay in cache
GRID_CELL_EDGES = 1.0  # closest-point grid cell side, in mean edge lengths of the reference mesh (measured best)
GRID_MARGIN_CELLS = 0.25  # faces also enter the cells within this many cell sides of their bounding box
GRID_RING_SEARCHES = (1, 2)  # neighbour rings searched for the few points not resolved in their own cell
GRID_MAX_CELLS = 1024  # cells per side at most, however small the faces
BOUNDED_CELL_FRACTION = 0.8  # closest_points_within: cells of 0.8·max_distance, one ring reaches it (measured fastest)
DEGENERATE_FRAME = 1e-10  # sin² of a face's angle at corner a below which its plane is not trusted (float32)

PairChunks = Iterator[tuple[torch.Tensor, torch.Tensor]]  # chunks of (owner, other) index pairs


class UVMesh(NamedTuple):
    """A mesh cut along its UV seams: ``vertices [V', 3]``, ``faces [F', 3]`` (int64), ``uvs [V', 2]`` (float32,
    in ``[0, 1]``) and ``vmapping [V']`` (int64), the input vertex each new vertex copies (upstream's ``vmaps``).

    The field order is that of upstream's ``uv_unwrap(return_vmaps=True)``, so it unpacks like it.
    """

    vertices: torch.Tensor
    faces: torch.Tensor
    uvs: torch.Tensor
    vmapping: torch.Tensor


class PBRTextures(NamedTuple):
    """The two glTF textures, host ``uint8`` arrays ready for ``PIL.Image.fromarray``, and the baked texels.

    ``base_color_rgba [T, T, 4]`` is (base colour, alpha); ``metallic_roughness [T, T, 3]`` is (0, roughness,
    metallic) in (R, G, B), glTF's packing; ``coverage [T, T]`` (bool) marks the texels a face covers, the others
    are inpainted. Row ``y`` holds ``v = (y + 0.5) / T``.
    """

    base_color_rgba: np.ndarray
    metallic_roughness: np.ndarray
    coverage: np.ndarray


class ClosestPoints(NamedTuple):
    """Per query point: the closest surface point ``[P, 3]``, its face ``[P]`` (int64) and the distance ``[P]``."""

    points: torch.Tensor
    face_ids: torch.Tensor
    distances: torch.Tensor


# ----------------------------------------------------------------------------------------------------------------
# UV unwrapping


def unwrap_uv(vertices: torch.Tensor, faces: torch.Tensor, texture_size: int | None = None) -> UVMesh:
    """Cut the mesh into charts, flatten them and pack them into the unit square with xatlas.

    Replaces CuMesh ``uv_unwrap`` as ``to_glb`` calls it: degenerate faces are dropped first (CuMesh's
    ``remove_degenerate_faces`` defaults), faces are grouped before xatlas sees them, and xatlas charts and packs
    with its default options (those of CuMesh's wrapper). Upstream groups faces by GPU cone clustering (90° cones);
    here each face joins the one of the six axis directions closest to its normal, within one of 8³ spatial cells
    (:func:`_chart_groups`). Grouping is not optional: xatlas 0.0.11 crashes (SIGSEGV in ``PackCharts``) on a smooth
    82k-face sphere left whole, and on a noisy one it took 35 s whole against 1.1 s grouped (measured on CPU).

    Args:
        vertices (`torch.Tensor`): ``[V, 3]`` float positions.
        faces (`torch.Tensor`): ``[F, 3]`` integer vertex indices.
        texture_size (`int`, *optional*): the texture the charts will be baked into. When given, charts are packed
            for that resolution with a 2-texel gutter, so that bilinear texture filtering at a chart's border reads
            that chart's (inpainted) colours instead of a neighbouring chart's.

    Returns:
        `UVMesh`: new vertices (copies of input vertices, duplicated along seams), faces, UVs in ``[0, 1]`` and the
        input vertex of each new vertex, on the input device; vertices keep the input dtype.
    """
    _check_mesh(vertices, faces)
    host_vertices = vertices.detach().to("cpu", torch.float32)
    host_faces = faces.detach().to("cpu", torch.long)
    host_faces = host_faces[_non_degenerate(host_vertices, host_faces)]
    groups = _chart_groups(host_vertices, host_faces)

    atlas = xatlas.Atlas()
    group_vertices = []
    for group in torch.unique(groups):
        used, local_faces = torch.unique(host_faces[groups == group], return_inverse=True)
        atlas.add_mesh(host_vertices[used].numpy(), local_faces.numpy().astype(np.uint32))
        group_vertices.append(used)
    if not group_vertices:
        raise ValueError(f"unwrap_uv: all {faces.shape[0]} faces are degenerate (zero area); nothing to unwrap")
    pack_options = xatlas.PackOptions()
    if texture_size is not None:
        pack_options.resolution = texture_size
        pack_options.padding = CHART_PADDING_TEXELS
    atlas.generate(pack_options=pack_options)

    vmapping, new_faces, uvs, offset = [], [], [], 0
    for index, used in enumerate(group_vertices):
        mesh_vmapping, mesh_faces, mesh_uvs = atlas[index]
        vmapping.append(used[torch.from_numpy(mesh_vmapping.astype(np.int64))])
        new_faces.append(torch.from_numpy(mesh_faces.astype(np.int64)).reshape(-1, 3) + offset)
        uvs.append(torch.from_numpy(mesh_uvs))
        offset += len(mesh_vmapping)
    vmapping = torch.cat(vmapping).to(vertices.device)
    logger.info(
        "unwrap_uv: %d faces, %d charts, atlas utilisation %.2f", len(host_faces), atlas.chart_count, atlas.utilization
    )
    return UVMesh(
        vertices=vertices.detach()[vmapping],
        faces=torch.cat(new_faces).to(vertices.device),
        uvs=torch.cat(uvs).clamp(0, 1).to(vertices.device),
        vmapping=vmapping,
    )


def _non_degenerate(vertices: torch.Tensor, faces: torch.Tensor) -> torch.Tensor:
    """``[F]`` bool: no repeated index, and area ≥ min(1e-12 · longest edge², 1e-24) (CuMesh, in float32).

    A mask rather than :func:`trellis2_npu.mesh_repair.remove_degenerate_faces`, which also renumbers the vertices:
    ``vmapping`` must index the caller's vertices.
    """
    repeated = (faces[:, 0] == faces[:, 1]) | (faces[:, 1] == faces[:, 2]) | (faces[:, 2] == faces[:, 0])
    corners = vertices[faces]
    edges = corners.roll(-1, dims=1) - corners
    area = 0.5 * torch.linalg.cross(edges[:, 0], edges[:, 1]).norm(dim=1)
    longest_squared = edges.square().sum(dim=2).amax(dim=1)
    return ~repeated & (area >= torch.clamp(DEGENERATE_REL_AREA * longest_squared, max=DEGENERATE_ABS_AREA))


CHART_PADDING_TEXELS = 2
SPATIAL_CELLS = 8  # per axis: groups = 6 normal directions × 8³ cells of the bounding box


def _chart_groups(vertices: torch.Tensor, faces: torch.Tensor, cells: int = SPATIAL_CELLS) -> torch.Tensor:
    """``[F]`` group ids: dominant normal direction × spatial cell of the face centroid.

    xatlas' chart growing is superlinear in the size of what it is given: a noisy 327k-face sphere took 34 s in 6
    normal groups and 3.2 s split further into 8³ cells (measured on this CPU); charts never cross a cell border.
    """
    centroids = vertices[faces].mean(dim=1)
    low, high = centroids.min(dim=0).values, centroids.max(dim=0).values
    cell = ((centroids - low) / (high - low).clamp_min(1e-12) * cells).long().clamp(0, cells - 1)
    cell_id = (cell[:, 0] * cells + cell[:, 1]) * cells + cell[:, 2]
    return _dominant_normal_axis(vertices, faces) * cells**3 + cell_id


def _dominant_normal_axis(vertices: torch.Tensor, faces: torch.Tensor) -> torch.Tensor:
    """``[F]`` in ``0..5``: which of +x, −x, +y, −y, +z, −z is closest to each face's normal."""
    corners = vertices[faces]
    normals = torch.linalg.cross(corners[:, 1] - corners[:, 0], corners[:, 2] - corners[:, 0])
    axis = normals.abs().argmax(dim=1)
    negative = normals.gather(1, axis[:, None]).squeeze(1) < 0
    return 2 * axis + negative.long()


# ----------------------------------------------------------------------------------------------------------------
# Rasterisation in UV space


def rasterize_uv(
    uvs: torch.Tensor, faces: torch.Tensor, texture_size: int, pairs_per_chunk: int = DEFAULT_PAIRS_PER_CHUNK
) -> tuple[torch.Tensor, torch.Tensor]:
    """Which face covers each texel of a ``texture_size²`` texture, and where in that face.

    Replaces nvdiffrast ``rasterize`` of ``(2u - 1, 2v - 1, 0, 1)`` in ``to_glb``: a texel is covered when its
    centre lies in the face (edges included, both windings); where faces overlap, the highest face index wins,
    as upstream's later 100k-face chunks overwrite earlier ones. Faces of zero UV area cover nothing. Each face's
    texel box is enumerated and tested in chunks of ``pairs_per_chunk`` (face, texel) pairs, so memory does not
    depend on face count or face size.

    Args:
        uvs (`torch.Tensor`): ``[V, 2]`` UVs in ``[0, 1]``; the barycentrics are computed in their dtype (at
            least float32).
        faces (`torch.Tensor`): ``[F, 3]`` integer indices into ``uvs``.
        texture_size (`int`): texture side ``T``, a power of two up to 8192.
        pairs_per_chunk (`int`, *optional*, defaults to 262144): (face, texel) candidates tested at once.

    Returns:
        `tuple[torch.Tensor, torch.Tensor]`: ``face_id [T, T]`` int64 (−1 where no face covers the texel) and
        ``barycentrics [T, T, 3]`` (weights of the face's corners 0, 1, 2; zero where uncovered). Row ``y`` is
        ``v = (y + 0.5) / T``, column ``x`` is ``u = (x + 0.5) / T``.
    """
    texels, face_ids, barycentrics = _rasterize_covered_texels(uvs, faces, texture_size, pairs_per_chunk)
    size = texture_size * texture_size
    face_image = torch.full((size,), -1, dtype=torch.long, device=uvs.device).index_copy_(0, texels, face_ids)
    bary_image = barycentrics.new_zeros(size, 3).index_copy_(0, texels, barycentrics)
    return face_image.reshape(texture_size, texture_size), bary_image.reshape(texture_size, texture_size, 3)


def _rasterize_covered_texels(
    uvs: torch.Tensor, faces: torch.Tensor, texture_size: int, pairs_per_chunk: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The covered texels only: flat texel index ``[K]`` (ascending), winning face ``[K]``, barycentrics ``[K, 3]``."""
    check_texture_size(texture_size)
    _check_chunk(pairs_per_chunk)
    if uvs.dim() != 2 or uvs.shape[1] != 2 or faces.dim() != 2 or faces.shape[1] != 3:
        raise ValueError(f"expected uvs [V, 2] and faces [F, 3], got {tuple(uvs.shape)} and {tuple(faces.shape)}")
    dtype = torch.promote_types(uvs.dtype, torch.float32)
    # Texel units: texel (x, y) is centred at the integer point (x, y).
    corners = uvs.to(dtype)[faces.long()] * texture_size - 0.5  # [F, 3, 2]
    first = corners.amin(dim=1).ceil().clamp(0, texture_size - 1).long()
    last = corners.amax(dim=1).floor().clamp(0, texture_size - 1).long()
    spans = (last - first + 1).clamp_min(0)
    spans = torch.where(_signed_double_area(corners).unsqueeze(1) == 0, 0, spans)
    pair_counts = spans[:, 0] * spans[:, 1]

    winner = torch.full((texture_size * texture_size,), -1, dtype=torch.long, device=uvs.device)
    for face, local in _ragged_chunks(pair_counts, pairs_per_chunk):
        x = first[face, 0] + local % spans[face, 0]
        y = first[face, 1] + local // spans[face, 0]
        inside = (_barycentrics_2d(corners[face], torch.stack([x, y], dim=1).to(dtype)) >= 0).all(dim=1)
        winner.scatter_reduce_(0, (y * texture_size + x)[inside], face[inside], reduce="amax")

    texels = (winner >= 0).nonzero().squeeze(1)
    face_ids = winner[texels]
    points = torch.stack([texels % texture_size, texels // texture_size], dim=1).to(dtype)
    return texels, face_ids, _barycentrics_2d(corners[face_ids], points)


def _signed_double_area(corners: torch.Tensor) -> torch.Tensor:
    """``[F]`` twice the signed area of 2D triangles ``[F, 3, 2]``."""
    return _cross_2d(corners[:, 1] - corners[:, 0], corners[:, 2] - corners[:, 0])


def _barycentrics_2d(corners: torch.Tensor, points: torch.Tensor) -> torch.Tensor:
    """``[P, 3]`` barycentrics of ``points [P, 2]`` in triangles ``[P, 3, 2]`` (of either winding, non-zero area).

    Each weight is an edge function (relative to the edge's first corner, which keeps float32 exact enough at
    texel scale) over the signed area; all three are ≥ 0 exactly when the point is inside or on an edge.
    """
    a, b, c = corners.unbind(dim=1)
    weights = torch.stack(
        [_cross_2d(c - b, points - b), _cross_2d(a - c, points - c), _cross_2d(b - a, points - a)], dim=1
    )
    return weights / _cross_2d(b - a, c - a).unsqueeze(1)


def _cross_2d(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return u[..., 0] * v[..., 1] - u[..., 1] * v[..., 0]


def _ragged_chunks(counts: torch.Tensor, chunk: int) -> PairChunks:
    """Enumerate ``(owner, local)`` pairs, ``local`` in ``range(counts[owner])``, ``chunk`` pairs at a time.

    Pair ``k`` of the concatenation belongs to the first owner whose running total exceeds ``k``; finding it by
    ``searchsorted`` keeps every chunk's memory at ``chunk`` pairs however large a single count is. Each chunk
    searches only the running totals of its own owners, a slice small enough to stay in cache.
    """
    ends = counts.cumsum(0)
    total = int(ends[-1]) if len(ends) else 0
    for start in range(0, total, chunk):
        stop = min(start + chunk, total)
        first, last = torch.searchsorted(
            ends, torch.tensor([start, stop - 1], device=counts.device), right=True
        ).tolist()
        pair = torch.arange(start, stop, device=counts.device)
        owner = first + torch.searchsorted(ends[first : last + 1], pair, right=True)
        yield owner, pair - (ends[owner] - counts[owner])


# ----------------------------------------------------------------------------------------------------------------
# Closest point on a triangle mesh


@dataclass
class _FaceGrid:
    """Faces bucketed by uniform cells: each face is listed in every cell its bounding box, grown by ``margin``,
    overlaps. ``keys`` (sorted, unique) are flat cell indices; cell ``keys[i]`` lists
    ``faces[starts[i] : starts[i] + counts[i]]``."""

    origin: torch.Tensor
    cell_size: float
    margin: float
    dims: torch.Tensor
    keys: torch.Tensor
    starts: torch.Tensor
    counts: torch.Tensor
    faces: torch.Tensor


@dataclass
class _Triangles:
    """The reference faces: ``corners [F, 3, 3]`` and ``frames [16, F]``, per face (channel-major, so that each
    quantity gathers into a contiguous row) the data of :func:`_point_face_bounds`: corner ``a`` (0:3), unit
    normal (3:6), the dual in-plane basis that gives the barycentrics of ``b`` (6:9) and ``c`` (9:12), the altitudes
    from ``a``, ``b``, ``c`` (12:15) and whether the face is degenerate (15)."""

    corners: torch.Tensor
    frames: torch.Tensor


def closest_points_on_mesh(
    points: torch.Tensor,
    vertices: torch.Tensor,
    faces: torch.Tensor,
    pairs_per_chunk: int = DEFAULT_PAIRS_PER_CHUNK,
) -> ClosestPoints:
    """The closest point of a triangle mesh to each query point (exact, unsigned).

    Replaces cuBVH ``unsigned_distance(points, return_uvw=True)`` in ``to_glb``, which snaps each texel's point to
    the mesh before simplification. Instead of a BVH, faces are bucketed in a uniform grid (cells of
    :data:`GRID_CELL_EDGES` mean edge lengths; a face enters every cell its bounding box, grown by
    :data:`GRID_MARGIN_CELLS` cells, touches). A point tests the faces of its own cell; that answer is exact when
    the distance found is at most the margin plus the point's distance to its cell's walls, which holds for nearly
    every point near the surface. The rest search the rings of cells around theirs, then, if still unresolved,
    every face. Each (point, face) pair first gets a cheap bound (exact when the point projects inside the face);
    only pairs whose bound could beat the best exact distance get Ericson's closest-point test (Real-Time Collision
    Detection, 5.1.5). Pairs are processed ``pairs_per_chunk`` at a time.

    Args:
        points (`torch.Tensor`): ``[P, 3]`` query points.
        vertices (`torch.Tensor`): ``[V, 3]`` mesh vertices.
        faces (`torch.Tensor`): ``[F, 3]`` integer vertex indices (at least one face).
        pairs_per_chunk (`int`, *optional*, defaults to 262144): (point, face) pairs evaluated at once.

    Returns:
        `ClosestPoints`: closest points ``[P, 3]``, their faces ``[P]`` and distances ``[P]``, in the promoted
        dtype of ``points`` and ``vertices`` (at least float32). Of faces at the same distance the lowest index wins.
    """
    _check_mesh(vertices, faces)
    _check_chunk(pairs_per_chunk)
    if faces.shape[0] == 0:
        raise ValueError("closest_points_on_mesh needs a mesh with at least one face, got 0 faces")
    if points.dim() != 2 or points.shape[1] != 3:
        raise ValueError(f"points must be [P, 3], got shape {tuple(points.shape)}")
    dtype = torch.promote_types(torch.promote_types(points.dtype, vertices.dtype), torch.float32)
    points = points.to(dtype)
    triangles = _prepare_triangles(vertices.to(dtype)[faces.long()])
    grid = _build_face_grid(triangles.corners, pairs_per_chunk)

    best_squared = torch.full((points.shape[0],), math.inf, dtype=dtype, device=points.device)
    best_face = torch.zeros(points.shape[0], dtype=torch.long, device=points.device)
    pending = torch.arange(points.shape[0], device=points.device)
    for ring in (0, *GRID_RING_SEARCHES):
        cells, reach = _cells_around(grid, points[pending], ring)
        candidates = _faces_in_cells(grid, cells, pairs_per_chunk)
        _keep_nearest(triangles, points, pending, candidates, best_squared, best_face)
        pending = pending[best_squared[pending] > reach.square()]
        if not len(pending):
            break
    if len(pending):  # still unresolved (far from the mesh): test every face
        logger.debug("closest_points_on_mesh: %d of %d points tested against all faces", len(pending), len(points))
        every_face = _ragged_chunks(torch.full_like(pending, len(triangles.corners)), pairs_per_chunk)
        _keep_nearest(triangles, points, pending, every_face, best_squared, best_face)

    closest = _closest_points_on_triangles(points, triangles.corners[best_face])
    return ClosestPoints(points=closest, face_ids=best_face, distances=(points - closest).norm(dim=1))


def closest_points_within(
    points: torch.Tensor,
    vertices: torch.Tensor,
    faces: torch.Tensor,
    max_distance: float,
    cell_size: float | None = None,
    pairs_per_chunk: int = DEFAULT_PAIRS_PER_CHUNK,
) -> ClosestPoints:
    """:func:`closest_points_on_mesh` for points of which only those near the mesh matter (the narrow-band remesh).

    The same exact search, but the rings of cells around a point grow only until they reach ``max_distance``, and
    no face beyond it gets the exact test: a point with no face that close gets distance ``+inf`` (its ``points``
    row is the query itself, its face ``-1``) instead of falling back to every face, which made points a few cells
    away cost as much as a brute-force search. ``cell_size`` sets the grid's cells (default:
    :data:`BOUNDED_CELL_FRACTION` of ``max_distance``, so that one ring of cells covers it).
    """
    _check_mesh(vertices, faces)
    _check_chunk(pairs_per_chunk)
    if faces.shape[0] == 0:
        raise ValueError("closest_points_within needs a mesh with at least one face, got 0 faces")
    if points.dim() != 2 or points.shape[1] != 3:
        raise ValueError(f"points must be [P, 3], got shape {tuple(points.shape)}")
    if not max_distance > 0:
        raise ValueError(f"max_distance must be positive, got {max_distance}")
    dtype = torch.promote_types(torch.promote_types(points.dtype, vertices.dtype), torch.float32)
    points = points.to(dtype)
    triangles = _prepare_triangles(vertices.to(dtype)[faces.long()])
    grid = _build_face_grid(triangles.corners, pairs_per_chunk, cell_size or BOUNDED_CELL_FRACTION * max_distance)

    # starting every point at (just above) the limit lets the search skip the exact test of any farther face
    best_squared = torch.full((points.shape[0],), max_distance**2 * (1 + 1e-6), dtype=dtype, device=points.device)
    best_face = torch.zeros(points.shape[0], dtype=torch.long, device=points.device)
    pending, ring = torch.arange(points.shape[0], device=points.device), 0
    while len(pending):
        unresolved = []
        for chunk in pending.split(max(1, pairs_per_chunk // (2 * ring + 1) ** 3)):
            cells, reach = _cells_around(grid, points[chunk], ring)
            _keep_nearest(
                triangles, points, chunk, _faces_in_cells(grid, cells, pairs_per_chunk), best_squared, best_face
            )
            unresolved.append(chunk[(best_squared[chunk] > reach.square()) & (reach < max_distance)])
        pending, ring = torch.cat(unresolved), ring + 1

    near = best_squared <= max_distance**2
    closest = _closest_points_on_triangles(points, triangles.corners[best_face])
    return ClosestPoints(
        points=torch.where(near.unsqueeze(1), closest, points),
        face_ids=torch.where(near, best_face, -1),
        distances=torch.where(near, (points - closest).norm(dim=1), math.inf),
    )


def _prepare_triangles(corners: torch.Tensor) -> _Triangles:
    """Per-face frames for :func:`_point_face_bounds` (see :class:`_Triangles`)."""
    a, b, c = corners.unbind(dim=1)
    ab, ac = b - a, c - a
    normal = torch.linalg.cross(ab, ac)
    double_area = normal.norm(dim=1, keepdim=True)
    gram_aa, gram_ab, gram_cc = _dot(ab, ab)[:, None], _dot(ab, ac)[:, None], _dot(ac, ac)[:, None]
    det = gram_aa * gram_cc - gram_ab.square()
    degenerate = det <= DEGENERATE_FRAME * gram_aa * gram_cc
    det = torch.where(degenerate, 1, det)
    lengths = torch.stack([(c - b).norm(dim=1), ac.norm(dim=1), ab.norm(dim=1)], dim=1)
    frames = torch.cat(
        [
            a,
            normal / torch.where(degenerate, 1, double_area),
            (gram_cc * ab - gram_ab * ac) / det,
            (gram_aa * ac - gram_ab * ab) / det,
            double_area / lengths.clamp_min(torch.finfo(corners.dtype).tiny),
            degenerate.to(corners.dtype),
        ],
        dim=1,
    )
    return _Triangles(corners=corners, frames=frames.T.contiguous())


def _build_face_grid(corners: torch.Tensor, pairs_per_chunk: int, cell_size: float | None = None) -> _FaceGrid:
    """Bucket the faces ``[F, 3, 3]`` into cells of ``cell_size`` (default :data:`GRID_CELL_EDGES` mean edges)."""
    if cell_size is None:
        cell_size = GRID_CELL_EDGES * (corners.roll(-1, dims=1) - corners).norm(dim=2).mean().item()
    extent = (corners.amax(dim=(0, 1)) - corners.amin(dim=(0, 1))).max().item()
    cell_size = max(cell_size, extent / GRID_MAX_CELLS, 1e-12)
    margin = GRID_MARGIN_CELLS * cell_size
    lower, upper = corners.amin(dim=1) - margin, corners.amax(dim=1) + margin
    origin = lower.amin(dim=0)
    first = ((lower - origin) / cell_size).floor().long()
    last = ((upper - origin) / cell_size).floor().long()
    dims = last.amax(dim=0) + 1
    spans = last - first + 1

    keys, owners = [], []
    for face, local in _ragged_chunks(spans.prod(dim=1), pairs_per_chunk):
        span_x, span_y = spans[face, 0], spans[face, 1]
        offset = torch.stack([local % span_x, local // span_x % span_y, local // (span_x * span_y)], dim=1)
        keys.append(_flat_cell_keys(first[face] + offset, dims))
        owners.append(face)
    keys, order = torch.cat(keys).sort(stable=True)
    unique_keys, counts = torch.unique_consecutive(keys, return_counts=True)
    return _FaceGrid(
        origin=origin,
        cell_size=cell_size,
        margin=margin,
        dims=dims,
        keys=unique_keys,
        starts=counts.cumsum(0) - counts,
        counts=counts,
        faces=torch.cat(owners)[order],
    )


def _flat_cell_keys(cells: torch.Tensor, dims: torch.Tensor) -> torch.Tensor:
    """Flat index of integer cells ``[..., 3]``; −1 for cells outside the grid."""
    inside = ((cells >= 0) & (cells < dims)).all(dim=-1)
    keys = (cells[..., 0] * dims[1] + cells[..., 1]) * dims[2] + cells[..., 2]
    return torch.where(inside, keys, -1)


def _cells_around(grid: _FaceGrid, points: torch.Tensor, ring: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Cell keys ``[P, (2·ring + 1)³]`` of the block of cells around each point's own, and the block's reach ``[P]``.

    A face closer to the point than the reach lists itself in some cell of the block (the L∞ ball of radius
    reach − margin around the point lies in the block), so a nearest candidate within the reach is exact.
    """
    position = (points - grid.origin) / grid.cell_size
    cell = position.floor()
    wall = torch.minimum(position - cell, cell + 1 - position).amin(dim=1) * grid.cell_size
    steps = torch.arange(-ring, ring + 1, device=points.device)
    offsets = torch.cartesian_prod(steps, steps, steps).reshape(-1, 3)
    keys = _flat_cell_keys(cell.long().unsqueeze(1) + offsets, grid.dims)
    return keys, grid.margin + wall + ring * grid.cell_size


def _faces_in_cells(grid: _FaceGrid, cells: torch.Tensor, pairs_per_chunk: int) -> PairChunks:
    """``(rows, faces)`` chunks: every face listed in ``cells [Q, B]``, paired with its row ``0 .. Q - 1``."""
    slot = torch.searchsorted(grid.keys, cells).clamp_max(len(grid.keys) - 1)
    found = (cells >= 0) & (grid.keys[slot] == cells)
    counts = torch.where(found, grid.counts[slot], 0).reshape(-1)
    starts = grid.starts[slot].reshape(-1)
    for owner, local in _ragged_chunks(counts, pairs_per_chunk):
        yield owner // cells.shape[1], grid.faces[starts[owner] + local]


def _keep_nearest(
    triangles: _Triangles,
    points: torch.Tensor,
    pending: torch.Tensor,
    candidates: PairChunks,
    best_squared: torch.Tensor,
    best_face: torch.Tensor,
) -> None:
    """Update ``best_squared``/``best_face`` (``[Q]``, for ``points [Q, 3]``) in place with candidate pairs.

    Each chunk of ``candidates`` pairs point ``pending[rows[k]]`` (``rows`` non-decreasing) with face ``faces[k]``.
    Pairs where the point projects inside the face have their exact distance from :func:`_point_face_bounds`; the
    others get Ericson's test only when their bound does not exceed the best exact distance known for their point.
    Work per chunk stays within the chunk's rows, so that small chunks cost no more than large ones.
    """
    points = points[pending]
    rows_of_points = points.T.contiguous()
    squared_so_far, face_so_far = best_squared[pending], best_face[pending]
    for rows, faces in candidates:
        first, last = int(rows[0]), int(rows[-1]) + 1
        local = rows - first
        frames = triangles.frames.index_select(1, faces)
        bound, inside = _point_face_bounds(rows_of_points.index_select(1, rows), frames)
        target = squared_so_far[first:last].clone().scatter_reduce_(0, local[inside], bound[inside], reduce="amin")
        refine = (~inside & (bound <= target[local])).nonzero().squeeze(1)
        refined_points = points[rows[refine]]
        closest = _closest_points_on_triangles(refined_points, triangles.corners[faces[refine]])
        squared = bound.index_copy(0, refine, (refined_points - closest).square().sum(dim=1))
        exact = inside.index_fill(0, refine, True)
        _merge_nearest(local[exact], faces[exact], squared[exact], squared_so_far[first:last], face_so_far[first:last])
    best_squared[pending], best_face[pending] = squared_so_far, face_so_far


def _point_face_bounds(points: torch.Tensor, frames: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A lower bound ``[P]`` on the squared distance of ``points [3, P]`` to faces ``frames [16, P]``, and ``[P]``
    whether it is exact.

    The point's offset splits into its height over the face's plane and its in-plane projection; a projection
    with barycentric ``λ_i < 0`` lies beyond the line of the edge opposite corner ``i``, at least
    ``-λ_i · altitude_i`` from the face. Exact when all ``λ_i ≥ 0`` (the projection is in the face). Degenerate
    faces get the bound 0, never exact. Written on rows (one quantity per contiguous row), which runs several
    times faster than reductions over a trailing dimension of 3.
    """
    x, y, z = points[0] - frames[0], points[1] - frames[1], points[2] - frames[2]
    height = x * frames[3] + y * frames[4] + z * frames[5]
    weight_b = x * frames[6] + y * frames[7] + z * frames[8]
    weight_c = x * frames[9] + y * frames[10] + z * frames[11]
    weight_a = 1 - weight_b - weight_c
    beyond = torch.maximum(
        torch.maximum((-weight_a).clamp_min(0) * frames[12], (-weight_b).clamp_min(0) * frames[13]),
        (-weight_c).clamp_min(0) * frames[14],
    )
    degenerate = frames[15] > 0
    bound = torch.where(degenerate, 0, height.square() + beyond.square())
    inside = (weight_a >= 0) & (weight_b >= 0) & (weight_c >= 0) & ~degenerate
    return bound, inside


def _merge_nearest(
    query: torch.Tensor, face: torch.Tensor, squared: torch.Tensor, best_squared: torch.Tensor, best_face: torch.Tensor
) -> None:
    """Keep, per point, the smallest squared distance (ties: the lowest face index) of the old and new pairs."""
    chunk_best = torch.full_like(best_squared, math.inf).scatter_reduce_(0, query, squared, reduce="amin")
    is_best = squared == chunk_best[query]
    chunk_face = torch.full_like(best_face, torch.iinfo(torch.long).max)
    chunk_face.scatter_reduce_(0, query[is_best], face[is_best], reduce="amin")
    better = (chunk_best < best_squared) | ((chunk_best == best_squared) & (chunk_face < best_face))
    best_squared.copy_(torch.where(better, chunk_best, best_squared))
    best_face.copy_(torch.where(better, chunk_face, best_face))


def _closest_points_on_triangles(points: torch.Tensor, triangles: torch.Tensor) -> torch.Tensor:
    """``[P, 3]`` closest point of triangle ``triangles[i]`` (``[P, 3, 3]``) to ``points[i]``.

    Ericson's region tests (vertex, edge, interior Voronoi regions), all evaluated and merged with ``where`` from
    the lowest to the highest priority; zero denominators (degenerate triangles) divide by 1 instead.
    """
    a, b, c = triangles.unbind(dim=1)
    ab, ac = b - a, c - a
    d1, d2 = _dot(ab, points - a), _dot(ac, points - a)
    d3, d4 = _dot(ab, points - b), _dot(ac, points - b)
    d5, d6 = _dot(ab, points - c), _dot(ac, points - c)
    va, vb, vc = d3 * d6 - d5 * d4, d5 * d2 - d1 * d6, d1 * d4 - d3 * d2

    total = va + vb + vc
    v, w = _safe_divide(vb, total), _safe_divide(vc, total)
    weights = torch.stack([1 - v - w, v, w], dim=1)  # interior
    t = _safe_divide(d4 - d3, (d4 - d3) + (d5 - d6))
    weights = _where_region((va <= 0) & (d4 >= d3) & (d5 >= d6), weights, [0.0, 1 - t, t])  # edge bc
    t = _safe_divide(d2, d2 - d6)
    weights = _where_region((vb <= 0) & (d2 >= 0) & (d6 <= 0), weights, [1 - t, 0.0, t])  # edge ac
    weights = _where_region((d6 >= 0) & (d5 <= d6), weights, [0.0, 0.0, 1.0])  # vertex c
    t = _safe_divide(d1, d1 - d3)
    weights = _where_region((vc <= 0) & (d1 >= 0) & (d3 <= 0), weights, [1 - t, t, 0.0])  # edge ab
    weights = _where_region((d3 >= 0) & (d4 <= d3), weights, [0.0, 1.0, 0.0])  # vertex b
    weights = _where_region((d1 <= 0) & (d2 <= 0), weights, [1.0, 0.0, 0.0])  # vertex a
    return (weights.unsqueeze(2) * triangles).sum(dim=1)


def _where_region(
    region: torch.Tensor, weights: torch.Tensor, region_weights: list[torch.Tensor | float]
) -> torch.Tensor:
    """``weights [P, 3]`` with the rows in ``region`` replaced by ``region_weights`` (per-row tensors or constants)."""
    columns = [
        torch.as_tensor(w, dtype=weights.dtype, device=weights.device).expand(len(weights)) for w in region_weights
    ]
    return torch.where(region.unsqueeze(1), torch.stack(columns, dim=1), weights)


def _dot(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return (u * v).sum(dim=-1)


def _safe_divide(numerator: torch.Tensor, denominator: torch.Tensor) -> torch.Tensor:
    return numerator / torch.where(denominator == 0, 1, denominator)


# ----------------------------------------------------------------------------------------------------------------
# Baking


def sample_texture_attributes(
    uv_mesh: UVMesh,
    reference_vertices: torch.Tensor,
    reference_faces: torch.Tensor,
    coords: torch.Tensor,
    attrs: torch.Tensor,
    voxel_size: float | Sequence[float] | torch.Tensor,
    aabb_min: float | Sequence[float] | torch.Tensor,
    texture_size: int,
    snap_distance: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The voxel attributes at every covered texel, in float, before quantisation and inpainting.

    Upstream's "Texture Baking": rasterise the UVs (:func:`rasterize_uv`), interpolate each texel's 3D point,
    snap it to the closest point of the reference mesh (the mesh before simplification, so that simplification does
    not shift the colours; :func:`closest_points_on_mesh`) and sample the voxels there with the renormalised
    trilinear ``grid_sample_3d`` at ``grid = (p - aabb_min) / voxel_size``.

    Args:
        uv_mesh (`UVMesh`): the unwrapped mesh (:func:`unwrap_uv`).
        reference_vertices (`torch.Tensor`): ``[V, 3]`` vertices of the mesh before simplification.
        reference_faces (`torch.Tensor`): ``[F, 3]`` its faces.
        coords (`torch.Tensor`): ``[N, 3]`` integer voxel indices (``MeshWithVoxel.coords``), all ≥ 0.
        attrs (`torch.Tensor`): ``[N, C]`` voxel attributes (``MeshWithVoxel.attrs``).
        voxel_size (`float` or `Sequence[float]` or `torch.Tensor`): voxel side, scalar or per axis (``1 / res``).
        aabb_min (`float` or `Sequence[float]` or `torch.Tensor`): corner of voxel ``(0, 0, 0)`` (``[-0.5] * 3``).
        texture_size (`int`): texture side ``T``, a power of two up to 8192.
        snap_distance (`float`, *optional*): how far the texels' points are expected to be from the reference
            mesh (a remeshed surface lies about its band outside it). The snap then searches only that far
            (:func:`closest_points_within`), and only the points beyond it search everywhere; the result is the same.

    Returns:
        `tuple[torch.Tensor, torch.Tensor]`: ``attributes [T, T, C]`` float32 (zero where uncovered) and
        ``coverage [T, T]`` bool, on the device of ``uv_mesh``.
    """
    check_texture_size(texture_size)
    if coords.dim() != 2 or coords.shape[1] != 3 or attrs.dim() != 2 or attrs.shape[0] != coords.shape[0]:
        raise ValueError(
            f"expected coords [N, 3] and attrs [N, C] with the same N, got {tuple(coords.shape)} and "
            f"{tuple(attrs.shape)}"
        )
    device = uv_mesh.uvs.device
    texels, face_ids, barycentrics = _rasterize_covered_texels(
        uv_mesh.uvs, uv_mesh.faces, texture_size, DEFAULT_PAIRS_PER_CHUNK
    )
    corners = uv_mesh.vertices.to(torch.float32)[uv_mesh.faces[face_ids]]  # nvdiffrast interpolates in float32
    positions = (barycentrics.to(torch.float32).unsqueeze(2) * corners).sum(dim=1)
    snapped = _snap(positions, reference_vertices.to(device), reference_faces.to(device), snap_distance)

    values = _sample_voxels(snapped, coords.to(device), attrs.to(device), voxel_size, aabb_min)
    size = texture_size * texture_size
    attributes = torch.zeros(size, attrs.shape[1], dtype=torch.float32, device=device)
    attributes.index_copy_(0, texels, values.to(torch.float32))
    coverage = torch.zeros(size, dtype=torch.bool, device=device).index_fill_(0, texels, True)
    return attributes.reshape(texture_size, texture_size, -1), coverage.reshape(texture_size, texture_size)


def _sample_voxels(
    points: torch.Tensor,
    coords: torch.Tensor,
    attrs: torch.Tensor,
    voxel_size: float | Sequence[float] | torch.Tensor,
    aabb_min: float | Sequence[float] | torch.Tensor,
) -> torch.Tensor:
    """``[P, C]`` attributes at ``points [P, 3]`` as ``to_glb`` samples them (float32 ``aabb``/``voxel_size``).

    Upstream passes the grid shape ``round((aabb_max - aabb_min) / voxel_size)``; any shape holding every voxel
    samples the same (a neighbour outside the grid is absent either way), so the coords' own extent is used.
    """
    origin = torch.as_tensor(aabb_min, dtype=torch.float32, device=points.device).expand(3)
    size = torch.as_tensor(voxel_size, dtype=torch.float32, device=points.device).expand(3)
    grid = ((points - origin) / size).reshape(1, -1, 3)
    coords = coords.long()
    shape = (1, attrs.shape[1], *(coords.amax(dim=0) + 1).tolist()) if len(coords) else (1, attrs.shape[1], 1, 1, 1)
    batched = torch.cat([torch.zeros_like(coords[:, :1]), coords], dim=1)
    return grid_sample_3d(attrs, batched, shape, grid)[0]


def pack_pbr_textures(
    attributes: torch.Tensor, coverage: torch.Tensor, layout: Mapping[str, Sequence[int]] | None = None
) -> PBRTextures:
    """Quantise, inpaint the uncovered texels and pack the glTF PBR textures, as ``to_glb`` does.

    ``uint8`` is ``clip(x · 255, 0, 255)`` truncated, as upstream. ``cv2.inpaint`` (Telea) fills every texel
    outside ``coverage`` from its covered neighbours, radius 3 for the base colour and 1 for metallic, roughness
    and alpha. Upstream inpaints those three one channel at a time; here they go through one 3-channel call,
    which OpenCV computes channel by channel with the same weights (identical bytes, ~2.5× faster).

    Args:
        attributes (`torch.Tensor`): ``[T, T, C]`` float attributes in ``[0, 1]`` (:func:`sample_texture_attributes`).
        coverage (`torch.Tensor`): ``[T, T]`` bool, the texels a face covers.
        layout (`Mapping[str, Sequence[int]]`, *optional*): ``[start, stop)`` channels of ``base_color``,
            ``metallic``, ``roughness`` and ``alpha``; defaults to :data:`trellis2_npu.mesh_io.PBR_LAYOUT`.

    Returns:
        `PBRTextures`: ``base_color_rgba [T, T, 4]``, ``metallic_roughness [T, T, 3]`` (0, roughness, metallic) and
        ``coverage [T, T]``, host numpy arrays.
    """
    layout = layout or PBR_LAYOUT
    values = attributes.detach().to("cpu", torch.float32).numpy()
    quantised = np.clip(values * 255, 0, 255).astype(np.uint8)
    covered = coverage.detach().cpu().numpy().astype(bool)
    holes = (~covered).astype(np.uint8)

    def channels(*names: str) -> np.ndarray:
        return np.ascontiguousarray(np.concatenate([quantised[..., slice(*layout[name])] for name in names], -1))

    base_color = cv2.inpaint(channels("base_color"), holes, INPAINT_RADIUS_BASE_COLOR, cv2.INPAINT_TELEA)
    metallic, roughness, alpha = np.moveaxis(
        cv2.inpaint(channels("metallic", "roughness", "alpha"), holes, INPAINT_RADIUS_OTHER, cv2.INPAINT_TELEA), -1, 0
    )
    return PBRTextures(
        base_color_rgba=np.concatenate([base_color, alpha[..., None]], axis=-1),
        metallic_roughness=np.stack([np.zeros_like(metallic), roughness, metallic], axis=-1),
        coverage=covered,
    )


def _snap(
    points: torch.Tensor, vertices: torch.Tensor, faces: torch.Tensor, snap_distance: float | None
) -> torch.Tensor:
    """Closest points on the mesh; with ``snap_distance``, a bounded search first and the unbounded one for the rest."""
    if snap_distance is None:
        return closest_points_on_mesh(points, vertices, faces).points
    near = closest_points_within(points, vertices, faces, snap_distance)
    far = (near.face_ids < 0).nonzero().squeeze(1)
    if not len(far):
        return near.points
    return near.points.index_copy(0, far, closest_points_on_mesh(points[far], vertices, faces).points)


def bake_pbr_textures(
    uv_mesh: UVMesh,
    reference_vertices: torch.Tensor,
    reference_faces: torch.Tensor,
    coords: torch.Tensor,
    attrs: torch.Tensor,
    voxel_size: float | Sequence[float] | torch.Tensor,
    aabb_min: float | Sequence[float] | torch.Tensor,
    texture_size: int,
    layout: Mapping[str, Sequence[int]] | None = None,
    snap_distance: float | None = None,
) -> PBRTextures:
    """Bake the voxel PBR attributes into the glTF textures of an unwrapped mesh (``to_glb``'s baking steps).

    :func:`sample_texture_attributes` then :func:`pack_pbr_textures`; see them for the arguments. For the decoder's
    ``MeshWithVoxel``: ``voxel_size = 1 / res``, ``aabb_min = [-0.5] * 3``.
    """
    attributes, coverage = sample_texture_attributes(
        uv_mesh, reference_vertices, reference_faces, coords, attrs, voxel_size, aabb_min, texture_size, snap_distance
    )
    return pack_pbr_textures(attributes, coverage, layout)


# ----------------------------------------------------------------------------------------------------------------
# Checks


def check_texture_size(texture_size: int) -> None:
    """``ValueError`` unless ``texture_size`` is a power of two up to 8192 (the export's range)."""
    if (
        isinstance(texture_size, bool)
        or not isinstance(texture_size, int)
        or texture_size < 1
        or texture_size & (texture_size - 1)
        or texture_size > MAX_TEXTURE_SIZE
    ):
        raise ValueError(
            f"texture_size must be a power of two up to {MAX_TEXTURE_SIZE} (e.g. 2048 or 4096), got {texture_size!r}"
        )


def _check_mesh(vertices: torch.Tensor, faces: torch.Tensor) -> None:
    if vertices.dim() != 2 or vertices.shape[1] != 3 or faces.dim() != 2 or faces.shape[1] != 3:
        raise ValueError(
            f"expected vertices [V, 3] and faces [F, 3], got {tuple(vertices.shape)} and {tuple(faces.shape)}"
        )


def _check_chunk(pairs_per_chunk: int) -> None:
    if pairs_per_chunk < 1:
        raise ValueError(f"pairs_per_chunk must be a positive number of pairs, got {pairs_per_chunk}")
