"""Narrow-band dual-contouring remesh (:mod:`trellis2_npu.geometry.remesh`) on shapes whose offset surface is known.

References are independent of the module: distances come from trimesh's brute-force closest point, edges and
shells are counted with numpy/trimesh, and the offset surfaces of the sphere and torus are analytic. Grids are
small (16-24 cells) to keep the tests fast; the properties do not depend on the resolution.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import trimesh
from trimesh.proximity import closest_point_naive

from trellis2_npu.geometry import mesh_repair, remesh
from trellis2_npu.geometry.closest_points import closest_points_within
from trellis2_npu.geometry.distance_field import distance_slabs, squared_distance_slabs
from trellis2_npu.geometry.distance_field_cpu import squared_distances_cpu
from trellis2_npu.geometry.export import to_glb
from trellis2_npu.geometry.remesh import remesh_narrow_band
from trellis2_npu.geometry.texture_bake import Voxels, sample_texture_attributes, unwrap_uv
from trellis2_npu.voxel_lookup import build_voxel_index

RESOLUTION = 20
VOXEL = 1 / RESOLUTION  # the box is [-0.5, 0.5]^3


def _tensors(mesh: trimesh.Trimesh) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.tensor(mesh.vertices, dtype=torch.float32), torch.tensor(mesh.faces, dtype=torch.int64)


def _torus(major: float = 0.25, minor: float = 0.1) -> trimesh.Trimesh:
    return trimesh.creation.torus(major_radius=major, minor_radius=minor, major_sections=48, minor_sections=24)


def plate() -> trimesh.Trimesh:
    """A single-sided square sheet of zero thickness (the thinnest input: both sides of the band are outside)."""
    grid = np.linspace(-0.3, 0.3, 13)
    x, y = np.meshgrid(grid, grid, indexing="ij")
    vertices = np.stack([x.ravel(), y.ravel(), np.full(x.size, 0.013)], axis=1)
    index = np.arange(x.size).reshape(13, 13)
    a, b, c, d = index[:-1, :-1].ravel(), index[1:, :-1].ravel(), index[1:, 1:].ravel(), index[:-1, 1:].ravel()
    return trimesh.Trimesh(vertices, np.concatenate([np.stack([a, b, c], 1), np.stack([a, c, d], 1)]), process=False)


def _edge_use_counts(faces: np.ndarray) -> np.ndarray:
    edges = np.sort(np.concatenate([faces[:, [0, 1]], faces[:, [1, 2]], faces[:, [2, 0]]]), axis=1)
    return np.unique(edges, axis=0, return_counts=True)[1]


def _offset_error(shape: str, points: np.ndarray, offset: float) -> np.ndarray:
    """Distance of ``points`` to the analytic surface at ``offset`` outside the shape."""
    if shape == "sphere":
        return np.abs(np.linalg.norm(points, axis=1) - (0.3 + offset))
    ring = np.hypot(points[:, 0], points[:, 1]) - 0.25
    return np.abs(np.hypot(ring, points[:, 2]) - (0.1 + offset))


def test_closest_points_within_matches_brute_force():
    mesh = trimesh.creation.icosphere(subdivisions=2, radius=0.3)
    mesh.vertices += np.random.default_rng(0).normal(scale=0.01, size=mesh.vertices.shape)
    points = np.random.default_rng(1).uniform(-0.5, 0.5, size=(600, 3))
    max_distance = 0.06
    found = closest_points_within(torch.tensor(points, dtype=torch.float64), *_tensors(mesh), max_distance)
    _, reference, _ = closest_point_naive(mesh, points)
    near = reference <= max_distance
    assert 50 < near.sum() < 550  # both kinds of points are tested
    # float64 queries on float32 vertices: the two searches agree to the vertices' rounding (~3e-8 here)
    np.testing.assert_allclose(found.distances.numpy()[near], reference[near], atol=1e-6)
    assert np.isinf(found.distances.numpy()[~near]).all() and (found.face_ids.numpy()[~near] == -1).all()
    # a coarser grid only changes the search, not the answer
    coarse = closest_points_within(torch.tensor(points), *_tensors(mesh), max_distance, cell_size=max_distance)
    np.testing.assert_allclose(coarse.distances.numpy()[near], reference[near], atol=1e-6)


@pytest.mark.heavy
@pytest.mark.parametrize("compiled", [False, True], ids=["torch", "compiled"])
def test_distance_slabs_match_brute_force(compiled):
    """Exact distances at every grid corner within reach, across slab boundaries, for small, large (split) and
    degenerate faces; the other corners are reported at least that far. Both the tensor path (any device) and
    the host CPU's compiled one (:mod:`trellis2_npu.geometry.distance_field_cpu`)."""
    resolution, reach = 24, 2.5
    mesh = trimesh.creation.icosphere(subdivisions=2, radius=7.0)
    mesh.vertices = mesh.vertices + 12 + np.random.default_rng(0).normal(scale=0.3, size=mesh.vertices.shape)
    large = [[1.0, 1.0, 1.0], [20.0, 3.0, 2.0], [5.0, 22.0, 10.0]]  # spans many cells: split before the scatter
    segment = [[3.0, 3.0, 3.0], [6.0, 6.0, 6.0], [9.0, 9.0, 9.0]]  # zero area: only its edges count
    triangles = np.concatenate([mesh.vertices[mesh.faces], [large, segment]])
    values = torch.full((resolution + 1,) * 3, math.inf)
    faces, slab_corners = torch.tensor(triangles, dtype=torch.float32), 5 * 25 * 25
    if compiled:
        slabs = [
            (slab.origin, squared_distances_cpu(slab))
            for slab in distance_slabs(faces, resolution, reach, slab_corners)
        ]
    else:
        slabs = list(squared_distance_slabs(faces, resolution, reach, slab_corners))
    assert len(slabs) > 3  # several slabs, each written once except their shared planes
    for origin, slab in slabs:
        x, y, z = origin.tolist()
        values[x : x + slab.shape[0], y : y + slab.shape[1], z : z + slab.shape[2]] = slab
    corners = np.stack(np.meshgrid(*[np.arange(resolution + 1)] * 3, indexing="ij"), -1).reshape(-1, 3)
    soup = trimesh.Trimesh(triangles[:-1].reshape(-1, 3), np.arange(3 * len(triangles) - 3).reshape(-1, 3))
    reference = np.minimum(closest_point_naive(soup, corners.astype(np.float64))[1], _segment_distance(corners))
    found = values.reshape(-1).sqrt().numpy()
    near = reference <= reach
    assert 1000 < near.sum() < len(corners) - 1000
    # float32 arithmetic on coordinates of a few cells relative to each face's box: ~1e-6 cells
    np.testing.assert_allclose(found[near], reference[near], atol=1e-5)
    assert (found[~near] >= reach * (1 - 1e-6)).all()


