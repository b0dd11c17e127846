"""``inference.py --mesh`` (texturing an existing mesh) without an upstream checkout: the usage errors and every input
check, made before anything loads (the runs themselves, with ``$TRELLIS2_SRC``: test_texturing_upstream.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import trimesh

from deliverykit.errors import ExitCode
from trellis2_npu.geometry.mesh_io import read_mesh
from trellis2_npu.tiny import tiny_image, tiny_mesh

from .conftest import assert_failed_cleanly


@pytest.fixture
def image(tmp_path: Path) -> Path:
    path = tmp_path / "object.png"
    tiny_image().save(path)
    return path


@pytest.fixture
def no_upstream(monkeypatch) -> None:
    monkeypatch.delenv("TRELLIS2_SRC", raising=False)


def _texture(run_cli, mesh, image, out, *extra):
    return run_cli("--smoke", "tiny", "--device", "cpu", "--mesh", mesh, "--image", image, "--output", out, *extra)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ("--decimation-target", "1000"),
            "--faces/--decimation-target: the texturing pipeline keeps the mesh as given",
        ),
        (("--remesh-band", "2"), "--remesh-band: the texturing pipeline keeps the mesh"),
        (("--pipeline", "512"), "--batch and --pipeline are image → 3D flags"),
        (("--memory", "none"), "--memory none: the plans are the image → 3D pipeline's"),
        (("--resolution", "256"), "--resolution 256: pick one of 512, 1024, 1536"),
        (("--texture-size", "1000"), "--texture-size 1000: need a power of two"),
    ],
)
def test_flags_that_make_no_sense_for_texturing(run_cli, tmp_path, image, no_upstream, flags, message):
    out = tmp_path / "o"
    code, _, err = _texture(run_cli, image, image, out, *flags)
    assert code == ExitCode.USAGE and message in err and "Traceback" not in err
    assert not out.exists()


def test_mesh_flag_usage(run_cli, tmp_path, image, no_upstream):
    out = tmp_path / "o"
    code, _, err = run_cli("--weights", tmp_path, "--mesh", "--image", image, "--output", out)
    assert code == ExitCode.USAGE and "built-in tiny mesh goes with --smoke" in err
    code, _, err = run_cli("--smoke", "tiny", "--resolution", "512", "--output", out)
    assert code == ExitCode.USAGE and "--resolution is the texturing grid; it goes with --mesh" in err
    assert_failed_cleanly(
        run_cli("--weights", tmp_path, "--mesh", tmp_path / "m.obj", "--device", "cpu", "--output", out),
        ExitCode.USAGE, "texturing needs --image FILE", out,
    )  # fmt: skip


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_bad_meshes_are_one_line_before_loading(run_cli, tmp_path, image, no_upstream):
    """Exit 3, one line naming the file and the fix, no --output: each checked before the upstream checkout."""
    out = tmp_path / "o"
    point_cloud = tmp_path / "points.ply"
    trimesh.PointCloud(np.random.default_rng(0).random((10, 3))).export(point_cloud)
    cases = {
        tmp_path / "gone.glb": "does not exist",
        tmp_path: "is not a file",
        _write(tmp_path / "mesh.stl", "solid x\nendsolid x\n"): "unsupported extension '.stl'",
        _write(tmp_path / "broken.glb", "not a glb"): "cannot read",
        point_cloud: "has no faces",
        _write(tmp_path / "nan.obj", "v 0 0 0\nv 1 0 nan\nv 0 1 0\nf 1 2 3\n"): "NaN/Inf vertex positions",
        _write(tmp_path / "inf.obj", "v 0 0 0\nv 1 0 inf\nv 0 1 0\nf 1 2 3\n"): "NaN/Inf vertex positions",
        _write(tmp_path / "point.obj", "v 1 1 1\nv 1 1 1\nv 1 1 1\nf 1 2 3\n"): "zero extent",
    }
    for mesh, message in cases.items():
        assert_failed_cleanly(_texture(run_cli, mesh, image, out), ExitCode.INPUT, message, out)


def test_bad_image_with_a_good_mesh(run_cli, tmp_path, no_upstream):
    out, mesh = tmp_path / "o", tmp_path / "mesh.ply"
    tiny_mesh().export(mesh)
    assert_failed_cleanly(_texture(run_cli, mesh, tmp_path / "gone.png", out), ExitCode.INPUT, "does not exist", out)


def test_texturing_weights_are_checked_before_the_upstream(run_cli, tmp_path, image, no_upstream):
    """A TRELLIS.2-4B folder without texturing_pipeline.json: exit 4, naming the download, before the checkout."""
    weights, out, mesh = tmp_path / "TRELLIS.2-4B", tmp_path / "o", tmp_path / "mesh.obj"
    weights.mkdir()
    (weights / "pipeline.json").write_text("{}")
    tiny_mesh().export(mesh)
    result = run_cli("--weights", weights, "--mesh", mesh, "--image", image, "--device", "cpu", "--output", out)
    assert_failed_cleanly(result, ExitCode.WEIGHTS, "has no texturing_pipeline.json", out)
    assert "--all-files" in result[2]


def test_a_good_mesh_reaches_the_upstream_check(run_cli, tmp_path, image, no_upstream):
    """Mesh and image pass; with no checkout the run stops at it (exit 3), still writing nothing."""
    out, mesh = tmp_path / "o", tmp_path / "mesh.glb"
    tiny_mesh().export(mesh)
    assert_failed_cleanly(_texture(run_cli, mesh, image, out), ExitCode.INPUT, "no --upstream, no $TRELLIS2_SRC", out)


@pytest.mark.parametrize("suffix", [".glb", ".obj", ".ply"])
def test_read_mesh_keeps_positions_and_faces(tmp_path, suffix):
    """What upstream's app hands the pipeline (``trimesh.load`` + ``to_mesh``): same faces, same positions (float32
    in GLB and PLY files, OBJ as text with 6+ digits: 1e-6 of the unit-size mesh)."""
    mesh = tiny_mesh()
    path = tmp_path / f"mesh{suffix}"
    mesh.export(path)
    loaded = read_mesh(path)
    assert len(loaded.faces) == len(mesh.faces)
    np.testing.assert_allclose(loaded.vertices[loaded.faces], mesh.vertices[mesh.faces], atol=1e-6)


def test_texture_mesh_bakes_the_voxel_colours_where_each_face_is():
    """``export.texture_mesh`` (the patched ``postprocess_mesh``) on voxels whose base colour is a linear function of
    position: the texel at each face's UV centroid (v flipped) holds the colour of the face's 3D centroid (in
    upstream's z-up frame, before the export turns it to glTF's y-up). Centroids, not vertices: a vertex sits on its
    chart's border, where texels belong to the gutter. Tolerance: 8-bit textures and a trilinear sample of a linear
    field (exact) half a texel away, 6/255."""
    import torch

    from trellis2_npu.geometry.export import texture_mesh

    resolution, size = 32, 256
    mesh = trimesh.creation.icosphere(subdivisions=2, radius=0.35)
    axis = torch.arange(resolution)
    coords = torch.stack(torch.meshgrid(axis, axis, axis, indexing="ij"), dim=-1).reshape(-1, 3)
    centres = (coords + 0.5) / resolution  # voxel centres in [0, 1]³ = position + 0.5
    attrs = torch.cat([centres, torch.full((len(coords), 3), 0.5)], dim=1)  # base colour = position + 0.5
    exported = texture_mesh(torch.tensor(mesh.vertices, dtype=torch.float32), torch.tensor(mesh.faces),
                            attrs, coords, resolution, texture_size=size)  # fmt: skip
    glb = exported.mesh
    assert len(glb.faces) == len(mesh.faces) and exported.stats["texel_coverage"] > 0
    texture = np.asarray(glb.visual.material.baseColorTexture.convert("RGB"), dtype=np.float64) / 255
    uv = glb.visual.uv[glb.faces].mean(axis=1)
    columns = np.clip((uv[:, 0] * size).astype(int), 0, size - 1)
    rows = np.clip(((1 - uv[:, 1]) * size).astype(int), 0, size - 1)  # glTF's v runs bottom-up in the image
    centroid = glb.vertices[glb.faces].mean(axis=1)
    z_up = np.stack([centroid[:, 0], -centroid[:, 2], centroid[:, 1]], axis=1)  # glTF (x, z, -y) back
    np.testing.assert_allclose(texture[rows, columns], z_up + 0.5, atol=6 / 255)
