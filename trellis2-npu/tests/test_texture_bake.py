"""UV unwrapping and texture baking (``trellis2_npu.geometry.texture_bake``) against references written independently
of it.

- The rasteriser against :func:`naive_rasterize_uv`, a per-face loop that solves each texel's barycentrics with
  ``numpy.linalg.solve`` in float64 (later faces overwrite earlier ones, as upstream's chunked nvdiffrast).
- The whole bake on a sphere whose voxels carry a known linear field: every covered texel, mapped back through
  the UVs to its 3D point by the naive rasteriser, must hold the field's value there.
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np
import pytest
import torch
import trimesh
import xatlas

from trellis2_npu.geometry import texture_bake
from trellis2_npu.geometry.mesh_io import PBR_LAYOUT
from trellis2_npu.geometry.texture_bake import (
    PBRTextures,
    UVMesh,
    Voxels,
    atlas_stats,
    bake_pbr_textures,
    pack_pbr_textures,
    rasterize_uv,
    sample_texture_attributes,
    unwrap_uv,
)
from trellis2_npu.geometry.uv_charts import chart_groups, chart_pieces, flatten_pieces, split_into_groups

EDGE_TOLERANCE = 1e-9  # texels this close (in barycentrics) to an edge may go to either face
RESOLUTION = 64  # voxels per side of the [-0.5, 0.5]³ box in the baking test
RADIUS = 0.4


def naive_rasterize_uv(uvs: torch.Tensor, faces: torch.Tensor, texture_size: int):
    """Per-face loop: ``(face_id [T, T], barycentrics [T, T, 3], ambiguous [T, T], hits [T, T])`` in float64.

    A texel ``(x, y)`` (centre ``u = (x + 0.5) / T``, ``v = (y + 0.5) / T``) is covered by a face when its
    barycentrics are all ≥ 0; later faces overwrite earlier ones. ``ambiguous`` marks texels within
    :data:`EDGE_TOLERANCE` of an edge of any face, where rounding may pick either face; ``hits`` counts the faces
    whose interior holds the texel.
    """
    corners_uv = uvs.double().numpy() * texture_size - 0.5
    face_id = np.full((texture_size, texture_size), -1)
    barycentrics = np.zeros((texture_size, texture_size, 3))
    ambiguous = np.zeros((texture_size, texture_size), dtype=bool)
    hits = np.zeros((texture_size, texture_size), dtype=int)
    for index, corner_ids in enumerate(faces.tolist()):
        a, b, c = corners_uv[corner_ids]
        system = np.array([[b[0] - a[0], c[0] - a[0]], [b[1] - a[1], c[1] - a[1]]])
        if np.linalg.det(system) == 0:
            continue
        low = np.clip(np.ceil(np.minimum(np.minimum(a, b), c)), 0, texture_size - 1).astype(int)
        high = np.clip(np.floor(np.maximum(np.maximum(a, b), c)), 0, texture_size - 1).astype(int)
        xs, ys = np.meshgrid(np.arange(low[0], high[0] + 1), np.arange(low[1], high[1] + 1), indexing="xy")
        xs, ys = xs.ravel(), ys.ravel()
        if not len(xs):
            continue
        weight_b, weight_c = np.linalg.solve(system, np.stack([xs - a[0], ys - a[1]]))
        weights = np.stack([1 - weight_b - weight_c, weight_b, weight_c], axis=1)
        lowest = weights.min(axis=1)
        ambiguous[ys, xs] |= np.abs(lowest) <= EDGE_TOLERANCE
        hits[ys, xs] += lowest > EDGE_TOLERANCE
        inside = lowest >= 0
        face_id[ys[inside], xs[inside]] = index
        barycentrics[ys[inside], xs[inside]] = weights[inside]
    return face_id, barycentrics, ambiguous, hits


def noisy_sphere(subdivisions: int, noise: float = 0.0, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    mesh = trimesh.creation.icosphere(subdivisions=subdivisions, radius=RADIUS)
    scale = 1 + noise * np.random.default_rng(seed).standard_normal((len(mesh.vertices), 1))
    return torch.tensor(mesh.vertices * scale, dtype=torch.float32), torch.tensor(mesh.faces, dtype=torch.long)


def linear_field(points: torch.Tensor) -> torch.Tensor:
    """``[P, 6]`` attributes, linear in the position and inside (0, 1) on the sphere: colour, metallic, roughness,
    alpha."""
    x, y, z = points.double().unbind(dim=1)
    return torch.stack(
        [0.5 + 0.9 * x, 0.5 + 0.9 * y, 0.5 + 0.9 * z, 0.5 + 0.5 * x - 0.4 * z, 0.5 - 0.6 * y, 0.6 + 0.3 * (x + y)], 1
    )


def sphere_voxels(band_voxels: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Voxels (``coords [N, 3]``, float64 ``attrs [N, 6]`` = the field at their centres) within ``band_voxels`` of
    the sphere: thick enough that every point on the mesh has all 8 trilinear neighbours."""
    index = torch.arange(RESOLUTION)
    coords = torch.cartesian_prod(index, index, index)
    centres = (coords.double() + 0.5) / RESOLUTION - 0.5
    keep = (centres.norm(dim=1) - RADIUS).abs() <= band_voxels / RESOLUTION
    return coords[keep], linear_field(centres[keep])