def _segment_distance(points: np.ndarray) -> np.ndarray:
    """Distance to the segment (3, 3, 3)-(9, 9, 9) of the degenerate face above."""
    t = np.clip(((points - 3) @ np.full(3, 6.0)) / 108, 0, 1)
    return np.linalg.norm(points - 3 - t[:, None] * 6, axis=1)


@pytest.mark.parametrize("shape", ["sphere", "torus", "plate"])
def test_remesh_is_closed_single_shell_near_the_offset_surface(shape):
    source = {"sphere": trimesh.creation.icosphere(subdivisions=3, radius=0.3), "torus": _torus(), "plate": plate()}
    mesh = source[shape]
    result = remesh_narrow_band(*_tensors(mesh), RESOLUTION)
    vertices, faces = result.vertices.double().numpy(), result.faces.numpy()
    remeshed = trimesh.Trimesh(vertices, faces, process=False)
    assert (_edge_use_counts(faces) == 2).all()  # closed: every edge has exactly two faces
    assert remeshed.is_winding_consistent and remeshed.volume > 0  # wound outwards
    assert len(trimesh.graph.connected_components(remeshed.face_adjacency, nodes=np.arange(len(faces)))) == 1
    epsilon = result.stats["epsilon"]
    assert epsilon == pytest.approx(VOXEL * (RESOLUTION + 3) / RESOLUTION)  # upstream's band: one of its cells

    # Vertices and face centres sit on the surface at ε from the input, within one voxel (both directions below).
    samples = np.concatenate([vertices, remeshed.triangles_center])
    _, distance, _ = closest_point_naive(mesh, samples)
    assert np.abs(distance - epsilon).max() < VOXEL
    if shape == "plate":  # offset points above and below the sheet's interior must be near the remesh
        inner = mesh.vertices[np.abs(mesh.vertices[:, :2]).max(axis=1) < 0.29]
        up = np.array([0.0, 0.0, epsilon])
        targets = np.concatenate([inner + up, inner - up])
    else:
        assert _offset_error(shape, samples, epsilon).max() < VOXEL
        targets = trimesh.Trimesh(mesh.vertices, mesh.faces).vertices  # pushed out by ε along the normals:
        targets = targets + epsilon * trimesh.Trimesh(mesh.vertices, mesh.faces).vertex_normals
    _, coverage, _ = closest_point_naive(remeshed, targets)
    assert coverage.max() < VOXEL


