"""Mesh → flexible dual grid (:mod:`trellis2_npu.geometry.voxelize`) against independent references, without upstream.

o-voxel's own function needs its CUDA extension built, so the references here are geometric: a brute-force
line-triangle intersection for the occupied voxels and flags, random points for the constrained QEF minimum, and the
decoder's inverse (:func:`trellis2_npu.geometry.dual_grid.flexible_dual_grid_to_mesh`) for the round trip.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
import trimesh

from trellis2_npu.geometry.dual_grid import flexible_dual_grid_to_mesh
from trellis2_npu.geometry.voxelize import _box_overlaps_triangle, mesh_to_flexible_dual_grid, solve_in_box

BOX = [[-0.5, -0.5, -0.5], [0.5, 0.5, 0.5]]
UPSTREAM_WEIGHTS = {"face_weight": 1.0, "boundary_weight": 0.2, "regularization_weight": 1e-2}  # encode_shape_slat's


def _sphere(radius: float = 0.3, subdivisions: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    mesh = trimesh.creation.icosphere(subdivisions=subdivisions, radius=radius)
    return torch.tensor(mesh.vertices, dtype=torch.float32), torch.tensor(mesh.faces)


def _cross(u: np.ndarray, v: np.ndarray) -> float:
    return float(u[0] * v[1] - u[1] * v[0])


def _brute_force_crossings(vertices: np.ndarray, faces: np.ndarray, resolution: int):
    """Occupied voxels and flags by testing every grid line (through voxel corners) against every triangle."""
    size = 1.0 / resolution
    voxels, flags = set(), set()
    corners = np.arange(1, resolution) * size
    for triangle in vertices[faces] + 0.5:
        for axis in range(3):
            a, b = (axis + 1) % 3, (axis + 2) % 3
            p0, p1, p2 = triangle[:, [a, b]]
            area = _cross(p1 - p0, p2 - p0)
            if area == 0:
                continue
            for ia, ib in itertools.product(range(len(corners)), repeat=2):
                q = np.array([corners[ia], corners[ib]])
                w1, w2 = _cross(q - p0, p2 - p0) / area, _cross(p1 - p0, q - p0) / area
                if min(w1, w2, 1 - w1 - w2) < 0:
                    continue
                depth = int(np.floor((triangle[0, axis] + w1 * (triangle[1, axis] - triangle[0, axis])
                                      + w2 * (triangle[2, axis] - triangle[0, axis])) / size))  # fmt: skip
                for da, db in itertools.product((0, 1), repeat=2):
                    voxel = [0, 0, 0]
                    voxel[a], voxel[b], voxel[axis] = ia + da, ib + db, depth
                    voxels.add(tuple(voxel))
                    if da == db == 0:
                        flags.add((tuple(voxel), axis))
    return voxels, flags


def test_occupied_voxels_and_flags_match_a_brute_force_line_test():
    """Random triangles in general position (no grid line through an edge): upstream's scan line finds exactly the
    grid lines whose projection lies inside each triangle."""
    rng = np.random.default_rng(0)
    vertices = rng.uniform(-0.4, 0.4, size=(12, 3))
    faces = np.arange(12).reshape(4, 3)
    coords, _, intersected = mesh_to_flexible_dual_grid(
        torch.tensor(vertices, dtype=torch.float32), torch.tensor(faces), grid_size=16, aabb=BOX, **UPSTREAM_WEIGHTS
    )
    voxels, flags = _brute_force_crossings(vertices.astype(np.float32).astype(np.float64), faces, 16)
    assert {tuple(c) for c in coords.tolist()} == voxels
    found = {(tuple(c), axis) for c, row in zip(coords.tolist(), intersected.tolist(), strict=True)
             for axis in range(3) if row[axis]}  # fmt: skip
    assert found == flags


def test_planar_patch_puts_every_dual_vertex_on_its_plane():
    """Every quadric (crossing, face, boundary) of a flat patch vanishes on its plane, so the constrained minimum lies
    on it; only lines along z cross a horizontal patch. float32 positions: 1e-6 of the unit box."""
    z = 0.1234
    vertices = torch.tensor([[-0.3, -0.2, z], [0.25, -0.3, z], [0.3, 0.3, z], [-0.2, 0.25, z]])
    faces = torch.tensor([[0, 1, 2], [0, 2, 3]])
    coords, dual, intersected = mesh_to_flexible_dual_grid(vertices, faces, grid_size=32, aabb=BOX, **UPSTREAM_WEIGHTS)
    assert len(coords) > 0
    assert torch.allclose(dual[:, 2] - 0.5, torch.full_like(dual[:, 2], z), atol=1e-6)
    assert intersected[:, 2].any() and not intersected[:, :2].any()


@pytest.mark.parametrize("resolution", [16, 32])
def test_closed_sphere_round_trips_through_the_decoder_inverse(resolution: int):
    """Voxelise, then rebuild the surface as the shape decoder does: a closed surface (every edge in two faces) whose
    vertices sit on the input mesh to a small fraction of a voxel (the 1e-2 regularisation pulls them off the planes
    by much less than that)."""
    from trellis2_npu.geometry.closest_points import closest_points_on_mesh

    vertices, faces = _sphere()
    coords, dual, intersected = mesh_to_flexible_dual_grid(
        vertices, faces, grid_size=resolution, aabb=BOX, **UPSTREAM_WEIGHTS
    )
    voxel = 1.0 / resolution
    assert (dual >= coords * voxel - 1e-6).all() and (dual <= (coords + 1) * voxel + 1e-6).all()
    mesh_vertices, mesh_faces = flexible_dual_grid_to_mesh(
        coords, dual * resolution - coords, intersected, None, aabb=BOX, grid_size=resolution
    )
    edges = torch.cat([mesh_faces[:, [k, (k + 1) % 3]] for k in range(3)]).sort(dim=1).values
    _, uses = torch.unique(edges, dim=0, return_counts=True)
    assert len(mesh_faces) > 0 and (uses == 2).all()
    distance = (closest_points_on_mesh(mesh_vertices, vertices, faces).points - mesh_vertices).norm(dim=1)
    assert distance.max() < 0.1 * voxel


def test_boundary_edges_pull_dual_vertices_onto_the_rim():
    """An open patch bent along a crease: raising the boundary weight moves the rim voxels' vertices closer to the
    boundary lines (what the boundary quadric measures)."""
    vertices = torch.tensor([[-0.3, -0.3, 0.0], [0.3, -0.3, 0.0], [0.3, 0.3, 0.2], [-0.3, 0.3, 0.2]])
    faces = torch.tensor([[0, 1, 2], [0, 2, 3]])
    rim = vertices[[0, 1, 2, 3, 0]] + 0.5

    def rim_distance(weight: float) -> float:
        _, dual, _ = mesh_to_flexible_dual_grid(
            vertices, faces, grid_size=16, aabb=BOX, face_weight=1.0, boundary_weight=weight, regularization_weight=0.5
        )
        starts, ends = rim[:-1], rim[1:]
        direction = (ends - starts) / (ends - starts).norm(dim=1, keepdim=True)
        offset = dual[:, None] - starts[None]
        along = (offset * direction[None]).sum(dim=2, keepdim=True)
        distances = (offset - along * direction[None]).norm(dim=2).min(dim=1).values
        near = distances < 1.0 / 16
        return float(distances[near].mean())

    assert rim_distance(10.0) < 0.5 * rim_distance(0.0)


def test_box_constrained_minimum_beats_random_points_in_the_box():
    """The constrained minimiser of random positive semi-definite quadrics is no worse than 4000 random points of
    the box (float64 sums: 1e-9 relative slack)."""
    generator = torch.Generator().manual_seed(0)
    count = 64
    planes = torch.randn(count, 5, 4, generator=generator, dtype=torch.float64)
    quadrics = planes.transpose(1, 2) @ planes
    lower = torch.rand(count, 3, generator=generator, dtype=torch.float64)
    upper = lower + 0.1
    best = solve_in_box(quadrics, lower, upper)
    assert ((best >= lower - 1e-12) & (best <= upper + 1e-12)).all()

    def error(points):
        homogeneous = torch.cat((points, torch.ones_like(points[..., :1])), dim=-1)
        return torch.einsum("mki,mij,mkj->mk", homogeneous, quadrics, homogeneous)

    samples = lower[:, None] + torch.rand(count, 4000, 3, generator=generator, dtype=torch.float64) * 0.1
    ours = error(best[:, None])[:, 0]
    assert (ours <= error(samples).min(dim=1).values * (1 + 1e-9) + 1e-12).all()


def test_box_triangle_test_has_no_false_negatives():
    """Every voxel holding a sampled point of the triangle is reported as overlapped (a sampled point inside the box
    is an overlap whatever the test)."""
    rng = np.random.default_rng(1)
    size = torch.full((3,), 1.0 / 16)
    for _ in range(20):
        triangle = torch.tensor(rng.uniform(0.2, 0.8, size=(3, 3)), dtype=torch.float32)
        weights = rng.dirichlet([1, 1, 1], size=2000)
        points = torch.tensor(weights, dtype=torch.float32) @ triangle
        voxels = torch.unique(torch.floor(points / size).long(), dim=0)
        normal = torch.nn.functional.normalize(
            torch.linalg.cross(triangle[1] - triangle[0], triangle[2] - triangle[1]), dim=0
        )
        keep = _box_overlaps_triangle(voxels, size, triangle.expand(len(voxels), 3, 3), normal.expand(len(voxels), 3))
        assert keep.all()
