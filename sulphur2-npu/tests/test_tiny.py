"""The tiny LTX-2.3 pipeline runs end to end on CPU and is a deterministic function of its seed."""

from __future__ import annotations

import numpy as np
import torch

from sulphur2_npu.tiny import TINY_CALL, TINY_HEIGHT, TINY_NUM_FRAMES, TINY_WIDTH, tiny_components, tiny_pipeline


def _run(seed: int) -> tuple[np.ndarray, torch.Tensor]:
    output = tiny_pipeline(seed)(**TINY_CALL, generator=torch.Generator().manual_seed(42))
    return output.frames, output.audio


def test_tiny_pipeline_makes_video_and_stereo_audio_and_is_seeded():
    frames, audio = _run(0)
    assert frames.shape == (1, TINY_NUM_FRAMES, TINY_HEIGHT, TINY_WIDTH, 3)
    assert audio.ndim == 3 and audio.shape[:2] == (1, 2) and audio.shape[2] > 0
    assert np.isfinite(frames).all() and torch.isfinite(audio).all()
    assert frames.std() > 0.01 and audio.std() > 1e-3  # not a constant image or silence

    again_frames, again_audio = _run(0)
    assert np.array_equal(frames, again_frames) and torch.equal(audio, again_audio)

    other_frames, other_audio = _run(1)
    assert not np.array_equal(frames, other_frames) and not torch.equal(audio, other_audio)


def test_tiny_components_have_the_ltx23_structure():
    components = tiny_components(0)
    transformer_keys = components["transformer"].state_dict().keys()
    assert any(".to_gate_logits." in key for key in transformer_keys)  # gated attention
    assert any(key.startswith("prompt_adaln.") for key in transformer_keys)  # prompt (cross-attention) AdaLN
    assert not any(key.startswith("caption_projection.") for key in transformer_keys)  # 2.0 only
    assert components["connectors"].config.per_modality_projections
    assert len(components["vae"].decoder.up_blocks) == 4
    assert components["vae"].spatial_compression_ratio == 32 and components["vae"].temporal_compression_ratio == 8
    assert any(key.startswith("bwe_generator.") for key in components["vocoder"].state_dict())
    assert components["vocoder"].mel_stft.mel_basis.abs().sum() > 0  # not the zero placeholder


def test_tiny_weights_do_not_depend_on_the_torch_random_stream():
    """Drawn with numpy's PCG64 (deliverykit.random_weights): a CPU reference and an NPU run on another torch build
    load the same model. The text encoder too: it is part of what the smoke run compares."""

    def state(torch_seed: int) -> dict[str, torch.Tensor]:
        torch.manual_seed(torch_seed)
        components = tiny_components(0)
        return {
            f"{name}.{key}": tensor
            for name in ("transformer", "connectors", "vae", "audio_vae", "vocoder", "text_encoder")
            for key, tensor in components[name].state_dict().items()
        }

    first, second = state(1), state(2)
    assert first.keys() == second.keys()
    assert [key for key in first if not torch.equal(first[key], second[key])] == []


def test_the_smoke_flag_names_every_tiny_model():
    """``--smoke``'s choices come from the torch-free options module; the models from tiny: the same names."""
    from sulphur2_npu import options, tiny

    assert tuple(tiny.TINY_MODELS) == options.SMOKE_MODELS