def test_inner_shell_is_the_bands_cavity_wall():
    """Upstream keeps both walls of the band; the inner one faces inwards at r - ε and is dropped by default."""
    mesh = trimesh.creation.icosphere(subdivisions=3, radius=0.3)
    both = remesh_narrow_band(*_tensors(mesh), RESOLUTION, remove_inner_shells=False)
    assert both.stats["shells"] == 2 and both.stats["inner_shells"] == 1
    remeshed = trimesh.Trimesh(both.vertices.double().numpy(), both.faces.numpy(), process=False)
    shells = remeshed.split(only_watertight=True)
    assert len(shells) == 2
    inner = min(shells, key=lambda shell: np.linalg.norm(shell.vertices, axis=1).mean())
    epsilon = both.stats["epsilon"]
    assert inner.volume < 0 and np.abs(np.linalg.norm(inner.vertices, axis=1) - (0.3 - epsilon)).max() < VOXEL
    outer_only = remesh_narrow_band(*_tensors(mesh), RESOLUTION)
    assert len(outer_only.faces) == len(both.faces) - len(inner.faces)


@pytest.mark.parametrize("shape", ["sphere", "plate"])
def test_projection_moves_vertices_onto_the_input(shape):
    mesh = trimesh.creation.icosphere(subdivisions=3, radius=0.3) if shape == "sphere" else plate()
    projected = remesh_narrow_band(*_tensors(mesh), RESOLUTION, project_back=1.0)
    assert projected.stats["faces"] == len(remesh_narrow_band(*_tensors(mesh), RESOLUTION).faces)  # shells kept
    _, distance, _ = closest_point_naive(mesh, projected.vertices.double().numpy())
    assert distance.max() < 1e-5  # float32 positions on the input's faces
    assert (_edge_use_counts(projected.faces.numpy()) == 2).all()  # projection moves vertices, not the topology
    if shape == "plate":  # both sides of the sheet's shell land on the sheet
        return
    half = remesh_narrow_band(*_tensors(mesh), RESOLUTION, project_back=0.5)
    _, distance, _ = closest_point_naive(mesh, half.vertices.double().numpy())
    assert np.abs(distance - half.stats["epsilon"] / 2).max() < VOXEL / 2


@pytest.mark.parametrize(("band", "project"), [(0.0, 0.0), (5.0, 0.0), (math.nan, 0.0), (1.0, -0.1), (1.0, 2.0)])
def test_bad_remesh_options_are_refused(band, project):
    mesh = trimesh.creation.icosphere(subdivisions=1, radius=0.3)
    with pytest.raises(ValueError, match=r"remesh (band|projection) must be in \["):
        remesh_narrow_band(*_tensors(mesh), RESOLUTION, band=band, project_back=project)


def test_to_glb_remeshes_within_the_face_budget():
    """The export's remesh path (upstream's examples' default): a closed single-sided surface, simplified to the
    budget, textured."""
    resolution = 24
    sphere = trimesh.creation.icosphere(subdivisions=3, radius=0.3)
    grid = torch.stack(torch.meshgrid(*[torch.arange(resolution)] * 3, indexing="ij"), -1).reshape(-1, 3)
    centres = (grid + 0.5) / resolution - 0.5
    coords = grid[(centres.norm(dim=1) - 0.3).abs() < 3 / resolution]
    attrs = torch.full((len(coords), 6), 0.5)
    exported = to_glb(
        *_tensors(sphere), attrs, coords.int(), resolution, decimation_target=500, texture_size=64, remesh=True
    )
    assert list(exported.stages_ms)[:3] == ["fill_holes", "remesh", "simplify"]
    stats = exported.stats
    assert stats["remesh"] and stats["remesh_shells"] == 2 and stats["remesh_inner_shells"] == 1
    assert stats["simplified_faces"] <= 500 < stats["remesh_faces"]
    welded = trimesh.Trimesh(exported.mesh.vertices, exported.mesh.faces)  # merges the UV-seam copies
    assert welded.is_watertight and welded.is_winding_consistent and len(welded.split(only_watertight=False)) == 1
    assert not exported.mesh.visual.material.doubleSided


