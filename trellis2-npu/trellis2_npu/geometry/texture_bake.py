"""UV unwrapping and PBR texture baking for the textured GLB, without nvdiffrast, cuBVH or CuMesh.

Adapted from: microsoft/TRELLIS.2 @ 5565d240, ``o-voxel/o_voxel/postprocess.py::to_glb``, the steps after
simplification ("UV Parameterization", "Texture Baking", "Texture Post-Processing"), and JeffreyXiang/CuMesh @
cf1a2f0 ``cumesh/cumesh.py::CuMesh.uv_unwrap``. Upstream's steps and what stands in for them here:

1. ``uv_unwrap``: drop degenerate faces, cluster faces on the GPU (normal cones), then xatlas ``compute_charts`` +
   ``pack_charts`` of the clusters → :func:`unwrap_uv` (faces grouped by the dominant axis of their normal and a
   spatial cell, each connected piece of a group flattened by projection (:mod:`trellis2_npu.geometry.uv_charts`), then
   xatlas packs them with the same default options).
2. nvdiffrast ``rasterize`` of the UVs at ``texture_size²`` in 100k-face chunks, later chunks overwriting earlier
   ones → :func:`rasterize_uv` (vectorised barycentric test over each face's texel box; the highest face id wins).
3. nvdiffrast ``interpolate`` of the vertex positions → the same barycentric sum in torch.
4. cuBVH ``unsigned_distance`` on the mesh *before* simplification →
   :func:`trellis2_npu.geometry.closest_points.closest_points_on_mesh` (a uniform grid of faces and an exact
   point-triangle distance, in chunks); the bounded search near a remeshed surface runs compiled on the host CPU
   (:mod:`trellis2_npu.geometry.closest_points_cpu`), in torch elsewhere.
5. FlexGEMM ``grid_sample_3d`` at ``(p - aabb_min) / voxel_size`` → :func:`trellis2_npu.grid_sample.grid_sample_3d`
   (compiled for float32 on the host CPU: :mod:`trellis2_npu.geometry.grid_sample_cpu`).
6. ``uint8`` by ``clip(x · 255)``, ``cv2.inpaint(TELEA)`` of the texels no face covers (radius 3 for the base colour,
   1 for the rest), PBR packing → :func:`pack_pbr_textures`.

Texel ``(row y, column x)`` is centred at ``u = (x + 0.5) / T``, ``v = (y + 0.5) / T``: rows grow with ``v``, as in
upstream's nvdiffrast raster of ``(2u - 1, 2v - 1)``. The GLB writer flips ``v`` (``1 - v``) as upstream does.

Tensors may live on any device; each function computes on its inputs' device, except xatlas and OpenCV, which run
on the host (:func:`unwrap_uv` returns its tensors on the input device).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import cv2
import numpy as np
import torch
import xatlas

from ..grid_sample import grid_sample_3d
from . import grid_sample_cpu, uv_charts
from .closest_points import (
    DEFAULT_PAIRS_PER_CHUNK,
    check_chunk,
    check_mesh,
    closest_points_on_mesh,
    closest_points_within,
    ragged_chunks,
)
from .closest_points_cpu import closest_points_within_cpu
from .grid_sample_cpu import grid_sample_3d_cpu
from .mesh_io import PBR_LAYOUT

logger = logging.getLogger(__name__)

MAX_TEXTURE_SIZE = 8192
DEGENERATE_ABS_AREA = 1e-24  # CuMesh remove_degenerate_faces defaults: a face goes when its area is below both
DEGENERATE_REL_AREA = 1e-12  # the absolute threshold and this fraction of its longest edge squared
INPAINT_RADIUS_BASE_COLOR = 3  # upstream's cv2.inpaint radii
INPAINT_RADIUS_OTHER = 1


class UVMesh(NamedTuple):
    """A mesh cut along its UV seams: ``vertices [V', 3]``, ``faces [F', 3]`` (int64), ``uvs [V', 2]`` (float32,
    in ``[0, 1]``) and ``vmapping [V']`` (int64), the input vertex each new vertex copies (upstream's ``vmaps``),
    then ``charts [F']`` (int64), the atlas chart of each face.

    The first four fields are upstream's ``uv_unwrap(return_vmaps=True)``'s, in its order.
    """

    vertices: torch.Tensor
    faces: torch.Tensor
    uvs: torch.Tensor
    vmapping: torch.Tensor
    charts: torch.Tensor


SMALL_CHART_TEXELS = 8  # a chart covering fewer texels is counted as speckle (T4's 3D editor's report)


def atlas_stats(uv_mesh: UVMesh, texture_size: int) -> dict[str, float | int]:
    """The atlas as a texture artist judges it: ``charts``, the share of them covering fewer than
    :data:`SMALL_CHART_TEXELS` texels (``small_chart_share``), and ``texels_per_unit``, the texel density (texels per
    unit of length on the surface, the model being in the unit box: the square root of the faces' texel area over
    their surface area)."""
    corners, uv_corners = uv_mesh.vertices[uv_mesh.faces].double(), uv_mesh.uvs[uv_mesh.faces].double()
    area = torch.linalg.cross(corners[:, 1] - corners[:, 0], corners[:, 2] - corners[:, 0]).norm(dim=1) / 2
    uv_edges = uv_corners[:, 1:] - uv_corners[:, :1]
    texels = (uv_edges[:, 0, 0] * uv_edges[:, 1, 1] - uv_edges[:, 0, 1] * uv_edges[:, 1, 0]).abs() / 2 * texture_size**2
    charts, chart_ids = uv_mesh.charts.unique(return_inverse=True)
    chart_texels = torch.zeros(len(charts), dtype=torch.float64, device=texels.device).index_add_(0, chart_ids, texels)
    return {
        "charts": len(chart_texels),
        "small_chart_share": float((chart_texels < SMALL_CHART_TEXELS).double().mean()) if len(chart_texels) else 0.0,
        "texels_per_unit": float((texels.sum() / area.sum()).sqrt()) if area.sum() > 0 else 0.0,
    }


class PBRTextures(NamedTuple):
    """The two glTF textures, host ``uint8`` arrays ready for ``PIL.Image.fromarray``, and the baked texels.

    ``base_color_rgba [T, T, 4]`` is (base colour, alpha); ``metallic_roughness [T, T, 3]`` is (0, roughness,
    metallic) in (R, G, B), glTF's packing; ``coverage [T, T]`` (bool) marks the texels a face covers, the others
    are inpainted. Row ``y`` holds ``v = (y + 0.5) / T``.
    """

    base_color_rgba: np.ndarray
    metallic_roughness: np.ndarray
    coverage: np.ndarray


# ----------------------------------------------------------------------------------------------------------------
# UV unwrapping


def unwrap_uv(vertices: torch.Tensor, faces: torch.Tensor, texture_size: int | None = None) -> UVMesh:
    """Cut the mesh into charts, flatten them and pack them into the unit square with xatlas.

    Replaces CuMesh ``uv_unwrap`` as ``to_glb`` calls it: degenerate faces are dropped first (CuMesh's
    ``remove_degenerate_faces`` defaults), then the faces are grouped and flattened before xatlas sees them
    (:mod:`trellis2_npu.geometry.uv_charts`). Upstream clusters faces on the GPU (90° normal cones) and xatlas computes
    charts within each cluster; here each face joins the one of the six axis directions closest to its normal
    (small regions along the seams merged into a neighbour's), within one of 16³ spatial cells, and each connected
    piece of such a group is projected onto its plane; xatlas
    only packs these charts (with its default options otherwise, those of CuMesh's wrapper). The few pieces whose
    projection folds over itself are grouped again in finer cells, and those still folded get xatlas' own chart
    computation. Grouping is not optional: xatlas 0.0.11 crashes
    (SIGSEGV in ``PackCharts``) on a smooth 82k-face sphere left whole.

    Args:
        vertices (`torch.Tensor`): ``[V, 3]`` float positions.
        faces (`torch.Tensor`): ``[F, 3]`` integer vertex indices.
        texture_size (`int`, *optional*): the texture the charts will be baked into. When given, charts are packed
            for that resolution as upstream packs them (CuMesh's xatlas defaults: no padding, and ``bilinear``, which
            leaves each chart the border texels bilinear filtering reads). xatlas sizes the charts for the
            resolution assuming 75 % utilisation and grows the atlas when they do not fit; the UVs are normalised
            to it.

    Returns:
        `UVMesh`: new vertices (copies of input vertices, duplicated along seams), faces, UVs in ``[0, 1]`` and the
        input vertex of each new vertex, on the input device; vertices keep the input dtype.
    """
    check_mesh(vertices, faces)
    host_vertices = vertices.detach().to("cpu", torch.float32)
    host_faces = faces.detach().to("cpu", torch.long)
    host_faces = host_faces[_non_degenerate(host_vertices, host_faces)]
    if not len(host_faces):
        raise ValueError(f"unwrap_uv: all {faces.shape[0]} faces are degenerate (zero area); nothing to unwrap")
    flat = uv_charts.flatten_pieces(host_vertices, uv_charts.chart_pieces(host_vertices, host_faces))
    refined = uv_charts.refined_pieces(host_vertices, flat)  # the folded ones, in smaller pieces
    positions, mesh_faces, mesh_uvs, input_vertices = _joined(
        [_flat_mesh(host_vertices, flat), _flat_mesh(host_vertices, refined), *_folded_meshes(host_vertices, refined)]
    )

    atlas = xatlas.Atlas()
    # one mesh per atlas (see uv_charts.xatlas_charts), in UV units: xatlas leaves out every face under FLT_EPSILON in
    # area, and one left out gets UV (0, 0) at all three corners (the corner texel's colour): in model units that was
    # 4693 of the benchmark's 500k faces, 272 now (slivers); the positions only decide which faces xatlas keeps
    atlas.add_mesh(positions * np.float32(flat.uv_scale), mesh_faces, None, mesh_uvs)
    chart_options = xatlas.ChartOptions()
    chart_options.use_input_mesh_uvs = True  # the pieces' UVs are the charts: xatlas only packs
    pack_options = xatlas.PackOptions()
    if texture_size is not None:
        pack_options.resolution = texture_size
    atlas.generate(chart_options=chart_options, pack_options=pack_options)

    atlas_vmapping, atlas_faces, atlas_uvs = atlas[0]
    vmapping = torch.from_numpy(input_vertices[atlas_vmapping.astype(np.int64)]).to(vertices.device)
    atlas_faces = atlas_faces.astype(np.int64).reshape(-1, 3)
    vertex_charts = atlas.get_mesh_vertex_assignment(0)[1].astype(np.int64)  # a face's corners share its chart
    logger.info(
        "unwrap_uv: %d faces, %d pieces (%d folded, in %d pieces again, %d of them folded: xatlas charts), %d "
        "charts, atlas utilisation %.2f",
        len(host_faces), len(flat.mesh.face_bounds), int(flat.folded.sum()), len(refined.mesh.face_bounds),
        int(refined.folded.sum()), atlas.chart_count, atlas.utilization,
    )  # fmt: skip
    return UVMesh(
        vertices=vertices.detach()[vmapping],
        faces=torch.from_numpy(atlas_faces).to(vertices.device),
        uvs=torch.from_numpy(atlas_uvs).clamp(0, 1).to(vertices.device),
        vmapping=vmapping,
        charts=torch.from_numpy(vertex_charts[atlas_faces[:, 0]]).to(vertices.device),
    )


_XatlasMesh = tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray]  # positions, faces, UVs, input vertex ids


def _flat_mesh(vertices: torch.Tensor, flat: uv_charts.FlatPieces) -> _XatlasMesh:
    """The projected pieces (the folded ones left out) as one mesh, with their UVs."""
    pieces = flat.mesh
    face_counts = torch.tensor([stop - start for start, stop in pieces.face_bounds], dtype=torch.long)
    vertex_counts = torch.tensor([stop - start for start, stop in pieces.vertex_bounds], dtype=torch.long)
    kept = ~flat.folded
    kept_vertex_counts = vertex_counts * kept
    piece_start = kept_vertex_counts.cumsum(0) - kept_vertex_counts  # a piece's first vertex among the kept ones
    faces = pieces.faces + torch.repeat_interleave(piece_start, face_counts)[:, None]
    kept_faces, kept_vertices = torch.repeat_interleave(kept, face_counts), torch.repeat_interleave(kept, vertex_counts)
    input_ids = pieces.vertices[kept_vertices]
    return (
        vertices[input_ids].numpy(),
        faces[kept_faces].numpy().astype(np.uint32),
        flat.uvs[kept_vertices].numpy(),
        input_ids.numpy(),
    )


def _folded_meshes(vertices: torch.Tensor, flat: uv_charts.FlatPieces) -> list[_XatlasMesh]:
    """The folded pieces with xatlas' own charts of them as their UVs, in meshes of about
    :data:`FOLDED_MESH_FACES` faces (xatlas' chart growing is superlinear in a mesh's size: the benchmark's folded
    pieces went faster in meshes of 512 faces than of 8k; Intel Xeon, one run each)."""
    batches, batch, batch_faces = [], [], 0
    for index in flat.folded.nonzero().squeeze(1).tolist():
        (f0, f1), (v0, v1) = flat.mesh.face_bounds[index], flat.mesh.vertex_bounds[index]
        input_ids = flat.mesh.vertices[v0:v1].numpy()
        batch.append((vertices.numpy()[input_ids], flat.mesh.faces[f0:f1].numpy().astype(np.uint32), None, input_ids))
        batch_faces += f1 - f0
        if batch_faces >= FOLDED_MESH_FACES:
            batches.append(_joined(batch))
            batch, batch_faces = [], 0
    batches += [_joined(batch)] if batch else []
    meshes = []
    for positions, faces, _, input_ids in batches:
        # charted in UV units (faces of about unit area): xatlas leaves out faces under FLT_EPSILON in area, 527 of
        # the benchmark's folded faces in model units (they came back with no UV area); 45 now
        vmapping, charted_faces, uvs = uv_charts.xatlas_charts(positions * np.float32(flat.uv_scale), faces)
        meshes.append((positions[vmapping], charted_faces, uvs, input_ids[vmapping]))
    return meshes


FOLDED_MESH_FACES = 512


def _joined(meshes: list[_XatlasMesh]) -> _XatlasMesh:
    """One mesh of several: vertices, UVs and ids concatenated, faces renumbered (the meshes share no vertex)."""
    starts = np.cumsum([0] + [len(positions) for positions, _, _, _ in meshes[:-1]]).astype(np.uint32)
    uvs = None if meshes[0][2] is None else np.concatenate([uvs for _, _, uvs, _ in meshes])
    return (
        np.concatenate([positions for positions, _, _, _ in meshes]),
        np.concatenate([faces + start for (_, faces, _, _), start in zip(meshes, starts, strict=True)]),
        uvs,
        np.concatenate([ids for _, _, _, ids in meshes]),
    )


def _non_degenerate(vertices: torch.Tensor, faces: torch.Tensor) -> torch.Tensor:
    """``[F]`` bool: no repeated index, and area ≥ min(1e-12 · longest edge², 1e-24) (CuMesh, in float32).

    A mask rather than :func:`trellis2_npu.geometry.mesh_repair.remove_degenerate_faces`, which also renumbers the
    vertices:
    ``vmapping`` must index the caller's vertices.
    """
    repeated = (faces[:, 0] == faces[:, 1]) | (faces[:, 1] == faces[:, 2]) | (faces[:, 2] == faces[:, 0])
    corners = vertices[faces]
    edges = corners.roll(-1, dims=1) - corners
    area = 0.5 * torch.linalg.cross(edges[:, 0], edges[:, 1]).norm(dim=1)
    longest_squared = edges.square().sum(dim=2).amax(dim=1)
    return ~repeated & (area >= torch.clamp(DEGENERATE_REL_AREA * longest_squared, max=DEGENERATE_ABS_AREA))


# ----------------------------------------------------------------------------------------------------------------
# Rasterisation in UV space


def rasterize_uv(
    uvs: torch.Tensor, faces: torch.Tensor, texture_size: int, pairs_per_chunk: int = DEFAULT_PAIRS_PER_CHUNK
) -> tuple[torch.Tensor, torch.Tensor]:
    """Which face covers each texel of a ``texture_size²`` texture, and where in that face.

    Replaces nvdiffrast ``rasterize`` of ``(2u - 1, 2v - 1, 0, 1)`` in ``to_glb``: a texel is covered when its
    centre lies in the face (edges included, both windings); where faces overlap, the highest face index wins,
    as upstream's later 100k-face chunks overwrite earlier ones. Faces of zero UV area cover nothing. Each face's
    texel box is enumerated and tested in chunks of ``pairs_per_chunk`` (face, texel) pairs, so memory does not
    depend on face count or face size.

    Args:
        uvs (`torch.Tensor`): ``[V, 2]`` UVs in ``[0, 1]``; the barycentrics are computed in their dtype (at
            least float32).
        faces (`torch.Tensor`): ``[F, 3]`` integer indices into ``uvs``.
        texture_size (`int`): texture side ``T``, a power of two up to 8192.
        pairs_per_chunk (`int`, *optional*, defaults to 262144): (face, texel) candidates tested at once.

    Returns:
        `tuple[torch.Tensor, torch.Tensor]`: ``face_id [T, T]`` int64 (−1 where no face covers the texel) and
        ``barycentrics [T, T, 3]`` (weights of the face's corners 0, 1, 2; zero where uncovered). Row ``y`` is
        ``v = (y + 0.5) / T``, column ``x`` is ``u = (x + 0.5) / T``.
    """
    texels, face_ids, barycentrics = _rasterize_covered_texels(uvs, faces, texture_size, pairs_per_chunk)
    size = texture_size * texture_size
    face_image = torch.full((size,), -1, dtype=torch.long, device=uvs.device).index_copy_(0, texels, face_ids)
    bary_image = barycentrics.new_zeros(size, 3).index_copy_(0, texels, barycentrics)
    return face_image.reshape(texture_size, texture_size), bary_image.reshape(texture_size, texture_size, 3)


def _rasterize_covered_texels(
    uvs: torch.Tensor, faces: torch.Tensor, texture_size: int, pairs_per_chunk: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The covered texels only: flat texel index ``[K]`` (ascending), winning face ``[K]``, barycentrics ``[K, 3]``."""
    check_texture_size(texture_size)
    check_chunk(pairs_per_chunk)
    if uvs.dim() != 2 or uvs.shape[1] != 2 or faces.dim() != 2 or faces.shape[1] != 3:
        raise ValueError(f"expected uvs [V, 2] and faces [F, 3], got {tuple(uvs.shape)} and {tuple(faces.shape)}")
    dtype = torch.promote_types(uvs.dtype, torch.float32)
    # Texel units: texel (x, y) is centred at the integer point (x, y).
    corners = uvs.to(dtype)[faces.long()] * texture_size - 0.5  # [F, 3, 2]
    first = corners.amin(dim=1).ceil().clamp(0, texture_size - 1).long()
    last = corners.amax(dim=1).floor().clamp(0, texture_size - 1).long()
    spans = (last - first + 1).clamp_min(0)
    spans = torch.where(_signed_double_area(corners).unsqueeze(1) == 0, 0, spans)
    pair_counts = spans[:, 0] * spans[:, 1]

    winner = torch.full((texture_size * texture_size,), -1, dtype=torch.long, device=uvs.device)
    for face, local in ragged_chunks(pair_counts, pairs_per_chunk):
        x = first[face, 0] + local % spans[face, 0]
        y = first[face, 1] + local // spans[face, 0]
        inside = (_barycentrics_2d(corners[face], torch.stack([x, y], dim=1).to(dtype)) >= 0).all(dim=1)
        winner.scatter_reduce_(0, (y * texture_size + x)[inside], face[inside], reduce="amax")

    texels = (winner >= 0).nonzero().squeeze(1)
    face_ids = winner[texels]
    points = torch.stack([texels % texture_size, texels // texture_size], dim=1).to(dtype)
    return texels, face_ids, _barycentrics_2d(corners[face_ids], points)


def _signed_double_area(corners: torch.Tensor) -> torch.Tensor:
    """``[F]`` twice the signed area of 2D triangles ``[F, 3, 2]``."""
    return _cross_2d(corners[:, 1] - corners[:, 0], corners[:, 2] - corners[:, 0])


def _barycentrics_2d(corners: torch.Tensor, points: torch.Tensor) -> torch.Tensor:
    """``[P, 3]`` barycentrics of ``points [P, 2]`` in triangles ``[P, 3, 2]`` (of either winding, non-zero area).

    Each weight is an edge function (relative to the edge's first corner, which keeps float32 exact enough at
    texel scale) over the signed area; all three are ≥ 0 exactly when the point is inside or on an edge.
    """
    a, b, c = corners.unbind(dim=1)
    weights = torch.stack(
        [_cross_2d(c - b, points - b), _cross_2d(a - c, points - c), _cross_2d(b - a, points - a)], dim=1
    )
    return weights / _cross_2d(b - a, c - a).unsqueeze(1)


def _cross_2d(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return u[..., 0] * v[..., 1] - u[..., 1] * v[..., 0]


# ----------------------------------------------------------------------------------------------------------------
# Baking


class Voxels(NamedTuple):
    """Sparse voxels with attributes, placed in space: what the bake samples."""

    coords: torch.Tensor  # [N, 3] integer voxel indices, all >= 0 (MeshWithVoxel.coords)
    attrs: torch.Tensor  # [N, C] (MeshWithVoxel.attrs)
    voxel_size: float | Sequence[float] | torch.Tensor  # the side, scalar or per axis (1 / res)
    aabb_min: float | Sequence[float] | torch.Tensor  # the corner of voxel (0, 0, 0) ([-0.5] * 3)


def sample_texture_attributes(
    uv_mesh: UVMesh,
    reference: tuple[torch.Tensor, torch.Tensor] | None,
    voxels: Voxels,
    texture_size: int,
    snap_distance: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The voxel attributes at every covered texel, in float, before quantisation and inpainting.

    Upstream's "Texture Baking": rasterise the UVs (:func:`rasterize_uv`), interpolate each texel's 3D point,
    snap it to the closest point of the reference mesh (the mesh before simplification, so that simplification does
    not shift the colours; :func:`closest_points_on_mesh`) and sample the voxels there with the renormalised
    trilinear ``grid_sample_3d`` at ``grid = (p - aabb_min) / voxel_size``.

    Args:
        uv_mesh (`UVMesh`): the unwrapped mesh (:func:`unwrap_uv`).
        reference (`tuple[torch.Tensor, torch.Tensor]`): ``[V, 3]`` vertices and ``[F, 3]`` faces of the mesh
            before simplification; None: no snap (the texturing pipeline samples at the rasterised points, which lie
            on the mesh itself).
        voxels (`Voxels`): what is sampled (``MeshWithVoxel.coords`` and ``.attrs``, placed in the box).
        texture_size (`int`): texture side ``T``, a power of two up to 8192.
        snap_distance (`float`, *optional*): how far the texels' points are expected to be from the reference
            mesh (a remeshed surface lies about its band outside it). The snap then searches only that far
            (:func:`closest_points_within`), and only the points beyond it search everywhere; the result is the same.

    Returns:
        `tuple[torch.Tensor, torch.Tensor]`: ``attributes [T, T, C]`` float32 (zero where uncovered) and
        ``coverage [T, T]`` bool, on the device of ``uv_mesh``.
    """
    check_texture_size(texture_size)
    coords, attrs = voxels.coords, voxels.attrs
    if coords.dim() != 2 or coords.shape[1] != 3 or attrs.dim() != 2 or attrs.shape[0] != coords.shape[0]:
        raise ValueError(
            f"expected coords [N, 3] and attrs [N, C] with the same N, got {tuple(coords.shape)} and "
            f"{tuple(attrs.shape)}"
        )
    device = uv_mesh.uvs.device
    texels, face_ids, barycentrics = _rasterize_covered_texels(
        uv_mesh.uvs, uv_mesh.faces, texture_size, DEFAULT_PAIRS_PER_CHUNK
    )
    corners = uv_mesh.vertices.to(torch.float32)[uv_mesh.faces[face_ids]]  # nvdiffrast interpolates in float32
    positions = (barycentrics.to(torch.float32).unsqueeze(2) * corners).sum(dim=1)
    snapped = positions
    if reference is not None:
        snapped = _snap(positions, reference[0].to(device), reference[1].to(device), snap_distance)

    values = _sample_voxels(snapped, coords.to(device), attrs.to(device), voxels.voxel_size, voxels.aabb_min)
    size = texture_size * texture_size
    attributes = torch.zeros(size, attrs.shape[1], dtype=torch.float32, device=device)
    attributes.index_copy_(0, texels, values.to(torch.float32))
    coverage = torch.zeros(size, dtype=torch.bool, device=device).index_fill_(0, texels, True)
    return attributes.reshape(texture_size, texture_size, -1), coverage.reshape(texture_size, texture_size)


def _sample_voxels(
    points: torch.Tensor,
    coords: torch.Tensor,
    attrs: torch.Tensor,
    voxel_size: float | Sequence[float] | torch.Tensor,
    aabb_min: float | Sequence[float] | torch.Tensor,
) -> torch.Tensor:
    """``[P, C]`` attributes at ``points [P, 3]`` as ``to_glb`` samples them (float32 ``aabb``/``voxel_size``).

    Upstream passes the grid shape ``round((aabb_max - aabb_min) / voxel_size)``; any shape holding every voxel
    samples the same (a neighbour outside the grid is absent either way), so the coords' own extent is used.
    """
    origin = torch.as_tensor(aabb_min, dtype=torch.float32, device=points.device).expand(3)
    size = torch.as_tensor(voxel_size, dtype=torch.float32, device=points.device).expand(3)
    grid = ((points - origin) / size).reshape(1, -1, 3)
    coords = coords.long()
    shape = (1, attrs.shape[1], *(coords.amax(dim=0) + 1).tolist()) if len(coords) else (1, attrs.shape[1], 1, 1, 1)
    batched = torch.cat([torch.zeros_like(coords[:, :1]), coords], dim=1)
    sample = grid_sample_3d_cpu if grid_sample_cpu.applies(attrs, grid) else grid_sample_3d
    return sample(attrs, batched, shape, grid)[0]


def pack_pbr_textures(
    attributes: torch.Tensor, coverage: torch.Tensor, layout: Mapping[str, Sequence[int]] | None = None
) -> PBRTextures:
    """Quantise, inpaint the uncovered texels and pack the glTF PBR textures, as ``to_glb`` does.

    ``uint8`` is ``clip(x · 255, 0, 255)`` truncated, as upstream. ``cv2.inpaint`` (Telea) fills every texel
    outside ``coverage`` from its covered neighbours, radius 3 for the base colour and 1 for metallic, roughness
    and alpha. Upstream inpaints those three one channel at a time; here they go through one 3-channel call,
    which OpenCV computes channel by channel with the same weights (identical bytes, faster: benchmarks/glb_bake.py);
    the two calls run in two threads.

    Args:
        attributes (`torch.Tensor`): ``[T, T, C]`` float attributes in ``[0, 1]`` (:func:`sample_texture_attributes`).
        coverage (`torch.Tensor`): ``[T, T]`` bool, the texels a face covers.
        layout (`Mapping[str, Sequence[int]]`, *optional*): ``[start, stop)`` channels of ``base_color``,
            ``metallic``, ``roughness`` and ``alpha``; defaults to :data:`trellis2_npu.geometry.mesh_io.PBR_LAYOUT`.

    Returns:
        `PBRTextures`: ``base_color_rgba [T, T, 4]``, ``metallic_roughness [T, T, 3]`` (0, roughness, metallic) and
        ``coverage [T, T]``, host numpy arrays.
    """
    layout = layout or PBR_LAYOUT
    # in torch, in place: NumPy's clip of fresh float temporaries took up to a second here (page faults)
    quantised = (attributes.detach().to("cpu", torch.float32) * 255).clamp_(0, 255).to(torch.uint8).numpy()
    covered = coverage.detach().cpu().numpy().astype(bool)
    holes = (~covered).astype(np.uint8)

    def channels(*names: str) -> np.ndarray:
        return np.ascontiguousarray(np.concatenate([quantised[..., slice(*layout[name])] for name in names], -1))

    # the two inpaints are independent and OpenCV releases the GIL: side by side they take the longer one's time
    with ThreadPoolExecutor(max_workers=2) as pool:
        base = pool.submit(cv2.inpaint, channels("base_color"), holes, INPAINT_RADIUS_BASE_COLOR, cv2.INPAINT_TELEA)
        rest = pool.submit(
            cv2.inpaint, channels("metallic", "roughness", "alpha"), holes, INPAINT_RADIUS_OTHER, cv2.INPAINT_TELEA
        )
    base_color = base.result()
    metallic, roughness, alpha = np.moveaxis(rest.result(), -1, 0)
    return PBRTextures(
        base_color_rgba=np.concatenate([base_color, alpha[..., None]], axis=-1),
        metallic_roughness=np.stack([np.zeros_like(metallic), roughness, metallic], axis=-1),
        coverage=covered,
    )


def _snap(
    points: torch.Tensor, vertices: torch.Tensor, faces: torch.Tensor, snap_distance: float | None
) -> torch.Tensor:
    """Closest points on the mesh; with ``snap_distance``, a bounded search first and the unbounded one for the rest."""
    if snap_distance is None:
        return closest_points_on_mesh(points, vertices, faces).points
    if points.device.type == "cpu" and points.dtype == vertices.dtype == torch.float32:
        near = closest_points_within_cpu(points, vertices, faces, snap_distance)
    else:
        near = closest_points_within(points, vertices, faces, snap_distance)
    far = (near.face_ids < 0).nonzero().squeeze(1)
    if not len(far):
        return near.points
    return near.points.index_copy(0, far, closest_points_on_mesh(points[far], vertices, faces).points)


def bake_pbr_textures(
    uv_mesh: UVMesh,
    reference: tuple[torch.Tensor, torch.Tensor] | None,
    voxels: Voxels,
    texture_size: int,
    layout: Mapping[str, Sequence[int]] | None = None,
    snap_distance: float | None = None,
) -> PBRTextures:
    """Bake the voxel PBR attributes into the glTF textures of an unwrapped mesh (``to_glb``'s baking steps).

    :func:`sample_texture_attributes` then :func:`pack_pbr_textures`; see them for the arguments. For the decoder's
    ``MeshWithVoxel``: ``voxel_size = 1 / res``, ``aabb_min = [-0.5] * 3``.
    """
    attributes, coverage = sample_texture_attributes(uv_mesh, reference, voxels, texture_size, snap_distance)
    return pack_pbr_textures(attributes, coverage, layout)


# ----------------------------------------------------------------------------------------------------------------
# Checks


def check_texture_size(texture_size: int) -> None:
    """``ValueError`` unless ``texture_size`` is a power of two up to 8192 (the export's range)."""
    if (
        isinstance(texture_size, bool)
        or not isinstance(texture_size, int)
        or texture_size < 1
        or texture_size & (texture_size - 1)
        or texture_size > MAX_TEXTURE_SIZE
    ):
        raise ValueError(
            f"texture_size must be a power of two up to {MAX_TEXTURE_SIZE} (e.g. 2048 or 4096), got {texture_size!r}"
        )
