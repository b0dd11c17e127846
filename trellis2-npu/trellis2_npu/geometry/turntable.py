"""A turntable video of the exported asset (``preview.mp4`` beside ``preview.png``), shaded from the GLB's material.

Upstream's ``example.py`` shows its asset as a video (``render_utils.render_video``: nvdiffrast on CUDA, an HDRI
through split-sum environment shading, ACES tone mapping, gamma 2.2). This renders on any device's host with the
rasteriser of ``preview.png`` (:func:`trellis2_npu.geometry.render_preview.rasterize_view`): the asset turns once in
``frames`` steps (yaw 30° + 360°·i/frames, so the loop is seamless and frame 0 is ``preview.png``'s first view),
seen at 20° elevation, shaded from what the GLB holds (base colour, metallic and roughness through the UVs, nearest
texel, times the material's factors):

- a key light that stays with the camera, as on a studio turntable (the object turns, the lights do not):
  Cook-Torrance with the GGX distribution, Smith-Schlick geometry and Schlick's Fresnel, ``F0 = mix(0.04, base
  colour, metallic)``, Lambert diffuse for the non-metal part;
- a sky-to-ground gradient as the environment (no HDRI file): diffuse is its cosine-weighted irradiance; specular
  samples it in the mirror direction, flattened towards the irradiance as roughness grows, weighted by Karis'
  analytic fit of the split-sum BRDF term (the same split as upstream's envmap shading);
- upstream's post-processing: base colour linearised (``^2.2``), ACES tone mapping, gamma 2.2. One sample per pixel
  by default; ``supersample=2`` averages 2×2 (upstream's ssaa 2) at about three times the time per frame
  (``benchmarks/turntable.py`` measures both).

The frames are H.264 (yuv420p) at :data:`FPS` through :func:`deliverykit.video.write_mp4`.
"""

from __future__ import annotations

import math
import os

import numpy as np
import torch

from deliverykit.video import write_mp4

from .export import ExportOptionsError
from .render_preview import (
    BACKGROUND,
    ELEVATION_DEG,
    VIEW_YAWS_DEG,
    Scene,
    rasterize_view,
    sample_texture,
    to_uint8,
)
from .render_preview import base_color as sample_base_color

PREVIEW_VIDEO = "preview.mp4"  # the file's name next to preview.png
DEFAULT_FRAMES = 60
MAX_FRAMES = 600
SIZE = 256  # pixels per side (even, for yuv420p)
SUPERSAMPLE = 1  # samples per pixel side (2: upstream's ssaa, about three times the time per frame)
FPS = 15  # upstream example.py's: 60 frames are one 4-second turn
KEY_LIGHT = (-0.4, 0.6, 0.7)  # camera frame (right, up, towards the camera): upper left, in front
KEY_IRRADIANCE = 2.2  # white key light; a Lambert albedo ``a`` facing it reflects ``a · KEY_IRRADIANCE``
SKY = (0.55, 0.60, 0.70)  # linear radiance straight up (camera frame), bluish
GROUND = (0.20, 0.18, 0.16)  # straight down, warm and dark
DIELECTRIC_F0 = 0.04
PLAIN_ROUGHNESS = 0.5  # a mesh without a metallic-roughness texture
MIN_ROUGHNESS = 0.045  # keeps the GGX lobe finite: a mirror's highlight would fall between the pixels


def check_preview_frames(frames: int) -> None:
    """Raise :class:`~trellis2_npu.geometry.export.ExportOptionsError` (exit 2) unless ``frames`` is 0 or 2 to 600."""
    if frames != 0 and not 2 <= frames <= MAX_FRAMES:
        raise ExportOptionsError(
            f"--preview-frames {frames}: need 0 (no preview.mp4) or 2 to {MAX_FRAMES} frames "
            f"(default {DEFAULT_FRAMES}: one {DEFAULT_FRAMES // FPS}-second turn at {FPS} fps)"
        )


def frame_yaws(frames: int) -> list[float]:
    """The camera's yaw per frame, degrees: one turn starting at ``preview.png``'s first view, without repeating it."""
    return [VIEW_YAWS_DEG[0] + 360.0 * index / frames for index in range(frames)]


