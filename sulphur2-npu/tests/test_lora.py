"""LoRA loading on the tiny LTX-2.3 pipeline, checked against an independently merged copy of the weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from deliverykit.compare import tensor_metrics
from deliverykit.errors import InputError
from sulphur2_npu.lora import load_lora
from sulphur2_npu.tiny import TINY_CALL, tiny_components, tiny_pipeline

RANK = 4
SCALE = 0.7
# diffusers module path -> name in the original (ComfyUI / ltx-core) layout
TRANSFORMER_TARGETS = {
    "transformer_blocks.0.attn1.to_q": "transformer_blocks.0.attn1.to_q",
    "transformer_blocks.1.audio_attn2.to_v": "transformer_blocks.1.audio_attn2.to_v",
    "transformer_blocks.0.ff.net.0.proj": "transformer_blocks.0.ff.net.0.proj",
    "prompt_adaln.linear": "prompt_adaln_single.linear",  # renamed by diffusers' converter
}
CONNECTOR_TARGETS = {"video_text_proj_in": "video_aggregate_embed"}


def _factors(pipe) -> dict[tuple[str, str], tuple[torch.Tensor, torch.Tensor]]:
    """Random (A, B) per (component, diffusers module path), large enough to move the output."""
    generator = torch.Generator().manual_seed(7)
    targets = [("transformer", name) for name in TRANSFORMER_TARGETS] + [("connectors", n) for n in CONNECTOR_TARGETS]
    factors = {}
    for component, name in targets:
        layer = getattr(pipe, component).get_submodule(name)
        a = torch.randn(RANK, layer.in_features, generator=generator) * 0.3
        b = torch.randn(layer.out_features, RANK, generator=generator) * 0.3
        factors[(component, name)] = (a, b)
    return factors


def _original_key(component: str, name: str) -> str:
    if component == "transformer":
        return f"diffusion_model.{TRANSFORMER_TARGETS[name]}"
    return f"text_embedding_projection.{CONNECTOR_TARGETS[name]}"


def _write(path: Path, tensors: dict[str, torch.Tensor]) -> Path:
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))
    return path


def _peft_file(path: Path, factors, *, original: bool) -> Path:
    tensors = {}
    for (component, name), (a, b) in factors.items():
        prefix = _original_key(component, name) if original else f"{component}.{name}"
        tensors[f"{prefix}.lora_A.weight"] = a
        tensors[f"{prefix}.lora_B.weight"] = b
    return _write(path, tensors)


def _latents(pipe) -> tuple[torch.Tensor, torch.Tensor]:
    out = pipe(**{**TINY_CALL, "output_type": "latent"}, generator=torch.Generator().manual_seed(42))
    return out.frames, out.audio


def _merged_pipeline(factors, scale: float):
    """The reference: W + scale·B·A written into copies of the weights, no peft involved."""
    components = tiny_components(0)
    for (component, name), (a, b) in factors.items():
        layer = components[component].get_submodule(name)
        with torch.no_grad():
            layer.weight += scale * (b @ a)
    return tiny_pipeline(components=components)


def _assert_close(actual, expected, tolerance: float = 1e-5) -> None:
    for got, want in zip(actual, expected, strict=True):
        metrics = tensor_metrics(want, got)
        assert metrics["rel_l2"] < tolerance, metrics


@pytest.fixture(scope="module")
def factors():
    return _factors(tiny_pipeline(0))


@pytest.fixture(scope="module")
def merged_latents(factors):
    return _latents(_merged_pipeline(factors, SCALE))


@pytest.mark.parametrize("original", [True, False], ids=["original-keys", "diffusers-keys"])
def test_lora_changes_output_and_equals_merged_weights(tmp_path, factors, merged_latents, original):
    pipe = tiny_pipeline(0)
    base = _latents(pipe)
    info = load_lora(pipe, _peft_file(tmp_path / "lora.safetensors", factors, original=original), SCALE)
    assert info.key_format == ("original" if original else "diffusers")
    assert info.layers == len(factors) and info.components == ("connectors", "transformer")
    with_lora = _latents(pipe)
    assert tensor_metrics(base[0], with_lora[0])["rel_l2"] > 1e-2  # the LoRA does something
    _assert_close(with_lora, merged_latents)


def test_fused_lora_equals_merged_weights(tmp_path, factors, merged_latents):
    pipe = tiny_pipeline(0)
    info = load_lora(pipe, _peft_file(tmp_path / "lora.safetensors", factors, original=True), SCALE, fuse=True)
    assert info.fused
    assert not any("lora" in name for name, _ in pipe.transformer.named_parameters())  # LoRA layers dropped
    _assert_close(_latents(pipe), merged_latents)


def test_kohya_with_alpha_equals_its_peft_equivalent(tmp_path, factors):
    alpha = 2.0  # Kohya scales B·A by alpha / rank at run time
    transformer_only = {key: value for key, value in factors.items() if key[0] == "transformer"}
    kohya = {}
    for (component, name), (a, b) in transformer_only.items():
        prefix = _original_key(component, name)
        kohya |= {
            f"{prefix}.lora_down.weight": a,
            f"{prefix}.lora_up.weight": b,
            f"{prefix}.alpha": torch.tensor(alpha),
        }
    peft_equivalent = {key: (a, b * (alpha / RANK)) for key, (a, b) in transformer_only.items()}

    pipe = tiny_pipeline(0)
    info = load_lora(pipe, _write(tmp_path / "kohya.safetensors", kohya), SCALE)
    assert info.key_format == "kohya" and info.components == ("transformer",)
    reference = tiny_pipeline(0)
    load_lora(reference, _peft_file(tmp_path / "peft.safetensors", peft_equivalent, original=True), SCALE)
    _assert_close(_latents(pipe), _latents(reference), tolerance=1e-6)
    _assert_close(_latents(pipe), _latents(_merged_pipeline(peft_equivalent, SCALE)))


def test_lora_for_another_architecture_names_the_keys(tmp_path):
    flux_like = {
        f"diffusion_model.double_blocks.{i}.img_attn.qkv.lora_{side}.weight": torch.zeros(4, 4)
        for i in range(7)
        for side in "AB"
    }
    with pytest.raises(InputError, match=r"14 of 14 keys do not match .*double_blocks\.0\.img_attn\.qkv") as err:
        load_lora(tiny_pipeline(0), _write(tmp_path / "flux.safetensors", flux_like), 1.0)
    assert "; ..." in str(err.value) and "\n" not in str(err.value)


def test_lora_with_wrong_shapes_names_the_layer(tmp_path):
    pipe = tiny_pipeline(0)
    in_features = pipe.transformer.get_submodule("transformer_blocks.0.attn1.to_q").in_features
    wrong = {
        "transformer.transformer_blocks.0.attn1.to_q.lora_A.weight": torch.zeros(RANK, in_features + 1),
        "transformer.transformer_blocks.0.attn1.to_q.lora_B.weight": torch.zeros(16, RANK),
    }
    with pytest.raises(InputError, match=r"1 of 2 keys .*to_q\.lora_A\.weight \(shape \(4, 17\)"):
        load_lora(pipe, _write(tmp_path / "wrong.safetensors", wrong), 1.0)


def test_missing_or_corrupt_lora_file_is_an_input_error(tmp_path):
    pipe = tiny_pipeline(0)
    with pytest.raises(InputError, match="does not exist"):
        load_lora(pipe, tmp_path / "absent.safetensors", 1.0)
    corrupt = tmp_path / "corrupt.safetensors"
    corrupt.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(InputError, match="not a readable safetensors file"):
        load_lora(pipe, corrupt, 1.0)
