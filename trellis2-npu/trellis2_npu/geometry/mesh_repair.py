"""Hole filling, clean-up and simplification of the decoded mesh, without CuMesh's CUDA kernels.

TRELLIS.2 closes small holes right after decoding (``Mesh.fill_holes``) and, when it exports a GLB without
remeshing, runs simplify → clean up → simplify → clean up → unify orientations (``o_voxel.postprocess.to_glb``).
Upstream does all of it with CuMesh, which needs a CUDA device. Here the same operations run on the host:

- Adapted from: JeffreyXiang/CuMesh @ cf1a2f0, ``src/clean_up.cu`` (``fill_holes``, ``remove_duplicate_faces``,
  ``remove_degenerate_faces``, ``repair_non_manifold_edges``, ``remove_small_connected_components``,
  ``unify_face_orientations``, ``remove_unreferenced_vertices``) and ``src/connectivity.cu`` (edges, boundary
  loops, connected components), as called by microsoft/TRELLIS.2 @ 5565d240
  ``trellis2/representations/mesh/base.py::Mesh.fill_holes`` and ``o-voxel/o_voxel/postprocess.py::to_glb``.
- Changes: vectorised numpy instead of CUDA kernels (CuMesh's parallel "hook and compress" union-find becomes
  :func:`_union_find`, compiled with numba where its result is unique); geometry in float64 instead of float32; hole
  fans are wound to match the faces around the hole (CuMesh winds them by vertex index and relies on a later
  ``unify_face_orientations``); QEM simplification is ``fast_simplification`` (see :func:`simplify`). Each function
  says what else differs.

Public functions take torch tensors on any device (vertices ``[V, 3]`` float, faces ``[F, 3]`` int), do the work on
the host and return tensors on the input device, with the input dtypes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import fast_simplification
import numba
import numpy as np
import torch

from .host_sort import stable_argsort

logger = logging.getLogger(__name__)

MAX_HOLE_PERIMETER = 3e-2  # upstream's fill_holes threshold, in the decoder's [-0.5, 0.5]^3 frame
MIN_COMPONENT_AREA = 1e-5  # upstream's remove_small_connected_components(1e-5): an absolute area, same frame
MIN_TARGET_FACES = 4  # a tetrahedron: the smallest closed triangle mesh
FACE_BUDGET_TOLERANCE = 0.05  # --faces N gives N ± 5 % after a remesh
FACE_BUDGET_ROUNDS = 4  # simplifications from the input towards that budget
PINCH_SEPARATION = 0.1  # of the way to its faces' centroid: how far each copy of a split vertex moves (remesh path)
SIMPLIFY_MAX_ROUNDS = 8  # fast_simplification stops after 100 inner passes; rerun it while it still makes progress

HostOp = Callable[..., tuple[np.ndarray, np.ndarray]]


# ----------------------------------------------------------------------------------------------------------------
# Public API (torch tensors in, torch tensors out)


def fill_holes(
    vertices: torch.Tensor, faces: torch.Tensor, max_hole_perimeter: float = MAX_HOLE_PERIMETER
) -> tuple[torch.Tensor, torch.Tensor]:
    """Close every boundary loop shorter than ``max_hole_perimeter`` with a fan around the loop's centre.

    Replaces ``Mesh.fill_holes`` (CuMesh ``fill_holes``), which TRELLIS.2 runs after decoding. A boundary edge is
    used by exactly one face. Boundary edges are chained through vertices that have exactly two boundary edges and
    no non-manifold edge; a chain is a loop when each of its vertices has two of its edges (so two holes that touch
    at one vertex are two loops). Chains that do not close are left open, as upstream does. Each closed loop gets
    one new vertex at the mean of its edge midpoints (its vertex mean) and one face per boundary edge, wound
    opposite to the face that owns the edge so the patch is oriented like its surroundings.

    Args:
        vertices (`torch.Tensor`): ``[V, 3]`` float positions.
        faces (`torch.Tensor`): ``[F, 3]`` integer vertex indices.
        max_hole_perimeter (`float`, *optional*, defaults to `3e-2`): loops with a perimeter strictly below this
            are filled; upstream's value is meant for the decoder's ``[-0.5, 0.5]^3`` box.

    Returns:
        `tuple[torch.Tensor, torch.Tensor]`: the input vertices followed by one vertex per filled loop, and the
        input faces followed by the new faces; unchanged when no loop is small enough.
    """
    return _run_on_host(_fill_holes, vertices, faces, max_hole_perimeter)


def remove_duplicate_faces(vertices: torch.Tensor, faces: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep the first of faces that use the same three vertices, whatever their order or winding.

    Replaces CuMesh ``remove_duplicate_faces``; like it, the kept faces stay in input order and vertices no face
    uses any more are dropped.
    """
    return _run_on_host(_remove_duplicate_faces, vertices, faces)


def remove_degenerate_faces(
    vertices: torch.Tensor, faces: torch.Tensor, abs_thresh: float = 1e-24, rel_thresh: float = 1e-12
) -> tuple[torch.Tensor, torch.Tensor]:
    """Drop faces with a repeated vertex index or (near) zero area, then the vertices no face uses.

    Replaces CuMesh ``remove_degenerate_faces`` with its defaults (upstream's ``uv_unwrap`` calls it first, since
    chart packing fails on zero-area faces): a face goes when its area is below both ``abs_thresh`` and
    ``rel_thresh`` times its longest edge squared.
    """
    return _run_on_host(_remove_degenerate_faces, vertices, faces, abs_thresh, rel_thresh)