@pytest.fixture(scope="module")
def sphere_uv_mesh() -> tuple[torch.Tensor, torch.Tensor, UVMesh]:
    vertices, faces = noisy_sphere(3)
    return vertices, faces, unwrap_uv(vertices, faces)


# ----------------------------------------------------------------------------------------------------------------
# UV unwrapping


def test_unwrap_uv_maps_back_to_the_input_vertices(sphere_uv_mesh):
    vertices, faces, uv_mesh = sphere_uv_mesh
    assert uv_mesh.uvs.dtype == torch.float32 and uv_mesh.faces.dtype == torch.long
    assert uv_mesh.uvs.min() >= 0 and uv_mesh.uvs.max() <= 1
    assert len(uv_mesh.vmapping) == len(uv_mesh.vertices) == len(uv_mesh.uvs)
    assert torch.equal(uv_mesh.vertices, vertices[uv_mesh.vmapping])
    assert len(uv_mesh.faces) == len(faces)
    # The same triangles, cut along seams: each new face is an input face once mapped back.
    as_input = {tuple(sorted(face)) for face in uv_mesh.vmapping[uv_mesh.faces].tolist()}
    assert as_input == {tuple(sorted(face)) for face in faces.tolist()}
    # The six groups' charts share one atlas without overlapping: no texel lies inside two faces.
    _, _, _, hits = naive_rasterize_uv(uv_mesh.uvs, uv_mesh.faces, 256)
    assert hits.max() == 1 and (hits == 1).mean() > 0.3


def _face_components(faces: torch.Tensor) -> list[int]:
    """Each face's connected component through shared vertices (union-find), written here to check the charts."""
    parent = list(range(int(faces.max()) + 1))

    def root(vertex: int) -> int:
        while parent[vertex] != vertex:
            parent[vertex] = parent[parent[vertex]]
            vertex = parent[vertex]
        return vertex

    for a, b, c in faces.tolist():
        parent[root(b)] = root(a)
        parent[root(c)] = root(a)
    return [root(face[0]) for face in faces.tolist()]


def test_unwrap_uv_charts_are_the_cut_meshs_pieces_and_the_atlas_stats_measure_them(sphere_uv_mesh):
    """A chart is made of connected pieces of the cut mesh (xatlas cuts the seams between charts; a chart's pieces
    may meet at a vertex it split), never of part of one. The stats: one entry per chart, the density the texels'
    and the surface's areas give, and half that density for a mesh twice as large packed into the same atlas."""
    uv_mesh = sphere_uv_mesh[2]
    components = _face_components(uv_mesh.faces)
    pairs = set(zip(components, uv_mesh.charts.tolist(), strict=True))
    assert len(pairs) == len(set(components))  # each piece in one chart
    stats = atlas_stats(uv_mesh, 512)
    assert stats["charts"] == len({chart for _, chart in pairs}) > 0.9 * len(pairs)
    flat = torch.cat([uv_mesh.uvs.double(), torch.zeros(len(uv_mesh.uvs), 1, dtype=torch.float64)], 1)
    texel_area = trimesh.Trimesh(flat.numpy(), uv_mesh.faces.numpy(), process=False).area * 512**2
    surface_area = trimesh.Trimesh(uv_mesh.vertices.numpy(), uv_mesh.faces.numpy(), process=False).area
    assert stats["texels_per_unit"] == pytest.approx(math.sqrt(texel_area / surface_area), rel=1e-5)
    doubled = atlas_stats(uv_mesh._replace(vertices=uv_mesh.vertices * 2), 512)
    assert doubled["texels_per_unit"] == pytest.approx(stats["texels_per_unit"] / 2, rel=1e-6)
    assert 0 <= stats["small_chart_share"] < 1
    # at a 4-texel atlas every chart of the sphere covers fewer than 8 texels
    assert atlas_stats(uv_mesh, 4)["small_chart_share"] == 1.0


