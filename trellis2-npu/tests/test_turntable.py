"""The turntable video (``preview.mp4``): decoded back, turning, matching a still, shaded by the material, its flag
and its place among the outputs that commit together. Synthetic spheres, no upstream; seconds on the CPU."""

from __future__ import annotations

import json
import types
from pathlib import Path

import numpy as np
import pytest
import torch
import trimesh
from PIL import Image

from deliverykit.errors import ExitCode
from trellis2_npu import generate, memory, session
from trellis2_npu.geometry import turntable
from trellis2_npu.geometry.export import ExportOptions
from trellis2_npu.geometry.glb import build_textured_mesh
from trellis2_npu.geometry.render_preview import MARGIN, prepare_scene

from .conftest import assert_failed_cleanly

av = pytest.importorskip("av")
SIZE, FRAMES = 128, 8


def sphere(base_rgb=None, metallic: float = 0.0, roughness: float = 0.5, texture_size: int = 32) -> trimesh.Trimesh:
    """A UV sphere in the GLB frame; base colour uniform (``base_rgb``) or a u → red, v → blue gradient."""
    shape = trimesh.creation.uv_sphere(radius=0.4, count=[32, 32])
    vertices = np.asarray(shape.vertices)
    uvs = np.stack([(np.arctan2(vertices[:, 1], vertices[:, 0]) / (2 * np.pi)) % 1, vertices[:, 2] / 0.8 + 0.5], 1)
    rows, columns = np.meshgrid(np.arange(texture_size), np.arange(texture_size), indexing="ij")
    if base_rgb is None:
        rgb = [columns * 255 // (texture_size - 1), np.full_like(rows, 60), rows * 255 // (texture_size - 1)]
    else:
        rgb = [np.full_like(rows, channel) for channel in base_rgb]
    rgba = np.stack([*rgb, np.full_like(rows, 255)], axis=-1).astype(np.uint8)
    packed = np.zeros((texture_size, texture_size, 3), np.uint8)  # glTF: (0, roughness, metallic)
    packed[..., 1], packed[..., 2] = round(roughness * 255), round(metallic * 255)
    return build_textured_mesh(vertices, np.asarray(shape.faces), uvs, rgba, packed)


def decode(path: Path) -> np.ndarray:
    with av.open(str(path)) as container:
        assert container.streams.video[0].codec_context.name == "h264"
        return np.stack([frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)])


