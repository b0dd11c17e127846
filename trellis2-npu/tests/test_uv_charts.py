from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import trimesh

from trellis2_npu.geometry import mesh_repair, uv_charts
from trellis2_npu.geometry.uv_charts import (
    chart_groups,
    chart_pieces,
    dominant_normal_axis,
    flatten_pieces,
    folded_pieces,
    refined_pieces,
    speckle_merged_axes,
    split_into_groups,
    xatlas_charts,
)


def _strip(turns: float, steps_per_turn: int = 23, rise: float = 0.01) -> tuple[torch.Tensor, torch.Tensor]:
    """A strip winding ``turns`` times around the z axis, 0.5 wide, its radii growing 0.2 a turn (so that a second
    turn's edges cross the first's instead of lying on them) and rising ``rise`` a turn; faces counter-clockwise seen
    from +z. 23 steps a turn: no vertex of one turn lies exactly on an edge of another (that would only touch)."""
    steps = round(turns * steps_per_turn)
    angle = torch.linspace(0, 2 * math.pi * turns, steps + 1, dtype=torch.float64)
    growth = 0.2 * angle / (2 * math.pi)
    rings = [
        torch.stack([(r + growth) * angle.cos(), (r + growth) * angle.sin(), rise * growth / 0.2], 1)
        for r in (0.5, 1.0)
    ]
    vertices = torch.cat(rings).float()  # inner ring 0..steps, outer ring steps+1..
    inner, outer = torch.arange(steps), torch.arange(steps) + steps + 1
    faces = torch.cat([torch.stack([inner, outer, outer + 1], 1), torch.stack([inner, outer + 1, inner + 1], 1)])
    return vertices, faces


def _one_piece(faces: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return faces, torch.zeros(len(faces), dtype=torch.long)


@pytest.mark.parametrize(("turns", "folds"), [(0.75, False), (1.5, True)])
def test_a_strip_folds_when_it_winds_over_itself(turns, folds):
    vertices, faces = _strip(turns)
    assert folded_pieces(vertices[:, :2], *_one_piece(faces), 1).tolist() == [folds]


@pytest.mark.parametrize(("turns", "folds"), [(1, False), (2, True)])
def test_a_closed_fan_folds_when_it_turns_twice_around_its_centre(turns, folds):
    """The second turn lies exactly on the first, so no boundary edge crosses another (they coincide): only the
    centre tells, its faces turning 4π around it."""
    count = 9 * turns
    angle = torch.arange(count) % 9 * 2 * math.pi / 9
    uvs = torch.cat([torch.zeros(1, 2), torch.stack([angle.cos(), angle.sin()], 1)])
    rim = torch.arange(count) + 1
    faces = torch.stack([torch.zeros(count, dtype=torch.long), rim, rim % count + 1], 1)
    assert folded_pieces(uvs, *_one_piece(faces), 1).tolist() == [folds]


def test_pieces_are_told_apart():
    """Two pieces in one call: only the folded one is reported."""
    flat_vertices, flat_faces = _strip(0.75)
    wound_vertices, wound_faces = _strip(1.5)
    uvs = torch.cat([flat_vertices, wound_vertices])[:, :2]
    faces = torch.cat([flat_faces, wound_faces + len(flat_vertices)])
    piece = torch.cat([torch.zeros(len(flat_faces)), torch.ones(len(wound_faces))]).long()
    assert folded_pieces(uvs, faces, piece, 2).tolist() == [False, True]


def test_a_flat_piece_is_flattened_without_distortion_and_keeps_its_winding():
    """A tilted plane projected onto its own plane: every UV edge is its 3D edge (times the UV scale)."""
    vertices, faces = _strip(0.75, rise=0.0)
    tilt = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.8, 0.6], [0.0, -0.6, 0.8]])  # a rotation about x
    vertices = vertices @ tilt.T
    pieces = split_into_groups(faces, torch.zeros(len(faces), dtype=torch.long), len(vertices))
    flat = flatten_pieces(vertices, pieces._replace(axis=dominant_normal_axis(vertices, faces)[:1]))
    global_faces = pieces.faces  # one piece: local indices are global
    positions = vertices[pieces.vertices]
    uv_edges = (flat.uvs[global_faces.roll(-1, 1)] - flat.uvs[global_faces]).norm(dim=2)
    edges = (positions[global_faces.roll(-1, 1)] - positions[global_faces]).norm(dim=2)
    torch.testing.assert_close(uv_edges, edges * flat.uv_scale, rtol=1e-5, atol=1e-5)  # float32 dot products
    corners = flat.uvs[global_faces]
    ab, ac = corners[:, 1] - corners[:, 0], corners[:, 2] - corners[:, 0]
    assert (ab[:, 0] * ac[:, 1] - ab[:, 1] * ac[:, 0] > 0).all()
    assert not flat.folded.any()


def test_pieces_are_connected_and_within_one_group():
    sphere = trimesh.creation.icosphere(subdivisions=3, radius=0.4)
    vertices, faces = torch.tensor(sphere.vertices, dtype=torch.float32), torch.tensor(sphere.faces)
    pieces = chart_pieces(vertices, faces)
    assert sum(stop - start for start, stop in pieces.face_bounds) == len(faces)
    group_of = {
        tuple(sorted(face)): group
        for face, group in zip(faces.tolist(), chart_groups(vertices, faces).tolist(), strict=True)
    }
    for (f0, f1), (v0, v1) in zip(pieces.face_bounds, pieces.vertex_bounds, strict=True):
        local = pieces.faces[f0:f1]
        assert mesh_repair.connected_components(local).max() == 0  # one piece
        groups = {group_of[tuple(sorted(face))] for face in pieces.vertices[v0 + local].tolist()}
        assert len(groups) == 1  # of one group
        assert torch.equal(torch.unique(local), torch.arange(v1 - v0))  # its own vertices, all used
    # every input face once, as its own vertices
    as_input = sorted(
        tuple(sorted(face))
        for (f0, f1), (v0, _) in zip(pieces.face_bounds, pieces.vertex_bounds, strict=True)
        for face in pieces.vertices[v0 + pieces.faces[f0:f1]].tolist()
    )
    assert as_input == sorted(tuple(sorted(face)) for face in faces.tolist())


