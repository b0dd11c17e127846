"""The hooks the patches call, and the full pipeline's helpers that need no upstream checkout (run in CI)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
import trimesh

from deliverykit.errors import WeightsError
from trellis2_npu import hooks
from trellis2_npu.geometry.mesh_io import read_ply, write_ply


def test_strict_loader_names_missing_unexpected_and_misshaped_keys():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    state = {k: v.clone() for k, v in model.state_dict().items()}
    hooks.load_state_dict_strict(model, state, "ok.safetensors")
    del state["1.bias"]
    state["2.weight"] = torch.zeros(1)
    state["0.weight"] = torch.zeros(5, 3)
    with pytest.raises(WeightsError) as err:
        hooks.load_state_dict_strict(model, state, "bad.safetensors")
    message = str(err.value)
    assert "1.bias" in message and "2.weight" in message and "0.weight [5, 3]" in message


def test_strict_loader_skips_derived_rope_buffers():
    """Files never hold the derived ``rope_phases``: their absence is not an error, and the weights still load."""
    model = torch.nn.Linear(2, 2)
    model.register_buffer("rope_phases", torch.arange(3.0))
    state = {"weight": torch.full((2, 2), 7.0), "bias": torch.full((2,), 3.0)}
    hooks.load_state_dict_strict(model, state, "x")
    assert torch.equal(model.weight, state["weight"]) and torch.equal(model.bias, state["bias"])
    assert torch.equal(model.rope_phases, torch.arange(3.0))  # the derived buffer is left as the model built it
    with pytest.raises(WeightsError, match="bias"):
        hooks.load_state_dict_strict(model, {"weight": state["weight"]}, "x")  # a real missing key still fails


def test_sparse_attention_routing():
    assert hooks.sparse_attention_backend("flash_attn", torch.device("cpu")) == "auto"
    assert hooks.sparse_attention_backend("sdpa", torch.device("cpu")) == "sdpa"
    assert hooks.sparse_attention_backend("npu", torch.device("cuda")) == "npu"


def test_sparse_attention_matches_per_item_softmax():
    torch.manual_seed(0)
    qkv = torch.randn(7, 3, 2, 8, dtype=torch.float64)
    out = hooks.sparse_attention(1, [qkv], [3, 4], [3, 4], "sdpa")
    for start, end in ((0, 3), (3, 7)):
        q, k, v = (t.transpose(0, 1) for t in qkv[start:end].unbind(1))  # [H, L, C]
        ref = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(8), -1) @ v
        torch.testing.assert_close(out[start:end], ref.transpose(0, 1))


def test_rope_phases_match_complex_rotation():
    torch.manual_seed(0)
    coords = torch.randint(0, 16, (5, 3))
    x = torch.randn(5, 2, 16)
    phases = hooks.rope_phases(coords, 16, (1.0, 10000.0))
    freqs = 1.0 / 10000 ** (torch.arange(2, dtype=torch.float32) / 2)
    angles = torch.cat([(coords.float()[:, i : i + 1] * freqs) for i in range(3)] + [torch.zeros(5, 2)], dim=-1)
    ref = torch.view_as_real(
        torch.view_as_complex(x.reshape(5, 2, 8, 2)) * torch.polar(torch.ones_like(angles), angles)[:, None]
    )
    torch.testing.assert_close(hooks.apply_rope_phases(x, phases), ref.reshape(5, 2, 16))


def test_imagenet_normalize():
    image = torch.full((1, 3, 2, 2), 0.5)
    out = hooks.imagenet_normalize(image)
    torch.testing.assert_close(
        out[0, :, 0, 0], (0.5 - torch.tensor(hooks.IMAGENET_MEAN)) / torch.tensor(hooks.IMAGENET_STD)
    )


def test_ply_round_trip(tmp_path):
    vertices = torch.rand(5, 3)
    faces = torch.tensor([[0, 1, 2], [2, 3, 4]])
    write_ply(tmp_path / "m.ply", vertices, faces)
    v, f = read_ply(tmp_path / "m.ply")
    assert (v == vertices.numpy()).all() and (f == faces.numpy()).all()


def test_fill_holes_hook_fills_on_the_host_off_cuda():
    """Off CUDA the hook closes the hole itself and tells the patched ``Mesh.fill_holes`` to skip cumesh."""
    box = trimesh.creation.box(extents=(0.01, 0.01, 0.01))
    faces = torch.tensor(box.faces[2:])  # one square side open: perimeter 0.04
    mesh = SimpleNamespace(vertices=torch.tensor(box.vertices, dtype=torch.float32), faces=faces)
    assert hooks.fill_holes(mesh, max_hole_perimeter=0.05) is False
    assert mesh.faces.shape[0] == faces.shape[0] + 4 and mesh.vertices.shape[0] == 9
    assert mesh.vertices.dtype == torch.float32 and mesh.faces.dtype == faces.dtype
