"""UV charts for xatlas to pack: the faces grouped by normal and place, each piece flattened by projection.

xatlas' own chart computation (growing charts by a cost, LSCM, validity checks) took about half of the unwrap in the GLB
export benchmark (benchmarks/glb_export.py; its packing, on one core, most of the rest). The faces are grouped
anyway, by the axis closest to their normal and a spatial cell (:func:`chart_groups`, because xatlas' chart growing
is superlinear in what it is given), and within a group every normal is within 78° of that axis (54.7° but where
the speckle along the seams between two axes is merged into its neighbours: :func:`speckle_merged_axes`). So each
connected piece of a group is flattened the way xatlas tries first for a chart of its own ("Ortho"): projected onto
the plane of the piece's area-weighted mean normal, or of the group's axis if some face leans further than 78° from
that mean; every face keeps its winding. xatlas then takes these UVs as its charts
(``ChartOptions.use_input_mesh_uvs``) and only packs them (:func:`trellis2_npu.geometry.texture_bake.unwrap_uv`).

Projection cannot flip a face (float32 rounding aside: 7 slivers of the benchmark's 500k faces), but a piece can
still fold over itself (a pleat that simplification left, a spiral ramp within one cell), which would give two
places of the surface the same texels. :func:`folded_pieces` finds such pieces exactly (boundary crossings, inner
vertices wound twice); their faces are grouped again in finer cells (:func:`refined_pieces`), and the pieces that
still fold get xatlas' own chart computation.
Where xatlas would have chosen LSCM over "Ortho" (its stretch limits: 1.1 on average, 1.25 at most), the projection
keeps the stretch: texel density on a face leaning θ from its piece's plane is ``cos θ`` of the piece's.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch
import xatlas

from deliverykit.cpu_tasks import task_runner

from . import mesh_repair
from .closest_points import ragged_chunks

SPATIAL_CELLS = 16  # per axis: groups = 6 normal directions × 16³ cells of the bounding box
REFINED_CELLS = 32  # the folded pieces' faces grouped again, in cells of their own bounding box (refined_pieces)
MIN_COSINE = 1 / math.sqrt(3)  # a face's normal is at least this close to its dominant axis (54.7°)
SPECKLE_FACES = 16  # an axis region of at most this many faces joins a neighbouring one (speckle_merged_axes)
SPECKLE_ROUNDS = 6
MERGED_COSINE = math.cos(math.radians(78))  # ... if the face's normal is within 78° of that region's axis
AXES = torch.tensor([[1, 0, 0], [-1, 0, 0], [0, 1, 0], [0, -1, 0], [0, 0, 1], [0, 0, -1]], dtype=torch.float32)
PAIRS_PER_CHUNK = 1 << 20  # (boundary edge, boundary edge) pairs of the fold test evaluated at once
CROSSING_CELL = 2.0  # boundary edges are paired only within cells of this many mean boundary edges


class GroupedMesh(NamedTuple):
    """A mesh split into groups: group ``i`` has the faces ``faces[start:stop]`` for ``(start, stop) =
    face_bounds[i]``, whose indices count from its first vertex, and the vertices ``vertices[start:stop]`` for
    ``vertex_bounds[i]`` (input vertex indices, ascending within a group)."""

    faces: torch.Tensor
    face_bounds: list[tuple[int, int]]
    vertices: torch.Tensor
    vertex_bounds: list[tuple[int, int]]
    axis: torch.Tensor | None = None  # [G] the normal axis (0..5) of each group, for the pieces of chart_pieces


class FlatPieces(NamedTuple):
    """The pieces (:func:`chart_pieces`) with their UVs ``[V', 2]`` (one row per row of ``mesh.vertices``, in
    model units scaled by ``uv_scale``) and which pieces need xatlas' chart computation (``folded [P]``, bool)."""

    mesh: GroupedMesh
    uvs: torch.Tensor
    uv_scale: float
    folded: torch.Tensor