def remove_unreferenced_vertices(vertices: torch.Tensor, faces: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Drop vertices no face uses and renumber the faces (CuMesh ``remove_unreferenced_vertices``)."""
    return _run_on_host(_remove_unreferenced_vertices, vertices, faces)


def repair_non_manifold_edges(vertices: torch.Tensor, faces: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Split vertices so that no edge is shared by more than two faces and no vertex joins two separate fans.

    Replaces CuMesh ``repair_non_manifold_edges``: every face corner starts as its own vertex, and corners are
    merged only across edges that exactly two faces share. Faces that met at a non-manifold edge (or only at a
    vertex) end up with copies of the shared vertices, at the same positions; no face is removed.
    """
    return _run_on_host(_repair_non_manifold_edges, vertices, faces)


def remove_small_connected_components(
    vertices: torch.Tensor, faces: torch.Tensor, min_area: float = MIN_COMPONENT_AREA
) -> tuple[torch.Tensor, torch.Tensor]:
    """Drop connected pieces whose total surface area is below ``min_area`` (floaters left by the decoder).

    Replaces CuMesh ``remove_small_connected_components(min_area)``. ``min_area`` is an absolute area (upstream
    passes ``1e-5`` in the ``[-0.5, 0.5]^3`` frame), not a fraction. Faces are connected through edges that
    exactly two faces share, as in CuMesh.
    """
    return _run_on_host(_remove_small_connected_components, vertices, faces, min_area)


def unify_face_orientations(vertices: torch.Tensor, faces: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Flip faces so that neighbours across every two-face edge traverse it in opposite directions.

    Replaces CuMesh ``unify_face_orientations``: each connected piece takes the winding of its lowest-numbered
    face. It makes windings consistent, not outward (neither does upstream). ``trimesh.repair.fix_winding`` would
    do the same with a per-face Python walk over a networkx graph, too slow for the decoder's million faces.
    """
    return _run_on_host(_unify_face_orientations, vertices, faces)


def simplify(vertices: torch.Tensor, faces: torch.Tensor, target_faces: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Reduce the mesh to at most ``target_faces`` faces by quadric edge collapse; no-op when already there.

    Replaces CuMesh ``simplify`` (a parallel QEM with edge-length and skinny-triangle penalties whose collapse
    threshold grows ×10 when a pass removes < 1 %) by ``fast_simplification`` (Forstmann's serial QEM, default
    aggressiveness 7). The surfaces agree in shape, not face by face.
    """
    _check_target_faces(target_faces)
    return _run_on_host(_simplify, vertices, faces, target_faces)


def clean_and_simplify(
    vertices: torch.Tensor,
    faces: torch.Tensor,
    target_faces: int,
    *,
    max_hole_perimeter: float = MAX_HOLE_PERIMETER,
    min_component_area: float = MIN_COMPONENT_AREA,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Simplify and repair a decoded mesh before UV unwrapping, as ``to_glb(remesh=False)`` does.

    Upstream's non-remesh branch (``o_voxel/postprocess.py``, after its first ``fill_holes``), step by step:

    1. ``simplify(3 · target_faces)``;
    2. clean up: ``remove_duplicate_faces``, ``repair_non_manifold_edges``,
       ``remove_small_connected_components(min_component_area)``, ``fill_holes(max_hole_perimeter)``;
    3. ``simplify(target_faces)``;
    4. the same clean-up again;
    5. ``unify_face_orientations``.

    Two steps are added, both removals of invalid faces: faces with a repeated vertex index are dropped before
    step 1 (upstream's edge and corner bookkeeping does not expect them), and after step 5 faces of zero area are
    dropped with :func:`remove_degenerate_faces`, the first thing upstream's ``uv_unwrap`` does. Simplification is
    ``fast_simplification``'s QEM (see :func:`simplify`). Holes the final clean-up fills may leave the result a
    few faces above ``target_faces``, as upstream's.

    Args:
        vertices (`torch.Tensor`): ``[V, 3]`` float positions (the decoder's ``[-0.5, 0.5]^3`` frame for the
            default thresholds).
        faces (`torch.Tensor`): ``[F, 3]`` integer vertex indices.
        target_faces (`int`): face budget, at least 4 (upstream's ``decimation_target``).
        max_hole_perimeter (`float`, *optional*, defaults to `3e-2`): see :func:`fill_holes`.
        min_component_area (`float`, *optional*, defaults to `1e-5`): see :func:`remove_small_connected_components`.

    Returns:
        `tuple[torch.Tensor, torch.Tensor]`: the cleaned vertices and faces, on the input device and dtypes.
    """
    _check_target_faces(target_faces)
    return _run_on_host(_clean_and_simplify, vertices, faces, target_faces, max_hole_perimeter, min_component_area)


def simplify_remeshed(
    vertices: torch.Tensor,
    faces: torch.Tensor,
    target_faces: int,
    *,
    max_hole_perimeter: float = MAX_HOLE_PERIMETER,
    min_component_area: float = MIN_COMPONENT_AREA,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Simplify a remeshed surface to ``target_faces`` (± :data:`FACE_BUDGET_TOLERANCE`), repairing what that breaks.

    Upstream's remesh branch of ``to_glb`` only simplifies (``simplify(decimation_target)``). QEM can leave
    non-manifold edges, slivers and flipped faces behind, and folds some regions into two-sided triangles, so here
    each simplification drops those folds whole and is followed by :func:`clean_and_simplify`'s last steps: one
    clean-up, ``unify_face_orientations`` and the removal of faces with a repeated index or zero area; it is rerun
    from the input with a corrected goal until the face count is within the tolerance
    (``_simplify_closed_to_budget``). The closed surface the remesh builds is not cleaned before it is simplified
    (that clean-up took about a third of the step on the benchmark sphere and had nothing to repair but the remesh's
    rare 4-face edges, which the clean-up after the simplification splits as well). A closed sphere stays closed,
    manifold and consistently wound at 5 000, 20 000 and 300 000 faces (tests).
    Arguments and result as :func:`clean_and_simplify`.
    """
    _check_target_faces(target_faces)
    return _run_on_host(
        _clean_and_simplify, vertices, faces, target_faces, max_hole_perimeter, min_component_area, True
    )


def connected_components(faces: torch.Tensor) -> torch.Tensor:
    """``[F]`` int64 piece label of every face, ``0 .. K-1`` in order of each piece's first face.

    Faces (triangles, or any polygons ``[F, k]``, edges joining consecutive corners) are connected through edges
    that exactly two faces share, as in
    :func:`remove_small_connected_components`; computed on the host, returned on the faces' device.
    """
    host_faces = faces.detach().cpu().to(torch.int64).numpy()
    if len(host_faces) == 0:
        return torch.zeros(0, dtype=torch.int64, device=faces.device)
    root, _ = _face_components(host_faces)
    _, labels = _root_ranks(root)
    return torch.from_numpy(labels).to(faces.device)


def mesh_quality(vertices: torch.Tensor, faces: torch.Tensor) -> dict[str, Any]:
    """What a report says of a triangle mesh: its size; boundary edges (one face) and non-manifold edges (more than
    two); degenerate faces (a repeated corner or zero area) and duplicate ones (the same corners); components (faces
    joined through edges two faces share, as :func:`connected_components`); whether the winding agrees across every
    such edge; watertight (every edge has exactly two faces); the Euler characteristic ``V - E + F`` of the vertices
    the faces use, and the genus ``C - χ / 2`` of a watertight, consistently wound mesh (else None)."""
    host_vertices = vertices.detach().cpu().to(torch.float64).numpy()
    host_faces = faces.detach().cpu().to(torch.int64).numpy()
    if len(host_faces) == 0:
        raise ValueError("no faces: nothing to measure")  # the export refuses such a mesh before (glb.check_mesh)
    _, _, count = _half_edges(host_faces)  # per half-edge: how many half-edges its undirected edge has
    edges = round(float((1.0 / count).sum()))
    non_manifold = round(float(((count > 2) / count).sum()))
    boundary = int((count == 1).sum())
    pairs = _manifold_half_edge_pairs(host_faces)
    start = host_faces.reshape(-1)
    consistent = not bool((start[pairs[:, 0]] == start[pairs[:, 1]]).any())  # a shared edge run the same way
    root, _ = _face_components(host_faces)
    components = len(np.unique(root))
    used = len(np.unique(host_faces))
    euler = used - edges + len(host_faces)
    watertight = boundary == 0 and non_manifold == 0
    degenerate = _has_repeated_index(host_faces) | (_face_areas(host_vertices, host_faces) == 0)
    return {
        "faces": len(host_faces),
        "vertices": used,
        "edges": edges,
        "boundary_edges": boundary,
        "non_manifold_edges": non_manifold,
        "degenerate_faces": int(degenerate.sum()),
        "duplicate_faces": len(host_faces) - len(_first_of_equal_rows(np.sort(host_faces, axis=1))),
        "components": components,
        "consistently_wound": consistent,
        "watertight": watertight,
        "euler_characteristic": euler,
        "genus": (2 * components - euler) // 2 if watertight and consistent else None,
    }


# ----------------------------------------------------------------------------------------------------------------
# Host plumbing


def _check_target_faces(target_faces: int) -> None:
    if target_faces < MIN_TARGET_FACES:
        raise ValueError(
            f"target_faces must be at least {MIN_TARGET_FACES} (a closed mesh needs 4 triangles), got {target_faces}"
        )


def _run_on_host(
    op: HostOp, vertices: torch.Tensor, faces: torch.Tensor, *args: object
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run ``op`` on float64 / int64 numpy copies and bring its result back to the inputs' device and dtypes."""
    if vertices.ndim != 2 or vertices.shape[1] != 3 or faces.ndim != 2 or faces.shape[1] != 3:
        raise ValueError(
            f"expected vertices [V, 3] and faces [F, 3], got {tuple(vertices.shape)} and {tuple(faces.shape)}"
        )
    host_vertices = vertices.detach().cpu().to(torch.float64).numpy()
    host_faces = faces.detach().cpu().to(torch.int64).numpy()
    new_vertices, new_faces = op(host_vertices, host_faces, *args)
    return (
        torch.from_numpy(np.ascontiguousarray(new_vertices)).to(vertices.dtype).to(vertices.device),
        torch.from_numpy(np.ascontiguousarray(new_faces)).to(faces.dtype).to(faces.device),
    )


# ----------------------------------------------------------------------------------------------------------------
# Connectivity


def _half_edges(faces: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Half-edge ``h = 3·face + corner`` runs from corner ``h`` to the next corner of its face.

    Returns each half-edge's start and end vertex and how many half-edges share its undirected edge (1: boundary,
    2: manifold, more: non-manifold), as CuMesh's ``get_edges``.
    """
    start, end, order, sorted_key = _sorted_edge_keys(faces)
    count = np.empty(len(sorted_key), dtype=np.int64)
    count[order] = _run_lengths(sorted_key)
    return start, end, count


def _run_lengths(sorted_key: np.ndarray) -> np.ndarray:
    """Length of the run of equal keys each position of ``sorted_key`` belongs to."""
    first = np.flatnonzero(np.diff(sorted_key, prepend=sorted_key[:1] - 1))
    lengths = np.diff(first, append=len(sorted_key))
    return np.repeat(lengths, lengths)


def _runs_of_two(order: np.ndarray, sorted_key: np.ndarray) -> np.ndarray:
    """``[M, 2]`` ``order`` at the runs of exactly two equal keys of ``sorted_key``, in key order."""
    same = np.concatenate([[False], sorted_key[1:] == sorted_key[:-1], [False]])  # same[i]: key i-1 == key i
    pair = np.flatnonzero(same[1:-1] & ~same[:-2] & ~same[2:])  # keys i, i+1 equal, and neither i-1 nor i+2
    return np.stack([order[pair], order[pair + 1]], axis=1)


def _sorted_edge_keys(faces: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Start and end vertex of every half-edge, the half-edges stably sorted by undirected edge, and their keys
    in that order: the one sort that edge counts and manifold pairs need (``np.unique`` with inverse and counts
    would sort, then scatter ids nobody reads)."""
    start = faces.reshape(-1)
    end = faces[:, [*range(1, faces.shape[1]), 0]].reshape(-1)  # polygons too: the next corner, cyclically
    num_vertices = int(faces.max()) + 1 if faces.size else 0
    key = np.minimum(start, end) * num_vertices + np.maximum(start, end)
    order = stable_argsort(key)
    return start, end, order, key[order]


def _manifold_half_edge_pairs(faces: np.ndarray) -> np.ndarray:
    """``[M, 2]`` the two half-edges of every edge that exactly two faces share (CuMesh ``manifold_face_adj``),
    rows in edge order, the lower half-edge first: the runs of exactly two equal keys among the sorted ones."""
    _, _, order, sorted_key = _sorted_edge_keys(faces)
    return _runs_of_two(order, sorted_key)


def _union_find(num_nodes: int, pairs: np.ndarray, flipped: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Connected components of ``num_nodes`` nodes joined by ``pairs``, with a parity along the joins.

    Returns each node's root (the smallest node of its component) and its parity to the root: the xor of
    ``flipped`` along a path between them (for orientation). Without ``flipped`` every parity is 0. Both are unique
    unless a cycle's parities contradict each other (as on a Möbius strip): then CuMesh's rounds decide
    (:func:`_union_find_rounds`). Otherwise the compiled serial union-find gives the same arrays in one pass.
    """
    pairs = np.ascontiguousarray(pairs, dtype=np.int64).reshape(-1, 2)
    relative = np.zeros(len(pairs), np.int64) if flipped is None else flipped.astype(np.int64)
    root, parity, consistent = _serial_union_find(num_nodes, pairs, relative)
    return (root, parity) if consistent else _union_find_rounds(num_nodes, pairs, flipped)


@numba.njit(inline="always")
def _find_root(parent: np.ndarray, parity: np.ndarray, node: int) -> tuple[int, int]:
    """``node``'s root and parity to it; the path is compressed (each node on it then points at the root)."""
    root, to_root = node, 0
    while parent[root] != root:
        to_root ^= parity[root]
        root = parent[root]
    current, current_parity = node, to_root
    while parent[current] != current:
        up, step = parent[current], parity[current]
        parent[current], parity[current] = root, current_parity
        current, current_parity = up, current_parity ^ step
    return root, to_root


@numba.njit(cache=True)
def _serial_union_find(num_nodes: int, pairs: np.ndarray, flipped: np.ndarray) -> tuple[np.ndarray, np.ndarray, bool]:
    """Every pair joined in turn, the larger root hooked under the smaller (so a root is its component's smallest
    node); ``False`` when some pair's parity contradicts the ones before it."""
    parent, parity, consistent = np.arange(num_nodes), np.zeros(num_nodes, np.int64), True
    for i in range(len(pairs)):
        root_a, parity_a = _find_root(parent, parity, pairs[i, 0])
        root_b, parity_b = _find_root(parent, parity, pairs[i, 1])
        relative = parity_a ^ parity_b ^ flipped[i]
        if root_a == root_b:
            consistent &= relative == 0
        elif root_a < root_b:
            parent[root_b], parity[root_b] = root_a, relative
        else:
            parent[root_a], parity[root_a] = root_b, relative
    for node in range(num_nodes):
        _find_root(parent, parity, node)
    return parent, parity, consistent


def _union_find_rounds(
    num_nodes: int, pairs: np.ndarray, flipped: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_union_find` as CuMesh's "hook and compress", vectorised: every round hooks each root to the smallest
    root it touches and then points every node at its root, so components at least halve per round; contradicting
    cycles keep the first parity found, as CuMesh does. A pair whose ends share a root keeps sharing it, so each
    round only looks at the pairs still apart; in the first round every node is its own root.
    """
    root = np.arange(num_nodes)
    parity = np.zeros(num_nodes, dtype=np.int64)
    with_parity = flipped is not None
    flipped = flipped.astype(np.int64) if with_parity else None
    node_a, node_b = pairs[:, 0], pairs[:, 1]
    root_a, root_b = node_a, node_b
    # buffers reused by every round (fresh pages cost more than the arithmetic on them; take(mode="clip") is
    # unbuffered, and every index is valid)
    unhooked = np.iinfo(np.int64).max
    hook, scratch = np.full(num_nodes, unhooked), np.empty(num_nodes, dtype=np.int64)
    buffer_a, buffer_b = np.empty(len(pairs), dtype=np.int64), np.empty(len(pairs), dtype=np.int64)
    first_round = True
    while True:
        apart = root_a != root_b
        if not apart.any():
            return root, parity
        if not apart.all():
            node_a, node_b, root_a, root_b = node_a[apart], node_b[apart], root_a[apart], root_b[apart]
            flipped = flipped[apart] if with_parity else None
        low = np.minimum(root_a, root_b)
        high = np.maximum(root_a, root_b, out=None if first_round else root_b)  # the first round's are the pairs
        if with_parity:
            relative = flipped if first_round else flipped ^ parity[node_a] ^ parity[node_b]
            np.minimum.at(hook, high, 2 * low + relative)
        else:
            np.minimum.at(hook, high, low)
        hooked = np.flatnonzero(hook != unhooked)
        if with_parity:
            root[hooked], parity[hooked] = hook[hooked] // 2, hook[hooked] % 2
        else:
            root[hooked] = hook[hooked]
        hook[hooked] = unhooked
        _compress(root, parity if with_parity else None, hooked, scratch)
        root_a = np.take(root, node_a, out=buffer_a[: len(node_a)], mode="clip")
        root_b = np.take(root, node_b, out=buffer_b[: len(node_b)], mode="clip")
        first_round = False


def _compress(root: np.ndarray, parity: np.ndarray | None, hooked: np.ndarray, scratch: np.ndarray) -> None:
    """Point every node at its root, in place, composing parities (when given) along the way.

    Before the round's hooks every node pointed at a root (whose parity is 0), so the only chains are among the
    ``hooked`` roots: pointer jumping over them alone, then one gather for every node, gives what jumping over
    all nodes would. ``scratch``: a buffer of ``len(root)`` for that gather.
    """
    active = hooked
    while active.size:
        up = root[active]
        moving = root[up] != up
        active, up = active[moving], up[moving]
        if parity is not None:
            parity[active] ^= parity[up]
        root[active] = root[up]
    if parity is not None:
        parity ^= np.take(parity, root, out=scratch, mode="clip")
    root[:] = np.take(root, root, out=scratch, mode="clip")


def _root_ranks(root: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(root, return_inverse=True)`` for a union-find root array, without sorting: the roots are the
    nodes that are their own root, in ascending order, and each node's label is its root's rank among them."""
    is_root = root == np.arange(len(root))
    return np.flatnonzero(is_root), (np.cumsum(is_root) - 1)[root]


# ----------------------------------------------------------------------------------------------------------------
# Host operations on float64 vertices [V, 3] and int64 faces [F, 3]


def _remove_unreferenced_vertices(vertices: np.ndarray, faces: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    used = np.zeros(len(vertices), dtype=bool)
    used[faces.reshape(-1)] = True
    new_index = np.cumsum(used) - 1
    return vertices[used], new_index[faces]


def _keep_faces(vertices: np.ndarray, faces: np.ndarray, keep: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """CuMesh's ``_remove_faces``: select faces, then drop the vertices left unused."""
    return _remove_unreferenced_vertices(vertices, faces[keep])


def _remove_duplicate_faces(vertices: np.ndarray, faces: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if len(faces) == 0:
        return vertices, faces
    keep = np.zeros(len(faces), dtype=bool)
    keep[_first_of_equal_rows(np.sort(faces, axis=1))] = True
    return _keep_faces(vertices, faces, keep)


def _first_of_equal_rows(rows: np.ndarray) -> np.ndarray:
    """Index of the first occurrence of each distinct row of non-negative ``rows [F, 3]``.

    ``np.unique(axis=0)`` sorts the rows as opaque bytes; one int64 key per row (when the values fit 21 bits,
    i.e. under 2 097 152 vertices) sorts far faster and gives the same first occurrences.
    """
    radix = int(rows.max()) + 1
    if radix >= 1 << 21:
        return np.unique(rows, axis=0, return_index=True)[1]
    key = (rows[:, 0] * radix + rows[:, 1]) * radix + rows[:, 2]
    order = stable_argsort(key)
    sorted_key = key[order]
    return order[np.flatnonzero(np.diff(sorted_key, prepend=sorted_key[0] - 1))]


def _has_repeated_index(faces: np.ndarray) -> np.ndarray:
    return (faces[:, 0] == faces[:, 1]) | (faces[:, 1] == faces[:, 2]) | (faces[:, 2] == faces[:, 0])


def _remove_degenerate_faces(
    vertices: np.ndarray, faces: np.ndarray, abs_thresh: float, rel_thresh: float
) -> tuple[np.ndarray, np.ndarray]:
    corners = vertices[faces]
    edges = np.roll(corners, -1, axis=1) - corners
    area = 0.5 * np.linalg.norm(np.cross(edges[:, 0], edges[:, 1]), axis=1)
    longest_squared = (edges**2).sum(axis=2).max(axis=1)
    thin = area < np.minimum(rel_thresh * longest_squared, abs_thresh)
    return _keep_faces(vertices, faces, ~(_has_repeated_index(faces) | thin))


def _repair_non_manifold_edges(
    vertices: np.ndarray, faces: np.ndarray, pairs: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """``pairs``: the faces' :func:`_manifold_half_edge_pairs`, when the caller has them already."""
    if len(faces) == 0:
        return vertices, faces
    pairs = _manifold_half_edge_pairs(faces) if pairs is None else pairs
    corner_vertex = faces.reshape(-1)
    next_corner = 3 * (np.arange(corner_vertex.size) // 3) + (np.arange(corner_vertex.size) + 1) % 3
    start_a, end_a = pairs[:, 0], next_corner[pairs[:, 0]]
    start_b, end_b = pairs[:, 1], next_corner[pairs[:, 1]]
    same_direction = corner_vertex[start_a] == corner_vertex[start_b]
    corner_pairs = np.concatenate(
        [
            np.stack([start_a, np.where(same_direction, start_b, end_b)], axis=1),
            np.stack([end_a, np.where(same_direction, end_b, start_b)], axis=1),
        ]
    )
    root, _ = _union_find(corner_vertex.size, corner_pairs)
    roots, new_index = _root_ranks(root)
    return vertices[corner_vertex[roots]], new_index.reshape(-1, 3)


def _pull_split_copies_apart(vertices: np.ndarray, faces: np.ndarray) -> np.ndarray:
    """Vertices that share a position (the copies :func:`_repair_non_manifold_edges` made of one vertex, one per
    sheet through it) each move :data:`PINCH_SEPARATION` of the way towards the centroid of their own faces, into
    their own sheet: no two vertices of the surface coincide, and faces filled between the copies have an area."""
    _, inverse, counts = np.unique(vertices, axis=0, return_inverse=True, return_counts=True)
    copies = np.flatnonzero(counts[inverse.reshape(-1)] > 1)
    if copies.size == 0:
        return vertices
    corners = faces.reshape(-1)
    centres = np.repeat(vertices[faces].mean(axis=1), 3, axis=0)
    sums = np.zeros_like(vertices)
    np.add.at(sums, corners, centres)
    uses = np.bincount(corners, minlength=len(vertices))[copies]
    copies, uses = copies[uses > 0], uses[uses > 0]
    moved = vertices.copy()
    moved[copies] += PINCH_SEPARATION * (sums[copies] / uses[:, None] - vertices[copies])
    return moved


def _face_areas(vertices: np.ndarray, faces: np.ndarray) -> np.ndarray:
    corners = vertices[faces]
    return 0.5 * np.linalg.norm(np.cross(corners[:, 1] - corners[:, 0], corners[:, 2] - corners[:, 0]), axis=1)


def _face_components(faces: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Root face and parity of every face; ``parity`` 1 where the face's winding disagrees with its root's."""
    pairs = _manifold_half_edge_pairs(faces)
    start = faces.reshape(-1)
    flipped = start[pairs[:, 0]] == start[pairs[:, 1]]  # both half-edges leave the same vertex: same direction
    return _union_find(len(faces), pairs // faces.shape[1], flipped)


def _remove_small_connected_components(
    vertices: np.ndarray, faces: np.ndarray, min_area: float
) -> tuple[np.ndarray, np.ndarray]:
    if len(faces) == 0:
        return vertices, faces
    return _keep_faces(vertices, faces, _in_large_components(vertices, faces, min_area))


def _in_large_components(
    vertices: np.ndarray, faces: np.ndarray, min_area: float, face_pairs: np.ndarray | None = None
) -> np.ndarray:
    """``[F]`` whether each face's piece has an area of at least ``min_area``; ``face_pairs``, when the caller has
    them: the faces joined by their manifold edges, in any order (a piece's root does not depend on it)."""
    root = _face_components(faces)[0] if face_pairs is None else _union_find(len(faces), face_pairs)[0]
    component_area = np.bincount(root, weights=_face_areas(vertices, faces), minlength=len(faces))
    return component_area[root] >= min_area


def _unify_face_orientations(vertices: np.ndarray, faces: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if len(faces) == 0:
        return vertices, faces
    _, parity = _face_components(faces)
    return vertices, np.where(parity[:, None] == 1, faces[:, [0, 2, 1]], faces)


def _boundary_loops(faces: np.ndarray, count: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Boundary half-edges that lie on closed loops, and the loop (a root half-edge id) of each.

    CuMesh's ``get_boundary_loops``: boundary edges are chained through "manifold boundary vertices" (exactly two
    boundary edges, no edge shared by more than two faces); a chain is a loop when each of its vertices has at
    least two of its edges. Other chains (ending at a vertex where several holes meet without closing) are skipped.
    """
    if count is None:
        start, end, count = _half_edges(faces)
    else:  # the faces per half-edge's edge, known to the caller
        start, end = faces.reshape(-1), faces[:, [1, 2, 0]].reshape(-1)
    boundary = np.flatnonzero((count == 1) & (start != end))  # an edge of a face with a repeated index is no hole
    num_vertices = int(faces.max()) + 1
    boundary_degree = np.bincount(start[boundary], minlength=num_vertices) + np.bincount(
        end[boundary], minlength=num_vertices
    )
    touches_non_manifold = np.zeros(num_vertices, dtype=bool)
    touches_non_manifold[start[count > 2]] = True
    touches_non_manifold[end[count > 2]] = True
    chains_through = (boundary_degree == 2) & ~touches_non_manifold

    # every (vertex, boundary edge) incidence; at a chaining vertex its two incidences join the two edges
    vertex = np.concatenate([start[boundary], end[boundary]])
    edge = np.tile(np.arange(len(boundary)), 2)
    at_chain = np.flatnonzero(chains_through[vertex])
    at_chain = at_chain[np.argsort(vertex[at_chain], kind="stable")]
    loop, _ = _union_find(len(boundary), edge[at_chain].reshape(-1, 2))

    # a chain is closed when every vertex on it carries two of its edges
    loop_vertex, incidences = np.unique(np.stack([loop[edge], vertex], axis=1), axis=0, return_counts=True)
    is_open = np.zeros(len(boundary), dtype=bool)
    is_open[loop_vertex[incidences < 2, 0]] = True
    closed = ~is_open[loop]
    return boundary[closed], loop[closed]


def _fill_holes(
    vertices: np.ndarray, faces: np.ndarray, max_hole_perimeter: float, count: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """``count``: :func:`_half_edges`' counts, when the caller has them already."""
    if len(faces) == 0:
        return vertices, faces
    half_edge, loop = _boundary_loops(faces, count)
    if half_edge.size == 0:
        return vertices, faces
    start = faces.reshape(-1)[half_edge]
    end = np.roll(faces, -1, axis=1).reshape(-1)[half_edge]
    loop_ids, loop = np.unique(loop, return_inverse=True)
    perimeter = np.bincount(loop, weights=np.linalg.norm(vertices[end] - vertices[start], axis=1))
    small = perimeter < max_hole_perimeter
    logger.debug("fill_holes: %d of %d boundary loops below %g", int(small.sum()), len(loop_ids), max_hole_perimeter)
    if not small.any():
        return vertices, faces

    filled = small[loop]
    start, end, loop = start[filled], end[filled], loop[filled]
    new_vertex = np.cumsum(small) - 1  # loop -> index among the new vertices, in loop order
    midpoints = 0.5 * (vertices[start] + vertices[end])
    edges_per_loop = np.bincount(new_vertex[loop], minlength=int(small.sum()))[:, None]
    centres = np.stack(
        [np.bincount(new_vertex[loop], weights=midpoints[:, k], minlength=int(small.sum())) for k in range(3)],
        axis=1,
    )
    # the face owning a boundary half-edge runs start -> end; the fan face runs end -> start -> centre
    fan = np.stack([end, start, len(vertices) + new_vertex[loop]], axis=1)
    return np.concatenate([vertices, centres / edges_per_loop]), np.concatenate([faces, fan])


def _simplify(vertices: np.ndarray, faces: np.ndarray, target_faces: int) -> tuple[np.ndarray, np.ndarray]:
    """fast_simplification until at most ``target_faces`` faces, rerun while a run still removes faces.

    A single run gives up after 100 passes (for instance when every remaining collapse would flip a face); a
    rerun restarts its threshold schedule, which is what CuMesh's threshold growth achieves.
    """
    for _ in range(SIMPLIFY_MAX_ROUNDS):
        if len(faces) <= target_faces:
            break
        new_vertices, new_faces = fast_simplification.simplify(vertices, faces, target_count=target_faces)
        if len(new_faces) >= len(faces):
            break
        vertices, faces = _remove_unreferenced_vertices(new_vertices, new_faces.astype(np.int64))
    if len(faces) > target_faces:
        logger.warning("simplify: stopped at %d faces, above the target %d", len(faces), target_faces)
    return vertices, faces


def _clean_up(
    vertices: np.ndarray,
    faces: np.ndarray,
    max_hole_perimeter: float,
    min_component_area: float,
    closed: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Upstream's clean-up block in ``to_glb`` (non-remesh branch), in its order, with one full edge sort.

    ``closed`` (a remeshed surface, which is closed by construction): the repair's split copies of a vertex are
    pulled apart (:func:`_pull_split_copies_apart`) and every hole is filled, whatever its perimeter: each is a slit
    the repair opened where two sheets met at an edge, and filled between copies at one position its faces would
    have no area.

    The repair only splits vertices, so a repaired edge's faces are faces of one original edge: a one-face or
    two-face edge stays as it was (the repair merged a two-face edge's ends), and only the half-edges of edges with
    3+ faces are grouped again, by their repaired vertices. Faces that share a repaired vertex are joined through
    two-face edges (that is how the repair merged their corners), so the original face pairs give the pieces, and
    a piece holds every face of each of its edges: removing pieces changes no count. Each step thus gets what its
    own edge sort would give it (a piece's root does not depend on the order of the pairs).
    """
    vertices, faces = _remove_duplicate_faces(vertices, faces)
    if len(faces) == 0:
        return vertices, faces  # every step returns an empty mesh as it is
    _, _, order, sorted_key = _sorted_edge_keys(faces)
    pairs = _runs_of_two(order, sorted_key)
    count = np.empty(faces.size, dtype=np.int64)
    count[order] = _run_lengths(sorted_key)
    vertices, faces = _repair_non_manifold_edges(vertices, faces, pairs)
    if closed:
        vertices, max_hole_perimeter = _pull_split_copies_apart(vertices, faces), np.inf

    wide = np.flatnonzero(count > 2)
    start, end = faces.reshape(-1)[wide], faces[:, [1, 2, 0]].reshape(-1)[wide]
    key = np.minimum(start, end) * (int(faces.max()) + 1) + np.maximum(start, end)
    wide_order = np.argsort(key, kind="stable")
    count[wide[wide_order]] = _run_lengths(key[wide_order])

    keep = _in_large_components(vertices, faces, min_component_area, pairs // 3)
    vertices, faces = _keep_faces(vertices, faces, keep)
    return _fill_holes(vertices, faces, max_hole_perimeter, count[np.repeat(keep, 3)])


def _clean_and_simplify(
    vertices: np.ndarray,
    faces: np.ndarray,
    target_faces: int,
    max_hole_perimeter: float,
    min_component_area: float,
    remeshed: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Both public entry points: ``remeshed`` (:func:`simplify_remeshed`) skips the 3× simplify and first clean-up."""
    vertices, faces = _keep_faces(vertices, faces, ~_has_repeated_index(faces))
    if remeshed:
        return _simplify_closed_to_budget(vertices, faces, target_faces, max_hole_perimeter, min_component_area)
    vertices, faces = _simplify(vertices, faces, 3 * target_faces)
    vertices, faces = _clean_up(vertices, faces, max_hole_perimeter, min_component_area)
    vertices, faces = _simplify_and_repair(vertices, faces, target_faces, max_hole_perimeter, min_component_area)
    logger.debug("clean_and_simplify: %d vertices, %d faces (target %d)", len(vertices), len(faces), target_faces)
    return vertices, faces


def _simplify_closed_to_budget(
    vertices: np.ndarray, faces: np.ndarray, target_faces: int, max_hole_perimeter: float, min_component_area: float
) -> tuple[np.ndarray, np.ndarray]:
    """A closed surface simplified to ``target_faces`` ± :data:`FACE_BUDGET_TOLERANCE`, kept closed.

    QEM folds some regions of a closed surface into two-sided triangles (two faces on the same three vertices, each
    edge of them shared by four faces). Keeping one face of a pair, as the clean-up does, leaves the other side
    open; dropping both leaves the surface around them closed. The repair, clean-up and those drops remove faces, so
    the simplification is rerun from the input with a goal scaled by how far the result fell short, until the count
    is within the tolerance (or :data:`FACE_BUDGET_ROUNDS` runs; the input itself when it already has fewer faces).
    """
    goal, result = target_faces, (vertices, faces)
    for _ in range(FACE_BUDGET_ROUNDS):
        simple_vertices, simple_faces = _drop_folded_pairs(*_simplify(vertices, faces, goal))
        result = _drop_non_orientable_pieces(
            *_simplify_and_repair(simple_vertices, simple_faces, goal, max_hole_perimeter, min_component_area, True)
        )
        got = len(result[1])
        if abs(got - target_faces) <= FACE_BUDGET_TOLERANCE * target_faces or goal >= len(faces) or got == 0:
            break
        goal = min(len(faces), round(goal * target_faces / got))
    logger.debug("simplify_remeshed: %d faces (target %d, last goal %d)", len(result[1]), target_faces, goal)
    return result


def _drop_non_orientable_pieces(vertices: np.ndarray, faces: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Drop the pieces whose winding no flip makes consistent (an edge both faces still run the same way after
    :func:`_unify_face_orientations`): closed but one-sided, they have no outside. The repairs of a noisy remesh
    leave the odd small one."""
    if len(faces) == 0:
        return vertices, faces
    pairs = _manifold_half_edge_pairs(faces)
    start = faces.reshape(-1)
    same_way = pairs[start[pairs[:, 0]] == start[pairs[:, 1]]]
    if same_way.size == 0:
        return vertices, faces
    root, _ = _face_components(faces)
    return _keep_faces(vertices, faces, ~np.isin(root, root[same_way[:, 0] // 3]))


def _drop_folded_pairs(vertices: np.ndarray, faces: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Drop every face whose three vertices another face also has (both faces of each fold, see
    :func:`_simplify_closed_to_budget`)."""
    if len(faces) == 0:
        return vertices, faces
    _, inverse, counts = np.unique(np.sort(faces, axis=1), axis=0, return_inverse=True, return_counts=True)
    return _keep_faces(vertices, faces, counts[inverse.reshape(-1)] == 1)


def _simplify_and_repair(
    vertices: np.ndarray,
    faces: np.ndarray,
    target_faces: int,
    max_hole_perimeter: float,
    min_component_area: float,
    closed: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """The last steps of both: simplify to the target, clean up (``closed``: see :func:`_clean_up`), unify
    orientations, drop zero-area faces."""
    vertices, faces = _simplify(vertices, faces, target_faces)
    vertices, faces = _clean_up(vertices, faces, max_hole_perimeter, min_component_area, closed)
    vertices, faces = _unify_face_orientations(vertices, faces)
    return _remove_degenerate_faces(vertices, faces, 1e-24, 1e-12)
