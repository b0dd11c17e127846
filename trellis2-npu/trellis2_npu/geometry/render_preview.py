"""A look at the exported asset: four views around it, rendered headless on the CPU, as one 2×2 PNG.

People judge a 3D asset by looking at it, and upstream's previews need nvdiffrast on CUDA. This is a small
rasteriser in vectorised torch: orthographic cameras on a ring at 20° elevation (y up, the GLB's frame), a z-buffer
built with ``scatter_reduce``, the base colour read from the texture through the UVs (nearest texel) and Lambert
shading from a light above the camera, both sides lit (the GLB is double-sided). It renders what the GLB holds: the
trimesh object that :mod:`trellis2_npu.geometry.glb` writes, in its frame and UV convention. The mesh is prepared once
(:func:`prepare_scene`: normals, UVs, the material's textures) for any number of views: the four of ``preview.png``
and the frames of the turntable video (:mod:`trellis2_npu.geometry.turntable`), which shares :func:`rasterize_view`.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch
import trimesh
from PIL import Image

from .glb import smooth_vertex_normals

BACKGROUND = 0.94  # light grey: dark and white objects both stand out
AMBIENT = 0.35
MAX_CANDIDATES = 1 << 22  # (face, pixel) pairs tested per chunk: ~200 MB of temporaries
VIEW_YAWS_DEG = (30.0, 120.0, 210.0, 300.0)
ELEVATION_DEG = 20.0
MARGIN = 1.08  # the bounding sphere's radius over half the image side
LIGHT = (-0.3, 0.5, 1.0)  # camera frame: from the upper left, behind the viewer


def camera_basis(yaw_deg: float, elevation_deg: float) -> torch.Tensor:
    """Rows right, up, towards-camera of a camera looking at the origin from ``yaw`` around y, ``elevation``."""
    yaw, pitch = math.radians(yaw_deg), math.radians(elevation_deg)
    back = torch.tensor([math.sin(yaw) * math.cos(pitch), math.sin(pitch), math.cos(yaw) * math.cos(pitch)])
    right = torch.linalg.cross(torch.tensor([0.0, 1.0, 0.0]), back)
    right = right / right.norm()
    up = torch.linalg.cross(back, right)
    return torch.stack([right, up, back]).double()


def rasterize(screen: torch.Tensor, depth: torch.Tensor, faces: torch.Tensor, size: int) -> tuple[torch.Tensor, ...]:
    """Nearest face per pixel: ``(face_id [P] (−1 = empty), barycentrics [P, 3])`` with ``P = size²``.

    ``screen`` ``[V, 2]`` is in pixels (pixel ``(i, j)`` covers ``[i, i+1) × [j, j+1)``, sampled at its centre),
    ``depth`` ``[V]`` grows towards the camera. Each face is tested against the pixel centres of its bounding box,
    in chunks of at most :data:`MAX_CANDIDATES` pairs; a chunk's winners overwrite earlier ones only where they are
    nearer, so the result does not depend on the chunking (exact depth ties aside).
    """
    pixels = size * size
    zbuf = torch.full((pixels,), -math.inf, dtype=depth.dtype)
    face_id = torch.full((pixels,), -1, dtype=torch.long)
    bary = torch.zeros(pixels, 3, dtype=depth.dtype)
    a, b, c = screen[faces].unbind(dim=1)  # [F, 2] each
    # elementwise min/max of the three corners: a third of the time of amin/amax over the strided corner axis
    low = torch.ceil(torch.minimum(torch.minimum(a, b), c) - 0.5).clamp(0, size - 1).long()
    high = torch.floor(torch.maximum(torch.maximum(a, b), c) - 0.5).clamp(-1, size - 1).long()
    extent = (high - low + 1).clamp_min(0)
    counts = extent[:, 0] * extent[:, 1]
    area = (b[:, 0] - a[:, 0]) * (c[:, 1] - a[:, 1]) - (b[:, 1] - a[:, 1]) * (c[:, 0] - a[:, 0])
    counts[area.abs() < 1e-12] = 0
    visible = torch.nonzero(counts).squeeze(1)
    budget = torch.cumsum(counts[visible], 0)
    start = 0
    while start < len(visible):
        stop = int(torch.searchsorted(budget, budget[start] - counts[visible[start]] + MAX_CANDIDATES, right=True))
        chunk = visible[start : max(stop, start + 1)]
        start = max(stop, start + 1)
        n = counts[chunk]
        owner = torch.repeat_interleave(torch.arange(len(chunk)), n)
        local = torch.arange(int(n.sum())) - torch.repeat_interleave(torch.cumsum(n, 0) - n, n)
        width = extent[chunk, 0][owner]
        px = low[chunk, 0][owner] + local % width
        py = low[chunk, 1][owner] + local // width
        point = torch.stack([px, py], dim=1).to(screen.dtype) + 0.5
        fa, fb, fc = a[chunk][owner], b[chunk][owner], c[chunk][owner]

        def edge(p, q, r):
            return (q[:, 0] - p[:, 0]) * (r[:, 1] - p[:, 1]) - (q[:, 1] - p[:, 1]) * (r[:, 0] - p[:, 0])

        # Barycentrics as signed sub-areas over the signed area: independent of the winding (both sides drawn).
        weights = torch.stack([edge(fb, fc, point), edge(fc, fa, point), edge(fa, fb, point)], 1)
        weights = weights / area[chunk][owner, None]
        inside = (weights >= -1e-9).all(dim=1)
        face = chunk[owner[inside]]
        weights = weights[inside]
        pid = (py * size + px)[inside]
        z = (weights * depth[faces[face]]).sum(dim=1)
        zbuf.scatter_reduce_(0, pid, z, reduce="amax")
        win = z >= zbuf[pid]
        face_id[pid[win]] = face[win]
        bary[pid[win]] = weights[win]
    return face_id, bary


@dataclasses.dataclass(frozen=True)
class Scene:
    """The GLB's mesh as tensors, prepared once for any number of views (normals and textures cost more than a view).

    ``textures`` maps a glTF material slot (``baseColorTexture``, ``metallicRoughnessTexture``) to its ``[H, W, 3]``
    texels in ``[0, 1]`` times the material's factor; slots the material lacks are absent (no UVs: none).
    """

    vertices: torch.Tensor  # [V, 3] float64, centred on the bounding box
    faces: torch.Tensor  # [F, 3] long
    normals: torch.Tensor  # [V, 3] float64, smooth (welded on UV seams)
    radius: float  # the bounding sphere's, times MARGIN
    uv: torch.Tensor | None  # [V, 2] float64, trimesh's OpenGL v
    textures: dict[str, torch.Tensor]


@dataclasses.dataclass(frozen=True)
class Fragments:
    """The surface one view sees: ``hit`` ``[size²]`` marks the covered pixels, the rest is per covered pixel."""

    hit: torch.Tensor
    corners: torch.Tensor  # [H, 3] vertex indices of the visible face
    weights: torch.Tensor  # [H, 3, 1] float64 barycentrics
    normal: torch.Tensor  # [H, 3] unit normal in the camera frame (right, up, towards the camera), facing the camera


def prepare_scene(mesh: trimesh.Trimesh) -> Scene:
    """What every view of ``mesh`` shares: centred vertices, smooth normals, UVs and the material's textures."""
    vertices = torch.as_tensor(np.array(mesh.vertices), dtype=torch.float64)
    faces = torch.as_tensor(np.array(mesh.faces), dtype=torch.long)
    center = (vertices.amin(0) + vertices.amax(0)) / 2
    radius = float((vertices - center).norm(dim=1).max()) * MARGIN or 1.0
    normals = torch.from_numpy(smooth_vertex_normals(np.asarray(mesh.vertices), np.asarray(mesh.faces)))
    uv = getattr(mesh.visual, "uv", None)
    return Scene(
        vertices=vertices - center,
        faces=faces,
        normals=normals,
        radius=radius,
        uv=None if uv is None else torch.as_tensor(np.array(uv), dtype=torch.float64),
        textures={} if uv is None else material_textures(getattr(mesh.visual, "material", None)),
    )