def chart_groups(vertices: torch.Tensor, faces: torch.Tensor, cells: int = SPATIAL_CELLS) -> torch.Tensor:
    """``[F]`` group ids: dominant normal direction × spatial cell of the face centroid.

    xatlas' chart growing is superlinear in the size of what it is given: a noisy sphere unwrapped an order of magnitude
    faster once its 6 normal groups were split further into 8³ cells; charts never cross a cell border.
    A smooth surface (a remeshed one) grows larger charts: on the remeshed benchmark sphere each doubling of the cells
    per side cut the time severalfold for a few percent more charts and an atlas utilisation lower in the third decimal
    (the noisy one: the same trend; measured with ``benchmarks/glb_export.py``'s meshes).
    """
    centroids = vertices[faces].mean(dim=1)
    low, high = centroids.min(dim=0).values, centroids.max(dim=0).values
    cell = ((centroids - low) / (high - low).clamp_min(1e-12) * cells).long().clamp(0, cells - 1)
    cell_id = (cell[:, 0] * cells + cell[:, 1]) * cells + cell[:, 2]
    return speckle_merged_axes(vertices, faces) * cells**3 + cell_id


def speckle_merged_axes(vertices: torch.Tensor, faces: torch.Tensor) -> torch.Tensor:
    """``[F]`` in ``0..5``: :func:`dominant_normal_axis`, with the speckle where two axes meet merged away.

    Where the surface turns through 45° between two axes, the dominant axis flips back and forth from face to face:
    most pieces of a remeshed surface had at most three faces, each a chart of its own with its gutter, texels
    largely on chart borders. So, for :data:`SPECKLE_ROUNDS` rounds, every face of a connected region
    of one axis with at most :data:`SPECKLE_FACES` faces takes the axis most of its edge neighbours outside the region
    have, if its normal is within 78° of it (:data:`MERGED_COSINE`): projected on that axis' plane it keeps its
    winding, at ``cos θ`` of the texel density.
    """
    axis = dominant_normal_axis(vertices, faces)
    normals = _face_normals(vertices, faces)
    allowed = normals @ AXES.T >= MERGED_COSINE * normals.norm(dim=1, keepdim=True)  # [F, 6]
    first, second, manifold = _edge_neighbours(faces)
    for _ in range(SPECKLE_ROUNDS):
        if manifold:  # the regions' edges are the mesh's own pairs of faces: a union-find over those of one axis
            same = axis[first] == axis[second]
            pairs = torch.stack([first[same], second[same]], dim=1).numpy()
            root = mesh_repair._union_find(len(faces), pairs)[0]
            sizes = torch.from_numpy(np.bincount(root, minlength=len(faces))[root])
        else:
            sizes = _region_sizes(faces, axis, len(vertices))
        small = sizes <= SPECKLE_FACES
        votes = torch.zeros(len(faces), len(AXES))
        for face, neighbour in ((first, second), (second, first)):
            across = small[face] & (axis[neighbour] != axis[face])
            votes.index_put_((face[across], axis[neighbour][across]), torch.ones(int(across.sum())), accumulate=True)
        votes = votes * allowed
        best, count = votes.argmax(dim=1), votes.amax(dim=1)
        if not bool((count > 0).any()):
            break
        axis = torch.where(count > 0, best, axis)
    return axis


