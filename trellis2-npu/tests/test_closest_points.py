"""The closest-point search (``trellis2_npu.geometry.closest_points``) against trimesh's point-triangle routine applied
to every
face (the bounded search, :func:`closest_points_within`, is also tested with the remesh that uses it)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import trimesh

from trellis2_npu.geometry import closest_points, closest_points_cpu
from trellis2_npu.geometry.closest_points import closest_points_on_mesh, closest_points_within

from .test_texture_bake import RADIUS, noisy_sphere


def _brute_force_distances(points: torch.Tensor, vertices: torch.Tensor, faces: torch.Tensor) -> np.ndarray:
    """``[P, F]`` distance from every point to every face (trimesh, float64)."""
    triangles = vertices[faces].double().numpy()
    candidates = trimesh.triangles.closest_point(
        np.repeat(triangles[None], len(points), axis=0).reshape(-1, 3, 3),
        np.repeat(points.double().numpy(), len(faces), axis=0),
    ).reshape(len(points), len(faces), 3)
    return np.linalg.norm(candidates - points.double().numpy()[:, None], axis=2)


def test_closest_points_within_lists_wide_faces():
    """A fine sphere plus a few faces far wider than the rest (wider than the grid's cells and than the faces' usual
    box, which each face is listed by): every point within reach finds its exact closest face, wide ones included,
    whatever the grid's cell size; the others are reported out of reach."""
    vertices, faces = noisy_sphere(2, noise=0.05)
    wide = torch.tensor([[-0.6, -0.6, 0.0], [0.6, -0.5, 0.05], [0.0, 0.7, -0.05], [0.1, 0.1, 0.6]])
    vertices = torch.cat([vertices, wide])
    n = len(vertices) - 4
    faces = torch.cat([faces, torch.tensor([[n, n + 1, n + 2], [n, n + 1, n + 3]])])
    generator = torch.Generator().manual_seed(1)
    points = torch.rand(800, 3, generator=generator) * 1.6 - 0.8
    reference = _brute_force_distances(points, vertices, faces).min(axis=1)
    max_distance = 0.12
    near = reference <= max_distance
    assert 100 < near.sum() < 700  # both kinds of points are tested
    for cell_size in (None, 0.02, 0.3):  # cells smaller and larger than the faces and the reach
        found = closest_points_within(points, vertices, faces, max_distance, cell_size=cell_size, pairs_per_chunk=999)
        # float32 points and vertices: the distances agree to a few float32 roundings of values below 1
        np.testing.assert_allclose(found.distances.numpy()[near], reference[near], rtol=0, atol=2e-6)
        assert np.isinf(found.distances.numpy()[~near]).all() and (found.face_ids.numpy()[~near] == -1).all()
        assert (found.face_ids.numpy()[near] >= len(faces) - 2).sum() > 20  # the wide faces are found


def test_closest_points_on_mesh_matches_brute_force():
    vertices, faces = noisy_sphere(2, noise=0.05)
    generator = torch.Generator().manual_seed(0)
    directions = torch.nn.functional.normalize(torch.randn(600, 3, generator=generator), dim=1)
    radii = torch.cat(
        [
            RADIUS + 0.002 * torch.randn(400, generator=generator),
            torch.rand(150, generator=generator),
            2 + 3 * torch.rand(50, generator=generator),
        ]
    )  # on, near and far from the surface
    points = directions * radii[:, None]
    result = closest_points_on_mesh(points, vertices, faces, pairs_per_chunk=1000)

    distances = _brute_force_distances(points, vertices, faces)
    np.testing.assert_allclose(result.distances.numpy(), distances.min(axis=1), rtol=0, atol=2e-6)
    np.testing.assert_allclose(
        result.distances.numpy(), distances[np.arange(len(points)), result.face_ids.numpy()], rtol=0, atol=2e-6
    )
    np.testing.assert_allclose((result.points - points).norm(dim=1).numpy(), result.distances.numpy(), atol=1e-6)


