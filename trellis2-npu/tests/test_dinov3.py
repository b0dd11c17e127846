"""DINOv3 loading and the TRELLIS.2 feature path, against plain transformers forwards of the same weights."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers import DINOv3ViTModel

from deliverykit import ops
from deliverykit.compare import tensor_metrics
from deliverykit.errors import WeightsError
from trellis2_npu.dinov3 import extract_features, feature_shape
from trellis2_npu.image import preprocess_image, synthetic_image, to_pixel_values
from trellis2_npu.loader import load_dinov3, weights_are_random
from trellis2_npu.precision import ErfGELU, MatmulPatchEmbedding, apply_precision_patch
from trellis2_npu.tiny import build_random_dinov3, checkpoint_key, dinov3_config


@pytest.fixture(scope="module")
def model(tiny_weights):
    return load_dinov3(tiny_weights)


@pytest.fixture(scope="module")
def pixels():
    return to_pixel_values(preprocess_image(synthetic_image(7, size=96)), 64)


def test_features_equal_plain_transformers_forward(model, pixels):
    """Independent reference: transformers' own forward, last block output, non-affine layer norm."""
    with torch.inference_mode():
        ours = extract_features(model, pixels)
        hidden = model(pixel_values=pixels, output_hidden_states=True).hidden_states[-1]
        reference = F.layer_norm(hidden, hidden.shape[-1:])
    assert list(ours.shape) == feature_shape(model.config, 64) == [1, 1 + 4 + 16, 64]
    assert tensor_metrics(reference, ours)["max_abs"] <= 1e-6


def test_features_are_not_the_models_final_norm(model, pixels):
    """TRELLIS.2 skips the affine final norm; using last_hidden_state would be a silent error."""
    with torch.inference_mode():
        ours = extract_features(model, pixels)
        last_hidden_state = model(pixel_values=pixels).last_hidden_state
    assert tensor_metrics(last_hidden_state, ours)["max_abs"] > 1e-2


def test_real_resolution_shapes():
    config = dinov3_config("full")
    assert feature_shape(config, 512) == [1, 1029, 1024]
    assert feature_shape(config, 1024) == [1, 4101, 1024]


def test_smoke_weights_round_trip_bit_exact_in_hub_layout(tiny_weights, model):
    reference = build_random_dinov3("tiny", seed=0).state_dict()
    loaded = model.state_dict()
    assert reference.keys() == loaded.keys()
    assert all(torch.equal(reference[k], loaded[k]) for k in reference)
    with safe_open(tiny_weights / "model.safetensors", framework="pt") as handle:
        keys = set(handle.keys())
    assert "layer.0.attention.q_proj.weight" in keys and not any(k.startswith("model.") for k in keys)
    assert weights_are_random(tiny_weights)


def test_full_architecture_has_the_released_tensor_set():
    """The released file has 415 tensors, 303.13 M parameters, keys ``layer.N.*`` (weights.md §3)."""
    with torch.device("meta"):
        full = DINOv3ViTModel(dinov3_config("full"))
    keys = {checkpoint_key(k) for k in full.state_dict()}
    assert len(keys) == 415
    assert sum(p.numel() for p in full.parameters()) == 303_129_600
    assert "layer.23.mlp.up_proj.weight" in keys and "embeddings.register_tokens" in keys


def test_random_weights_perturb_every_tensor_kind():
    model = build_random_dinov3("tiny", seed=0)
    state = model.state_dict()
    assert state["model.layer.0.norm1.bias"].abs().max() > 0  # not the zero init
    assert not torch.all(state["model.layer.0.layer_scale1.lambda1"] == 1.0)


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_missing_folder_and_missing_files(tmp_path, tiny_weights):
    with pytest.raises(WeightsError, match="does not exist"):
        load_dinov3(tmp_path / "nowhere")
    folder = _copy(tiny_weights, tmp_path / "w")
    (folder / "model.safetensors").unlink()
    with pytest.raises(WeightsError, match=r"model\.safetensors is missing"):
        load_dinov3(folder)