def _edge_neighbours(faces: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """The two faces of every edge that exactly two faces share, and whether no edge has more than two faces."""
    edges = faces[:, [[0, 1], [1, 2], [2, 0]]].reshape(-1, 2)
    keys = edges.amin(dim=1) * (int(faces.max()) + 1) + edges.amax(dim=1)
    sorted_keys, order = keys.sort(stable=True)
    _, counts = torch.unique_consecutive(sorted_keys, return_counts=True)
    starts = counts.cumsum(0) - counts
    pairs = starts[counts == 2]
    return order[pairs] // 3, order[pairs + 1] // 3, bool((counts <= 2).all())


def _region_sizes(faces: torch.Tensor, axis: torch.Tensor, vertex_count: int) -> torch.Tensor:
    """``[F]`` the face count of each face's connected region of one axis."""
    grouped = split_into_groups(faces, axis, vertex_count)
    labels = mesh_repair.connected_components(_global_faces(grouped))
    order = axis.argsort(stable=True)
    return torch.empty_like(labels).index_copy_(0, order, torch.bincount(labels)[labels])


def dominant_normal_axis(vertices: torch.Tensor, faces: torch.Tensor) -> torch.Tensor:
    """``[F]`` in ``0..5``: which of +x, −x, +y, −y, +z, −z is closest to each face's normal."""
    normals = _face_normals(vertices, faces)
    axis = normals.abs().argmax(dim=1)
    negative = normals.gather(1, axis[:, None]).squeeze(1) < 0
    return 2 * axis + negative.long()


def split_into_groups(faces: torch.Tensor, groups: torch.Tensor, vertex_count: int) -> GroupedMesh:
    """The faces sorted by group (stably), each group with its own vertices, as ``torch.unique(group_faces,
    return_inverse=True)`` numbers them group by group, but from one sort of ``(group, vertex)`` keys: the calls per
    group cost an order of magnitude more on the benchmark's thousands of groups."""
    order = groups.argsort(stable=True)
    face_counts = torch.unique_consecutive(groups[order], return_counts=True)[1]
    rank = torch.repeat_interleave(torch.arange(len(face_counts)), face_counts)
    keys, inverse = torch.unique(rank[:, None] * vertex_count + faces[order], return_inverse=True)
    vertex_counts = torch.bincount(keys // vertex_count, minlength=len(face_counts))
    local = inverse - (vertex_counts.cumsum(0) - vertex_counts)[rank][:, None]
    return GroupedMesh(local, _bounds(face_counts), keys % vertex_count, _bounds(vertex_counts))


def chart_pieces(vertices: torch.Tensor, faces: torch.Tensor, cells: int = SPATIAL_CELLS) -> GroupedMesh:
    """The connected pieces of each group of :func:`chart_groups` (faces joined by an edge that exactly two faces
    of the group share), split as :func:`split_into_groups` does."""
    groups = chart_groups(vertices, faces, cells)
    grouped = split_into_groups(faces, groups, len(vertices))
    labels = mesh_repair.connected_components(_global_faces(grouped))
    piece = torch.empty_like(labels).index_copy_(0, groups.argsort(stable=True), labels)
    pieces = split_into_groups(faces, piece, len(vertices))
    first_faces = piece.argsort(stable=True)[[start for start, _ in pieces.face_bounds]]
    return pieces._replace(axis=groups[first_faces] // cells**3)


def flatten_pieces(vertices: torch.Tensor, pieces: GroupedMesh, uv_scale: float | None = None) -> FlatPieces:
    """Project each piece onto its plane (see the module docstring) and find the pieces that fold over.

    Args:
        vertices (`torch.Tensor`): ``[V, 3]`` float32 input positions (host).
        pieces (`GroupedMesh`): from :func:`chart_pieces`.
        uv_scale (`float`, *optional*): UV units per model unit (default: about one face per unit of UV area), to
            give pieces flattened apart the same texel density.
    """
    faces = _global_faces(pieces)
    positions = vertices[pieces.vertices]
    face_piece = _owners(pieces.face_bounds, len(faces))
    normals = _face_normals(positions, faces)  # length: twice the face's area
    double_areas = normals.norm(dim=1)
    plane = torch.zeros(len(pieces.face_bounds), 3).index_add_(0, face_piece, normals)
    plane = plane / plane.norm(dim=1, keepdim=True).clamp_min(1e-30)
    cosines = (normals * plane[face_piece]).sum(dim=1) / double_areas.clamp_min(1e-30)
    leaning = torch.ones(len(plane)).scatter_reduce_(0, face_piece, cosines, reduce="amin")
    # a face leaning further from the mean than the group's axis ever allows: the axis, which every face is within
    # 78° of (54.7° but for merged speckle, speckle_merged_axes)
    axis = AXES[pieces.axis]
    plane = torch.where((leaning < MERGED_COSINE)[:, None], axis, plane)
    tangent, bitangent = _basis(plane)
    vertex_piece = _owners(pieces.vertex_bounds, len(positions))
    if uv_scale is None:
        uv_scale = 1 / math.sqrt(float(double_areas.mean()) / 2)  # UV units of about one face: clear of xatlas' ε
    # relative to each piece's first vertex: the small differences keep a sliver's winding through float32 rounding
    local = positions - positions[[start for start, _ in pieces.vertex_bounds]][vertex_piece]
    uvs = uv_scale * torch.stack(
        [(local * tangent[vertex_piece]).sum(dim=1), (local * bitangent[vertex_piece]).sum(dim=1)], dim=1
    )
    return FlatPieces(pieces, uvs, uv_scale, folded_pieces(uvs, faces, face_piece, len(plane)))


def refined_pieces(vertices: torch.Tensor, flat: FlatPieces) -> FlatPieces:
    """The faces of ``flat``'s folded pieces grouped again in :data:`REFINED_CELLS`³ cells of their own bounding box
    and flattened at ``flat``'s scale: smaller pieces, most of which no longer fold, so that xatlas' own chart
    computation (superlinear in a piece's size) is left the few that still do."""
    pieces = flat.mesh
    folded = flat.folded.nonzero().squeeze(1).tolist()
    faces = torch.cat(
        [torch.zeros((0, 3), dtype=torch.long)]
        + [pieces.vertices[pieces.vertex_bounds[i][0] + pieces.faces[slice(*pieces.face_bounds[i])]] for i in folded]
    )
    if not len(faces):
        empty = GroupedMesh(faces, [], torch.zeros(0, dtype=torch.long), [], torch.zeros(0, dtype=torch.long))
        return FlatPieces(empty, torch.zeros((0, 2)), flat.uv_scale, torch.zeros(0, dtype=torch.bool))
    return flatten_pieces(vertices, chart_pieces(vertices, faces, REFINED_CELLS), flat.uv_scale)


def folded_pieces(uvs: torch.Tensor, faces: torch.Tensor, face_piece: torch.Tensor, piece_count: int) -> torch.Tensor:
    """``[P]`` bool: whether a piece's projection overlaps itself (its faces all keep their winding, ``uvs [V, 2]``).

    Such a projection is locally one-to-one except at an inner vertex whose faces turn around it more than once;
    without one, it overlaps itself only if its boundary crosses itself. So a piece folds when an inner vertex's
    angles sum to more than 3π (2π for a flat fan, 4π for a double one), or when two of its boundary edges that
    share no vertex cross; an edge of three or more faces counts as a fold too. Edges that only touch (an end on
    the other edge, or collinear ones) do not count: counted, the benchmark's remeshed sphere had 490 folded
    pieces instead of 322 (pinches at vertices of the same position; measured before the projection became
    relative to each piece, 335 since); so two boundaries lying exactly on each other go unnoticed.
    """
    edges = faces[:, [[1, 2], [2, 0], [0, 1]]].reshape(-1, 2)  # the edge opposite corner k of each face
    keys = edges.amin(dim=1) * len(uvs) + edges.amax(dim=1)
    _, inverse, counts = torch.unique(keys, return_inverse=True, return_counts=True)
    uses = counts[inverse]
    edge_piece = face_piece.repeat_interleave(3)
    folded = torch.zeros(piece_count, dtype=torch.bool).index_fill_(0, edge_piece[uses > 2], True)

    corners = uvs[faces]  # [F, 3, 2]
    before, after = corners.roll(1, dims=1) - corners, corners.roll(-1, dims=1) - corners
    angles = torch.atan2(_cross(after.reshape(-1, 2), before.reshape(-1, 2)), (after * before).sum(dim=2).reshape(-1))
    turning = torch.zeros(len(uvs), dtype=angles.dtype).index_add_(0, faces.reshape(-1), angles)
    on_boundary = torch.zeros(len(uvs), dtype=torch.bool).index_fill_(0, edges[uses == 1].reshape(-1), True)
    branch = (~on_boundary & (turning > 3 * math.pi)).nonzero().squeeze(1)
    vertex_piece = torch.zeros(len(uvs), dtype=torch.long).index_copy_(0, faces.reshape(-1), edge_piece)
    folded.index_fill_(0, vertex_piece[branch], True)

    boundary = (uses == 1).nonzero().squeeze(1)
    ends = edges[boundary]  # [B, 2] vertex ids
    piece = edge_piece[boundary]
    # relative to each piece's lowest corner: float32 keeps ~1e-6 of a face width at a piece's scale
    low = torch.full((piece_count, 2), math.inf).scatter_reduce_(0, vertex_piece[:, None].expand(-1, 2), uvs, "amin")
    segments = (uvs - low[vertex_piece])[ends].reshape(-1, 4)  # [B, 4]
    cells = _edges_by_cell(segments, piece)

    def crossing_pieces(pairs: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        run, index = pairs  # pair `index` of the run's m² (edge, edge) pairs, kept when first < second
        first, second = index // cells.sizes[run], index % cells.sizes[run]
        keep = first < second
        a = cells.edges[cells.starts[run[keep]] + first[keep]]
        b = cells.edges[cells.starts[run[keep]] + second[keep]]
        apart = (ends[a][:, :, None] != ends[b][:, None, :]).all(dim=2).all(dim=1)
        p, q, r, t = segments[a, :2], segments[a, 2:], segments[b, :2], segments[b, 2:]
        cross = (_cross(q - p, r - p) * _cross(q - p, t - p) < 0) & (_cross(t - r, p - r) * _cross(t - r, q - r) < 0)
        return piece[a[apart & cross]]

    crossed = task_runner(uvs.device)(crossing_pieces, ragged_chunks(cells.sizes.square(), PAIRS_PER_CHUNK))
    return folded.index_fill_(0, torch.cat([torch.zeros(0, dtype=torch.long), *crossed]), True)


class _CellRuns(NamedTuple):
    """Boundary edges listed per cell: cell ``i`` holds ``edges[starts[i] : starts[i] + sizes[i]]``."""

    edges: torch.Tensor
    starts: torch.Tensor
    sizes: torch.Tensor


def _edges_by_cell(segments: torch.Tensor, piece: torch.Tensor) -> _CellRuns:
    """Each segment (``[B, 4]``, of piece ``piece [B]``) listed in every cell its box meets, cells of
    :data:`CROSSING_CELL` times its piece's mean segment length: two segments can cross only if they share a cell,
    so only those pairs are tested (all pairs of each piece's boundary: millions of pairs on the benchmark)."""
    lengths = (segments[:, 2:] - segments[:, :2]).norm(dim=1)
    count = int(piece.max()) + 1 if len(piece) else 0
    mean = torch.zeros(count).index_add_(0, piece, lengths) / torch.bincount(piece, minlength=count).clamp_min(1)
    size = (CROSSING_CELL * mean[piece]).clamp_min(1e-30)[:, None]
    first = (torch.minimum(segments[:, :2], segments[:, 2:]) / size).floor().long()
    last = (torch.maximum(segments[:, :2], segments[:, 2:]) / size).floor().long()
    spans = last - first + 1
    counts = spans[:, 0] * spans[:, 1]
    owner = torch.repeat_interleave(torch.arange(len(counts)), counts)
    local = torch.arange(len(owner)) - torch.repeat_interleave(counts.cumsum(0) - counts, counts)
    x, y = first[owner, 0] + local % spans[owner, 0], first[owner, 1] + local // spans[owner, 0]
    keys, order = ((piece[owner] << 42) + (y << 21) + x).sort()
    _, sizes = torch.unique_consecutive(keys, return_counts=True)
    return _CellRuns(owner[order], sizes.cumsum(0) - sizes, sizes)


def xatlas_charts(positions: np.ndarray, faces: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """xatlas' own charts of one mesh (``positions [V, 3]`` float32, ``faces [F, 3]`` uint32): ``(vmapping [V']
    int64, faces [F, 3], uvs [V', 2])`` as xatlas returns them, the UVs in the units of ``positions``, which should
    make faces of about unit area (xatlas leaves out faces of area below ``FLT_EPSILON``).

    Each mesh gets an atlas of its own, because xatlas 0.0.11 crashes when one atlas is given several: ``AddMesh``
    queues a task per mesh in an array that its worker threads read through a pointer taken under a lock but used
    after it, so a later ``AddMesh`` that grows the array can free the task a worker is about to run (SIGSEGV in
    ``add_mesh``, about once in 300 unwraps with one mesh per group, measured; ``TaskScheduler::workerThread`` in
    xatlas.cpp). A single ``AddMesh`` per atlas is never concurrent with a task of its own atlas.
    """
    atlas = xatlas.Atlas()
    atlas.add_mesh(positions, faces)
    pack_options = xatlas.PackOptions()
    # this atlas only holds the charts until the real packing: one texel per unit keeps its bitmap small (with faces
    # of about unit area, xatlas' default density took 3.2 s instead of 1.3 s for the benchmark's folded pieces)
    pack_options.texels_per_unit = 1.0
    atlas.generate(pack_options=pack_options)
    vmapping, charted_faces, uvs = atlas[0]
    if not atlas.chart_count:  # every face left out: an empty atlas, whose UVs xatlas divides by its zero width
        return vmapping.astype(np.int64), charted_faces.reshape(-1, 3), np.zeros_like(uvs)
    to_units = np.array([atlas.width, atlas.height], dtype=np.float32) / atlas.texels_per_unit
    return vmapping.astype(np.int64), charted_faces.reshape(-1, 3), uvs * to_units


def _global_faces(grouped: GroupedMesh) -> torch.Tensor:
    """``[F, 3]`` the groups' faces indexing the concatenated group vertices."""
    starts = torch.tensor([start for start, _ in grouped.vertex_bounds], dtype=torch.long)
    return grouped.faces + starts[_owners(grouped.face_bounds, len(grouped.faces))][:, None]


def _owners(bounds: list[tuple[int, int]], total: int) -> torch.Tensor:
    """``[total]`` the index of the ``(start, stop)`` run each row lies in."""
    counts = torch.tensor([stop - start for start, stop in bounds], dtype=torch.long)
    return torch.repeat_interleave(torch.arange(len(bounds)), counts, output_size=total)


def _bounds(counts: torch.Tensor) -> list[tuple[int, int]]:
    """``(start, stop)`` of consecutive runs of ``counts`` rows."""
    ends = counts.cumsum(0).tolist()
    return list(zip([0, *ends[:-1]], ends, strict=True))


def _face_normals(vertices: torch.Tensor, faces: torch.Tensor) -> torch.Tensor:
    corners = vertices[faces]
    return torch.linalg.cross(corners[:, 1] - corners[:, 0], corners[:, 2] - corners[:, 0])


def _basis(normals: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Unit tangent and bitangent ``[P, 3]`` with ``tangent × bitangent = normal``, so windings are kept."""
    helper = torch.where((normals[:, :1].abs() < 0.9), torch.tensor([1.0, 0.0, 0.0]), torch.tensor([0.0, 1.0, 0.0]))
    tangent = torch.linalg.cross(helper, normals)
    tangent = tangent / tangent.norm(dim=1, keepdim=True)
    return tangent, torch.linalg.cross(normals, tangent)


def _cross(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return u[:, 0] * v[:, 1] - u[:, 1] * v[:, 0]
