"""The strict offline loader: bit-exact round trip through the original layout, identical outputs, strict errors."""

from __future__ import annotations

import re
import socket

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from deliverykit.errors import InputError, WeightsError
from deliverykit.testing import assert_equal_up_to_reordering
from sulphur2_npu.loader import load_pipeline
from sulphur2_npu.tiny import (
    TINY_CALL,
    TINY_HEADS8,
    TINY_HEIGHT,
    TINY_WIDTH,
    tiny_components,
    tiny_pipeline,
    write_smoke_files,
)

MODULES = ("transformer", "connectors", "vae", "audio_vae", "vocoder", "text_encoder")


@pytest.fixture
def offline(monkeypatch):
    """HF_HUB_OFFLINE=1 and no sockets: any hub or network access fails the test."""
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)

    def refuse(*args, **kwargs):
        raise AssertionError("network access during an offline load")

    monkeypatch.setattr(socket.socket, "connect", refuse)


def _run(pipe, **extra):
    output = pipe(**TINY_CALL, **extra, generator=torch.Generator().manual_seed(42))
    return output.frames, output.audio


@pytest.mark.parametrize("files", ["smoke_files"])  # without metadata: test_model_config.py
def test_round_trip_is_bit_exact_and_gives_identical_outputs(files, request, tiny_components, offline):
    smoke = request.getfixturevalue(files)
    loaded = load_pipeline(smoke.checkpoint, smoke.text_encoder, torch_dtype=torch.float32)
    assert loaded.info.version == "LTX-2.3" and loaded.load_seconds > 0
    assert loaded.info.config_source == ("metadata" if files == "smoke_files" else "shapes")
    for name in MODULES:
        reference, got = tiny_components[name].state_dict(), getattr(loaded.pipe, name).state_dict()
        assert reference.keys() == got.keys(), name
        assert all(torch.equal(reference[key], got[key]) for key in reference), name
        assert loaded.info.parameter_counts[name] == sum(p.numel() for p in tiny_components[name].parameters())

    # The tensors are the same (above); the two pipelines are different objects, whose kernels may sum in another
    # order (CPU vendor, alignment): equal up to float32 reordering, not bit for bit.
    frames, audio = _run(loaded.pipe)
    ref_frames, ref_audio = _run(tiny_pipeline(components=tiny_components))
    assert_equal_up_to_reordering(frames, ref_frames, "frames")
    assert_equal_up_to_reordering(audio, ref_audio, "audio")


def test_the_eight_head_variant_loads_back_bit_exact(tmp_path, offline):
    """``--smoke tiny-heads8`` (what Ulysses 4 and 8 run on) takes the same loader; its metadata says 8 heads."""
    smoke = write_smoke_files(tmp_path, seed=0, model=TINY_HEADS8)
    loaded = load_pipeline(smoke.checkpoint, smoke.text_encoder, torch_dtype=torch.float32)
    config = loaded.pipe.transformer.config
    assert (config.num_attention_heads, config.audio_num_attention_heads) == (8, 8)
    reference = tiny_components(0, TINY_HEADS8)
    for name in MODULES:
        expected, got = reference[name].state_dict(), getattr(loaded.pipe, name).state_dict()
        assert expected.keys() == got.keys(), name
        assert all(torch.equal(expected[key], got[key]) for key in expected), name


def test_image_to_video_pipeline_matches_the_modules(smoke_files, tiny_components, offline):
    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (TINY_HEIGHT, TINY_WIDTH, 3), dtype=np.uint8))
    loaded = load_pipeline(
        smoke_files.checkpoint, smoke_files.text_encoder, image_to_video=True, torch_dtype=torch.float32
    )
    reference = tiny_pipeline(image_to_video=True, components=tiny_components)
    frames, audio = _run(loaded.pipe, image=image, image_crf=0)
    ref_frames, ref_audio = _run(reference, image=image, image_crf=0)
    assert_equal_up_to_reordering(frames, ref_frames, "frames")  # two pipeline objects: see the round-trip test
    assert_equal_up_to_reordering(audio, ref_audio, "audio")


def test_bfloat16_load_keeps_no_float32_or_meta_tensors(smoke_files, offline):
    loaded = load_pipeline(smoke_files.checkpoint, smoke_files.text_encoder)
    for name in MODULES:
        module = getattr(loaded.pipe, name)
        # transformers keeps Gemma's rotary buffers in float32 on purpose; the vocoder runs in float32 as in ltx-core;
        # everything else must be bf16
        tensors = list(module.parameters()) + (list(module.buffers()) if name != "text_encoder" else [])
        assert not any(t.is_meta for t in tensors), name
        expected = torch.float32 if name == "vocoder" else torch.bfloat16
        assert {t.dtype for t in tensors if t.is_floating_point()} == {expected}, name


def _rewrite(smoke, tmp_path, edit) -> object:
    tensors = load_file(str(smoke.checkpoint))
    with safe_open(str(smoke.checkpoint), framework="pt") as handle:
        metadata = handle.metadata()  # keep the config: without it the file is refused before any key check
    edit(tensors)
    path = tmp_path / "edited.safetensors"
    save_file(tensors, str(path), metadata=metadata)
    return path


def test_a_missing_key_is_named_with_its_component(smoke_files, tmp_path, offline):
    key = "audio_vae.decoder.conv_out.conv.bias"
    path = _rewrite(smoke_files, tmp_path, lambda tensors: tensors.pop(key))
    with pytest.raises(WeightsError, match="the audio_vae weights") as error:
        load_pipeline(path, smoke_files.text_encoder)
    assert "1 missing (e.g. decoder.conv_out.conv.bias)" in str(error.value)


def test_an_unexpected_key_is_named_with_its_component(smoke_files, tmp_path, offline):
    key = "model.diffusion_model.transformer_blocks.0.attn1.extra.weight"
    path = _rewrite(smoke_files, tmp_path, lambda tensors: tensors.setdefault(key, torch.zeros(2)))
    with pytest.raises(WeightsError, match="the transformer weights") as error:
        load_pipeline(path, smoke_files.text_encoder)
    assert "1 unexpected (e.g. transformer_blocks.0.attn1.extra.weight)" in str(error.value)


def test_a_wrong_shape_is_reported_before_loading(smoke_files, tmp_path, offline):
    key = "vocoder.vocoder.conv_post.weight"
    path = _rewrite(smoke_files, tmp_path, lambda tensors: tensors.__setitem__(key, torch.zeros(3, 3, 3)))
    with pytest.raises(WeightsError, match="wrong shape") as error:
        load_pipeline(path, smoke_files.text_encoder, torch_dtype=torch.float32)
    assert "vocoder.conv_out.weight (3, 3, 3)" in str(error.value)


def test_ltx20_file_and_missing_text_encoder_are_refused(smoke_files, tmp_path, as_ltx20, offline):
    path = tmp_path / "ltx20.safetensors"
    save_file({key: torch.zeros(1) for key in as_ltx20(list(load_file(str(smoke_files.checkpoint))))}, str(path))
    with pytest.raises(WeightsError, match=r"is an LTX-2\.0 checkpoint"):
        load_pipeline(path, smoke_files.text_encoder)
    absent = tmp_path / "gemma"
    with pytest.raises(InputError, match=re.escape(f"text encoder folder {absent} does not exist")):
        load_pipeline(smoke_files.checkpoint, absent)
