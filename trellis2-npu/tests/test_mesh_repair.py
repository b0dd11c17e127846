"""Hole filling, clean-up and simplification (:mod:`trellis2_npu.geometry.mesh_repair`) on meshes with known defects.

Icospheres get holes punched by removing faces; boundary loops are counted by a small pure-Python reference that
groups boundary edges by shared vertices, independently of the module. trimesh checks watertightness and winding.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import trimesh
from trimesh.grouping import group_rows
from trimesh.proximity import closest_point_naive

from trellis2_npu.geometry import mesh_repair
from trellis2_npu.geometry.mesh_repair import (
    clean_and_simplify,
    fill_holes,
    remove_degenerate_faces,
    remove_duplicate_faces,
    remove_small_connected_components,
    remove_unreferenced_vertices,
    repair_non_manifold_edges,
    simplify,
    unify_face_orientations,
)

MAX_HOLE_PERIMETER = 3e-2  # upstream's default


def _sphere(subdivisions: int = 3, radius: float = 0.05) -> trimesh.Trimesh:
    """Icosphere with outward, consistent winding; at radius 0.05 and 3 subdivisions an edge is about 0.0075."""
    return trimesh.creation.icosphere(subdivisions=subdivisions, radius=radius)


def _tensors(mesh: trimesh.Trimesh, keep: np.ndarray | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    faces = mesh.faces if keep is None else mesh.faces[keep]
    return torch.tensor(mesh.vertices, dtype=torch.float32), torch.tensor(faces, dtype=torch.int64)


def _trimesh(vertices: torch.Tensor, faces: torch.Tensor) -> trimesh.Trimesh:
    return trimesh.Trimesh(vertices.double().numpy(), faces.long().numpy(), process=False)


def _boundary_loop_perimeters(vertices: torch.Tensor, faces: torch.Tensor) -> list[float]:
    """Perimeter of every group of boundary edges connected through shared vertices (holes must not touch)."""
    mesh = _trimesh(vertices, faces)
    edges = mesh.edges_sorted[group_rows(mesh.edges_sorted, require_count=1)]
    parent: dict[int, int] = {}

    def find(x: int) -> int:
        while parent.setdefault(x, x) != x:
            x = parent[x]
        return x

    for a, b in edges:
        parent[find(int(a))] = find(int(b))
    perimeters: dict[int, float] = {}
    for a, b in edges:
        root = find(int(a))
        perimeters[root] = perimeters.get(root, 0.0) + float(np.linalg.norm(mesh.vertices[a] - mesh.vertices[b]))
    return sorted(perimeters.values())


def _far_apart_faces(mesh: trimesh.Trimesh, count: int) -> list[int]:
    """Faces whose vertex sets are pairwise far apart, so the holes they leave never touch."""
    chosen: list[int] = []
    centres = mesh.triangles_center
    for face in range(len(mesh.faces)):
        if all(np.linalg.norm(centres[face] - centres[c]) > 0.3 * mesh.scale for c in chosen):
            chosen.append(face)
        if len(chosen) == count:
            return chosen
    raise AssertionError("sphere too small for the requested holes")


def _without(mesh: trimesh.Trimesh, faces_to_remove: np.ndarray) -> np.ndarray:
    keep = np.ones(len(mesh.faces), dtype=bool)
    keep[faces_to_remove] = False
    return keep


# ----------------------------------------------------------------------------------------------------------------
# fill_holes


def test_fill_holes_closes_small_loops_and_keeps_large_ones():
    mesh = _sphere()
    small_a, small_b, large_centre = _far_apart_faces(mesh, 3)
    one_ring = np.flatnonzero(np.isin(mesh.faces, mesh.faces[large_centre]).any(axis=1))  # around 3 vertices
    vertices, faces = _tensors(mesh, _without(mesh, np.concatenate([[small_a, small_b], one_ring])))
    before = _boundary_loop_perimeters(vertices, faces)
    assert len(before) == 3
    assert before[1] < MAX_HOLE_PERIMETER < before[2]  # the test's premise: two small loops, one large

    new_vertices, new_faces = fill_holes(vertices, faces)

    assert _boundary_loop_perimeters(new_vertices, new_faces) == pytest.approx([before[2]])
    assert len(new_vertices) == len(vertices) + 2  # one centre per filled loop
    assert len(new_faces) == len(faces) + 6  # one face per edge of the two triangle-shaped holes
    assert torch.equal(new_vertices[: len(vertices)], vertices) and torch.equal(new_faces[: len(faces)], faces)
    assert _trimesh(new_vertices, new_faces).is_winding_consistent


def test_fill_holes_makes_a_mesh_with_only_small_holes_watertight():
    mesh = _sphere()
    holes = _far_apart_faces(mesh, 4)
    vertices, faces = _tensors(mesh, _without(mesh, np.array(holes)))
    assert len(_boundary_loop_perimeters(vertices, faces)) == 4

    new_vertices, new_faces = fill_holes(vertices, faces)
    filled = _trimesh(new_vertices, new_faces)

    assert filled.is_watertight and filled.is_winding_consistent
    assert filled.volume == pytest.approx(mesh.volume, rel=1e-2)  # fans wound outward like the sphere
    removed = np.sort(mesh.triangles_center[holes], axis=0)
    centres = np.sort(new_vertices[len(vertices) :].double().numpy(), axis=0)
    assert np.abs(centres - removed).max() < 1e-6  # a triangle's vertex mean is its centroid


def test_fill_holes_respects_the_threshold():
    mesh = _sphere()
    vertices, faces = _tensors(mesh, _without(mesh, np.array(_far_apart_faces(mesh, 2))))
    (perimeter, _) = _boundary_loop_perimeters(vertices, faces)

    assert len(fill_holes(vertices, faces, max_hole_perimeter=0.999 * perimeter)[1]) == len(faces)
    assert len(fill_holes(vertices, faces, max_hole_perimeter=1.001 * perimeter)[1]) > len(faces)


def test_fill_holes_leaves_a_closed_mesh_unchanged():
    vertices, faces = _tensors(_sphere())
    new_vertices, new_faces = fill_holes(vertices, faces)
    assert torch.equal(new_vertices, vertices) and torch.equal(new_faces, faces)


@pytest.mark.parametrize(("vertex_dtype", "face_dtype"), [(torch.float32, torch.int32), (torch.float64, torch.int64)])
def test_fill_holes_keeps_device_and_dtypes(vertex_dtype, face_dtype):
    mesh = _sphere()
    vertices, faces = _tensors(mesh, _without(mesh, np.array(_far_apart_faces(mesh, 1))))
    new_vertices, new_faces = fill_holes(vertices.to(vertex_dtype), faces.to(face_dtype))
    assert (new_vertices.dtype, new_faces.dtype) == (vertex_dtype, face_dtype)
    assert new_vertices.device == vertices.device and new_faces.device == faces.device


def test_fill_holes_splits_holes_that_touch_at_one_vertex():
    """Two faces of one vertex's fan, not neighbours: two triangle holes meeting at a non-manifold vertex."""
    mesh = _sphere()
    fan = np.flatnonzero((mesh.faces == 0).any(axis=1))
    apart = next(f for f in fan[1:] if len(np.intersect1d(mesh.faces[f], mesh.faces[fan[0]])) == 1)
    vertices, faces = _tensors(mesh, _without(mesh, np.array([fan[0], apart])))

    new_vertices, new_faces = fill_holes(vertices, faces)
    filled = _trimesh(new_vertices, new_faces)

    assert len(new_vertices) == len(vertices) + 2
    assert filled.is_watertight and filled.is_winding_consistent


