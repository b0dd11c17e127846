"""GLB export on synthetic meshes: the file a viewer gets, the preview people look at, and the options' checks.

No upstream here: the meshes are spheres with a colour field in voxels, in TRELLIS.2's ``[-0.5, 0.5]³`` z-up frame.
The GLB is read back twice, by trimesh (what most tools see) and by its raw JSON chunk (what the spec says).
"""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import torch
import trimesh
from trimesh.proximity import closest_point_naive

from deliverykit.errors import ExitCode
from trellis2_npu.geometry.export import ExportOptionsError, check_export_options, to_glb
from trellis2_npu.geometry.glb import MeshExportError, build_textured_mesh, write_glb
from trellis2_npu.geometry.render_preview import BACKGROUND, prepare_scene, render_preview, render_view

RESOLUTION = 64


def gltf_json(path) -> dict:
    """The JSON chunk of a binary glTF (header: magic, version, length; then chunk length, type, data)."""
    data = path.read_bytes()
    magic, version, length = struct.unpack_from("<4sII", data, 0)
    assert (magic, version, length) == (b"glTF", 2, len(data))
    chunk_length, chunk_type = struct.unpack_from("<I4s", data, 12)
    assert chunk_type == b"JSON"
    return json.loads(data[20 : 20 + chunk_length])


def textured_sphere(texture_size: int = 64) -> tuple[np.ndarray, ...]:
    """A z-up sphere of radius 0.4 with latitude/longitude UVs and a (u → red, v → blue) gradient texture."""
    sphere = trimesh.creation.uv_sphere(radius=0.4, count=[48, 48])
    vertices = np.asarray(sphere.vertices)
    uvs = np.stack([(np.arctan2(vertices[:, 1], vertices[:, 0]) / (2 * np.pi)) % 1, vertices[:, 2] / 0.8 + 0.5], 1)
    rows, columns = np.meshgrid(np.arange(texture_size), np.arange(texture_size), indexing="ij")
    red, blue = columns * 255 // (texture_size - 1), rows * 255 // (texture_size - 1)
    rgba = np.stack([red, np.full_like(rows, 60), blue, np.full_like(rows, 255)], axis=-1).astype(np.uint8)
    metallic_roughness = np.zeros((texture_size, texture_size, 3), np.uint8)
    metallic_roughness[..., 1], metallic_roughness[..., 2] = 200, 30
    return vertices, np.asarray(sphere.faces), uvs, rgba, metallic_roughness


def voxel_sphere(subdivisions: int = 4, noise: float = 0.0) -> dict[str, torch.Tensor]:
    """An icosphere and a shell of voxels around it whose base colour is a linear function of position."""
    sphere = trimesh.creation.icosphere(subdivisions=subdivisions, radius=0.35)
    vertices = torch.tensor(sphere.vertices, dtype=torch.float32)
    if noise:
        vertices = vertices * (1 + noise * torch.randn(len(vertices), 1, generator=torch.Generator().manual_seed(0)))
    grid = torch.stack(torch.meshgrid(*[torch.arange(RESOLUTION)] * 3, indexing="ij"), -1).reshape(-1, 3)
    centres = (grid + 0.5) / RESOLUTION - 0.5
    shell = (centres.norm(dim=1) - 0.35).abs() < 4 / RESOLUTION
    coords, centres = grid[shell], centres[shell]
    attrs = torch.zeros(len(coords), 6)
    attrs[:, :3] = expected_color(centres)
    attrs[:, 3], attrs[:, 4], attrs[:, 5] = 0.25, 0.75, 1.0
    return {"vertices": vertices, "faces": torch.tensor(sphere.faces), "attrs": attrs, "coords": coords.int()}


def expected_color(points: torch.Tensor) -> torch.Tensor:
    """The voxels' base colour field: linear in x, y, z (trilinear sampling reproduces it exactly)."""
    return (points + 0.5).clamp(0, 1)


