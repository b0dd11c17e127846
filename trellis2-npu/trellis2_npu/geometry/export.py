"""The decoded mesh + voxel attributes → a textured GLB, upstream's ``to_glb`` without CUDA.

Adapted from: microsoft/TRELLIS.2 @ 5565d240, ``o-voxel/o_voxel/postprocess.py::to_glb``.
Steps, each timed (:class:`deliverykit.timing.Stopwatch`) under its name:

1. ``fill_holes`` — close boundary loops shorter than 3e-2 (:func:`trellis2_npu.geometry.mesh_repair.fill_holes`,
   cumesh's
   ``fill_holes`` in upstream);
2. ``remesh`` (with ``remesh=True``, as upstream's ``example.py``/``app.py`` pass and ``inference.py``/``app.py``
   here by default; the function's default stays upstream ``to_glb``'s, off) — rebuild the surface as the closed
   narrow-band dual-contouring surface ``remesh_band`` voxels from it, inner shells dropped
   (:func:`trellis2_npu.geometry.remesh.remesh_narrow_band`, CuMesh's ``remesh_narrow_band_dc`` in upstream);
3. ``simplify`` — clean and simplify to ``decimation_target`` faces
   (:func:`trellis2_npu.geometry.mesh_repair.clean_and_simplify`, upstream's simplify ×3 → clean → simplify → clean; a
   remeshed surface: :func:`trellis2_npu.geometry.mesh_repair.simplify_remeshed`, upstream's simplify with QEM's folds
   dropped whole, one clean-up that repairs what the simplification breaks, rerun until the face count is within
   ``mesh_repair.FACE_BUDGET_TOLERANCE`` of ``decimation_target``);
4. ``unwrap`` — UV charts (the face groups' pieces projected onto their planes, :mod:`trellis2_npu.geometry.uv_charts`)
   packed by xatlas (:func:`trellis2_npu.geometry.texture_bake.unwrap_uv`);
5. ``bake`` — each texel's 3D point, snapped to the closest point of the mesh *before* simplification (so the
   simplified geometry does not shift the colours), samples the voxel attributes trilinearly; gaps inpainted
   (:func:`trellis2_npu.geometry.texture_bake.bake_pbr_textures`);
6. ``assemble`` — upstream's PBR material, axes and UV flip (:mod:`trellis2_npu.geometry.glb`);
7. ``mesh_qa`` — not upstream's: what ``stats["mesh_qa"]`` says of the exported surface (boundary and non-manifold
   edges, components, winding, watertight, genus: :func:`trellis2_npu.geometry.mesh_repair.mesh_quality`).

The texturing pipeline's ``postprocess_mesh`` is :func:`texture_mesh`: the given mesh is kept as it is (no hole
filling, remesh or simplification, as upstream), then steps 4-7 (``unwrap``, ``bake``, ``assemble``, double-sided,
``mesh_qa``).

Changes: the remesh drops the band's inward-facing shells (see :mod:`trellis2_npu.geometry.remesh`); the GPU chart
clustering before xatlas is not ported: faces are grouped by normal axis and place, and each connected piece of a
group is one chart, flattened by projection (xatlas' own charts only for the few pieces that fold over themselves).
Writing the file and the preview are the caller's (:func:`trellis2_npu.geometry.glb.write_glb`,
:mod:`trellis2_npu.geometry.render_preview`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import trimesh

from deliverykit.errors import DeliveryError, ExitCode
from deliverykit.timing import Stopwatch

from . import glb, mesh_repair, texture_bake
from .mesh_io import PBR_LAYOUT
from .remesh import MAX_BAND, MIN_BAND, remesh_narrow_band

MAX_HOLE_PERIMETER = 3e-2  # upstream's, in the [-0.5, 0.5]³ box
AABB_MIN = (-0.5, -0.5, -0.5)  # the decoder's box (MeshWithVoxel.origin)
DEFAULT_DECIMATION_TARGET = 500_000  # app.py's (example.py: 1 000 000)
DEFAULT_TEXTURE_SIZE = 2048  # app.py's (example.py: 4096)
MIN_DECIMATION_TARGET = 4  # a tetrahedron: the smallest closed surface
MAX_TEXTURE_SIZE = 8192
DEFAULT_REMESH_BAND = 1.0  # upstream's example.py/app.py: remesh_band=1, remesh_project=0
DEFAULT_REMESH_PROJECT = 0.0
SNAP_MARGIN_VOXELS = 0.75  # the bake's bounded snap of a remeshed surface searches remesh_band + this far


class ExportOptionsError(DeliveryError):
    """An export option out of range or not available; exit code 2 like any bad argument."""

    exit_code = ExitCode.USAGE


@dataclasses.dataclass
class GlbExport:
    """The assembled asset (glTF frame) and how it was made."""

    mesh: trimesh.Trimesh
    stages_ms: dict[str, float]
    stats: dict[str, Any]


def check_export_options(
    decimation_target: int,
    texture_size: int,
    remesh: bool = True,
    remesh_band: float = DEFAULT_REMESH_BAND,
    remesh_project: float = DEFAULT_REMESH_PROJECT,
) -> None:
    """Raise :class:`ExportOptionsError` naming the flag, the value and what is accepted."""
    if remesh and not MIN_BAND <= remesh_band <= MAX_BAND:  # NaN fails both
        raise ExportOptionsError(
            f"--remesh-band {remesh_band}: need {MIN_BAND:g} to {MAX_BAND:g} voxels "
            f"(default {DEFAULT_REMESH_BAND:g}, as upstream)"
        )
    if remesh and not 0 <= remesh_project <= 1:
        raise ExportOptionsError(
            f"--remesh-project {remesh_project}: need a fraction from 0 to 1 (default {DEFAULT_REMESH_PROJECT:g}, "
            "as upstream: no projection)"
        )
    if decimation_target < MIN_DECIMATION_TARGET:
        raise ExportOptionsError(
            f"--faces {decimation_target}: need at least {MIN_DECIMATION_TARGET} faces "
            f"(default {DEFAULT_DECIMATION_TARGET}, as upstream's app.py)"
        )
    if texture_size < 1 or texture_size & (texture_size - 1) or texture_size > MAX_TEXTURE_SIZE:
        raise ExportOptionsError(
            f"--texture-size {texture_size}: need a power of two up to {MAX_TEXTURE_SIZE} (e.g. 1024, 2048, 4096)"
        )


@dataclasses.dataclass(frozen=True)
class ExportOptions:
    """What :func:`to_glb` is asked for beside the mesh: the GLB export flags (``--faces`` ...)."""

    decimation_target: int = DEFAULT_DECIMATION_TARGET
    texture_size: int = DEFAULT_TEXTURE_SIZE
    remesh: bool = False
    remesh_band: float = DEFAULT_REMESH_BAND
    remesh_project: float = DEFAULT_REMESH_PROJECT

    def check(self) -> None:
        """:func:`check_export_options`: before minutes of pipeline, not after."""
        check_export_options(**dataclasses.asdict(self))


def to_glb(
    vertices: torch.Tensor,
    faces: torch.Tensor,
    attrs: torch.Tensor,
    coords: torch.Tensor,
    resolution: int,
    decimation_target: int = DEFAULT_DECIMATION_TARGET,
    texture_size: int = DEFAULT_TEXTURE_SIZE,
    remesh: bool = False,
    remesh_band: float = DEFAULT_REMESH_BAND,
    remesh_project: float = DEFAULT_REMESH_PROJECT,
    layout: dict[str, list[int]] | None = None,
) -> GlbExport:
    """Fill holes, simplify, unwrap, bake and assemble the textured mesh (not written: see :func:`glb.write_glb`).

    Args:
        vertices (`torch.Tensor`): ``[V, 3]`` in the ``[-0.5, 0.5]³`` box (upstream ``MeshWithVoxel.vertices``).
        faces (`torch.Tensor`): ``[F, 3]`` vertex indices.
        attrs (`torch.Tensor`): ``[N, 6]`` voxel attributes in ``[0, 1]``, laid out as ``layout``.
        coords (`torch.Tensor`): ``[N, 3]`` voxel indices at ``resolution``.
        resolution (`int`): voxels per side of the box (voxel size ``1 / resolution``).
        decimation_target (`int`, *optional*, defaults to 500 000): face budget of the simplification (the last
            clean-up's hole filling may add a few faces, as upstream's).
        texture_size (`int`, *optional*, defaults to 2048): side of both textures, a power of two ≤ 8192.
        remesh (`bool`, *optional*, defaults to `False`): upstream's narrow-band dual-contouring remesh.
        remesh_band (`float`, *optional*, defaults to 1): the remeshed surface's offset, in voxels (0.25 to 4).
        remesh_project (`float`, *optional*, defaults to 0): how far (0 to 1) remeshed vertices move back to the
            input surface.
        layout (`dict`, *optional*): channel ranges of ``attrs``; default
        :data:`trellis2_npu.geometry.mesh_io.PBR_LAYOUT`.
    """
    check_export_options(decimation_target, texture_size, remesh, remesh_band, remesh_project)
    vertices = vertices.detach().to("cpu", torch.float32)
    faces = faces.detach().to("cpu", torch.long)
    glb.check_mesh(vertices.numpy(), faces.numpy())
    watch = Stopwatch()  # every step runs on the host

    with watch.stage("fill_holes"):
        filled_vertices, filled_faces = mesh_repair.fill_holes(vertices, faces, MAX_HOLE_PERIMETER)
    surface_vertices, surface_faces, remesh_stats = filled_vertices, filled_faces, {}
    if remesh:
        with watch.stage("remesh"):
            surface_vertices, surface_faces, remesh_stats = remesh_narrow_band(
                filled_vertices, filled_faces, resolution, band=remesh_band, project_back=remesh_project
            )
    with watch.stage("simplify"):
        simplify = mesh_repair.simplify_remeshed if remesh else mesh_repair.clean_and_simplify
        simple_vertices, simple_faces = simplify(surface_vertices, surface_faces, decimation_target)
    glb.check_mesh(simple_vertices.numpy(), simple_faces.numpy())
    with watch.stage("unwrap"):
        uv_mesh = texture_bake.unwrap_uv(simple_vertices, simple_faces, texture_size)
    with watch.stage("bake"):
        textures = texture_bake.bake_pbr_textures(
            uv_mesh,
            reference=(filled_vertices, filled_faces),
            voxels=texture_bake.Voxels(coords.detach().cpu(), attrs.detach().cpu(), 1.0 / resolution, AABB_MIN),
            texture_size=texture_size,
            layout=layout or PBR_LAYOUT,
            # the remeshed surface lies about remesh_band voxels outside the reference (measured: band 1, texels
            # 0.4-1.5 voxels away, median 1.0): search that far; the few texels beyond search everywhere
            snap_distance=(remesh_band + SNAP_MARGIN_VOXELS) / resolution if remesh else None,
        )
    with watch.stage("assemble"):
        mesh = _assemble(uv_mesh, textures, simple_vertices, simple_faces, remesh=remesh)
    with watch.stage("mesh_qa"):
        quality = mesh_repair.mesh_quality(simple_vertices, simple_faces)  # the surface, before the UV seams split it
    stats = {
        "input_vertices": int(vertices.shape[0]),
        "input_faces": int(faces.shape[0]),
        "filled_faces": len(filled_faces),
        "simplified_faces": len(simple_faces),
        "faces": len(mesh.faces),
        "vertices": len(mesh.vertices),
        "texture_size": texture_size,
        "texel_coverage": float(textures.coverage.mean()),
        **texture_bake.atlas_stats(uv_mesh, texture_size),
        "decimation_target": decimation_target,
        "mesh_qa": quality,
        "remesh": remesh,
        **(
            {
                "remesh_band": remesh_band,
                "remesh_project": remesh_project,
                **{f"remesh_{key}": value for key, value in remesh_stats.items()},
            }
            if remesh
            else {}
        ),
    }
    return GlbExport(mesh=mesh, stages_ms=watch.stages, stats=stats)


def texture_mesh(
    vertices: torch.Tensor,
    faces: torch.Tensor,
    attrs: torch.Tensor,
    coords: torch.Tensor,
    resolution: int,
    texture_size: int = DEFAULT_TEXTURE_SIZE,
    layout: dict[str, list[int]] | None = None,
) -> GlbExport:
    """Unwrap, bake and assemble a given mesh, its faces and positions kept (the texturing pipeline's export).

    Adapted from: microsoft/TRELLIS.2 @ 5565d240, ``trellis2/pipelines/trellis2_texturing.py::postprocess_mesh``
    (cumesh ``uv_unwrap``, nvdiffrast rasterisation, FlexGEMM ``grid_sample_3d``, ``cv2.inpaint``). Changes: xatlas
    charts (:func:`trellis2_npu.geometry.texture_bake.unwrap_uv`, which drops degenerate faces as cumesh does),
    area-weighted
    normals welded by position instead of trimesh's.

    Args:
        vertices (`torch.Tensor`): ``[V, 3]`` in the ``[-0.5, 0.5]³`` box, z up (upstream's ``preprocess_mesh``).
        faces (`torch.Tensor`): ``[F, 3]`` vertex indices.
        attrs (`torch.Tensor`): ``[N, C]`` decoded voxel attributes in ``[0, 1]``, laid out as ``layout``.
        coords (`torch.Tensor`): ``[N, 3]`` voxel indices at ``resolution``.
        resolution (`int`): voxels per side of the box.
        texture_size (`int`, *optional*, defaults to 2048): side of both textures, a power of two <= 8192.
        layout (`dict`, *optional*): channel ranges of ``attrs``; default
        :data:`trellis2_npu.geometry.mesh_io.PBR_LAYOUT`.
    """
    check_export_options(MIN_DECIMATION_TARGET, texture_size, remesh=False)
    vertices = vertices.detach().to("cpu", torch.float32)
    faces = faces.detach().to("cpu", torch.long)
    glb.check_mesh(vertices.numpy(), faces.numpy())
    watch = Stopwatch()
    with watch.stage("unwrap"):
        uv_mesh = texture_bake.unwrap_uv(vertices, faces, texture_size)
    with watch.stage("bake"):
        textures = texture_bake.bake_pbr_textures(
            uv_mesh,
            reference=None,  # no snap: upstream samples at the rasterised points, on this very mesh
            voxels=texture_bake.Voxels(coords.detach().cpu(), attrs.detach().float().cpu(), 1.0 / resolution, AABB_MIN),
            texture_size=texture_size,
            layout=layout or PBR_LAYOUT,
        )
    with watch.stage("assemble"):
        mesh = _assemble(uv_mesh, textures, vertices, faces, remesh=False)  # double-sided, as upstream's texturing
    with watch.stage("mesh_qa"):
        quality = mesh_repair.mesh_quality(vertices, faces)  # the given mesh, kept as it is
    stats = {
        "input_vertices": int(vertices.shape[0]),
        "input_faces": int(faces.shape[0]),
        "faces": len(mesh.faces),
        "vertices": len(mesh.vertices),
        "texture_size": texture_size,
        "texel_coverage": float(textures.coverage.mean()),
        **texture_bake.atlas_stats(uv_mesh, texture_size),
        "mesh_qa": quality,
        "remesh": False,
    }
    return GlbExport(mesh=mesh, stages_ms=watch.stages, stats=stats)


def _assemble(
    uv_mesh: Any, textures: Any, vertices: torch.Tensor, faces: torch.Tensor, *, remesh: bool
) -> trimesh.Trimesh:
    """The textured trimesh: the surface's smooth normals (of ``vertices``/``faces``, before the UV seams split
    them) at the unwrapped vertices; single-sided after a remesh, double-sided otherwise (as upstream)."""
    normals = glb.smooth_vertex_normals(vertices.numpy(), faces.numpy())
    return glb.build_textured_mesh(
        uv_mesh.vertices.numpy(),
        uv_mesh.faces.numpy(),
        uv_mesh.uvs.numpy(),
        textures.base_color_rgba,
        textures.metallic_roughness,
        vertex_normals=normals[uv_mesh.vmapping.numpy()],
        remesh=remesh,
    )