def test_fill_holes_survives_non_manifold_soup():
    """Random faces over few vertices (edges shared by many faces, open chains): no crash, valid indices."""
    rng = np.random.default_rng(0)
    vertices = torch.tensor(rng.uniform(-0.01, 0.01, (12, 3)), dtype=torch.float32)
    faces = torch.tensor(np.stack([rng.choice(12, 3, replace=False) for _ in range(40)]))
    new_vertices, new_faces = fill_holes(vertices, faces)
    assert new_faces.min() >= 0 and new_faces.max() < len(new_vertices)


# ----------------------------------------------------------------------------------------------------------------
# clean-up


def test_remove_duplicate_faces_keeps_the_first_in_order():
    vertices, faces = _tensors(_sphere())
    duplicated = torch.cat([faces, faces[:5], faces[5:10].flip(1), faces[10:15].roll(1, dims=1)])
    new_vertices, new_faces = remove_duplicate_faces(vertices, duplicated)
    assert torch.equal(new_faces, faces) and torch.equal(new_vertices, vertices)


def test_remove_degenerate_faces_drops_repeated_indices_and_zero_area():
    vertices, faces = _tensors(_sphere())
    collinear = torch.tensor([[0.0, 0.0, 0.0], [0.1, 0.0, 0.0], [0.2, 0.0, 0.0]])
    n = len(vertices)
    extra = torch.tensor([[0, 0, 1], [2, 3, 3], [n, n + 1, n + 2]])
    new_vertices, new_faces = remove_degenerate_faces(torch.cat([vertices, collinear]), torch.cat([faces, extra]))
    assert torch.equal(new_faces, faces) and torch.equal(new_vertices, vertices)


