#!/usr/bin/env python3
"""Texture baking (``trellis2_npu.geometry.texture_bake``): the vectorised UV rasteriser against a per-face loop, and
the
full bake of a million-face mesh at 2048².

1. Rasteriser: ``rasterize_uv`` against the naive per-face loop of ``tests/test_texture_bake.py``
   (``naive_rasterize_uv``, numpy over each face's texel box) on a small mesh unwrapped by xatlas (icosphere,
   1 280 faces) at 256², alternating round by round; the ratio is the median of the per-round ratios (target ≤ 1).
2. Full bake, as ``to_glb`` runs it: the reference mesh (the mesh before simplification) is an icosphere of radius
   0.4 subdivided 8 times (1 310 720 faces), each vertex moved radially by Gaussian noise (σ = 0.1 % of the
   radius); ``fast_simplification`` removes 25 % of its faces (≈ 983k faces left), and that mesh is baked. Voxels:
   every voxel of a 512³ grid within 3 voxels of the sphere, carrying a field linear in position (so the baked
   values can be checked: renormalised trilinear sampling reproduces it wherever all 8 neighbours exist).
   The UV layout is synthetic (each pair of faces in its own square of a grid over the texture): xatlas took 593 s
   for the 1.3M-face noisy sphere on this CPU, which would hide the bake. It covers nearly every texel where an
   xatlas atlas covers 75-80 %, so the snap and the sampling see about a quarter more texels than after a real
   unwrap. Timed: ``bake_pbr_textures`` whole (``--rounds`` times), and once each of its parts: ``rasterize_uv``,
   ``closest_points_on_mesh`` on the texels' points, ``sample_texture_attributes`` (raster + snap +
   ``grid_sample_3d``) and ``pack_pbr_textures`` (uint8 + inpainting + packing). Reported per megatexel too, the
   figure that scales with ``--texture-size``.

    python trellis2-npu/benchmarks/glb_bake.py --output trellis2-npu/results/glb_bake.json

About a minute on 2 CPU cores with the defaults. Exit code 0, or 1 with --check when the ratio misses its target.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import fast_simplification
import numpy as np
import torch
import trimesh

from deliverykit.errors import run_main
from deliverykit.files import ensure_writable_dir, write_json_atomic
from deliverykit.report import delivery_report
from deliverykit.testing import load_script
from deliverykit.timing import Stopwatch, benchmark_alternating, paired_ratio
from trellis2_npu.geometry.closest_points import closest_points_on_mesh
from trellis2_npu.geometry.texture_bake import (
    UVMesh,
    Voxels,
    bake_pbr_textures,
    pack_pbr_textures,
    rasterize_uv,
    sample_texture_attributes,
    unwrap_uv,
)

DELIVERY_DIR = Path(__file__).resolve().parents[1]

TARGET_RATIO = 1.0
RADIUS = 0.4
BAND_VOXELS = 3.0
OURS, NAIVE = "ours (rasterize_uv)", "naive per-face loop"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--subdivisions", type=int, default=8, help="reference icosphere subdivisions (8: 1.3M faces)")
    parser.add_argument("--reduction", type=float, default=0.25, help="fraction of faces simplification removes")
    parser.add_argument("--resolution", type=int, default=512, help="voxel grid side")
    parser.add_argument("--texture-size", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=2, help="timed full bakes (default 2)")
    parser.add_argument("--raster-rounds", type=int, default=5, help="alternating rounds of the rasteriser ratio")
    parser.add_argument("--output", required=True, help="results JSON for the README")
    parser.add_argument("--check", action="store_true", help="exit 1 when the rasteriser ratio misses its target")
    return parser.parse_args(argv)


def load_naive_rasterizer():
    """``naive_rasterize_uv`` from the test module (the reference lives with the tests, not in the package)."""
    return load_script(DELIVERY_DIR / "tests" / "test_texture_bake.py", "test_texture_bake").naive_rasterize_uv


def linear_field(points: torch.Tensor) -> torch.Tensor:
    """``[P, 6]`` attributes linear in position, inside (0, 1) near the sphere (colour, metallic, roughness, alpha)."""
    x, y, z = points.unbind(dim=1)
    return torch.stack(
        [0.5 + 0.9 * x, 0.5 + 0.9 * y, 0.5 + 0.9 * z, 0.5 + 0.5 * x - 0.4 * z, 0.5 - 0.6 * y, 0.6 + 0.3 * (x + y)], 1
    )


def noisy_sphere(subdivisions: int) -> tuple[torch.Tensor, torch.Tensor]:
    sphere = trimesh.creation.icosphere(subdivisions=subdivisions, radius=RADIUS)
    noise = torch.randn(len(sphere.vertices), 1, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    vertices = torch.from_numpy(sphere.vertices) * (1 + 0.001 * noise)
    return vertices.float(), torch.from_numpy(sphere.faces).long()


def simplify_with_synthetic_uvs(vertices: torch.Tensor, faces: torch.Tensor, reduction: float) -> UVMesh:
    """Simplify, then give each pair of faces its own square of a grid over the unit square (one UV vertex per
    corner, as after unwrapping)."""
    simple_vertices, simple_faces = fast_simplification.simplify(
        vertices.numpy(), faces.numpy().astype(np.int32), target_reduction=reduction
    )
    simple_faces = torch.from_numpy(simple_faces.astype(np.int64))
    count = len(simple_faces)
    side = int(np.ceil(np.sqrt((count + 1) // 2)))
    square = torch.arange(count) // 2
    origin = torch.stack([square % side, square // side], dim=1).double() / side
    lower = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    upper = torch.tensor([[1.0, 1.0], [0.0, 1.0], [1.0, 0.0]], dtype=torch.float64)
    corners = torch.where((torch.arange(count) % 2 == 1)[:, None, None], upper, lower) / side + origin[:, None]
    vmapping = simple_faces.reshape(-1)
    return UVMesh(
        vertices=torch.from_numpy(simple_vertices).float()[vmapping],
        faces=torch.arange(3 * count).reshape(count, 3),
        uvs=corners.reshape(-1, 2).float(),
        vmapping=vmapping,
        charts=square,  # a pair of faces per square
    )


def shell_voxels(resolution: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Voxels within :data:`BAND_VOXELS` of the sphere, slab by slab, with the linear field at their centres."""
    index = torch.arange(resolution)
    plane = torch.cartesian_prod(index, index)
    coords = []
    for x in range(resolution):
        centres = (torch.cat([torch.full_like(plane[:, :1], x), plane], 1).double() + 0.5) / resolution - 0.5
        keep = (centres.norm(dim=1) - RADIUS).abs() <= BAND_VOXELS / resolution
        coords.append(torch.cat([torch.full((int(keep.sum()), 1), x), plane[keep]], 1))
    coords = torch.cat(coords)
    return coords, linear_field((coords.double() + 0.5) / resolution - 0.5).float()