def shade(normal: torch.Tensor, base: torch.Tensor, metallic: torch.Tensor, roughness: torch.Tensor) -> torch.Tensor:
    """Linear RGB ``[H, 3]`` seen by an orthographic camera looking down −z, at unit camera-frame ``normal`` ``[H, 3]``.

    ``base`` ``[H, 3]`` is the (sRGB) base colour in ``[0, 1]``; ``metallic`` and ``roughness`` are ``[H, 1]``.
    """
    albedo = base.clamp(0, 1) ** 2.2
    metallic, roughness = metallic.clamp(0, 1), roughness.clamp(MIN_ROUGHNESS, 1)
    f0 = DIELECTRIC_F0 * (1 - metallic) + albedo * metallic
    n_v = normal[:, 2:].clamp_min(1e-4)  # the view direction is +z

    light = torch.tensor(KEY_LIGHT, dtype=normal.dtype)
    light = light / light.norm()
    half = light + torch.tensor([0.0, 0.0, 1.0], dtype=normal.dtype)
    half = half / half.norm()
    n_l = (normal @ light).clamp_min(0)[:, None]
    n_h = (normal @ half).clamp_min(0)[:, None]
    a2 = roughness**4  # GGX's alpha is roughness²
    distribution = a2 / (math.pi * (n_h**2 * (a2 - 1) + 1) ** 2)
    k = (roughness + 1) ** 2 / 8  # Smith-Schlick for analytic lights (Karis 2013)
    geometry = n_l / (n_l * (1 - k) + k) * n_v / (n_v * (1 - k) + k)
    fresnel = f0 + (1 - f0) * (1 - float(half[2])) ** 5
    specular = distribution * geometry * fresnel / (4 * n_l * n_v).clamp_min(1e-4)
    diffuse = (1 - fresnel) * (1 - metallic) * albedo / math.pi
    key = (diffuse + specular) * n_l * (math.pi * KEY_IRRADIANCE)

    # The environment L(d) = mean + half_range · d_y; its cosine-weighted irradiance over π is mean + ⅔ half_range·n_y.
    sky, ground = torch.tensor(SKY, dtype=normal.dtype), torch.tensor(GROUND, dtype=normal.dtype)
    mean, half_range = (sky + ground) / 2, (sky - ground) / 2
    ambient = (1 - metallic) * albedo * (mean + 2 / 3 * half_range * normal[:, 1:2])
    mirror_y = 2 * n_v * normal[:, 1:2]  # the y of reflect(−view, normal)
    radiance = mean + half_range * mirror_y * (1 - roughness / 3)  # rough: towards the irradiance's ⅔
    # Karis 2014, "Physically Based Shading on Mobile": the split-sum BRDF integral as scale and bias on F0.
    r = roughness * torch.tensor([-1.0, -0.0275, -0.572, 0.022]) + torch.tensor([1.0, 0.0425, 1.04, -0.04])
    a004 = torch.minimum(r[:, :1] ** 2, torch.exp2(-9.28 * n_v)) * r[:, :1] + r[:, 1:2]
    scale, bias = -1.04 * a004 + r[:, 2:3], 1.04 * a004 + r[:, 3:4]
    reflection = radiance * (f0 * scale + bias)
    return key + ambient + reflection


def aces(x: torch.Tensor) -> torch.Tensor:
    """Narkowicz's ACES fit, as upstream's ``aces_tonemapping``: HDR → ``[0, 1]``."""
    return ((x * (2.51 * x + 0.03)) / (x * (2.43 * x + 0.59) + 0.14)).clamp(0, 1)


def render_pbr_view(
    scene: Scene, yaw_deg: float, elevation_deg: float = ELEVATION_DEG, size: int = SIZE, supersample: int = SUPERSAMPLE
) -> np.ndarray:
    """One ``[size, size, 3]`` uint8 PBR view of ``scene``
    (:func:`~trellis2_npu.geometry.render_preview.prepare_scene`)."""
    samples = size * supersample
    fragments = rasterize_view(scene, yaw_deg, elevation_deg, samples)
    packed = sample_texture(scene, "metallicRoughnessTexture", fragments)  # glTF: roughness in G, metallic in B
    if packed is None:  # no metallic-roughness texture (not a GLB of ours): a plain dielectric
        packed = torch.tensor([0.0, PLAIN_ROUGHNESS, 0.0], dtype=torch.float64).expand(len(fragments.corners), 3)
    color = shade(fragments.normal, sample_base_color(scene, fragments), packed[:, 2:3], packed[:, 1:2])
    image = torch.full((samples * samples, 3), BACKGROUND, dtype=torch.float64)
    image[fragments.hit] = aces(color) ** (1 / 2.2)
    return to_uint8(image.reshape(size, supersample, size, supersample, 3).mean(dim=(1, 3)).reshape(-1, 3), size)


def render_turntable(
    scene: Scene, frames: int = DEFAULT_FRAMES, size: int = SIZE, supersample: int = SUPERSAMPLE
) -> np.ndarray:
    """``[frames, size, size, 3]`` uint8: ``scene`` (:func:`~trellis2_npu.geometry.render_preview.prepare_scene`)
    turning once
    (:func:`frame_yaws`)."""
    return np.stack([render_pbr_view(scene, yaw, size=size, supersample=supersample) for yaw in frame_yaws(frames)])


def video_record(frames: np.ndarray | None) -> dict[str, int] | None:
    """What ``report.json`` says of the video: frame count, side in pixels, fps (None: no video)."""
    return None if frames is None else {"frames": len(frames), "size": int(frames.shape[1]), "fps": FPS}


def write_turntable(path: str | os.PathLike, frames: np.ndarray) -> None:
    """The frames as an H.264 mp4 at :data:`FPS` (any ``path``: temporary names work)."""
    write_mp4(path, frames, FPS)
