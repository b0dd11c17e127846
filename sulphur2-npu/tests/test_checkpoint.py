"""Header-only detection: LTX-2.3 vs LTX-2.0, other families, fp8, corrupt files, and config derivation."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from deliverykit.errors import InputError, WeightsError, run_main
from sulphur2_npu.checkpoint import inspect_checkpoint, main
from sulphur2_npu.keymap import COMPONENTS, map_to_diffusers, map_to_original

TINY_GEMMA = {"hidden_size": 32, "num_hidden_layers": 2}


def _keys(path) -> list[str]:
    with safe_open(str(path), framework="pt") as handle:
        return list(handle.keys())


def _write(path, keys, dtype=torch.float32):
    save_file({key: torch.zeros(1, dtype=dtype) for key in keys}, str(path))
    return path


def test_ltx23_file_is_detected_with_its_evidence(smoke_files):
    info = inspect_checkpoint(smoke_files.checkpoint, text_encoder_config=TINY_GEMMA)
    assert info.family == "LTX-2.3"
    assert "prompt_adaln_single" in info.evidence[0] and "bwe_generator" in info.evidence[0]
    assert sum(info.tensor_counts.values()) == len(_keys(smoke_files.checkpoint))


def test_ltx20_layout_is_reported_as_ltx20(smoke_files, tmp_path, as_ltx20):
    path = _write(tmp_path / "ltx20.safetensors", as_ltx20(_keys(smoke_files.checkpoint)))
    info = inspect_checkpoint(path)
    assert info.family == "LTX-2.0" and "caption_projection" in info.evidence[0]
    assert info.configs == {}  # LTX-2.3 configs are not derived for a 2.0 file


@pytest.mark.parametrize(
    ("keys", "looks_like"),
    [
        (["double_blocks.0.img_attn.qkv.weight", "single_blocks.0.linear1.weight"], "Flux"),
        (
            [
                "model.diffusion_model.patchify_proj.weight",
                "model.diffusion_model.transformer_blocks.0.attn1.to_q.weight",
            ],
            "LTX-Video 0.9",
        ),
        (
            ["model.diffusion_model.input_blocks.0.0.weight", "cond_stage_model.transformer.x.weight"],
            "Stable Diffusion 1.x",
        ),
        (["foo.weight", "bar.bias"], "matches no known family"),
    ],
)
def test_other_families_are_refused_with_what_they_look_like(tmp_path, keys, looks_like):
    path = _write(tmp_path / "other.safetensors", keys)
    with pytest.raises(WeightsError, match=looks_like) as error:
        inspect_checkpoint(path)
    assert str(path) in str(error.value)


def test_fp8_mixed_file_is_refused_with_the_reason(smoke_files, tmp_path):
    keys = _keys(smoke_files.checkpoint)[:3]
    tensors = {key: torch.zeros(1) for key in keys}
    tensors["model.diffusion_model.transformer_blocks.0.attn1.to_q.weight"] = torch.zeros(2, 2).to(torch.float8_e4m3fn)
    tensors["model.diffusion_model.transformer_blocks.0.attn1.to_q.weight_scale"] = torch.ones(1)
    path = tmp_path / "fp8.safetensors"
    save_file(tensors, str(path))
    with pytest.raises(WeightsError, match="fp8-mixed") as error:
        inspect_checkpoint(path)
    assert "1 float8 tensors, 1 scale tensors" in str(error.value) and "no FP8 compute" in str(error.value)


def test_truncated_and_missing_files_name_the_file(smoke_files, tmp_path):
    data = smoke_files.checkpoint.read_bytes()
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(WeightsError, match="truncated or corrupt") as error:
        inspect_checkpoint(truncated)
    assert str(truncated) in str(error.value)
    with pytest.raises(InputError, match="does not exist"):
        inspect_checkpoint(tmp_path / "absent.safetensors")


def test_metadata_and_shape_configs_agree_and_rebuild_the_tiny_modules(
    smoke_files, smoke_files_without_metadata, tiny_components
):
    from_metadata = inspect_checkpoint(smoke_files.checkpoint, text_encoder_config=TINY_GEMMA)
    from_shapes = inspect_checkpoint(smoke_files_without_metadata.checkpoint, text_encoder_config=TINY_GEMMA)
    assert from_metadata.config_source == "metadata" and from_shapes.config_source == "shapes"
    assert from_shapes.assumptions and not from_metadata.assumptions
    for name in COMPONENTS:
        assert from_metadata.configs[name] == from_shapes.configs[name], name
        reference = tiny_components[name].config  # the independent source: how tiny.py built the module
        for arg, value in from_metadata.configs[name].items():
            expected = reference[arg]
            assert (list(value) if isinstance(value, tuple) else value) == (
                list(expected) if isinstance(expected, tuple) else expected
            ), (name, arg)


def test_wrong_text_encoder_width_is_an_input_error(smoke_files):
    with pytest.raises(InputError, match="Gemma-3-12B"):
        inspect_checkpoint(smoke_files.checkpoint, text_encoder_config={"hidden_size": 64, "num_hidden_layers": 2})


def test_cli_prints_the_detection_and_exits_4_on_bad_files(smoke_files, tmp_path, capsys):
    assert run_main(lambda: main([str(smoke_files.checkpoint), "--text-encoder", str(smoke_files.text_encoder)])) == 0
    out = capsys.readouterr().out
    assert "family: LTX-2.3" in out and "config source: metadata" in out
    path = _write(tmp_path / "flux.safetensors", ["double_blocks.0.x.weight", "single_blocks.0.x.weight"])
    assert run_main(lambda: main([str(path)])) == 4
    assert "Flux" in capsys.readouterr().err


def test_key_mapping_is_a_bijection_on_the_tiny_model(tiny_components):
    for name in COMPONENTS:
        diffusers_keys = list(tiny_components[name].state_dict())
        original = map_to_original(name, diffusers_keys)
        assert len(set(original.values())) == len(diffusers_keys), name  # no two modules share a file key
        back = map_to_diffusers(original.values())
        assert list(back.components) == [name] and not back.unknown and not back.ignored, name
        assert back.components[name] == original, name  # forward(inverse(key)) == key, key for key