def test_other_architecture_is_refused(tmp_path, tiny_weights):
    folder = _copy(tiny_weights, tmp_path / "w")
    config = json.loads((folder / "config.json").read_text())
    config["model_type"] = "vit"
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(WeightsError, match="model_type 'vit', expected 'dinov3_vit'"):
        load_dinov3(folder)


def test_truncated_and_corrupt_weights_are_refused(tmp_path, tiny_weights):
    folder = _copy(tiny_weights, tmp_path / "w")
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:-1])
    with pytest.raises(WeightsError, match="truncated or corrupt"):
        load_dinov3(folder)
    weights.write_bytes(b"\x00" * 64)
    with pytest.raises(WeightsError, match="truncated or corrupt"):
        load_dinov3(folder)


def test_missing_tensor_fails_instead_of_random_init(tmp_path, tiny_weights):
    folder = _copy(tiny_weights, tmp_path / "w")
    tensors = load_file(folder / "model.safetensors")
    del tensors["layer.1.mlp.down_proj.bias"]
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(WeightsError, match=r"missing_keys: .*mlp\.down_proj\.bias.*deliverykit weights download"):
        load_dinov3(folder)


def test_another_models_tensors_are_refused_with_the_fix(tmp_path, tiny_weights):
    """Same shapes under another model's names (a ViT saved with a ``vision_model.`` prefix): named, with the fix."""
    folder = _copy(tiny_weights, tmp_path / "w")
    tensors = load_file(folder / "model.safetensors")
    save_file({f"vision_model.{key}": value for key, value in tensors.items()}, folder / "model.safetensors")
    with pytest.raises(WeightsError) as caught:
        load_dinov3(folder)
    message = str(caught.value)
    assert "missing_keys: " in message and "unexpected_keys: vision_model." in message and "\n" not in message
    assert "another model's tensors" in message and "deliverykit weights download --manifest" in message


def test_precision_patch_is_equivalent_on_cpu_fp32(tiny_weights, pixels):
    model = load_dinov3(tiny_weights)
    keys_before = list(model.state_dict())
    with torch.inference_mode():
        plain = extract_features(model, pixels)
    patched_names = apply_precision_patch(model)
    assert patched_names[0] == "embeddings.patch_embeddings" and len(patched_names) == 1 + 2
    assert list(model.state_dict()) == keys_before  # same checkpoint keys: the patch loads the same file
    with torch.inference_mode():
        patched = extract_features(model, pixels)
    assert tensor_metrics(plain, patched)["max_abs"] <= 1e-5


def test_patch_modules_match_their_torch_counterparts():
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 8, kernel_size=4, stride=4)
    x = torch.randn(2, 3, 16, 12)
    patched = MatmulPatchEmbedding.from_conv(conv)
    assert patched.weight is conv.weight
    torch.testing.assert_close(patched(x), conv(x), atol=1e-6, rtol=0)
    z = torch.linspace(-6, 6, 1001)
    npu_gelu = ops.kernels()["erf_gelu"].npu  # the composite the NPU runs, evaluated on the CPU
    assert ops.select("erf_gelu", "npu:0") is npu_gelu and ops.select("erf_gelu", "cpu") is F.gelu
    torch.testing.assert_close(npu_gelu(z.clone()), F.gelu(z), atol=1e-6, rtol=0)
    torch.testing.assert_close(ErfGELU()(z), F.gelu(z), atol=0, rtol=0)
    assert (npu_gelu(z.clone()) - F.gelu(z, approximate="tanh")).abs().max() > 1e-4  # it is not the tanh formula
    with pytest.raises(ValueError, match="non-overlapping"):
        MatmulPatchEmbedding.from_conv(torch.nn.Conv2d(3, 8, kernel_size=3, padding=1))


def test_random_dinov3_does_not_depend_on_the_torch_random_stream():
    """Smoke weights come from numpy's PCG64 (deliverykit.random_weights), so every torch build draws this model."""
    torch.manual_seed(1)
    first = build_random_dinov3("tiny", seed=0).state_dict()
    torch.manual_seed(2)
    second = build_random_dinov3("tiny", seed=0).state_dict()
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)
    assert not torch.equal(
        build_random_dinov3("tiny", seed=1).state_dict()["embeddings.cls_token"], first["embeddings.cls_token"]
    )