def test_the_video_decodes_to_the_frames_of_one_turn_starting_at_preview_pngs_first_view(tmp_path):
    scene = prepare_scene(sphere())
    frames = turntable.render_turntable(scene, FRAMES, size=SIZE)
    target = tmp_path / ".preview.mp4.1.tmp"  # written under the temporary name files.Outputs hands out
    turntable.write_turntable(target, frames)
    video = decode(target).astype(float)
    assert video.shape == (FRAMES, SIZE, SIZE, 3)
    assert turntable.frame_yaws(4) == [30.0, 120.0, 210.0, 300.0]  # preview.png's views; no frame repeats frame 0

    still = turntable.render_pbr_view(scene, 30.0, size=SIZE).astype(float)
    opposite = turntable.render_pbr_view(scene, 210.0, size=SIZE).astype(float)
    # Frame 0 is the still at 30°, up to the codec (both are uint8 already, so no rounding between them). The
    # conversion to yuv420p alone costs ~1.9 levels on mean here (luma in 219 limited-range levels; chroma at half
    # resolution smears the silhouette against the light background), x264 at crf 18 adds ~1: 2.6-2.9 measured,
    # bound 4. The view half a turn away differs by ~23 levels on this gradient texture.
    assert np.abs(video[0] - still).mean() < 4.0
    assert np.abs(video[0] - opposite).mean() > 15.0
    assert np.abs(video[0] - video[FRAMES // 2]).mean() > 15.0  # the asset turns
    assert np.abs(video[FRAMES // 2] - opposite).mean() < 4.0  # half-way round is the view from 210°


def key_highlight(view: np.ndarray) -> np.ndarray:
    """Mean RGB of the 3×3 pixels where a sphere centred in ``view`` turns its normal to the key light's half vector
    (the GGX peak), found from the geometry: orthographic camera, the sphere's radius is ``side / 2 / MARGIN``."""
    light = np.array(turntable.KEY_LIGHT) / np.linalg.norm(turntable.KEY_LIGHT)
    half = light + np.array([0.0, 0.0, 1.0])  # the view direction
    half = half / np.linalg.norm(half)
    side = view.shape[0]
    radius, centre = side / 2 / MARGIN, side / 2
    row, column = int(centre - half[1] * radius), int(centre + half[0] * radius)
    return view[row - 1 : row + 2, column - 1 : column + 2].reshape(-1, 3).astype(float).mean(axis=0)


def test_metal_tints_its_highlight_with_the_base_colour_and_roughness_spreads_it():
    red = (200, 40, 30)
    dielectric, metal = (
        turntable.render_pbr_view(prepare_scene(sphere(red, metallic=m, roughness=0.5)), 30.0, size=64)
        for m in (0.0, 1.0)
    )
    # Schlick's F0: 0.04 (grey) for a dielectric, the base colour for a metal. On red paint the white key light's
    # highlight lifts green as much as red (G/R 0.79 measured); a red metal reflects it red (G/R 0.50).
    paint, steel = key_highlight(dielectric), key_highlight(metal)
    assert paint[1] / paint[0] > 0.7 and steel[1] / steel[0] < 0.6, (paint, steel)
    assert np.abs(dielectric.astype(float) - metal.astype(float)).mean() > 5  # and a metal has no diffuse colour

    # GGX: a rough surface spreads the same light over a wider, dimmer lobe: the peak falls and the area brighter
    # than half-way from the sphere's median to the peak grows (31, 672, 972 pixels measured).
    peaks, areas = [], []
    for roughness in (0.2, 0.5, 0.8):
        view = turntable.render_pbr_view(prepare_scene(sphere((128, 128, 128), roughness=roughness)), 30.0, size=64)
        brightness = view.astype(float).mean(axis=-1)[np.abs(view.astype(float) - 240).max(axis=-1) > 2]
        peaks.append(key_highlight(view).mean())
        areas.append(int((brightness > (peaks[-1] + np.median(brightness)) / 2).sum()))
    assert peaks[0] > peaks[1] > peaks[2] and areas[0] < areas[1] < areas[2], (peaks, areas)


def test_shade_follows_the_brdf_limits():
    """Directly on ``shade``: a metal has no diffuse term; facing away from the key light only the sky remains."""
    up = torch.tensor([[0.0, 0.0, 1.0]], dtype=torch.float64)  # facing the camera
    base = torch.tensor([[1.0, 1.0, 1.0]], dtype=torch.float64)
    one, zero = torch.ones(1, 1, dtype=torch.float64), torch.zeros(1, 1, dtype=torch.float64)
    white_metal, white_paint = turntable.shade(up, base, one, one), turntable.shade(up, base, zero, one)
    assert (white_paint > white_metal).all()  # rough white metal reflects mostly specularly: less light overall
    black = turntable.shade(up, torch.zeros(1, 3, dtype=torch.float64), zero, one)
    assert (black > 0).all() and (black < 0.2).all()  # black paint keeps only its 4 % Fresnel reflection


@pytest.mark.parametrize("value", ["1", "-1", "601"])
def test_a_bad_preview_frames_is_one_line_before_the_pipeline(run_cli, tmp_path, monkeypatch, value):
    monkeypatch.delenv("TRELLIS2_SRC", raising=False)  # the check comes before the checkout is looked for
    out = tmp_path / "o"
    args = ("--smoke", "tiny", "--device", "cpu", "--preview-frames", value, "--output", out)
    assert_failed_cleanly(run_cli(*args), ExitCode.USAGE, f"--preview-frames {value}: need 0 (no preview.mp4)", out)


def test_preview_frames_0_passes_the_check(run_cli, tmp_path, monkeypatch):
    monkeypatch.delenv("TRELLIS2_SRC", raising=False)
    out = tmp_path / "o"
    args = ("--smoke", "tiny", "--device", "cpu", "--preview-frames", "0", "--output", out)
    assert_failed_cleanly(run_cli(*args), ExitCode.INPUT, "no --upstream, no $TRELLIS2_SRC", out)  # the next check


def fake_session(frames: int, monkeypatch) -> session.Session:
    """An image → 3D session with the pipeline replaced by a decoded-mesh stand-in (a sphere in a voxel shell)."""
    resolution = 32
    shape = trimesh.creation.icosphere(subdivisions=3, radius=0.35)
    grid = torch.stack(torch.meshgrid(*[torch.arange(resolution)] * 3, indexing="ij"), -1).reshape(-1, 3)
    centres = (grid + 0.5) / resolution - 0.5
    coords = grid[(centres.norm(dim=1) - 0.35).abs() < 3 / resolution]
    attrs = torch.cat([(coords + 0.5) / resolution, torch.tensor([[0.5, 0.5, 1.0]]).expand(len(coords), 3)], 1)
    mesh = types.SimpleNamespace(vertices=torch.tensor(shape.vertices, dtype=torch.float32),
                                 faces=torch.tensor(shape.faces), attrs=attrs, coords=coords.int())  # fmt: skip
    result = generate.PipelineResult(mesh, "512", resolution, {"flow": 1.0}, {"voxels": len(coords)}, 1.0)
    monkeypatch.setattr(generate, "run_pipeline", lambda *args, **kwargs: result)
    return session.Session(
        loaded=types.SimpleNamespace(device=torch.device("cpu")),
        device=torch.device("cpu"),
        default_steps=1,
        preview_frames=frames,
        model={"smoke": "tiny"},
        checkout=Path("."),
        weights=[],
        random_weights=True,
        pipeline_type="512",
        export_options=ExportOptions(decimation_target=1000, texture_size=64),
        memory_plan=memory.choose_memory_plan(torch.device("cpu")),
    )


def test_preview_mp4_commits_with_the_asset_and_is_reported(tmp_path, monkeypatch):
    run = fake_session(FRAMES, monkeypatch)
    out = tmp_path / "out"
    files = session.asset_outputs(out, video=True)
    run.write(run.run(run.request((None, False), "sphere", 0)), files)
    names = ["asset.glb", "mesh.ply", "preview.mp4", "preview.png", "report.json", "voxels.safetensors"]
    assert sorted(p.name for p in out.iterdir()) == names
    report = json.loads((out / "report.json").read_text())
    video = {"frames": FRAMES, "size": turntable.SIZE, "fps": turntable.FPS}
    assert report["results"]["preview_video_file"] == "preview.mp4" and report["results"]["preview_video"] == video
    assert {"preview_video", "encode_mp4"} <= set(report["timing"]["export_ms"])
    assert decode(out / "preview.mp4").shape == (FRAMES, turntable.SIZE, turntable.SIZE, 3)
    # --preview-frames 0 (no video, preview_video_file null) runs end to end in test_pipeline_upstream.py


def test_a_failed_video_leaves_no_file_of_the_asset(tmp_path, monkeypatch):
    """The mp4 is written last of the asset files: when its encoder fails, the files written before it vanish too."""
    run = fake_session(2, monkeypatch)

    def broken(path, frames, fps):
        Path(path).write_bytes(b"partial")
        raise RuntimeError("encoder broke")

    monkeypatch.setattr(turntable, "write_mp4", broken)
    monkeypatch.setattr(session.render_preview, "render_preview", lambda scene: Image.new("RGB", (8, 8)))  # fast
    out = tmp_path / "out"
    asset = run.run(run.request((None, False), "sphere", 0))
    with pytest.raises(RuntimeError, match="encoder broke"):
        run.write(asset, session.asset_outputs(out, video=True))
    assert not out.exists()
