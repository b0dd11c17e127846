"""The closest point of a triangle mesh to many query points, exact, without cuBVH (the texture bake's snap).

Adapted from: microsoft/TRELLIS.2 @ 5565d240, ``o-voxel/o_voxel/postprocess.py::to_glb``, which snaps each texel's
3D point to the mesh *before* simplification with cuBVH ``unsigned_distance`` (a GPU BVH). Here faces are bucketed
in a uniform grid and each point gets an exact point-triangle distance against the faces of the cells around it:
:func:`closest_points_on_mesh` (unbounded; chunks of (point, face) pairs) and :func:`closest_points_within` (only
the points within a distance, each face listed in one cell, the points of a cell against their faces in one
matrix product that culls the faces by their bounding spheres: the bake of a remeshed surface, the remesh's
projection). Used by :mod:`.texture_bake` and :mod:`.remesh`.

Tensors may live on any device; each function computes on its inputs' device.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

import torch

from deliverykit.cpu_tasks import task_runner

logger = logging.getLogger(__name__)

DEFAULT_PAIRS_PER_CHUNK = 1 << 18  # (face, texel) or (point, face) pairs tested at once: small enough to stay in cache

GRID_CELL_EDGES = 1.0  # closest-point grid cell side, in mean edge lengths of the reference mesh (measured best)
GRID_MARGIN_CELLS = 0.25  # faces also enter the cells within this many cell sides of their bounding box
GRID_RING_SEARCHES = (1, 2)  # neighbour rings searched for the few points not resolved in their own cell
GRID_MAX_CELLS = 1024  # cells per side at most, however small the faces
BOUNDED_CELL_FRACTION = 0.85  # closest_points_within: cells of this fraction of max_distance (fastest of 0.7-1)
ANCHOR_SPAN_QUANTILE = 0.99  # closest_points_within: faces with wider boxes are listed in more than one cell
FIRST_PASS_FRACTION = 0.85  # closest_points_within: every point searches this fraction of max_distance first
POINTS_PER_PIECE = 8  # closest_points_within: points of a cell that share one broadcast (measured best of 4-16)
DENSE_PAIRS_PER_CHUNK = 1 << 20  # closest_points_within: pairs a broadcast (4 MiB a float32 tensor; ~15% faster)
BLOCK_SLACK = 1e-4  # closest_points_within: blocks of cells reach this fraction beyond max_distance (rounding)
SPHERE_SLACK = 1e-4  # closest_points_within: faces whose bounding sphere is this fraction farther are still tested
SPHERE_ROUNDINGS = 16  # closest_points_within: bounding spheres grow by this many roundings of the largest coordinate
DEGENERATE_FRAME = 1e-10  # sin² of a face's angle at corner a below which its plane is not trusted (float32)

PairChunks = Iterator[tuple[torch.Tensor, torch.Tensor]]  # chunks of (owner, other) index pairs


class ClosestPoints(NamedTuple):
    """Per query point: the closest surface point ``[P, 3]``, its face ``[P]`` (int64) and the distance ``[P]``."""

    points: torch.Tensor
    face_ids: torch.Tensor
    distances: torch.Tensor


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
    """The reference faces: ``corners [F, 3, 3]`` and ``frames [F, 16]``, per face (one 64-byte row, so that a
    face's data gathers in one cache line; :func:`_gather_frames` turns them into rows) the data of
    :func:`_point_face_bounds`: corner ``a`` (0:3), unit normal (3:6), the dual in-plane basis that gives the
    barycentrics of ``b`` (6:9) and ``c`` (9:12), the altitudes from ``a``, ``b``, ``c`` (12:15) and whether the face
    is degenerate (15); ``spheres [F, 4]`` a bounding sphere per face (centroid, distance to the farthest corner)
    for :func:`_keep_nearest_dense`."""

    corners: torch.Tensor
    frames: torch.Tensor
    spheres: torch.Tensor


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
    _check_query("closest_points_on_mesh", points, vertices, faces, pairs_per_chunk)
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
        every_face = ragged_chunks(torch.full_like(pending, len(triangles.corners)), pairs_per_chunk)
        _keep_nearest(triangles, points, pending, every_face, best_squared, best_face)

    closest = _closest_points_on_triangles(points, triangles.corners[best_face])
    return ClosestPoints(points=closest, face_ids=best_face, distances=(points - closest).norm(dim=1))


def closest_points_within(
    points: torch.Tensor,
    vertices: torch.Tensor,
    faces: torch.Tensor,
    max_distance: float,
    cell_size: float | None = None,
    pairs_per_chunk: int = DENSE_PAIRS_PER_CHUNK,
    first_distance: float | None = None,
) -> ClosestPoints:
    """:func:`closest_points_on_mesh` for points of which only those near the mesh matter (near a remeshed surface).

    The same exact answer, but no face beyond ``max_distance`` gets the exact test: a point with no face that close
    gets distance ``+inf`` (its ``points`` row is the query itself, its face ``-1``) instead of falling back to
    every face. Each face is listed once, in the grid cell of its bounding box's lower corner
    (:func:`_build_anchor_grid`). The points are grouped by the cell they lie in, in pieces of up to
    :data:`POINTS_PER_PIECE` (:func:`_point_pieces`); a piece tests every face listed in the block of cells where
    the lower corner of a face close enough to its points must lie: one batched matrix product of its points and
    the faces' bounding-sphere centres leaves the few faces that can be the nearest, and only they get the exact
    test (:func:`_keep_nearest_dense`). Every point searches ``first_distance`` first (default
    :data:`FIRST_PASS_FRACTION` of ``max_distance``: a smaller block), then the points with nothing that close
    search the whole ``max_distance``. On the bake of the remeshed benchmark sphere (texels within a voxel or so of a
    mesh of a million faces) this is several times faster than a search per point (benchmarks/glb_bake.py).
    ``cell_size`` sets the grid's cells (default: :data:`BOUNDED_CELL_FRACTION` of ``max_distance``).
    """
    _check_query("closest_points_within", points, vertices, faces, pairs_per_chunk)
    if not max_distance > 0:
        raise ValueError(f"max_distance must be positive, got {max_distance}")
    dtype = torch.promote_types(torch.promote_types(points.dtype, vertices.dtype), torch.float32)
    points = points.to(dtype)
    triangles = _prepare_triangles(vertices.to(dtype)[faces.long()])
    grid, span = _build_anchor_grid(
        triangles.corners, cell_size or BOUNDED_CELL_FRACTION * max_distance, cell_size is None
    )

    best_squared = torch.empty(points.shape[0], dtype=dtype, device=points.device)
    best_face = torch.zeros(points.shape[0], dtype=torch.long, device=points.device)
    rows_of_points = points.T.contiguous()
    pending = torch.arange(points.shape[0], device=points.device)
    run = task_runner(points.device)

    def settle(task: tuple[_Pieces, _Chunk]) -> None:
        piece_points, piece_faces = _chunk_indices(grid, *task)
        _keep_nearest_dense(triangles, points, rows_of_points, piece_points, piece_faces, best_squared, best_face)

    first_distance = min(first_distance or FIRST_PASS_FRACTION * max_distance, max_distance)
    for distance in sorted({first_distance, max_distance}):
        if not len(pending):
            break
        # starting each point at (just above) the limit lets the search skip the exact test of any farther face
        best_squared[pending] = distance**2 * (1 + 1e-6)
        pieces = _point_pieces(grid, points, pending, distance * (1 + BLOCK_SLACK), span)
        # each point is in one chunk, so no two tasks write the same entries of best_squared / best_face
        run(settle, [(pieces, chunk) for chunk in _dense_chunks(pieces, pairs_per_chunk)])
        pending = pending[best_squared[pending] > distance**2]  # nothing that close: search farther

    near = best_squared <= max_distance**2
    closest = _closest_points_on_triangles(points, triangles.corners[best_face])
    return ClosestPoints(
        points=torch.where(near.unsqueeze(1), closest, points),
        face_ids=torch.where(near, best_face, -1),
        distances=torch.where(near, (points - closest).norm(dim=1), math.inf),
    )


class _Pieces(NamedTuple):
    """Points in groups that share their candidate faces: piece ``i`` holds the points ``order[starts[i] :
    starts[i] + sizes[i]]`` and tests the runs of faces ``grid.faces[runs[i, j] : runs[i, j] + counts[i, j]]``
    (``[n, B²]``: one run per column of its block of cells), ``face_counts[i]`` faces in all. Pieces with no faces
    are left out: their points stay unresolved."""

    order: torch.Tensor
    starts: torch.Tensor
    sizes: torch.Tensor
    runs: torch.Tensor
    counts: torch.Tensor
    face_counts: torch.Tensor


def _point_pieces(grid: _FaceGrid, points: torch.Tensor, subset: torch.Tensor, reach: float, span: float) -> _Pieces:
    """Group the points by grid cell, in pieces of at most :data:`POINTS_PER_PIECE`, each with its block of cells.

    A face within ``reach`` of a point ``p`` has its box's lower corner in ``[p - reach - span, p + reach]``
    (:func:`_build_anchor_grid`), so the cells from the piece's lowest point minus ``reach + span`` to its highest
    plus ``reach`` list every such face. Pieces come sorted by size, then by face count, so that a chunk of them
    pads little.
    """
    position = (points[subset] - grid.origin) / grid.cell_size
    cell = position.floor().long()
    low = cell.amin(dim=0)
    extent = cell.amax(dim=0) - low + 1
    keys = _flat_cell_keys(cell - low, extent)
    order = keys.argsort()
    _, cell_sizes = torch.unique_consecutive(keys[order], return_counts=True)
    # pieces: each cell's points split into runs of at most POINTS_PER_PIECE
    piece_counts = (cell_sizes + POINTS_PER_PIECE - 1) // POINTS_PER_PIECE
    cell_starts = cell_sizes.cumsum(0) - cell_sizes
    piece_cell = torch.repeat_interleave(torch.arange(len(cell_sizes), device=points.device), piece_counts)
    within = torch.arange(len(piece_cell), device=points.device) - (piece_counts.cumsum(0) - piece_counts)[piece_cell]
    starts = cell_starts[piece_cell] + within * POINTS_PER_PIECE
    sizes = torch.minimum(
        cell_sizes[piece_cell] - within * POINTS_PER_PIECE, torch.tensor(POINTS_PER_PIECE, device=points.device)
    )
    # each piece's block, from the extremes of its own points
    member = torch.repeat_interleave(torch.arange(len(starts), device=points.device), sizes)
    sorted_position = position[order]
    lowest = torch.full((len(starts), 3), math.inf, dtype=position.dtype, device=points.device)
    highest = torch.full((len(starts), 3), -math.inf, dtype=position.dtype, device=points.device)
    lowest.scatter_reduce_(0, member[:, None].expand(-1, 3), sorted_position, reduce="amin")
    highest.scatter_reduce_(0, member[:, None].expand(-1, 3), sorted_position, reduce="amax")
    first = (lowest - (reach + span) / grid.cell_size).floor().long().clamp_min(0)
    last = torch.minimum((highest + reach / grid.cell_size).floor().long(), grid.dims - 1)
    # the block's cells along z are consecutive keys, so their faces are one run of grid.faces: one run per (x, y)
    side = int((last[:, :2] - first[:, :2]).amax()) + 1 if len(first) else 1
    steps = torch.arange(side, device=points.device)
    offsets = torch.cartesian_prod(steps, steps).reshape(-1, 2)
    face_ends = torch.cat([grid.starts, grid.starts.new_tensor([len(grid.faces)])])

    def block_runs(chunk: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = (first[chunk, :2].unsqueeze(1) + offsets).unbind(dim=2)
        rows = (x * grid.dims[1] + y) * grid.dims[2]
        low = torch.searchsorted(grid.keys, rows + first[chunk, 2:])
        high = torch.searchsorted(grid.keys, rows + last[chunk, 2:], right=True)
        empty = (x > last[chunk, :1]) | (y > last[chunk, 1:2]) | (first[chunk, 2:] > last[chunk, 2:])
        return face_ends[low], torch.where(empty, 0, face_ends[high] - face_ends[low])

    chunks = torch.arange(len(first), device=points.device).split(max(1, DEFAULT_PAIRS_PER_CHUNK // len(offsets)))
    found = task_runner(points.device)(block_runs, chunks)
    runs = torch.cat([run for run, _ in found]) if found else first.new_zeros(0, len(offsets))
    counts = torch.cat([count for _, count in found]) if found else first.new_zeros(0, len(offsets))
    face_counts = counts.sum(dim=1)
    keep = (face_counts > 0).nonzero().squeeze(1)
    rank = (sizes[keep] * (int(face_counts.max()) + 1) + face_counts[keep]).argsort() if len(keep) else keep
    keep = keep[rank]
    return _Pieces(subset[order], starts[keep], sizes[keep], runs[keep], counts[keep], face_counts[keep])


class _Chunk(NamedTuple):
    """Consecutive pieces ``start .. stop - 1`` tested as one ``[G, width] × [G, height]`` block."""

    start: int
    stop: int
    width: int
    height: int


def _dense_chunks(pieces: _Pieces, pairs_per_chunk: int) -> list[_Chunk]:
    """Consecutive pieces in chunks of at most ``pairs_per_chunk`` padded pairs (at least one piece each). The
    pieces' order (by size, then face count) keeps the padding small."""
    sizes, face_counts = pieces.sizes.tolist(), pieces.face_counts.tolist()
    chunks, start = [], 0
    while start < len(sizes):
        stop = start + 1
        width, height = sizes[start], face_counts[start]
        while stop < len(sizes):
            wider, higher = max(width, sizes[stop]), max(height, face_counts[stop])
            if (stop + 1 - start) * wider * higher > pairs_per_chunk:
                break
            width, height, stop = wider, higher, stop + 1
        chunks.append(_Chunk(start, stop, width, height))
        start = stop
    return chunks


def _chunk_indices(grid: _FaceGrid, pieces: _Pieces, chunk: _Chunk) -> tuple[torch.Tensor, torch.Tensor]:
    """``(points [G, width], faces [G, height])`` index blocks of a chunk's pieces, padded by repeating each piece's
    last point and last face (a repeated pair changes no minimum)."""
    rows = slice(chunk.start, chunk.stop)
    device = pieces.sizes.device
    point_slots = (
        torch.minimum(torch.arange(chunk.width, device=device), pieces.sizes[rows, None] - 1)
        + pieces.starts[rows, None]
    )
    ends = pieces.counts[rows].cumsum(dim=1)
    face_slots = torch.minimum(torch.arange(chunk.height, device=device), pieces.face_counts[rows, None] - 1)
    block = torch.searchsorted(ends, face_slots, right=True)
    first_in_block = (ends - pieces.counts[rows]).gather(1, block)
    faces = grid.faces[pieces.runs[rows].gather(1, block) + face_slots - first_in_block]
    return pieces.order[point_slots], faces


def _keep_nearest_dense(
    triangles: _Triangles,
    points: torch.Tensor,
    rows_of_points: torch.Tensor,
    point_ids: torch.Tensor,
    face_ids: torch.Tensor,
    best_squared: torch.Tensor,
    best_face: torch.Tensor,
) -> None:
    """Settle the points ``point_ids [G, Kp]`` against the faces ``face_ids [G, Kf]`` of their piece, in place.

    One batched matrix product gives every (point, face) pair's squared distance to the centre of the face's
    bounding sphere (:func:`_squared_distances_to_centres`). The face of each point's nearest centre gets Ericson's
    exact test; only the faces whose sphere comes as close (``|p - c| - r`` at most that distance, or the search
    limit) can be nearer, about one in nine on the export benchmark, and only they get the bound of
    :func:`_point_face_bounds` and, where it is not exact, Ericson's test, as in :func:`_keep_nearest`. Each point is
    in exactly one piece, so its result is final here.
    """
    groups, width = point_ids.shape
    height = face_ids.shape[1]
    flat_points, flat_faces = point_ids.reshape(-1), face_ids.reshape(-1)
    query = points.index_select(0, flat_points)
    spheres = triangles.spheres.index_select(0, flat_faces).view(groups, height, 4)
    to_centres, tolerance = _squared_distances_to_centres(query.view(groups, width, 3), spheres)
    first = face_ids.gather(1, to_centres.argmin(dim=2)).reshape(-1)
    first_squared = (
        (_closest_points_on_triangles(query, triangles.corners.index_select(0, first)) - query).square().sum(dim=1)
    )
    limit = best_squared.index_select(0, flat_points)
    target = torch.minimum(limit, first_squared)
    reach = (target.sqrt().view(groups, width, 1) + spheres[:, None, :, 3]) * (1 + SPHERE_SLACK)
    pairs = (to_centres <= reach.square() + tolerance).view(-1).nonzero().squeeze(1)

    slots = pairs // height  # the point's row in query: group · Kp + row
    candidates = flat_faces.index_select(0, slots // width * height + pairs % height)
    bound, inside = _point_face_bounds(
        rows_of_points.index_select(1, flat_points.index_select(0, slots)), _gather_frames(triangles, candidates)
    )
    close = bound <= target.index_select(0, slots)
    refine = (close & ~inside).nonzero().squeeze(1)
    refined_points = query.index_select(0, slots.index_select(0, refine))
    closest = _closest_points_on_triangles(
        refined_points, triangles.corners.index_select(0, candidates.index_select(0, refine))
    )
    squared = bound.index_copy(0, refine, (refined_points - closest).square().sum(dim=1))
    exact = close.nonzero().squeeze(1)

    local_squared, local_face = limit, best_face.index_select(0, flat_points)
    every = torch.arange(len(first), device=first.device)
    _merge_nearest(
        torch.cat([slots.index_select(0, exact), every]),
        torch.cat([candidates.index_select(0, exact), first]),
        torch.cat([squared.index_select(0, exact), first_squared]),
        local_squared, local_face,
    )  # fmt: skip
    best_squared[flat_points] = local_squared  # padding repeats a point, with its own result
    best_face[flat_points] = local_face


def _squared_distances_to_centres(points: torch.Tensor, spheres: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[G, Kp, Kf]`` squared distances of ``points [G, Kp, 3]`` to the centres of ``spheres [G, Kf, 4]`` as
    ``|p|² - 2 p·c + |c|²`` (one ``baddbmm``), and ``[G, 1, 1]`` a bound on their rounding error.

    Both are taken relative to each group's first point, so that the terms are of the size of the group's block
    and the cancellation loses few digits; the bound is a few roundings of the largest term.
    """
    origin = points[:, :1]
    relative, centres = points - origin, spheres[..., :3] - origin
    point_norms, centre_norms = relative.square().sum(dim=2), centres.square().sum(dim=2)
    squared = torch.baddbmm(point_norms.unsqueeze(2), relative, centres.transpose(1, 2), alpha=-2)
    squared += centre_norms.unsqueeze(1)
    largest = point_norms.amax(dim=1) + centre_norms.amax(dim=1)
    return squared, (8 * torch.finfo(points.dtype).eps * largest).view(-1, 1, 1)


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
    centres = corners.mean(dim=1)
    # grown by a few roundings of the coordinates: the centre, the radius and the points relative to a piece's first
    # point are each rounded at the scale of the coordinates, not of the (small) distances
    rounding = SPHERE_ROUNDINGS * torch.finfo(corners.dtype).eps * corners.abs().amax().item()
    radii = (corners - centres.unsqueeze(1)).norm(dim=2).amax(dim=1, keepdim=True) + rounding
    spheres = torch.cat([centres, radii], dim=1)
    return _Triangles(corners=corners, frames=frames.contiguous(), spheres=spheres)


def _gather_frames(triangles: _Triangles, faces: torch.Tensor) -> torch.Tensor:
    """``[16, n]`` the frames of ``faces [n]``, one quantity per contiguous row (as :func:`_point_face_bounds` reads
    them): a row gather then a transpose is a fraction of the time of one row-wise gather per component."""
    return triangles.frames.index_select(0, faces).T.contiguous()


def _build_face_grid(corners: torch.Tensor, pairs_per_chunk: int) -> _FaceGrid:
    """Bucket the faces ``[F, 3, 3]`` into cells of :data:`GRID_CELL_EDGES` mean edges, each face in every cell its
    bounding box, grown by :data:`GRID_MARGIN_CELLS` cells, overlaps."""
    cell_size = GRID_CELL_EDGES * (corners.roll(-1, dims=1) - corners).norm(dim=2).mean().item()
    cell_size = _bounded_cell_size(corners, cell_size)
    margin = GRID_MARGIN_CELLS * cell_size
    return _bucket_boxes(corners.amin(dim=1) - margin, corners.amax(dim=1) + margin, cell_size, margin, pairs_per_chunk)


def _build_anchor_grid(corners: torch.Tensor, cell_size: float, at_least_span: bool = False) -> tuple[_FaceGrid, float]:
    """Bucket the faces ``[F, 3, 3]`` by the lower corner of their bounding box, listing each face once.

    Returns the grid and ``span``, the :data:`ANCHOR_SPAN_QUANTILE` quantile of the boxes' sides. A face whose box
    is wider than ``span`` along an axis is also listed in the cells from its lower corner to its upper corner
    minus ``span``, so that, for every face, the box meets ``[p - d, p + d]`` only if some cell listing it meets
    ``[p - d - span, p + d]``: a point finds every face within ``d`` in that block of cells, each face once (a
    margin around every box, as in :func:`_build_face_grid`, lists a face in many cells of a point's block).
    With ``at_least_span``, cells are made no narrower than ``span``: narrower ones only multiply the cells of a
    block (a search of a quarter voxel among faces of about one voxel spent most of its time in the empty cells without
    this).
    """
    lower, upper = corners.amin(dim=1), corners.amax(dim=1)
    sides = (upper - lower).amax(dim=1)
    span = torch.quantile(sides[:: max(1, len(sides) // (1 << 20))], ANCHOR_SPAN_QUANTILE).item()
    cell_size = _bounded_cell_size(corners, max(cell_size, span) if at_least_span else cell_size)
    grid = _bucket_boxes(lower, torch.maximum(lower, upper - span), cell_size, 0.0, DEFAULT_PAIRS_PER_CHUNK)
    return grid, span


def _bounded_cell_size(corners: torch.Tensor, cell_size: float) -> float:
    """``cell_size``, raised so that the faces' extent needs at most :data:`GRID_MAX_CELLS` cells per side."""
    extent = (corners.amax(dim=(0, 1)) - corners.amin(dim=(0, 1))).max().item()
    return max(cell_size, extent / GRID_MAX_CELLS, 1e-12)


def _bucket_boxes(
    lower: torch.Tensor, upper: torch.Tensor, cell_size: float, margin: float, pairs_per_chunk: int
) -> _FaceGrid:
    """A :class:`_FaceGrid` listing face ``i`` in every cell that the box ``lower[i] .. upper[i]`` overlaps."""
    origin = lower.amin(dim=0)
    first = ((lower - origin) / cell_size).floor().long()
    last = ((upper - origin) / cell_size).floor().long()
    dims = last.amax(dim=0) + 1
    spans = last - first + 1

    keys, owners = [], []
    for face, local in ragged_chunks(spans.prod(dim=1), pairs_per_chunk):
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
    for owner, local in ragged_chunks(counts, pairs_per_chunk):
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
        frames = _gather_frames(triangles, faces)
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
    the lowest to the highest priority; zero denominators (degenerate triangles) divide by 1 instead. Computed on
    rows (one coordinate per contiguous row), as :func:`_point_face_bounds`: faster than dot products over a trailing
    dimension of 3, with bit-identical results.
    """
    p = points.T.contiguous()
    a, b, c = triangles.permute(1, 2, 0).contiguous()  # each [3, P]
    ab, ac = b - a, c - a
    d1, d2 = _row_dot(ab, p - a), _row_dot(ac, p - a)
    d3, d4 = _row_dot(ab, p - b), _row_dot(ac, p - b)
    d5, d6 = _row_dot(ab, p - c), _row_dot(ac, p - c)
    va, vb, vc = d3 * d6 - d5 * d4, d5 * d2 - d1 * d6, d1 * d4 - d3 * d2

    total = va + vb + vc
    v, w = _safe_divide(vb, total), _safe_divide(vc, total)
    weights = (1 - v - w, v, w)  # interior
    t = _safe_divide(d4 - d3, (d4 - d3) + (d5 - d6))
    weights = _where_region((va <= 0) & (d4 >= d3) & (d5 >= d6), weights, (0.0, 1 - t, t))  # edge bc
    t = _safe_divide(d2, d2 - d6)
    weights = _where_region((vb <= 0) & (d2 >= 0) & (d6 <= 0), weights, (1 - t, 0.0, t))  # edge ac
    weights = _where_region((d6 >= 0) & (d5 <= d6), weights, (0.0, 0.0, 1.0))  # vertex c
    t = _safe_divide(d1, d1 - d3)
    weights = _where_region((vc <= 0) & (d1 >= 0) & (d3 <= 0), weights, (1 - t, t, 0.0))  # edge ab
    weights = _where_region((d3 >= 0) & (d4 <= d3), weights, (0.0, 1.0, 0.0))  # vertex b
    weights = _where_region((d1 <= 0) & (d2 <= 0), weights, (1.0, 0.0, 0.0))  # vertex a
    weight_a, weight_b, weight_c = weights
    return (weight_a * a + weight_b * b + weight_c * c).T


def _where_region(
    region: torch.Tensor, weights: tuple[torch.Tensor, ...], region_weights: tuple[torch.Tensor | float, ...]
) -> tuple[torch.Tensor, ...]:
    """The three corner weights ``[P]`` with the entries in ``region`` replaced by ``region_weights`` (per-entry
    tensors or constants)."""
    return tuple(torch.where(region, new, old) for old, new in zip(weights, region_weights, strict=True))


def _row_dot(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Dot products of the columns of ``u``, ``v`` (``[3, P]``, one coordinate per row)."""
    return u[0] * v[0] + u[1] * v[1] + u[2] * v[2]


def _dot(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return (u * v).sum(dim=-1)


def _safe_divide(numerator: torch.Tensor, denominator: torch.Tensor) -> torch.Tensor:
    return numerator / torch.where(denominator == 0, 1, denominator)


def ragged_chunks(counts: torch.Tensor, chunk: int) -> PairChunks:
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


def _check_query(
    name: str, points: torch.Tensor, vertices: torch.Tensor, faces: torch.Tensor, pairs_per_chunk: int
) -> None:
    """The arguments of a closest-point search (``name``): a mesh with faces, ``points [P, 3]``, a chunk size."""
    check_mesh(vertices, faces)
    check_chunk(pairs_per_chunk)
    if faces.shape[0] == 0:
        raise ValueError(f"{name} needs a mesh with at least one face, got 0 faces")
    if points.dim() != 2 or points.shape[1] != 3:
        raise ValueError(f"points must be [P, 3], got shape {tuple(points.shape)}")


def check_mesh(vertices: torch.Tensor, faces: torch.Tensor) -> None:
    """``ValueError`` unless ``vertices`` is ``[V, 3]`` and ``faces`` ``[F, 3]``."""
    if vertices.dim() != 2 or vertices.shape[1] != 3 or faces.dim() != 2 or faces.shape[1] != 3:
        raise ValueError(
            f"expected vertices [V, 3] and faces [F, 3], got {tuple(vertices.shape)} and {tuple(faces.shape)}"
        )


def check_chunk(pairs_per_chunk: int) -> None:
    """``ValueError`` unless ``pairs_per_chunk`` is at least 1."""
    if pairs_per_chunk < 1:
        raise ValueError(f"pairs_per_chunk must be a positive number of pairs, got {pairs_per_chunk}")
