"""Assembling and writing the textured GLB, with upstream's material, axes and UV conventions.

Adapted from: microsoft/TRELLIS.2 @ 5565d240, ``o-voxel/o_voxel/postprocess.py::to_glb`` (its last two steps,
"Texture Post-Processing & Material Construction" and "Coordinate System Conversion"), exported as ``example.py``
does (``glb.export(path, extension_webp=True)``). What a viewer sees therefore matches upstream's asset:

- one PBR material: ``baseColorTexture`` = RGBA (base colour + alpha), ``metallicRoughnessTexture`` = (0,
  roughness, metallic) in (R, G, B) as glTF packs them, both factors 1, ``alphaMode`` ``OPAQUE``;
- ``doubleSided = not remesh``: without remeshing the surface is the decoder's open dual-grid surface, whose
  faces are not consistently oriented, so both sides must be drawn;
- axes (x, y, z) → (x, z, −y): TRELLIS.2's frame is z-up, glTF's is y-up;
- UV v → 1 − v: the bake's texel row grows with v (upstream's nvdiffrast raster), trimesh keeps OpenGL's
  bottom-up v and flips it back when writing, so the file holds the bake's v as glTF's top-down image v.

Changes: the mesh is checked (non-empty, finite, indices in range) before anything is written, and the file is
written atomically (:func:`deliverykit.files.atomic_path`): a failed export leaves no partial GLB.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import trimesh
from PIL import Image

from deliverykit.errors import DeliveryError, ExitCode
from deliverykit.files import atomic_path

ALPHA_MODE = "OPAQUE"  # upstream's choice: the alpha channel is baked, but viewers ignore it


class MeshExportError(DeliveryError):
    """The mesh cannot become a GLB (no faces, NaN, bad indices); exit code 7, like a mesh without faces."""

    exit_code = ExitCode.NUMERICS


@dataclasses.dataclass(frozen=True)
class GlbStats:
    """What the written GLB holds: the figures ``report.json`` and the README quote."""

    faces: int
    vertices: int
    texture_size: int
    file_bytes: int


def to_gltf_frame(points: np.ndarray) -> np.ndarray:
    """TRELLIS.2's z-up (x, y, z) → glTF's y-up (x, z, −y); for positions and normals alike."""
    return np.stack([points[:, 0], points[:, 2], -points[:, 1]], axis=1)


def build_textured_mesh(
    vertices: np.ndarray,
    faces: np.ndarray,
    uvs: np.ndarray,
    base_color_rgba: np.ndarray,
    metallic_roughness: np.ndarray,
    vertex_normals: np.ndarray | None = None,
    remesh: bool = False,
) -> trimesh.Trimesh:
    """A ``trimesh.Trimesh`` in the glTF frame with upstream's PBR material.

    Args:
        vertices (`np.ndarray`): ``[V, 3]`` positions in TRELLIS.2's frame (the ``[-0.5, 0.5]³`` box, z up).
        faces (`np.ndarray`): ``[F, 3]`` vertex indices.
        uvs (`np.ndarray`): ``[V, 2]`` in ``[0, 1]``, the bake's convention (texel row ``i`` ↔ ``v = (i + 0.5)/T``).
        base_color_rgba (`np.ndarray`): ``[T, T, 4]`` uint8, base colour and alpha.
        metallic_roughness (`np.ndarray`): ``[T, T, 3]`` uint8, (0, roughness, metallic).
        vertex_normals (`np.ndarray`, *optional*): ``[V, 3]`` in TRELLIS.2's frame; computed by viewers if absent.
        remesh (`bool`, *optional*, defaults to `False`): whether the surface was remeshed (then single-sided).
    """
    vertices = np.asarray(vertices, dtype=np.float64)
    faces = np.asarray(faces, dtype=np.int64)
    uvs = np.asarray(uvs, dtype=np.float64)
    check_mesh(vertices, faces)
    if uvs.shape != (len(vertices), 2):
        raise MeshExportError(f"UVs of shape {list(uvs.shape)} for {len(vertices)} vertices; expected [V, 2]")
    for name, texture, channels in (
        ("base_color_rgba", base_color_rgba, 4),
        ("metallic_roughness", metallic_roughness, 3),
    ):
        if texture.dtype != np.uint8 or texture.ndim != 3 or texture.shape[2] != channels:
            raise MeshExportError(f"{name}: uint8 [T, T, {channels}] expected, got {texture.dtype} {texture.shape}")
    material = trimesh.visual.material.PBRMaterial(
        baseColorTexture=Image.fromarray(base_color_rgba, mode="RGBA"),
        baseColorFactor=np.array([255, 255, 255, 255], dtype=np.uint8),
        metallicRoughnessTexture=Image.fromarray(metallic_roughness, mode="RGB"),
        metallicFactor=1.0,
        roughnessFactor=1.0,
        alphaMode=ALPHA_MODE,
        doubleSided=not remesh,
    )
    flipped = uvs.copy()
    flipped[:, 1] = 1.0 - flipped[:, 1]
    return trimesh.Trimesh(
        vertices=to_gltf_frame(vertices),
        faces=faces,
        vertex_normals=None if vertex_normals is None else to_gltf_frame(np.asarray(vertex_normals, np.float64)),
        visual=trimesh.visual.TextureVisuals(uv=flipped, material=material),
        process=False,  # keep the unwrapped vertices: merging them would tear the UV seams
    )


def smooth_vertex_normals(vertices: np.ndarray, faces: np.ndarray) -> np.ndarray:
    """Area-weighted vertex normals ``[V, 3]`` (float64), equal for all vertices at one position.

    Welding by position keeps UV seams (where the unwrap duplicates vertices) from showing as creases.
    Computed here rather than by trimesh, whose sparse path needs scipy.
    """
    vertices = np.asarray(vertices, dtype=np.float64)
    _, weld = np.unique(vertices, axis=0, return_inverse=True)
    weld = weld.reshape(-1)
    corner = vertices[faces]
    face_normals = np.cross(corner[:, 1] - corner[:, 0], corner[:, 2] - corner[:, 0])  # length 2·area
    summed = np.zeros((weld.max() + 1, 3))
    np.add.at(summed, weld[faces].reshape(-1), np.repeat(face_normals, 3, axis=0))
    normals = summed[weld]
    return normals / np.maximum(np.linalg.norm(normals, axis=1, keepdims=True), 1e-12)


def check_mesh(vertices: np.ndarray, faces: np.ndarray) -> None:
    """Raise :class:`MeshExportError` unless the mesh has faces, finite vertices and indices in range."""
    if vertices.ndim != 2 or vertices.shape[1] != 3 or faces.ndim != 2 or faces.shape[1] != 3:
        raise MeshExportError(f"vertices [V, 3] and faces [F, 3] expected, got {vertices.shape} and {faces.shape}")
    if len(faces) == 0:
        raise MeshExportError(f"the mesh has no faces ({len(vertices)} vertices): nothing to export as GLB")
    if not np.isfinite(vertices).all():
        raise MeshExportError("NaN/Inf in the mesh vertices: nothing to export as GLB")
    if faces.min() < 0 or faces.max() >= len(vertices):
        raise MeshExportError(f"face indices outside [0, {len(vertices)}): the mesh is corrupt")


def encode_glb(mesh: trimesh.Trimesh, webp: bool = True) -> bytes:
    """``mesh`` as binary glTF; textures as WebP (``EXT_texture_webp``, required) like upstream's export.

    ``webp=False`` embeds PNG textures instead, for viewers without ``EXT_texture_webp``.
    """
    check_mesh(np.asarray(mesh.vertices), np.asarray(mesh.faces))
    return mesh.export(file_type="glb", extension_webp=webp)


def write_glb(path: str | os.PathLike, mesh: trimesh.Trimesh, webp: bool = True) -> GlbStats:
    """Encode ``mesh`` (:func:`encode_glb`) and write it atomically: a failure leaves no partial file."""
    data = encode_glb(mesh, webp=webp)
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    texture = mesh.visual.material.baseColorTexture
    return GlbStats(
        faces=len(mesh.faces), vertices=len(mesh.vertices), texture_size=int(texture.size[0]), file_bytes=len(data)
    )