def texel_points(uv_mesh: UVMesh, texture_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The covered texels' flat indices and 3D points on the baked mesh (the points the bake snaps)."""
    face_id, barycentrics = rasterize_uv(uv_mesh.uvs, uv_mesh.faces, texture_size)
    covered = (face_id.reshape(-1) >= 0).nonzero().squeeze(1)
    corners = uv_mesh.vertices[uv_mesh.faces[face_id.reshape(-1)[covered]]]
    return covered, (barycentrics.reshape(-1, 3)[covered].unsqueeze(2) * corners).sum(dim=1)


def raster_ratio(rounds: int) -> dict:
    """Median per-round time ratio of ``rasterize_uv`` to the naive loop, and whether they agree."""
    naive_rasterize_uv = load_naive_rasterizer()
    sphere = trimesh.creation.icosphere(subdivisions=3, radius=RADIUS)
    uv_mesh = unwrap_uv(torch.tensor(sphere.vertices, dtype=torch.float32), torch.from_numpy(sphere.faces).long())
    variants = {
        OURS: lambda: rasterize_uv(uv_mesh.uvs, uv_mesh.faces, 256),
        NAIVE: lambda: naive_rasterize_uv(uv_mesh.uvs, uv_mesh.faces, 256),
    }
    face_id, _ = variants[OURS]()
    expected_id, _, ambiguous, _ = variants[NAIVE]()
    samples = benchmark_alternating(variants, rounds)
    return {
        "faces": len(uv_mesh.faces),
        "texture_size": 256,
        "samples_ms": samples,
        "medians_ms": {name: statistics.median(values) for name, values in samples.items()},
        "ratio": paired_ratio(samples, OURS, NAIVE),
        "face_ids_equal_where_unambiguous": bool((face_id.numpy()[~ambiguous] == expected_id[~ambiguous]).all()),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    ensure_writable_dir(Path(args.output).parent)
    texture_size = args.texture_size
    megatexels = texture_size * texture_size / 1e6
    raster = raster_ratio(args.raster_rounds)

    setup = Stopwatch()
    with setup.stage("reference mesh"):
        reference_vertices, reference_faces = noisy_sphere(args.subdivisions)
    with setup.stage("simplify + synthetic UVs"):
        uv_mesh = simplify_with_synthetic_uvs(reference_vertices, reference_faces, args.reduction)
    with setup.stage("voxels"):
        coords, attrs = shell_voxels(args.resolution)
    bake_args = (
        (reference_vertices, reference_faces),
        Voxels(coords, attrs, 1 / args.resolution, [-0.5] * 3),
        texture_size,
    )

    parts = Stopwatch()
    with parts.stage("rasterize_uv"):
        covered, points = texel_points(uv_mesh, texture_size)
    with parts.stage("closest_points_on_mesh"):
        snapped = closest_points_on_mesh(points, reference_vertices, reference_faces)
    with parts.stage("sample_texture_attributes"):
        attributes, coverage = sample_texture_attributes(uv_mesh, *bake_args)
    with parts.stage("pack_pbr_textures"):
        pack_pbr_textures(attributes, coverage)
    field_error = (attributes.reshape(-1, 6)[covered] - linear_field(snapped.points)).abs().max().item()

    bakes = Stopwatch()
    for index in range(args.rounds):
        with bakes.stage(f"bake {index}"):
            bake_pbr_textures(uv_mesh, *bake_args)
    bake_s = statistics.median(bakes.stages.values()) / 1000

    ratio = raster["ratio"]
    title = (
        f"texture bake on the CPU: {len(uv_mesh.faces)} faces baked from a {len(reference_faces)}-face reference, "
        f"{len(coords)} voxels at {args.resolution}³, {texture_size}²"
    )
    part_rows = [[name, ms / 1000, ms / 1000 / megatexels] for name, ms in parts.stages.items()]
    report = delivery_report(
        "benchmark",
        DELIVERY_DIR,
        device="cpu",
        random_weights=True,
        results={
            "raster": raster,
            "faces": len(uv_mesh.faces),
            "reference_faces": len(reference_faces),
            "voxels": len(coords),
            "texture_size": texture_size,
            "covered_texels": len(covered),
            "bake_s": bake_s,
            "bake_s_per_megatexel": bake_s / megatexels,
            "bake_samples_ms": list(bakes.stages.values()),
            "parts_ms": parts.stages,
            "setup_ms": setup.stages,
            "max_abs_error_vs_linear_field": field_error,
            "tables": [
                {
                    "title": f"rasterize_uv against a per-face loop ({raster['faces']} faces, 256², "
                    f"{args.raster_rounds} alternating rounds)",
                    "columns": ["ratio", "measured", "target", "met"],
                    "rows": [
                        ["ours / naive (median of paired rounds)", ratio, f"≤ {TARGET_RATIO}", ratio <= TARGET_RATIO]
                    ],
                },
                {
                    "title": f"{title}: whole bake (median of {args.rounds})",
                    "columns": ["step", "s", "s per megatexel"],
                    "rows": [["bake_pbr_textures", bake_s, bake_s / megatexels], *part_rows],
                },
            ],
        },
    )
    write_json_atomic(args.output, report)
    print(f"rasterize_uv / naive loop: {ratio:.4f} (medians {raster['medians_ms']}) target ≤ {TARGET_RATIO}")
    print(f"bake of {len(uv_mesh.faces)} faces at {texture_size}²: {bake_s:.1f} s ({bake_s / megatexels:.2f} s/MTexel)")
    for name, seconds, per_megatexel in part_rows:
        print(f"  {name}: {seconds:.2f} s ({per_megatexel:.3f} s/MTexel)")
    print(f"max |baked - linear field| over {len(covered)} texels: {field_error:.2e}")
    print(f"results: {args.output}")
    return 1 if args.check and ratio > TARGET_RATIO else 0


if __name__ == "__main__":
    sys.exit(run_main(main))