def material_textures(material: object) -> dict[str, torch.Tensor]:
    """The PBR material's textures as ``[H, W, 3]`` float64 in ``[0, 1]``, each times its factors, as glTF defines.

    ``metallicRoughnessTexture`` keeps glTF's packing: roughness in G, metallic in B (factors ``None`` mean 1).
    """
    textures = {}
    base = getattr(material, "baseColorTexture", None)
    if base is not None:
        factor = getattr(material, "baseColorFactor", None)  # trimesh keeps it as uint8 RGBA
        scale = [1.0, 1.0, 1.0] if factor is None else np.asarray(factor, dtype=np.float64)[:3] / 255
        textures["baseColorTexture"] = texels(base) * torch.as_tensor(scale, dtype=torch.float64)
    packed = getattr(material, "metallicRoughnessTexture", None)
    if packed is not None:
        factors = (getattr(material, "roughnessFactor", None), getattr(material, "metallicFactor", None))
        scale = [1.0, *(1.0 if f is None else float(f) for f in factors)]
        textures["metallicRoughnessTexture"] = texels(packed) * torch.tensor(scale, dtype=torch.float64)
    return textures


def texels(image: Image.Image) -> torch.Tensor:
    return torch.as_tensor(np.array(image.convert("RGB")), dtype=torch.float64) / 255


