"""The closest-point search (``trellis2_npu.closest_points``) against trimesh's point-triangle routine applied to every
face (the bounded search, :func:`closest_points_within`, is tested with the remesh that uses it: test_remesh.py)."""

from __future__ import annotations

import numpy as np
import torch
import trimesh

from trellis2_npu.closest_points import closest_points_on_mesh

from .test_texture_bake import RADIUS, noisy_sphere


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

    triangles = vertices[faces].double().numpy()
    candidates = trimesh.triangles.closest_point(
        np.repeat(triangles[None], len(points), axis=0).reshape(-1, 3, 3),
        np.repeat(points.double().numpy(), len(faces), axis=0),
    ).reshape(len(points), len(faces), 3)
    distances = np.linalg.norm(candidates - points.double().numpy()[:, None], axis=2)
    np.testing.assert_allclose(result.distances.numpy(), distances.min(axis=1), rtol=0, atol=2e-6)
    np.testing.assert_allclose(
        result.distances.numpy(), distances[np.arange(len(points)), result.face_ids.numpy()], rtol=0, atol=2e-6
    )
    np.testing.assert_allclose((result.points - points).norm(dim=1).numpy(), result.distances.numpy(), atol=1e-6)
