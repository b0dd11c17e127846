"""Header-only detection: LTX-2.3 vs LTX-2.0, other families, fp8, corrupt files, and config derivation."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from deliverykit.errors import InputError, WeightsError
from deliverykit.testing import CliRunner
from sulphur2_npu.checkpoint import inspect_checkpoint
from sulphur2_npu.configs import read_model_config
from sulphur2_npu.keymap import COMPONENTS, map_to_diffusers, map_to_original
from sulphur2_npu.tiny import tiny_ltx_metadata_config

from .conftest import DELIVERY_DIR

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


def _as_lists(value):
    return list(value) if isinstance(value, tuple) else value


def test_metadata_configs_rebuild_the_tiny_modules(smoke_files, tiny_components):
    from_metadata = inspect_checkpoint(smoke_files.checkpoint, text_encoder_config=TINY_GEMMA)
    assert from_metadata.config_source == "metadata" and not from_metadata.assumptions
    for name in COMPONENTS:
        reference = tiny_components[name].config  # the independent source: how tiny.py built the module
        for arg, value in from_metadata.configs[name].items():
            assert _as_lists(value) == _as_lists(reference[arg]), (name, arg)


def test_a_file_without_metadata_is_refused_naming_the_field_and_the_fix(smoke_files_without_metadata):
    with pytest.raises(WeightsError, match=r"no vocoder\.bwe config .*input_sampling_rate.*--model-config FILE"):
        inspect_checkpoint(smoke_files_without_metadata.checkpoint, text_encoder_config=TINY_GEMMA)


def test_model_config_stands_in_for_the_lost_metadata(smoke_files, smoke_files_without_metadata, tmp_path):
    from_metadata = inspect_checkpoint(smoke_files.checkpoint, text_encoder_config=TINY_GEMMA)
    config_file = tmp_path / "config.json"
    config_file.write_text(json.dumps(tiny_ltx_metadata_config()))
    given = inspect_checkpoint(
        smoke_files_without_metadata.checkpoint,
        text_encoder_config=TINY_GEMMA,
        model_config=read_model_config(config_file),
    )
    assert given.config_source == "model-config" and given.configs == from_metadata.configs
    with pytest.raises(InputError, match=r"--model-config .* not a readable JSON"):
        read_model_config(tmp_path / "absent.json")


# ltx-core 400fd310's defaults for absent metadata fields, copied by hand from its configurators (where the tiny model
# has LTX-2.3's metadata values instead, e.g. zero decoder padding, the file without those sections must not get them):
# video_vae/model_configurator.py:66 (encoder padding), :90 (causal_decoder), :92 (decoder padding),
# video_vae/conv_video_decoder.py:134 (compress_all residual), transformer/model_configurator.py:66-68,
# text_encoders/gemma/embeddings_connector.py:202 (connector positions).
LTX_CORE_DEFAULTS = {
    "vae": {
        "encoder_spatial_padding_mode": "zeros",
        "decoder_spatial_padding_mode": "reflect",
        "decoder_causal": False,
        "upsample_residual": [False] * 4,
    },
    "transformer": {"cross_attn_timestep_scale_multiplier": 1, "rope_double_precision": False, "rope_type": "split"},
    "connectors": {"connector_rope_base_seq_len": 1, "rope_double_precision": False},
}


def test_sections_without_metadata_take_shapes_and_ltx_core_defaults(smoke_files_partial_metadata, tiny_components):
    info = inspect_checkpoint(smoke_files_partial_metadata.checkpoint, text_encoder_config=TINY_GEMMA)
    shaped = ("transformer", "connectors", "vae", "audio_vae")
    assert {name: info.config_sources[name] for name in shaped} == dict.fromkeys(shaped, "shapes")
    assert info.config_sources["vocoder"] == "metadata" and info.config_source == "metadata+shapes"
    assert all(any(text.startswith(name) for text in info.assumptions) for name in shaped)
    for name in shaped:
        defaults = LTX_CORE_DEFAULTS.get(name, {})
        for arg, value in defaults.items():
            assert _as_lists(info.configs[name][arg]) == value, (name, arg)
        reference = tiny_components[name].config
        structure = {arg: value for arg, value in info.configs[name].items() if arg not in defaults}
        for arg, value in structure.items():  # everything shapes prove is what tiny.py built
            assert _as_lists(value) == _as_lists(reference[arg]), (name, arg)


def test_wrong_text_encoder_width_is_an_input_error(smoke_files):
    with pytest.raises(InputError, match="Gemma-3-12B"):
        inspect_checkpoint(smoke_files.checkpoint, text_encoder_config={"hidden_size": 64, "num_hidden_layers": 2})


def test_cli_prints_the_detection_and_exits_4_on_bad_files(smoke_files, tmp_path):
    inspect = CliRunner(DELIVERY_DIR / "scripts" / "inspect_checkpoint.py")
    code, out, _ = inspect(smoke_files.checkpoint, "--text-encoder", smoke_files.text_encoder)
    assert code == 0 and "family: LTX-2.3" in out and "config source: metadata" in out
    path = _write(tmp_path / "flux.safetensors", ["double_blocks.0.x.weight", "single_blocks.0.x.weight"])
    code, _, err = inspect(path)
    assert code == 4 and "Flux" in err


def test_key_mapping_is_a_bijection_on_the_tiny_model(tiny_components):
    for name in COMPONENTS:
        diffusers_keys = list(tiny_components[name].state_dict())
        original = map_to_original(name, diffusers_keys)
        assert len(set(original.values())) == len(diffusers_keys), name  # no two modules share a file key
        back = map_to_diffusers(original.values())
        assert list(back.components) == [name] and not back.unknown and not back.ignored, name
        assert back.components[name] == original, name  # forward(inverse(key)) == key, key for key