def rasterize_view(scene: Scene, yaw_deg: float, elevation_deg: float, size: int) -> Fragments:
    """The visible surface of ``scene`` from an orthographic camera at ``yaw``/``elevation``, framed on its sphere."""
    basis = camera_basis(yaw_deg, elevation_deg)
    view = scene.vertices @ basis.T  # right, up, towards the camera
    screen = torch.stack([(view[:, 0] / scene.radius + 1) * size / 2, (1 - view[:, 1] / scene.radius) * size / 2], 1)
    face_id, bary = rasterize(screen.float(), view[:, 2].float(), scene.faces, size)
    hit = face_id >= 0
    corners = scene.faces[face_id[hit]]
    weights = bary[hit, :, None].double()
    normal = (scene.normals[corners] @ basis.T * weights).sum(1)
    normal = normal / normal.norm(dim=1, keepdim=True).clamp_min(1e-12)
    normal = normal * torch.where(normal[:, 2:] < 0, -1.0, 1.0)  # double-sided: the side facing the camera
    return Fragments(hit=hit, corners=corners, weights=weights, normal=normal)


def sample_texture(scene: Scene, slot: str, fragments: Fragments) -> torch.Tensor | None:
    """``[H, 3]`` texels of ``slot`` at the visible points (nearest texel), or None when the mesh has none."""
    texture = scene.textures.get(slot)
    if texture is None:
        return None
    height, width = texture.shape[:2]
    uv = (scene.uv[fragments.corners] * fragments.weights).sum(1)
    # trimesh keeps OpenGL's v (0 at the image's bottom row); the GLB writer flips it for glTF.
    column = (uv[:, 0] * width).floor().long().clamp(0, width - 1)
    row = ((1 - uv[:, 1]) * height).floor().long().clamp(0, height - 1)
    return texture[row, column]


def base_color(scene: Scene, fragments: Fragments) -> torch.Tensor:
    """``[H, 3]`` base colour in ``[0, 1]`` at the visible points: the texture's nearest texel, else mid grey."""
    color = sample_texture(scene, "baseColorTexture", fragments)
    return torch.full((len(fragments.corners), 3), 0.7, dtype=torch.float64) if color is None else color


def to_uint8(image: torch.Tensor, size: int) -> np.ndarray:
    """``[size², 3]`` values in ``[0, 1]`` → a ``[size, size, 3]`` uint8 picture (rounded)."""
    return (image.reshape(size, size, 3).clamp(0, 1) * 255 + 0.5).to(torch.uint8).numpy()


def render_view(scene: Scene, yaw_deg: float, elevation_deg: float = ELEVATION_DEG, size: int = 512) -> np.ndarray:
    """One ``[size, size, 3]`` uint8 Lambert view of ``scene`` (:func:`prepare_scene`), framed on its bounding ball."""
    fragments = rasterize_view(scene, yaw_deg, elevation_deg, size)
    image = torch.full((size * size, 3), BACKGROUND, dtype=torch.float64)
    light = torch.tensor(LIGHT, dtype=torch.float64)
    shade = AMBIENT + (1 - AMBIENT) * (fragments.normal @ (light / light.norm())).clamp_min(0)
    image[fragments.hit] = base_color(scene, fragments) * shade[:, None]
    return to_uint8(image, size)


def render_preview(scene: Scene, size: int = 512) -> Image.Image:
    """Four views around ``scene`` (yaw 30°, 120°, 210°, 300°) as a ``2·size × 2·size`` RGB grid."""
    grid = Image.new("RGB", (2 * size, 2 * size))
    for index, yaw in enumerate(VIEW_YAWS_DEG):
        view = Image.fromarray(render_view(scene, yaw, size=size))
        grid.paste(view, ((index % 2) * size, (index // 2) * size))
    return grid
