"""A look at the exported asset: four views around it, rendered headless on the CPU, as one 2×2 PNG.

People judge a 3D asset by looking at it, and upstream's previews need nvdiffrast on CUDA. This is a small
rasteriser in vectorised torch: orthographic cameras on a ring at 20° elevation (y up, the GLB's frame), a z-buffer
built with ``scatter_reduce``, the base colour read from the texture through the UVs (nearest texel) and Lambert
shading from a light above the camera, both sides lit (the GLB is double-sided). It renders what the GLB holds: the
trimesh object that :mod:`trellis2_npu.glb` writes, in its frame and UV convention.
"""

from __future__ import annotations

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
    tri = screen[faces]  # [F, 3, 2]
    low = torch.ceil(tri.amin(dim=1) - 0.5).clamp(0, size - 1).long()
    high = torch.floor(tri.amax(dim=1) - 0.5).clamp(-1, size - 1).long()
    extent = (high - low + 1).clamp_min(0)
    counts = extent[:, 0] * extent[:, 1]
    a, b, c = tri.unbind(dim=1)
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


def render_view(
    mesh: trimesh.Trimesh, yaw_deg: float, elevation_deg: float = ELEVATION_DEG, size: int = 512
) -> np.ndarray:
    """One ``[size, size, 3]`` uint8 view of ``mesh``, framed on its bounding sphere."""
    vertices = torch.as_tensor(np.array(mesh.vertices), dtype=torch.float64)
    faces = torch.as_tensor(np.array(mesh.faces), dtype=torch.long)
    center = (vertices.amin(0) + vertices.amax(0)) / 2
    radius = float((vertices - center).norm(dim=1).max()) * MARGIN or 1.0
    basis = camera_basis(yaw_deg, elevation_deg)
    view = (vertices - center) @ basis.T  # right, up, towards the camera
    screen = torch.stack([(view[:, 0] / radius + 1) * size / 2, (1 - view[:, 1] / radius) * size / 2], 1)
    face_id, bary = rasterize(screen.float(), view[:, 2].float(), faces, size)

    image = torch.full((size * size, 3), BACKGROUND, dtype=torch.float64)
    hit = face_id >= 0
    corners = faces[face_id[hit]]  # [H, 3]
    weights = bary[hit, :, None].double()
    normals = torch.from_numpy(smooth_vertex_normals(np.asarray(mesh.vertices), np.asarray(mesh.faces)))
    normal = (normals[corners] @ basis.T * weights).sum(1)
    normal = normal / normal.norm(dim=1, keepdim=True).clamp_min(1e-12)
    normal = normal * torch.where(normal[:, 2:] < 0, -1.0, 1.0)  # double-sided: the side facing the camera
    light = torch.tensor([-0.3, 0.5, 1.0], dtype=torch.float64)
    shade = AMBIENT + (1 - AMBIENT) * (normal @ (light / light.norm())).clamp_min(0)
    image[hit] = base_color(mesh, corners, weights) * shade[:, None]
    return (image.reshape(size, size, 3).clamp(0, 1) * 255 + 0.5).to(torch.uint8).numpy()


def base_color(mesh: trimesh.Trimesh, corners: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``[H, 3]`` base colour in ``[0, 1]`` at the hit points: the texture's nearest texel, else mid grey."""
    visual = mesh.visual
    texture = getattr(getattr(visual, "material", None), "baseColorTexture", None)
    uv = getattr(visual, "uv", None)
    if texture is None or uv is None:
        return torch.full((len(corners), 3), 0.7, dtype=torch.float64)
    pixels = torch.as_tensor(np.array(texture.convert("RGB")), dtype=torch.float64) / 255
    height, width = pixels.shape[:2]
    uv = (torch.as_tensor(np.array(uv), dtype=torch.float64)[corners] * weights).sum(1)
    # trimesh keeps OpenGL's v (0 at the image's bottom row); the GLB writer flips it for glTF.
    column = (uv[:, 0] * width).floor().long().clamp(0, width - 1)
    row = ((1 - uv[:, 1]) * height).floor().long().clamp(0, height - 1)
    return pixels[row, column]


def render_preview(mesh: trimesh.Trimesh, size: int = 512) -> Image.Image:
    """Four views around ``mesh`` (yaw 30°, 120°, 210°, 300°) as a ``2·size × 2·size`` RGB grid."""
    grid = Image.new("RGB", (2 * size, 2 * size))
    for index, yaw in enumerate(VIEW_YAWS_DEG):
        view = Image.fromarray(render_view(mesh, yaw, size=size))
        grid.paste(view, ((index % 2) * size, (index // 2) * size))
    return grid