def spiral_ramp(cell: int, turns: float = 1.5, steps: int = 36, size: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """A ramp winding ``turns`` times about the middle of cell ``(cell, cell, cell)`` of the 32³ grouping (so one
    piece, whose projection winds over itself), and two small faces at far corners that span the [-0.5, 0.5]³ box;
    ``size`` scales the ramp and the two faces."""
    angle = torch.linspace(0, 2 * math.pi * turns, steps + 1, dtype=torch.float64)
    centre = torch.tensor([-0.5 + (cell + 0.5) / 32] * 3, dtype=torch.float64)
    rings = [size * torch.stack([r * angle.cos(), r * angle.sin(), 0.001 * angle], 1) + centre for r in (0.005, 0.012)]
    inner, outer = torch.arange(steps), torch.arange(steps) + steps + 1
    ramp = torch.cat([torch.stack([inner, outer, outer + 1], 1), torch.stack([inner, outer + 1, inner + 1], 1)])
    far = torch.tensor([[0.0, 0.0, 0.0], [0.01, 0.0, 0.0], [0.0, 0.01, 0.0]], dtype=torch.float64) * size
    corners = torch.cat([far - 0.5, 0.5 - far])
    vertices = torch.cat([*rings, corners]).float()
    return vertices, torch.cat([ramp, torch.tensor([[0, 1, 2], [3, 5, 4]]) + 2 * (steps + 1)])


def test_unwrap_uv_gives_a_piece_that_folds_over_itself_charts_that_do_not():
    """A spiral ramp within one grid cell of the grouping is one piece, and its projection winds over itself 1.5
    times: it must go to xatlas' own charts, so that no texel lies inside two faces."""
    vertices, faces = spiral_ramp(cell=16)
    pieces = chart_pieces(vertices, faces)
    assert flatten_pieces(vertices, pieces).folded.sum() == 1  # the ramp, whole

    uv_mesh = unwrap_uv(vertices, faces)

    assert len(uv_mesh.faces) == len(faces) and uv_mesh.uvs.min() >= 0 and uv_mesh.uvs.max() <= 1
    _, _, _, hits = naive_rasterize_uv(uv_mesh.uvs, uv_mesh.faces, 256)
    assert hits.max() == 1 and (hits == 1).sum() > 1000


def _uv_areas(uv_mesh: UVMesh) -> torch.Tensor:
    corners = uv_mesh.uvs.double()[uv_mesh.faces]
    edges = corners[:, 1:] - corners[:, :1]
    return (edges[:, 0, 0] * edges[:, 1, 1] - edges[:, 0, 1] * edges[:, 1, 0]).abs() / 2


def test_unwrap_uv_of_a_tiny_mesh_gives_every_face_its_texels():
    """A sphere of radius 4e-4 (faces ~6e-9 in area, under FLT_EPSILON): xatlas leaves such faces out in model
    units and gives them UV (0, 0) at every corner; in UV units each face keeps an area and no texel is shared."""
    vertices, faces = noisy_sphere(2)
    uv_mesh = unwrap_uv(vertices * 1e-3, faces, texture_size=256)
    assert len(uv_mesh.faces) == len(faces) and (_uv_areas(uv_mesh) > 0).all()
    _, _, _, hits = naive_rasterize_uv(uv_mesh.uvs, uv_mesh.faces, 256)
    assert hits.max() == 1 and (hits == 1).mean() > 0.1


def test_unwrap_uv_charts_a_folded_piece_of_tiny_faces():
    """The ramp at 1/100 of its size: its faces (~1e-9 in area) are below xatlas' FLT_EPSILON in model units, where
    xatlas' charting ignores them (they came back with no UV area); charted in UV units, each keeps an area."""
    vertices, faces = spiral_ramp(cell=16, size=0.01)
    pieces = chart_pieces(vertices, faces)
    assert flatten_pieces(vertices, pieces).folded.sum() == 1

    uv_mesh = unwrap_uv(vertices, faces)

    assert len(uv_mesh.faces) == len(faces) and (_uv_areas(uv_mesh) > 0).all()
    _, _, _, hits = naive_rasterize_uv(uv_mesh.uvs, uv_mesh.faces, 256)
    assert hits.max() == 1


class _CountingAtlas:
    """An ``xatlas.Atlas`` that records how many meshes it was given."""

    instances: ClassVar[list[_CountingAtlas]] = []

    def __init__(self) -> None:
        self.atlas, self.meshes = REAL_ATLAS(), 0
        _CountingAtlas.instances.append(self)

    def add_mesh(self, *args, **kwargs) -> None:
        self.meshes += 1
        self.atlas.add_mesh(*args, **kwargs)

    def __getitem__(self, index: int):
        return self.atlas[index]

    def __getattr__(self, name: str):
        return getattr(self.atlas, name)


REAL_ATLAS = xatlas.Atlas


def test_unwrap_uv_gives_each_xatlas_atlas_one_mesh(monkeypatch):
    """xatlas 0.0.11 can crash when an atlas gets a second mesh while its threads still process the first (see
    ``uv_charts.xatlas_charts``): every atlas must get exactly one, here with three folded ramps in meshes of their
    own (a batch of 1 face) beside the projected pieces of a sphere, and the result must still cover no texel twice."""
    sphere_vertices, sphere_faces = noisy_sphere(2)
    meshes = [spiral_ramp(cell) for cell in (3, 16, 28)]
    vertices = torch.cat([sphere_vertices * 0.2, *(ramp for ramp, _ in meshes)])
    starts = torch.tensor([0, *(len(ramp) for ramp, _ in meshes)]).cumsum(0) + len(sphere_vertices)
    ramps = [ramp_faces + start for (_, ramp_faces), start in zip(meshes, starts[:-1], strict=True)]
    faces = torch.cat([sphere_faces, *ramps])
    monkeypatch.setattr(xatlas, "Atlas", _CountingAtlas)
    monkeypatch.setattr(_CountingAtlas, "instances", [])
    monkeypatch.setattr(texture_bake, "FOLDED_MESH_FACES", 1)

    uv_mesh = unwrap_uv(vertices, faces)

    counts = [atlas.meshes for atlas in _CountingAtlas.instances]
    assert set(counts) == {1} and len(counts) >= 2  # the ramps still folded once grouped again, then the packing
    assert len(uv_mesh.faces) == len(faces)
    _, _, _, hits = naive_rasterize_uv(uv_mesh.uvs, uv_mesh.faces, 512)
    assert hits.max() == 1


def test_unwrap_uv_drops_degenerate_faces():
    vertices, faces = noisy_sphere(1)
    collinear = torch.tensor([[0.0, 0.0, 0.0], [0.1, 0.0, 0.0], [0.2, 0.0, 0.0]])
    all_vertices = torch.cat([vertices, collinear])
    n = len(vertices)
    bad = torch.tensor([[0, 0, 1], [n, n + 1, n + 2]])
    uv_mesh = unwrap_uv(all_vertices, torch.cat([faces, bad]))
    assert len(uv_mesh.faces) == len(faces)
    assert uv_mesh.vmapping.max() < n


def test_unwrap_uv_of_only_degenerate_faces_says_so():
    """Before the grouping, which has no centroid range to cut (it raised an IndexError from ``min()`` here)."""
    collinear = torch.tensor([[0.0, 0.0, 0.0], [0.1, 0.0, 0.0], [0.2, 0.0, 0.0]])
    with pytest.raises(ValueError, match="all 2 faces are degenerate"):
        unwrap_uv(collinear, torch.tensor([[0, 1, 2], [0, 0, 1]]))


def test_groups_for_xatlas_are_what_unique_gives_group_by_group():
    """The one-sort split equals the per-group ``torch.unique(return_inverse=True)`` it replaced, mesh by mesh."""
    vertices, faces = noisy_sphere(3)
    faces = faces[torch.randperm(len(faces), generator=torch.Generator().manual_seed(0))]  # groups interleaved
    groups = chart_groups(vertices, faces, cells=4)
    grouped = split_into_groups(faces, groups, len(vertices))
    order = groups.argsort(stable=True)
    expected = faces[order].split(torch.unique_consecutive(groups[order], return_counts=True)[1].tolist())
    assert len(expected) == len(grouped.face_bounds) == len(grouped.vertex_bounds) > 10
    for group_faces, (f0, f1), (v0, v1) in zip(expected, grouped.face_bounds, grouped.vertex_bounds, strict=True):
        used, local = torch.unique(group_faces, return_inverse=True)
        assert torch.equal(grouped.vertices[v0:v1], used) and torch.equal(grouped.faces[f0:f1], local)


def test_unwrap_uv_survives_a_smooth_dense_sphere():
    """xatlas 0.0.11 crashes (SIGSEGV) on this 82k-face sphere left whole; grouped by normal it does not."""
    vertices, faces = noisy_sphere(6)
    uv_mesh = unwrap_uv(vertices, faces)
    assert len(uv_mesh.faces) == len(faces) and uv_mesh.uvs.isfinite().all()


# ----------------------------------------------------------------------------------------------------------------
# Rasterisation


def _assert_matches_naive(uvs: torch.Tensor, faces: torch.Tensor, texture_size: int) -> None:
    face_id, barycentrics = rasterize_uv(uvs, faces, texture_size)
    expected_id, expected_bary, ambiguous, _ = naive_rasterize_uv(uvs, faces, texture_size)
    clear = ~ambiguous
    assert (expected_id[clear] >= 0).any()
    np.testing.assert_array_equal(face_id.numpy()[clear], expected_id[clear])
    covered = clear & (expected_id >= 0)
    np.testing.assert_allclose(barycentrics.numpy()[covered], expected_bary[covered], rtol=0, atol=1e-6)
    assert (barycentrics.numpy()[face_id.numpy() < 0] == 0).all()


def test_rasterize_uv_matches_naive_loop_on_an_unwrapped_mesh(sphere_uv_mesh):
    _, _, uv_mesh = sphere_uv_mesh
    _assert_matches_naive(uv_mesh.uvs.double(), uv_mesh.faces, 128)
    _assert_matches_naive(uv_mesh.uvs, uv_mesh.faces, 64)  # float32 UVs, computed in float32


def test_rasterize_uv_overlapping_faces_later_wins_both_windings():
    generator = torch.Generator().manual_seed(0)
    uvs = torch.rand(60, 2, generator=generator, dtype=torch.float64)
    faces = torch.randperm(60, generator=generator).reshape(20, 3)
    faces = torch.cat([faces, faces[:3].flip(1), torch.tensor([[0, 0, 1]])])  # flipped duplicates, a zero-area face
    _assert_matches_naive(uvs, faces, 64)


def test_rasterize_uv_small_chunks_change_nothing(sphere_uv_mesh):
    _, _, uv_mesh = sphere_uv_mesh
    face_id, barycentrics = rasterize_uv(uv_mesh.uvs, uv_mesh.faces, 64)
    chunked_id, chunked_bary = rasterize_uv(uv_mesh.uvs, uv_mesh.faces, 64, pairs_per_chunk=97)
    assert torch.equal(face_id, chunked_id) and torch.equal(barycentrics, chunked_bary)


@pytest.mark.parametrize("texture_size", [0, 3, 1000, 16384, 2048.0, True])
def test_bad_texture_sizes_are_rejected(texture_size, sphere_uv_mesh):
    vertices, faces, uv_mesh = sphere_uv_mesh
    with pytest.raises(ValueError, match="texture_size must be a power of two up to 8192"):
        rasterize_uv(uv_mesh.uvs, uv_mesh.faces, texture_size)
    with pytest.raises(ValueError, match="texture_size must be a power of two up to 8192"):
        bake_pbr_textures(
            uv_mesh, (vertices, faces), Voxels(torch.zeros(1, 3), torch.zeros(1, 6), 1 / 64, -0.5), texture_size
        )


# ----------------------------------------------------------------------------------------------------------------
# Baking


@pytest.fixture(scope="module")
def baked(sphere_uv_mesh):
    vertices, faces, uv_mesh = sphere_uv_mesh
    coords, attrs = sphere_voxels(band_voxels=2.5)
    texture_size = 256
    voxels = Voxels(coords, attrs.float(), 1 / RESOLUTION, [-0.5] * 3)
    attributes, coverage = sample_texture_attributes(uv_mesh, (vertices, faces), voxels, texture_size)
    return uv_mesh, attributes, coverage, texture_size


def test_baked_texels_hold_the_linear_field_at_their_3d_points(baked):
    uv_mesh, attributes, coverage, texture_size = baked
    face_id, barycentrics, ambiguous, _ = naive_rasterize_uv(uv_mesh.uvs, uv_mesh.faces, texture_size)
    assert attributes.shape == (texture_size, texture_size, 6) and attributes.dtype == torch.float32
    np.testing.assert_array_equal(coverage.numpy()[~ambiguous], face_id[~ambiguous] >= 0)
    assert coverage.float().mean() > 0.3

    covered = torch.from_numpy((face_id >= 0) & ~ambiguous)
    corners = uv_mesh.vertices.double()[uv_mesh.faces[torch.from_numpy(face_id)[covered]]]
    points = (torch.from_numpy(barycentrics)[covered].unsqueeze(2) * corners).sum(dim=1)
    error = (attributes[covered].double() - linear_field(points)).abs().max().item()
    assert error < 1e-3, f"baked texels differ from the field by up to {error:.2e}"
    assert (attributes[~coverage] == 0).all()


def test_pack_pbr_textures_quantises_packs_and_inpaints(baked):
    _, attributes, coverage, texture_size = baked
    textures = pack_pbr_textures(attributes, coverage)
    assert isinstance(textures, PBRTextures)
    assert textures.base_color_rgba.shape == (texture_size, texture_size, 4)
    assert textures.metallic_roughness.shape == (texture_size, texture_size, 3)
    assert textures.base_color_rgba.dtype == textures.metallic_roughness.dtype == np.uint8

    quantised = np.clip(attributes.numpy() * 255, 0, 255).astype(np.uint8)
    covered = coverage.numpy()
    channel = {name: quantised[..., slice(*span)] for name, span in PBR_LAYOUT.items()}
    expected_rgba = np.concatenate([channel["base_color"], channel["alpha"]], axis=-1)
    expected_mr = np.concatenate([np.zeros_like(channel["metallic"]), channel["roughness"], channel["metallic"]], -1)
    np.testing.assert_array_equal(textures.base_color_rgba[covered], expected_rgba[covered])
    np.testing.assert_array_equal(textures.metallic_roughness[covered], expected_mr[covered])
    np.testing.assert_array_equal(textures.coverage, covered)
    # Every texel no face covers is inpainted from covered ones (the field is > 0 everywhere on the sphere).
    assert (~covered).any()
    assert (textures.base_color_rgba[~covered] > 0).all()
    assert (textures.metallic_roughness[~covered][:, 1:] > 0).all()
    assert (textures.metallic_roughness[..., 0] == 0).all()


def test_bake_pbr_textures_is_sample_then_pack(sphere_uv_mesh, baked):
    vertices, faces, uv_mesh = sphere_uv_mesh
    _, attributes, coverage, texture_size = baked
    coords, attrs = sphere_voxels(band_voxels=2.5)
    textures = bake_pbr_textures(
        uv_mesh, (vertices, faces), Voxels(coords, attrs.float(), 1 / RESOLUTION, -0.5), texture_size
    )
    expected = pack_pbr_textures(attributes, coverage)
    for got, want in zip(textures, expected, strict=True):
        np.testing.assert_array_equal(got, want)


def test_sampling_grid_is_relative_to_aabb_min(sphere_uv_mesh):
    """``grid = (p - aabb_min) / voxel_size``: a shifted box with shifted coords bakes the same texture."""
    vertices, faces, uv_mesh = sphere_uv_mesh
    coords, attrs = sphere_voxels(band_voxels=2.5)
    reference, _ = sample_texture_attributes(
        uv_mesh, (vertices, faces), Voxels(coords, attrs.float(), 1 / 64, -0.5), 32
    )
    shifted_box = Voxels(coords + 3, attrs.float(), [1 / 64] * 3, torch.full((3,), -0.5 - 3 / 64))
    shifted, _ = sample_texture_attributes(uv_mesh, (vertices, faces), shifted_box, 32)
    assert reference.abs().sum() > 0
    torch.testing.assert_close(shifted, reference, rtol=0, atol=1e-5)