def test_xatlas_charts_of_a_mesh_xatlas_leaves_out_whole_are_zero_not_nan():
    """One face of 5e-11 in area, under xatlas' FLT_EPSILON: no chart, an empty atlas whose UVs xatlas divides by
    its zero width (NaN, seen); the face comes back with zero UVs."""
    positions = np.array([[0, 0, 0], [1e-5, 0, 0], [0, 1e-5, 0]], dtype=np.float32)
    vmapping, faces, uvs = xatlas_charts(positions, np.array([[0, 1, 2]], dtype=np.uint32))
    assert vmapping.tolist() == [0, 1, 2] and faces.tolist() == [[0, 1, 2]]
    assert np.isfinite(uvs).all() and not uvs.any()


def test_speckle_where_two_axes_meet_is_merged_within_78_degrees():
    """A noisy sphere: the dominant axis speckles along the 45° seams; merged, the small axis regions are down to a
    third or fewer (a 1 % noise leaves some whose neighbours all lean too far), no face is further than 78° from its
    axis (so its projection keeps its winding)."""
    sphere = trimesh.creation.icosphere(subdivisions=5, radius=0.4)
    noise = torch.randn(len(sphere.vertices), 1, generator=torch.Generator().manual_seed(0))
    vertices = torch.tensor(sphere.vertices, dtype=torch.float32) * (1 + 0.01 * noise)
    faces = torch.tensor(sphere.faces)

    def small_regions(axis: torch.Tensor) -> int:
        grouped = split_into_groups(faces, axis, len(vertices))
        offsets = torch.tensor([start for start, _ in grouped.vertex_bounds])
        counts = torch.tensor([stop - start for start, stop in grouped.face_bounds])
        global_faces = grouped.faces + offsets.repeat_interleave(counts)[:, None]
        return int((torch.bincount(mesh_repair.connected_components(global_faces)) <= 3).sum())

    dominant, merged = dominant_normal_axis(vertices, faces), speckle_merged_axes(vertices, faces)
    assert small_regions(dominant) > 100 and small_regions(merged) < small_regions(dominant) / 3
    corners = vertices[faces]
    normals = torch.nn.functional.normalize(
        torch.linalg.cross(corners[:, 1] - corners[:, 0], corners[:, 2] - corners[:, 0])
    )
    directions = torch.tensor([[1.0, 0, 0], [-1, 0, 0], [0, 1, 0], [0, -1, 0], [0, 0, 1], [0, 0, -1]])
    assert (normals @ directions.T).gather(1, merged[:, None]).min() >= math.cos(math.radians(78)) - 1e-6


def test_speckle_on_a_manifold_mesh_joins_the_same_regions_as_the_grouped_search(monkeypatch):
    """On an edge-manifold mesh the axis regions are found by a union-find over the mesh's own pairs of faces; it
    merges exactly as the search over each axis' faces grouped apart (the path a mesh with an edge of three or more
    faces takes), on the noisy sphere where the speckle is."""
    sphere = trimesh.creation.icosphere(subdivisions=4, radius=0.4)
    noise = torch.randn(len(sphere.vertices), 1, generator=torch.Generator().manual_seed(0))
    vertices = torch.tensor(sphere.vertices, dtype=torch.float32) * (1 + 0.01 * noise)
    faces = torch.tensor(sphere.faces)
    assert uv_charts._edge_neighbours(faces)[2]
    merged = speckle_merged_axes(vertices, faces)
    assert not torch.equal(merged, dominant_normal_axis(vertices, faces))  # there was speckle to merge
    grouped_path = uv_charts._edge_neighbours
    monkeypatch.setattr(uv_charts, "_edge_neighbours", lambda f: (*grouped_path(f)[:2], False))
    assert torch.equal(speckle_merged_axes(vertices, faces), merged)
    assert not grouped_path(torch.cat([faces, faces[:1, [1, 0, 2]]]))[2]  # face 0 again: its edges have three faces


def test_a_folded_piece_is_grouped_again_into_pieces_that_do_not_fold():
    """A strip winding 1.5 times folds as one piece; grouped again in finer cells of its own box, its faces (all of
    them, each once) are pieces that do not fold, flattened at the first flattening's scale."""
    vertices, faces = _strip(1.5)
    pieces = split_into_groups(faces, torch.zeros(len(faces), dtype=torch.long), len(vertices))
    flat = flatten_pieces(vertices, pieces._replace(axis=dominant_normal_axis(vertices, faces)[:1]))
    assert flat.folded.tolist() == [True]
    refined = refined_pieces(vertices, flat)
    again = refined.mesh
    assert len(again.face_bounds) > 1 and not refined.folded.any() and refined.uv_scale == flat.uv_scale
    as_input = sorted(
        tuple(sorted(face))
        for (f0, f1), (v0, _) in zip(again.face_bounds, again.vertex_bounds, strict=True)
        for face in again.vertices[v0 + again.faces[f0:f1]].tolist()
    )
    assert as_input == sorted(tuple(sorted(face)) for face in faces.tolist())
    assert not refined_pieces(vertices, refined).mesh.face_bounds  # nothing folded: nothing to group again