@pytest.mark.parametrize("points_per_piece", [1, 3, 8])
def test_closest_points_within_equals_the_unbounded_search_near_a_surface(monkeypatch, points_per_piece):
    """The bake's case: many points per grid cell, 0 to 1.5 mean edges off a noisy sphere. The bounded search (one
    broadcast per piece of a cell's points, a first pass at a shorter distance) finds the same closest points as
    the unbounded search, whatever the pieces, the chunks and the first pass (also one that resolves few points,
    and one at the full distance: a single pass)."""
    monkeypatch.setattr(closest_points, "POINTS_PER_PIECE", points_per_piece)
    vertices, faces = noisy_sphere(4, noise=0.01)
    edge = (vertices[faces[:, 0]] - vertices[faces[:, 1]]).norm(dim=1).mean().item()
    generator = torch.Generator().manual_seed(2)
    directions = torch.nn.functional.normalize(torch.randn(3000, 3, generator=generator), dim=1)
    points = directions * (RADIUS + 1.5 * edge * torch.rand(3000, 1, generator=generator))
    reference = closest_points_on_mesh(points, vertices, faces)
    max_distance = 1.75 * edge
    for first_distance, chunk in ((None, 1 << 20), (0.3 * edge, 5000), (max_distance, 999)):
        found = closest_points_within(
            points, vertices, faces, max_distance, pairs_per_chunk=chunk, first_distance=first_distance
        )
        assert (found.face_ids >= 0).all()
        # two searches over float32 data: the distances agree to a few roundings of values below 1
        np.testing.assert_allclose(found.distances.numpy(), reference.distances.numpy(), rtol=0, atol=2e-6)
        np.testing.assert_allclose((found.points - points).norm(dim=1).numpy(), found.distances.numpy(), atol=1e-6)
        # and so do the points, but for the few queries two places of the bumpy mesh are as close to (faces that
        # share the closest place tie too, so face ids are not compared)
        moved = (found.points - reference.points).abs().amax(dim=1) > 1e-5
        assert moved.float().mean() < 0.005


@pytest.mark.parametrize("cell_fraction", [0.2, 1.5, 5.0], ids=["small-cells", "default", "large-cells"])
def test_the_compiled_cpu_search_matches_brute_force(monkeypatch, cell_fraction):
    """``closest_points_within_cpu`` (numba) on the wide-faces case above: each point within reach gets its exact
    closest distance and a face at that distance, wide faces included, whatever the grid's cells; the others are
    out of reach (face -1, distance inf, the point itself)."""
    monkeypatch.setattr(closest_points_cpu, "CELL_FRACTION", cell_fraction)
    vertices, faces = noisy_sphere(2, noise=0.05)
    wide = torch.tensor([[-0.6, -0.6, 0.0], [0.6, -0.5, 0.05], [0.0, 0.7, -0.05], [0.1, 0.1, 0.6]])
    vertices = torch.cat([vertices, wide])
    n = len(vertices) - 4
    faces = torch.cat([faces, torch.tensor([[n, n + 1, n + 2], [n, n + 1, n + 3]])])
    points = torch.rand(800, 3, generator=torch.Generator().manual_seed(1)) * 1.6 - 0.8
    distances = _brute_force_distances(points, vertices, faces)
    reference, max_distance = distances.min(axis=1), 0.12
    near = reference <= max_distance
    found = closest_points_cpu.closest_points_within_cpu(points, vertices, faces, max_distance)
    # float32 points and vertices: the distances agree to a few float32 roundings of values below 1
    np.testing.assert_allclose(found.distances.numpy()[near], reference[near], rtol=0, atol=2e-6)
    faces_found = found.face_ids.numpy()[near]
    np.testing.assert_allclose(distances[near.nonzero()[0], faces_found], reference[near], rtol=0, atol=2e-6)
    assert (faces_found >= len(faces) - 2).sum() > 20  # the wide faces are found
    assert np.isinf(found.distances.numpy()[~near]).all() and (found.face_ids.numpy()[~near] == -1).all()
    assert torch.equal(found.points[~torch.from_numpy(near)], points[~torch.from_numpy(near)])


def test_the_compiled_cpu_search_equals_the_torch_one_near_a_surface():
    """The bake's case (many points per cell, 0 to 1.5 mean edges off a noisy sphere): the compiled search and the
    torch one find the same distances and, but for near-ties between two places of the bumpy mesh, the same points."""
    vertices, faces = noisy_sphere(4, noise=0.01)
    edge = (vertices[faces[:, 0]] - vertices[faces[:, 1]]).norm(dim=1).mean().item()
    generator = torch.Generator().manual_seed(2)
    directions = torch.nn.functional.normalize(torch.randn(3000, 3, generator=generator), dim=1)
    points = directions * (RADIUS + 1.5 * edge * torch.rand(3000, 1, generator=generator))
    reference = closest_points_within(points, vertices, faces, 1.75 * edge)
    found = closest_points_cpu.closest_points_within_cpu(points, vertices, faces, 1.75 * edge)
    assert (found.face_ids >= 0).all()
    # two searches over float32 data: the distances agree to a few roundings of values below 1
    np.testing.assert_allclose(found.distances.numpy(), reference.distances.numpy(), rtol=0, atol=2e-6)
    np.testing.assert_allclose((found.points - points).norm(dim=1).numpy(), found.distances.numpy(), atol=1e-6)
    moved = (found.points - reference.points).abs().amax(dim=1) > 1e-5
    assert moved.float().mean() < 0.005


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16])
def test_the_compiled_cpu_search_takes_float32_only(dtype):
    vertices, faces = noisy_sphere(1, noise=0.0)
    with pytest.raises(ValueError, match="float32 CPU tensors"):
        closest_points_cpu.closest_points_within_cpu(vertices.to(dtype), vertices.to(dtype), faces, 0.1)