def test_remove_unreferenced_vertices_renumbers_faces():
    vertices = torch.tensor([[9.0, 9.0, 9.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [7.0, 7.0, 7.0], [0.0, 1.0, 0.0]])
    new_vertices, new_faces = remove_unreferenced_vertices(vertices, torch.tensor([[1, 2, 4]]))
    assert torch.equal(new_vertices, vertices[[1, 2, 4]]) and new_faces.tolist() == [[0, 1, 2]]


def test_remove_small_connected_components_drops_floaters():
    big, tiny = _sphere(radius=0.3), _sphere(subdivisions=1, radius=5e-4)  # tiny area 3e-6 < 1e-5
    vertices = torch.tensor(np.concatenate([big.vertices, tiny.vertices + 0.4]), dtype=torch.float32)
    faces = torch.tensor(np.concatenate([big.faces, tiny.faces + len(big.vertices)]))

    new_vertices, new_faces = remove_small_connected_components(vertices, faces)

    assert torch.equal(new_faces, faces[: len(big.faces)])
    assert torch.equal(new_vertices, vertices[: len(big.vertices)])


def test_repair_non_manifold_edges_splits_a_fin():
    """A third face on a sphere edge: afterwards no edge has more than two faces, and no face moved."""
    mesh = _sphere()
    a, b = mesh.edges_unique[0]
    vertices = torch.tensor(np.concatenate([mesh.vertices, [[0.2, 0.2, 0.2]]]), dtype=torch.float32)
    faces = torch.tensor(np.concatenate([mesh.faces, [[a, b, len(mesh.vertices)]]]))

    new_vertices, new_faces = repair_non_manifold_edges(vertices, faces)

    repaired = _trimesh(new_vertices, new_faces)
    assert np.unique(repaired.edges_sorted, axis=0, return_counts=True)[1].max() == 2
    assert torch.equal(new_vertices[new_faces], vertices[faces])  # same triangles, same corner order


def test_repair_non_manifold_edges_keeps_a_manifold_mesh():
    vertices, faces = _tensors(_sphere())
    new_vertices, new_faces = repair_non_manifold_edges(vertices, faces)
    assert len(new_vertices) == len(vertices)
    assert torch.equal(new_vertices[new_faces], vertices[faces])


def test_unify_face_orientations_undoes_random_flips():
    vertices, faces = _tensors(_sphere())
    flip = torch.from_numpy(np.random.default_rng(0).random(len(faces)) < 0.3)
    flip[0] = False  # each piece keeps the winding of its first face
    scrambled = torch.where(flip[:, None], faces[:, [0, 2, 1]], faces)
    assert not _trimesh(vertices, scrambled).is_winding_consistent

    _, unified = unify_face_orientations(vertices, scrambled)

    assert torch.equal(unified, faces)


# ----------------------------------------------------------------------------------------------------------------
# simplification


def test_simplify_reaches_the_target_and_stays_on_the_surface():
    mesh = _sphere(subdivisions=4, radius=0.4)  # 5120 faces, edge about 0.03
    vertices, faces = _tensors(mesh)

    new_vertices, new_faces = simplify(vertices, faces, 500)

    assert len(new_faces) <= 500
    simplified = _trimesh(new_vertices, new_faces)
    assert simplified.is_watertight and simplified.is_winding_consistent
    # Hausdorff-like, both ways, against a 0.4 radius and 0.1 edges after simplification
    assert closest_point_naive(mesh, simplified.vertices)[1].max() < 0.01
    assert closest_point_naive(simplified, mesh.vertices)[1].max() < 0.015


def test_simplify_below_the_face_count_is_a_no_op():
    vertices, faces = _tensors(_sphere())
    new_vertices, new_faces = simplify(vertices, faces, len(faces))
    assert torch.equal(new_vertices, vertices) and torch.equal(new_faces, faces)


def test_clean_and_simplify_repairs_and_reaches_the_target():
    sphere, floater = _sphere(subdivisions=4, radius=0.4), _sphere(subdivisions=1, radius=5e-4)
    keep = _without(sphere, np.array(_far_apart_faces(sphere, 3)))
    vertices = np.concatenate([sphere.vertices, floater.vertices + 0.45])
    faces = np.concatenate(
        [sphere.faces[keep], sphere.faces[:20], floater.faces + len(sphere.vertices), [[0, 0, 1]]]
    )  # three holes, duplicated faces, a floater, a repeated index

    new_vertices, new_faces = clean_and_simplify(
        torch.tensor(vertices, dtype=torch.float32), torch.tensor(faces, dtype=torch.int32), 1000
    )

    result = _trimesh(new_vertices, new_faces)
    assert new_faces.dtype == torch.int32 and len(new_faces) <= 1000
    assert result.is_watertight and result.is_winding_consistent and result.volume > 0
    assert np.abs(np.linalg.norm(result.vertices, axis=1) - 0.4).max() < 0.02  # floater gone, shape kept


@pytest.mark.parametrize("function", [simplify, clean_and_simplify, mesh_repair.simplify_remeshed])
def test_target_below_four_faces_is_rejected(function):
    vertices, faces = _tensors(_sphere())
    with pytest.raises(ValueError, match=r"target_faces must be at least 4 .* got 3"):
        function(vertices, faces, 3)


# ----------------------------------------------------------------------------------------------------------------
# the connectivity helpers against straightforward references (they were rewritten for speed, not to change results)


def _reference_union_find(num_nodes: int, pairs: np.ndarray, flipped: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The hook-and-compress rounds over every pair, then pointer jumping over every node (the first version)."""
    root, parity = np.arange(num_nodes), np.zeros(num_nodes, dtype=np.int64)
    while True:
        root_a, root_b = root[pairs[:, 0]], root[pairs[:, 1]]
        apart = root_a != root_b
        if not apart.any():
            return root, parity
        root_a, root_b = root_a[apart], root_b[apart]
        relative = flipped[apart] ^ parity[pairs[apart, 0]] ^ parity[pairs[apart, 1]]
        hook = np.full(num_nodes, np.iinfo(np.int64).max)
        np.minimum.at(hook, np.maximum(root_a, root_b), 2 * np.minimum(root_a, root_b) + relative)
        hooked = np.flatnonzero(hook != np.iinfo(np.int64).max)
        root[hooked], parity[hooked] = hook[hooked] // 2, hook[hooked] % 2
        while not np.array_equal(root[root], root):
            root, parity = root[root], parity ^ parity[root]


def _soup(seed: int) -> np.ndarray:
    """Faces with every defect the helpers see: duplicates, flips, fins, repeated indices, a strip of stray faces."""
    faces = _sphere(subdivisions=2).faces.copy()
    rng = np.random.default_rng(seed)
    flip = rng.random(len(faces)) < 0.2
    faces[flip] = faces[flip][:, [0, 2, 1]]
    stray = rng.integers(0, faces.max() + 1, size=(40, 3))
    return np.concatenate([faces, faces[:7], stray, [[0, 0, 1], [3, 4, 4]]])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_edge_counts_and_manifold_pairs_match_np_unique(seed):
    faces = _soup(seed)
    start, end = faces.reshape(-1), np.roll(faces, -1, axis=1).reshape(-1)
    key = np.minimum(start, end) * (faces.max() + 1) + np.maximum(start, end)
    _, edge, count = np.unique(key, return_inverse=True, return_counts=True)
    shared = np.flatnonzero(count[edge] == 2)

    got_start, got_end, got_count = mesh_repair._half_edges(faces)

    assert np.array_equal(got_start, start) and np.array_equal(got_end, end)
    assert np.array_equal(got_count, count[edge])
    expected_pairs = shared[np.argsort(edge[shared], kind="stable")].reshape(-1, 2)
    assert np.array_equal(mesh_repair._manifold_half_edge_pairs(faces), expected_pairs)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_union_find_matches_the_reference_with_contradicting_cycles(seed):
    rng = np.random.default_rng(seed)
    num_nodes = 300
    pairs = rng.integers(0, num_nodes, size=(400, 2))  # many cycles, most with contradicting parities
    flipped = rng.integers(0, 2, size=len(pairs))

    root, parity = mesh_repair._union_find(num_nodes, pairs, flipped)

    expected_root, expected_parity = _reference_union_find(num_nodes, pairs, flipped)
    assert np.array_equal(root, expected_root) and np.array_equal(parity, expected_parity)
    root_only, no_parity = mesh_repair._union_find(num_nodes, pairs)  # no flips: parities are not tracked
    assert np.array_equal(root_only, expected_root) and not no_parity.any()
    roots, labels = mesh_repair._root_ranks(root)
    expected_roots, expected_labels = np.unique(root, return_inverse=True)
    assert np.array_equal(roots, expected_roots) and np.array_equal(labels, expected_labels)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_compiled_union_find_matches_the_reference_where_parities_agree(seed):
    """Parities that some node labelling explains (any orientable mesh's) make root and parity unique: the serial
    compiled pass must give the reference's arrays, and say so (a contradiction is left to the rounds, above)."""
    rng = np.random.default_rng(seed)
    num_nodes = 500
    pairs = rng.integers(0, num_nodes, size=(700, 2))  # many components and cycles, self-pairs included
    label = rng.integers(0, 2, size=num_nodes)
    flipped = label[pairs[:, 0]] ^ label[pairs[:, 1]]

    root, parity, consistent = mesh_repair._serial_union_find(num_nodes, pairs, flipped)

    expected_root, expected_parity = _reference_union_find(num_nodes, pairs, flipped)
    assert consistent and np.array_equal(root, expected_root) and np.array_equal(parity, expected_parity)
    repeated = np.concatenate([pairs, pairs[:1]]), np.concatenate([flipped, 1 - flipped[:1]])  # a 2-cycle, odd
    assert not mesh_repair._serial_union_find(num_nodes, *repeated)[2]


@pytest.mark.parametrize("seed", [0, 1])
def test_first_of_equal_rows_matches_np_unique(seed):
    rows = np.sort(_soup(seed), axis=1)
    expected = np.unique(rows, axis=0, return_index=True)[1]
    assert np.array_equal(np.sort(mesh_repair._first_of_equal_rows(rows)), np.sort(expected))


def _defective_sphere(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A sphere with holes, duplicated faces, tiny fins on some edges (3 and 4 faces on an edge), a floater."""
    sphere = _sphere(subdivisions=2)
    rng = np.random.default_rng(seed)
    faces = sphere.faces[_without(sphere, np.array(_far_apart_faces(sphere, 3)))]
    edges = sphere.edges_unique[rng.choice(len(sphere.edges_unique), 8, replace=False)]
    vertices, extra = [sphere.vertices], []
    for k, (a, b) in enumerate(np.concatenate([edges, edges[:2]])):  # the first two edges get two fins
        tip = (sphere.vertices[a] + sphere.vertices[b]) / 2 * (1 + 1e-3 * (k + 1))
        extra.append([a, b, len(sphere.vertices) + k])
        vertices.append(tip[None])
    floater = _sphere(subdivisions=1, radius=1e-3)
    vertices = np.concatenate([*vertices, floater.vertices + 0.2])
    faces = np.concatenate([faces, faces[:5], np.array(extra), floater.faces + len(vertices) - len(floater.vertices)])
    return vertices, faces


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("min_area", [1e-9, 1e-5, 1e-3])  # fins kept, fins and floater gone, all but the sphere
def test_clean_up_matches_its_steps_one_by_one(seed, min_area):
    """The clean-up shares one edge sort among its steps; each step computing its own must give the same mesh."""
    vertices, faces = _defective_sphere(seed)
    expected = mesh_repair._remove_duplicate_faces(vertices, faces)
    expected = mesh_repair._repair_non_manifold_edges(*expected)
    expected = mesh_repair._remove_small_connected_components(*expected, min_area)
    expected = mesh_repair._fill_holes(*expected, MAX_HOLE_PERIMETER)
    assert len(expected[1]) != len(faces)  # something was repaired

    got = mesh_repair._clean_up(vertices, faces, MAX_HOLE_PERIMETER, min_area)

    assert np.array_equal(got[0], expected[0]) and np.array_equal(got[1], expected[1])


# ----------------------------------------------------------------------------------------------------------------
# mesh_quality, against trimesh (an independent checker)


def _quality_shapes() -> dict[str, trimesh.Trimesh]:
    sphere = trimesh.creation.icosphere(subdivisions=2, radius=0.3)
    flipped = sphere.copy()
    flipped.faces[0] = flipped.faces[0][::-1]
    plate = trimesh.creation.box(extents=(1.0, 1.0, 0.1))
    plate.faces = plate.faces[2:]  # two faces gone: an open box
    fin = trimesh.Trimesh([[0, 0, 0], [1, 0, 0], [0, 1, 0], [0, -1, 0], [0, 0, 1]], [[0, 1, 2], [1, 0, 3], [0, 1, 4]])
    return {
        "sphere": sphere,
        "torus": trimesh.creation.torus(major_radius=0.3, minor_radius=0.1),
        "two spheres": trimesh.util.concatenate([sphere, sphere.copy().apply_translation([1, 0, 0])]),
        "open box": plate,
        "flipped face": flipped,
        "three faces on one edge": fin,
    }


@pytest.mark.parametrize("name", list(_quality_shapes()))
def test_mesh_quality_agrees_with_trimesh(name):
    mesh = _quality_shapes()[name]
    quality = mesh_repair.mesh_quality(torch.tensor(mesh.vertices), torch.tensor(mesh.faces))
    checked = trimesh.Trimesh(mesh.vertices, mesh.faces, process=False)
    edge_uses = np.unique(checked.edges_sorted, axis=0, return_counts=True)[1]
    pieces = trimesh.graph.connected_components(checked.face_adjacency, nodes=np.arange(len(checked.faces)))
    assert quality["faces"] == len(checked.faces) and quality["edges"] == len(checked.edges_unique)
    assert (
        quality["boundary_edges"] == (edge_uses == 1).sum() and quality["non_manifold_edges"] == (edge_uses > 2).sum()
    )
    assert quality["watertight"] == checked.is_watertight and quality["euler_characteristic"] == checked.euler_number
    assert quality["components"] == len(pieces)
    if quality["non_manifold_edges"] == 0:  # trimesh's winding check reads manifold edges only too
        assert quality["consistently_wound"] == checked.is_winding_consistent
    expected_genus = {"sphere": 0, "torus": 1, "two spheres": 0}
    assert quality["genus"] == expected_genus.get(name), quality


def test_mesh_quality_counts_degenerate_and_duplicate_faces():
    sphere = trimesh.creation.icosphere(subdivisions=1, radius=0.3)
    faces = np.concatenate([sphere.faces, sphere.faces[:2], [[0, 0, 1], [0, 1, 1]]])  # 2 duplicates, 2 degenerate
    quality = mesh_repair.mesh_quality(torch.tensor(sphere.vertices), torch.tensor(faces))
    assert quality["duplicate_faces"] == 2 and quality["degenerate_faces"] == 2
    assert not quality["watertight"] and quality["genus"] is None


@pytest.fixture(scope="module")
def noisy_dense_sphere() -> tuple[torch.Tensor, torch.Tensor]:
    """A closed, consistently wound 1.3M-face icosphere (radius 0.4, the decoder box) with 0.002 of vertex noise:
    a remeshed surface's size, on which plain QEM folds regions into two-sided triangles."""
    mesh = trimesh.creation.icosphere(subdivisions=8, radius=0.4)
    noise = np.random.default_rng(0).normal(0.0, 0.002, mesh.vertices.shape)
    return torch.tensor(mesh.vertices + noise, dtype=torch.float32), torch.tensor(mesh.faces, dtype=torch.int64)


@pytest.mark.parametrize("target", [5_000, 20_000, 300_000])
def test_simplify_remeshed_keeps_a_closed_surface_closed_within_the_face_budget(noisy_dense_sphere, target):
    """``--faces N`` after a remesh: N ± 5 % faces, and a closed, consistently wound 2-manifold by trimesh's checks
    (the clean-up used to keep one face of each fold QEM makes, which opened the other side)."""
    vertices, faces = mesh_repair.simplify_remeshed(*noisy_dense_sphere, target)
    assert abs(len(faces) - target) <= 0.05 * target
    mesh = trimesh.Trimesh(vertices.numpy(), faces.numpy(), process=False)
    assert mesh.is_watertight and mesh.is_winding_consistent
    edges = np.sort(mesh.edges, axis=1)
    assert group_rows(edges, require_count=2).size == len(edges)  # every edge on exactly two faces
    assert mesh.volume > 0  # outward, as the sphere was


def test_folded_pairs_are_dropped_whole():
    """Both faces on one vertex triple go, whatever their winding; a lone face stays."""
    vertices = np.arange(15.0).reshape(5, 3)  # vertex i at (3i, 3i+1, 3i+2): unused ones are dropped, renumbered
    faces = np.array([[0, 1, 2], [2, 1, 0], [1, 2, 3], [0, 3, 4], [3, 1, 2]])
    kept_vertices, kept = mesh_repair._drop_folded_pairs(vertices, faces)
    assert kept_vertices[kept].tolist() == [vertices[[0, 3, 4]].tolist()]


def test_simplify_remeshed_drops_a_closed_one_sided_piece():
    """The 6-vertex projective plane (every edge shared by two faces, no orientation agrees across all of them) next
    to a sphere: the remesh path keeps the sphere, consistently wound, and drops the piece that has no outside."""
    sphere = _sphere(radius=0.2)
    rp2 = np.array(
        [[0, 1, 2], [0, 2, 3], [0, 3, 4], [0, 4, 5], [0, 5, 1], [1, 2, 4], [2, 3, 5], [3, 4, 1], [4, 5, 2], [5, 1, 3]]
    )
    angles = np.linspace(0, 2 * np.pi, 6, endpoint=False)
    rp2_vertices = np.stack([0.3 + 0.1 * np.cos(angles), 0.1 * np.sin(angles), 0.05 * np.cos(3 * angles)], 1)
    rp2_vertices[0] = (0.3, 0.0, 0.12)
    vertices = np.concatenate([sphere.vertices, rp2_vertices])
    faces = np.concatenate([sphere.faces, rp2 + len(sphere.vertices)])
    edges = np.sort(np.concatenate([faces[:, [0, 1]], faces[:, [1, 2]], faces[:, [2, 0]]]), axis=1)
    assert (np.unique(edges, axis=0, return_counts=True)[1] == 2).all()  # closed
    assert not trimesh.Trimesh(vertices, faces, process=False).is_winding_consistent  # one-sided
    kept_vertices, kept_faces = mesh_repair.simplify_remeshed(
        torch.tensor(vertices, dtype=torch.float32), torch.tensor(faces), len(faces)
    )
    kept = trimesh.Trimesh(kept_vertices.double().numpy(), kept_faces.numpy(), process=False)
    assert len(kept_faces) == len(sphere.faces) and kept.is_watertight and kept.is_winding_consistent
    assert kept.volume == pytest.approx(sphere.volume, rel=1e-5)
