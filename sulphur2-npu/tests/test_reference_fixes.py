"""The two diffusers overrides (``reference_fixes``) against ltx-core's formulas, without the ltx-core peer.

Hand-derived from ltx-core 400fd310: ``transformer_args.py`` ``_prepare_cross_attention_timestep`` (scale/shift
embedder fed the stream's own per-token timesteps x multiplier, gate embedder the other stream's σ x multiplier x
av_ca factor) and ``model.py`` ``X0Model.forward`` (``to_denoised(latent, v, timesteps)``: x0 = x - v·σ·mask, so x on
a conditioned token). ``tests/test_reference_ltx.py`` checks the same against ltx-core itself when it is available.
"""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch
from PIL import Image

from sulphur2_npu.reference_fixes import ReferenceImageToVideoPipeline, install_cross_timestep_fix
from sulphur2_npu.tiny import TINY_CALL, TINY_HEIGHT, TINY_WIDTH, tiny_components

FRAMES, HEIGHT, WIDTH, AUDIO_FRAMES, SIGMA = 2, 2, 3, 5, 800.0
# The fixed and the stock transformer run the same kernels on the same values in T2V; float32 rounding bound.
FP32_TOLERANCE = 1e-6


@pytest.fixture(scope="module")
def transformers():
    """(fixed, stock): the tiny transformer twice with the same weights, the first with the fix installed."""
    fixed, stock = tiny_components(0)["transformer"], tiny_components(0)["transformer"]
    assert install_cross_timestep_fix(fixed) and not install_cross_timestep_fix(fixed)  # idempotent
    return fixed, stock


def _inputs(conditioned: bool) -> dict:
    generator = torch.Generator().manual_seed(0)
    tokens = FRAMES * HEIGHT * WIDTH
    timestep = torch.full((1, tokens), SIGMA)
    if conditioned:
        timestep[:, : HEIGHT * WIDTH] = 0.0  # image-to-video: the first latent frame is the clean image
    return {
        "hidden_states": torch.randn(1, tokens, 8, generator=generator),
        "audio_hidden_states": torch.randn(1, AUDIO_FRAMES, 4, generator=generator),
        "encoder_hidden_states": torch.randn(1, 4, 16, generator=generator),
        "audio_encoder_hidden_states": torch.randn(1, 4, 8, generator=generator),
        "timestep": timestep,
        "audio_timestep": torch.tensor([SIGMA]),
        "sigma": torch.tensor([SIGMA]),
        "num_frames": FRAMES,
        "height": HEIGHT,
        "width": WIDTH,
        "audio_num_frames": AUDIO_FRAMES,
        "return_dict": False,
    }


def _embedder_inputs(transformer, kwargs) -> dict[str, torch.Tensor]:
    seen, handles = {}, []
    for name in ("av_cross_attn_video_scale_shift", "av_cross_attn_video_a2v_gate", "av_cross_attn_audio_scale_shift"):
        module = getattr(transformer, name)
        handles.append(module.register_forward_hook(lambda m, args, out, name=name: seen.update({name: args[0]})))
    try:
        with torch.no_grad():
            transformer(**kwargs)
    finally:
        for handle in handles:
            handle.remove()
    return seen


def test_scale_shift_gets_the_own_timesteps_and_the_gate_the_other_sigma(transformers):
    fixed, _ = transformers
    kwargs = _inputs(conditioned=True)
    seen = _embedder_inputs(fixed, {**kwargs, "use_cross_timestep": False})  # overridden: the gate is ltx-core's
    gate_factor = fixed.config.cross_attn_timestep_scale_multiplier / fixed.config.timestep_scale_multiplier
    assert torch.equal(seen["av_cross_attn_video_scale_shift"], kwargs["timestep"].flatten())  # per token, 0 on frame 0
    assert torch.equal(seen["av_cross_attn_video_a2v_gate"], kwargs["sigma"] * gate_factor)  # the audio σ
    assert torch.equal(seen["av_cross_attn_audio_scale_shift"], kwargs["audio_timestep"])


def test_text_to_video_is_unchanged_and_image_to_video_is_not(transformers):
    fixed, stock = transformers
    with torch.no_grad():
        same = [fixed(**_inputs(False)), stock(**_inputs(False), use_cross_timestep=True)]
        differ = [fixed(**_inputs(True)), stock(**_inputs(True), use_cross_timestep=True)]
    for got, want in zip(*same, strict=True):
        assert float((got - want).abs().max()) <= FP32_TOLERANCE
    for got, want in zip(*differ, strict=True):
        assert float((got - want).abs().max() / want.abs().max()) > 1e-3  # the stock path really is different


def test_conditioned_tokens_keep_their_latent_as_x0():
    components = tiny_components(0)
    pipe = ReferenceImageToVideoPipeline(**components)
    pipe.set_progress_bar_config(disable=True)
    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (TINY_HEIGHT, TINY_WIDTH, 3), dtype=np.uint8))
    conditioned = pipe.video_processor.preprocess(image, height=TINY_HEIGHT, width=TINY_WIDTH)
    latents, mask = pipe.prepare_latents(
        conditioned, 1, 8, TINY_HEIGHT, TINY_WIDTH, TINY_CALL["num_frames"], 0.0, torch.float32, "cpu", None, None
    )
    pipe.scheduler.sigmas = torch.tensor([0.8, 0.5, 0.0])  # what set_timesteps leaves, without its dynamic shift
    velocity = torch.randn(latents.shape, generator=torch.Generator().manual_seed(1))
    x0 = pipe.convert_velocity_to_x0(latents, velocity, 0, pipe.scheduler)
    sigma = float(pipe.scheduler.sigmas[0])
    expected = latents - velocity * sigma * (1 - mask)[..., None]  # ltx-core to_denoised with per-token timesteps
    assert bool(mask.any()) and torch.allclose(x0, expected, atol=1e-6)
    assert torch.equal(x0[mask.bool()], latents[mask.bool()])  # x0 = x exactly where σ·(1 - mask) is 0
    audio = torch.randn(1, 6, 16)
    audio_scheduler = types.SimpleNamespace(sigmas=torch.tensor([0.8, 0.5, 0.0]))  # the pipeline's deepcopy
    assert torch.allclose(pipe.convert_velocity_to_x0(audio, audio, 0, audio_scheduler), audio * (1 - 0.8))