def test_simplified_remesh_is_closed_where_the_remesh_had_four_face_edges():
    """Dual contouring leaves an edge with 4 faces where a grid face's signs alternate (a noisy sphere at 96³ has
    6; the simplification alone keeps 2 of them); ``simplify_remeshed`` does not clean before simplifying, so its
    one clean-up after the simplification must still give a closed, consistently wound single shell at about the
    budget (the clean-up's hole filling closes what splitting those edges opens: at 96³ they are short enough)."""
    sphere = trimesh.creation.icosphere(subdivisions=5, radius=0.3)
    vertices = torch.tensor(sphere.vertices, dtype=torch.float32)
    vertices = vertices * (1 + 0.005 * torch.randn(len(vertices), 1, generator=torch.Generator().manual_seed(0)))
    remeshed = remesh_narrow_band(vertices, torch.tensor(sphere.faces), 96)
    assert (_edge_use_counts(remeshed.faces.numpy()) == 4).any()  # the case this test is about
    target = len(remeshed.faces) // 3
    new_vertices, new_faces = mesh_repair.simplify_remeshed(remeshed.vertices, remeshed.faces, target)
    result = trimesh.Trimesh(new_vertices.double().numpy(), new_faces.numpy(), process=False)
    assert (_edge_use_counts(new_faces.numpy()) == 2).all()
    assert result.is_winding_consistent and result.volume > 0
    assert len(trimesh.graph.connected_components(result.face_adjacency, nodes=np.arange(len(new_faces)))) == 1
    assert len(new_faces) <= 1.01 * target  # the repair's hole fans may add a few faces, as upstream's clean-up


def test_bounded_snap_bakes_the_same_texels():
    """With ``snap_distance`` the bake's snap searches near first and everywhere only for the rest: same answer."""
    sphere = trimesh.creation.icosphere(subdivisions=3, radius=0.3)
    offset = trimesh.creation.icosphere(subdivisions=2, radius=0.3 + 1.5 * VOXEL)  # like a remeshed surface
    uv_mesh = unwrap_uv(*_tensors(offset), 64)
    grid = torch.stack(torch.meshgrid(*[torch.arange(RESOLUTION)] * 3, indexing="ij"), -1).reshape(-1, 3)
    attrs = ((grid + 0.5) / RESOLUTION).repeat(1, 2)
    args = (uv_mesh, tuple(_tensors(sphere)), Voxels(grid, attrs, VOXEL, (-0.5,) * 3), 64)
    unbounded, covered = sample_texture_attributes(*args)
    probes = torch.tensor(np.concatenate([offset.vertices, offset.triangles_center]), dtype=torch.float32)
    near = closest_points_within(probes, *_tensors(sphere), 1.45 * VOXEL).face_ids >= 0
    assert near.any() and not near.all()  # at 1.45 voxels the texels split into found nearby / by the fallback
    for snap_distance in (3 * VOXEL, 1.45 * VOXEL):
        bounded, same_coverage = sample_texture_attributes(*args, snap_distance=snap_distance)
        assert torch.equal(covered, same_coverage) and covered.any()
        # the two searches may settle a near-tie differently: closest points whose distances (about 0.07) agree to
        # float32 rounding (3e-8) can lie sqrt(2 · 0.07 · 3e-8) ≈ 7e-5 apart on the surface, and the attributes
        # are the position (slope 1); every other texel is the same to float32 rounding
        torch.testing.assert_close(bounded, unbounded, rtol=0, atol=1e-4)
        assert ((bounded - unbounded).abs().amax(dim=-1) > 1e-6).float().mean() < 0.001


@pytest.mark.parametrize("shape", ["sphere", "torus", "plate"])
def test_quad_pieces_are_the_triangle_pieces(shape):
    """The inner shells are found on the quads (half the faces); labels must be the triangles' own."""
    source = {"sphere": trimesh.creation.icosphere(subdivisions=3, radius=0.3), "torus": _torus(), "plate": plate()}
    vertices, faces = _tensors(source[shape])
    triangles = ((vertices + 0.5) * RESOLUTION)[faces]  # the box is [-0.5, 0.5]^3: no margin needed here
    slabs = [
        remesh._crossing_cells(origin, squared, 1.0) for origin, squared in squared_distance_slabs(triangles, 24, 2.01)
    ]
    cells, values = torch.cat([c for c, _ in slabs]), torch.cat([v for _, v in slabs])
    quads = remesh._quads(cells, values, build_voxel_index(cells), slice(None))
    split = remesh._split_quads(remesh._dual_vertices(cells, values), quads)

    labels = remesh._quad_components(quads)

    assert torch.equal(labels, mesh_repair.connected_components(split))
    assert int(labels.max()) + 1 == (1 if shape == "plate" else 2)  # a closed shape's band has two walls
