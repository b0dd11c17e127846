"""``inference.py --mesh`` end to end on the patched upstream's ``Trellis2TexturingPipeline`` (needs a checkout:
TRELLIS2_SRC=/path; every test here skips without it). The checkout is never modified: the patches, 0007 included,
are applied to a scratch copy of the pinned commit (conftest.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import trimesh

from trellis2_npu import generate
from trellis2_npu.geometry import turntable
from trellis2_npu.tiny import tiny_image, tiny_mesh

SEED, STEPS, TEXTURE = 7, 2, 64


@pytest.fixture(scope="module")
def textured(patched: Path, tmp_path_factory, run_cli) -> tuple[Path, Path, Path]:
    """One tiny texturing run of a PLY mesh and an RGBA image: ``(output folder, mesh file, image file)``."""
    folder = tmp_path_factory.mktemp("texturing")
    mesh, image, out = folder / "mesh.ply", folder / "object.png", folder / "out"
    tiny_mesh().export(mesh)
    tiny_image().save(image)
    code, _, err = run_cli("--smoke", "tiny", "--upstream", patched, "--device", "cpu", "--mesh", mesh, "--image",
                           image, "--seed", str(SEED), "--steps", str(STEPS), "--texture-size", str(TEXTURE),
                           "--output", out)  # fmt: skip
    assert code == 0, err[-3000:]
    return out, mesh, image


def test_outputs_and_report(textured):
    out, mesh, _ = textured
    names = ["asset.glb", "preview.mp4", "preview.png", "report.json", "voxels.safetensors"]
    assert sorted(p.name for p in out.iterdir()) == names
    report = json.loads((out / "report.json").read_text())
    assert report["random_weights"] is True and report["model"]["pipeline"] == "texturing"
    # no path of this machine in the report (deliverykit.report.portable_paths): tmp_path lies outside the checkout
    assert report["inputs"]["mesh"] == f"DIR/{mesh.name}" and report["inputs"]["seed"] == SEED
    assert report["results"]["resolution"] == generate.SMOKE_RESOLUTION
    stages = report["timing"]["stages_ms"]
    for stage in ("conditioning_1024", "mesh_voxelization", "encoder:shape_slat_encoder",
                  "flow:tex_slat_flow_model_1024", "decoder:tex_slat_decoder"):  # fmt: skip
        assert stage in stages, stage
    assert set(report["timing"]["export_ms"]) == {
        "unwrap",
        "bake",
        "assemble",
        "mesh_qa",
        "preview",
        "preview_video",
        "encode_glb",
        "encode_mp4",  # written last, as the image → 3D asset's
    }
    assert report["results"]["preview_video_file"] == "preview.mp4"
    assert report["results"]["preview_video"]["frames"] == turntable.DEFAULT_FRAMES


def test_glb_is_the_input_mesh_with_a_pbr_texture(textured):
    """trimesh reads a PBR-textured mesh whose faces are the input's faces and whose vertices are input vertices
    (split along UV seams), normalised into the unit box as upstream does. Positions are float32 in the GLB: 1e-6
    of the unit box."""
    out, mesh_file, _ = textured
    glb = trimesh.load(out / "asset.glb", force="mesh", process=False)
    material = glb.visual.material
    assert isinstance(material, trimesh.visual.material.PBRMaterial)
    assert material.baseColorTexture.size == (TEXTURE, TEXTURE) == material.metallicRoughnessTexture.size
    assert material.doubleSided
    assert glb.visual.uv.min() >= 0 and glb.visual.uv.max() <= 1

    source = trimesh.load(mesh_file, force="mesh", process=False)
    vertices = source.vertices
    low, high = vertices.min(axis=0), vertices.max(axis=0)
    normalised = (vertices - (low + high) / 2) * (0.99999 / (high - low).max())  # upstream's preprocess_mesh
    # preprocess_mesh turns the y-up file z-up for the models; the export turns it back to glTF's y-up
    distance = np.linalg.norm(glb.vertices[:, None] - normalised[None], axis=2)
    nearest = distance.argmin(axis=1)
    assert distance.min(axis=1).max() < 1e-6
    assert len(glb.faces) == len(source.faces)
    assert {tuple(sorted(face)) for face in nearest[glb.faces].tolist()} == {
        tuple(sorted(face)) for face in source.faces.tolist()
    }


def test_decoded_voxels_equal_upstreams_own_steps(textured, patched: Path, tmp_path):
    """The same tiny weights (rewritten, same seeds), mesh, image, seed and steps through upstream's own methods, in
    run()'s order with its own preprocessing: the CLI's decoded PBR voxels are the same voxels with the same values.
    Same float32 code on the same inputs in one process: equal up to the image preprocessing (ours, tested equal
    to upstream's) and summation order, 1e-5 on attributes in [0, 1]."""
    from safetensors.torch import load_file

    from trellis2_npu import loader, tiny, upstream

    out, mesh_file, image_file = textured
    pipeline_class = upstream.import_texturing_pipeline_class(patched)
    main = tiny.write_tiny_texturing(tiny.write_tiny_weights(tmp_path, seed=0), seed=0)
    loader.set_model_roots([tmp_path])
    pipeline = pipeline_class.from_pretrained(str(main), config_file="texturing_pipeline.json")
    pipeline.to(torch.device("cpu"))
    from PIL import Image

    with torch.no_grad():
        image = pipeline.preprocess_image(Image.open(image_file))
        mesh = pipeline.preprocess_mesh(trimesh.load(mesh_file))
        torch.manual_seed(SEED)
        cond = pipeline.get_cond([image], 1024)
        shape_slat = pipeline.encode_shape_slat(mesh, generate.SMOKE_RESOLUTION)
        flow = pipeline.models["tex_slat_flow_model_1024"]
        pbr = pipeline.decode_tex_slat(pipeline.sample_tex_slat(cond, flow, shape_slat, {"steps": STEPS}))

    ours = load_file(out / "voxels.safetensors")
    assert torch.equal(ours["coords"], pbr.coords[:, 1:].int())
    torch.testing.assert_close(ours["attrs"], pbr.feats.float(), atol=1e-5, rtol=0)