def test_glb_round_trip_material_axes_and_uvs(tmp_path):
    vertices, faces, uvs, rgba, metallic_roughness = textured_sphere(texture_size=64)
    mesh = build_textured_mesh(vertices, faces, uvs, rgba, metallic_roughness)
    stats = write_glb(tmp_path / "asset.glb", mesh)
    assert (stats.faces, stats.vertices, stats.texture_size) == (len(faces), len(vertices), 64)
    assert [p.name for p in tmp_path.iterdir()] == ["asset.glb"]  # no temporary file left

    loaded = trimesh.load(tmp_path / "asset.glb", force="mesh", process=False)
    material = loaded.visual.material
    assert isinstance(material, trimesh.visual.material.PBRMaterial)
    assert material.baseColorTexture.size == (64, 64)  # RGBA; WebP drops an all-opaque alpha
    assert material.metallicRoughnessTexture.size == (64, 64)
    assert material.alphaMode == "OPAQUE" and material.doubleSided is True
    assert loaded.visual.uv.min() >= 0 and loaded.visual.uv.max() <= 1
    # (x, y, z) -> (x, z, -y): the north pole (0, 0, 0.4) is up in glTF, the point (0, 0.4, 0) goes to -z.
    np.testing.assert_allclose(loaded.vertices, np.stack([vertices[:, 0], vertices[:, 2], -vertices[:, 1]], 1), 1e-6)
    # v -> 1 - v in trimesh; the file holds the bake's v (texel row grows with v, glTF's top-down convention).
    np.testing.assert_allclose(loaded.visual.uv, np.stack([uvs[:, 0], 1 - uvs[:, 1]], 1), atol=1e-6)

    document = gltf_json(tmp_path / "asset.glb")
    (gltf_material,) = document["materials"]
    pbr = gltf_material["pbrMetallicRoughness"]
    assert {"baseColorTexture", "metallicRoughnessTexture"} <= set(pbr)
    assert gltf_material["alphaMode"] == "OPAQUE" and gltf_material["doubleSided"] is True
    assert document["extensionsRequired"] == ["EXT_texture_webp"]  # as upstream's export(extension_webp=True)
    assert {image["mimeType"] for image in document["images"]} == {"image/webp"}


def test_remeshed_surface_is_single_sided():
    vertices, faces, uvs, rgba, metallic_roughness = textured_sphere(texture_size=16)
    mesh = build_textured_mesh(vertices, faces, uvs, rgba, metallic_roughness, remesh=True)
    assert mesh.visual.material.doubleSided is False


@pytest.mark.parametrize(
    "vertices, faces, message",
    [
        (np.zeros((3, 3)), np.zeros((0, 3), np.int64), "no faces"),
        (np.full((3, 3), np.nan), np.array([[0, 1, 2]]), "NaN"),
        (np.zeros((3, 3)), np.array([[0, 1, 3]]), "outside"),
    ],
)
def test_bad_mesh_is_refused_with_one_line(tmp_path, vertices, faces, message):
    _, _, _, rgba, metallic_roughness = textured_sphere(texture_size=16)
    with pytest.raises(MeshExportError, match=message) as raised:
        build_textured_mesh(vertices, faces, np.zeros((len(vertices), 2)), rgba, metallic_roughness)
    assert "\n" not in str(raised.value) and raised.value.exit_code == ExitCode.NUMERICS
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    "decimation_target, texture_size, band, project, message",
    [
        (3, 2048, 1.0, 0.0, "--faces 3"),
        (500_000, 1000, 1.0, 0.0, "--texture-size 1000"),
        (500_000, 16384, 1.0, 0.0, "--texture-size 16384"),
        (500_000, 2048, 0.0, 0.0, "--remesh-band 0.0: need 0.25 to 4"),
        (500_000, 2048, float("nan"), 0.0, "--remesh-band nan"),
        (500_000, 2048, 1.0, 1.5, "--remesh-project 1.5: need a fraction from 0 to 1"),
    ],
)
def test_bad_export_options(decimation_target, texture_size, band, project, message):
    with pytest.raises(ExportOptionsError, match=message) as raised:
        check_export_options(decimation_target, texture_size, True, band, project)
    assert raised.value.exit_code == ExitCode.USAGE and "\n" not in str(raised.value)


def test_good_export_options():
    for decimation_target, texture_size in ((4, 1), (500_000, 2048), (1_000_000, 8192)):
        check_export_options(decimation_target, texture_size)
    check_export_options(500_000, 2048, remesh=False, remesh_band=0.0)  # the remesh options only matter with it


def test_preview_shows_the_textured_object():
    vertices, faces, uvs, rgba, metallic_roughness = textured_sphere(texture_size=64)
    mesh = build_textured_mesh(vertices, faces, uvs, rgba, metallic_roughness)
    view = render_view(prepare_scene(mesh), yaw_deg=30.0, size=128).astype(np.float64)
    background = round(BACKGROUND * 255)
    covered = (np.abs(view - background) > 2).any(axis=-1)
    assert 0.4 < covered.mean() < 0.9  # a sphere framed on its bounding sphere covers π/4 / 1.08² ≈ 67 %
    border = np.concatenate([covered[0], covered[-1], covered[:, 0], covered[:, -1]])
    assert not border.any()  # the whole object is in view
    # The texture's blue grows with v, i.e. towards the north pole, which is up in the GLB frame.
    top, bottom = view[20:40, 54:74], view[88:108, 54:74]
    assert top[..., 2].mean() > bottom[..., 2].mean() + 40
    grid = render_preview(prepare_scene(mesh), size=64)
    assert grid.size == (128, 128)


@pytest.mark.parametrize("remesh", [True, False])
def test_to_glb_bakes_the_voxel_colours(tmp_path, remesh):
    data = voxel_sphere(subdivisions=4, noise=0.01)
    exported = to_glb(**data, resolution=RESOLUTION, decimation_target=1000, texture_size=256, remesh=remesh)
    mesh = exported.mesh
    assert len(mesh.faces) <= 1000 and exported.stats["input_faces"] == len(data["faces"])
    steps = {"fill_holes", "simplify", "unwrap", "bake", "assemble", "mesh_qa"} | ({"remesh"} if remesh else set())
    assert set(exported.stages_ms) == steps and exported.stats["remesh"] is remesh
    quality = exported.stats["mesh_qa"]  # of the exported surface, before the UV seams split its vertices
    assert quality["faces"] == exported.stats["simplified_faces"] == len(mesh.faces)
    assert quality["watertight"] is trimesh.Trimesh(mesh.vertices, mesh.faces).is_watertight  # merged there
    uv = mesh.visual.uv
    assert uv.min() >= 0 and uv.max() <= 1
    write_glb(tmp_path / "asset.glb", mesh)
    loaded = trimesh.load(tmp_path / "asset.glb", force="mesh", process=False)
    material = loaded.visual.material
    assert material.baseColorTexture.size == (256, 256) and material.metallicRoughnessTexture.size == (256, 256)

    # Each face's centre texel holds the colour field there (back in TRELLIS.2's frame: (x, y, z) = (x, -z, y)).
    centres = loaded.vertices[loaded.faces].mean(axis=1)
    points = np.stack([centres[:, 0], -centres[:, 2], centres[:, 1]], 1)
    if remesh:  # the remeshed surface lies a voxel outside the input: its texels hold the closest input point's colour
        points = closest_point_naive(trimesh.Trimesh(data["vertices"].numpy(), data["faces"].numpy()), points)[0]
    points = torch.tensor(points, dtype=torch.float32)
    uv = loaded.visual.uv[loaded.faces].mean(axis=1)
    texture = np.asarray(material.baseColorTexture.convert("RGB"), dtype=np.float64) / 255
    columns = np.clip((uv[:, 0] * 256).astype(int), 0, 255)
    rows = np.clip(((1 - uv[:, 1]) * 256).astype(int), 0, 255)
    error = np.abs(texture[rows, columns] - expected_color(points).numpy())
    assert np.median(error) < 0.02 and np.quantile(error, 0.95) < 0.08
    metallic_roughness = np.asarray(material.metallicRoughnessTexture.convert("RGB"), dtype=np.float64) / 255
    np.testing.assert_allclose(np.median(metallic_roughness[rows, columns], axis=0), [0, 0.75, 0.25], atol=0.03)


def test_cli_refuses_bad_export_flags_before_running(run_cli, tmp_path):
    base = ["--smoke", "tiny", "--upstream", str(tmp_path / "none"), "--device", "cpu", "--output", str(tmp_path)]
    for extra, message in (
        (["--texture-size", "1000"], "--texture-size 1000"),
        (["--decimation-target", "3"], "--faces 3"),
        (["--faces", "3"], "--faces 3"),
        (["--remesh-band", "0"], "--remesh-band 0.0: need 0.25 to 4"),  # remesh is on by default, as upstream's
        (["--remesh", "--remesh-project", "-1"], "--remesh-project -1.0: need a fraction from 0 to 1"),
    ):
        code, _, err = run_cli(*base, *extra)
        assert code == ExitCode.USAGE and message in err, err
        assert len(err.strip().splitlines()) == 1
    # without the remesh its options do not matter: the run gets past the flags, to the missing checkout
    code, _, err = run_cli(*base, "--no-remesh", "--remesh-band", "0")
    assert code == ExitCode.INPUT and "--remesh-band" not in err, err
    assert not list(tmp_path.glob("*.glb"))
