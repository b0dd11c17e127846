"""Every guidance pass the dev schedule pays for changes the prediction (none is silently a no-op).

LTX-2.3's dev guidance runs three transformer calls per step: CFG (batch 2: negative, positive), STG (self-attention
skipped in the STG block) and modality isolation (no audio<->video cross-attention). Each must differ from the
positive pass; before ``perturbed_attn=True`` the STG pass equalled it to 7e-7 while costing a quarter of the compute.
The loader builds the transformer config in two ways (file metadata; tensor shapes with ltx-core's defaults); both are
checked.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from PIL import Image

from sulphur2_npu.accuracy import tiny_request
from sulphur2_npu.generate import generate
from sulphur2_npu.loader import load_pipeline
from sulphur2_npu.tiny import TINY_HEIGHT, TINY_WIDTH

# A pass counts as "different" above this fraction of the positive pass's peak. fp32 noise between two evaluations
# of the same maths is ~1e-7 of the peak; a real perturbation of the random tiny model moves it by ~1e-2 or more.
MIN_RELATIVE_CHANGE = 1e-4


def _passes(pipe, image=None) -> list[tuple[str, tuple[torch.Tensor, torch.Tensor]]]:
    """(kind, (video, audio)) of the transformer calls of the first dev step, in call order."""
    calls = []

    def record(module, args, kwargs, output):
        if kwargs.get("isolate_modalities"):
            kind = "modality"
        elif kwargs.get("spatio_temporal_guidance_blocks"):
            kind = "stg"
        else:
            kind = "cfg"
        calls.append((kind, tuple(tensor.detach().clone() for tensor in output[:2])))

    handle = pipe.transformer.register_forward_hook(record, with_kwargs=True)
    try:
        request = dataclasses.replace(tiny_request(), image=image)
        generate(pipe, request, device="cpu", generator=torch.Generator().manual_seed(42))
    finally:
        handle.remove()
    return calls[:3]


@pytest.mark.parametrize(
    ("files", "image_to_video"),
    [("smoke_files", False), ("smoke_files_partial_metadata", False), ("smoke_files", True)],
    ids=["metadata", "shapes", "i2v"],
)
def test_every_guidance_pass_differs_from_the_positive_pass(files, image_to_video, request):
    smoke = request.getfixturevalue(files)
    pipe = load_pipeline(
        smoke.checkpoint, smoke.text_encoder, image_to_video=image_to_video, torch_dtype=torch.float32
    ).pipe
    assert pipe.transformer.config.perturbed_attn
    pixels = np.random.default_rng(0).integers(0, 255, (TINY_HEIGHT, TINY_WIDTH, 3), dtype=np.uint8)
    calls = _passes(pipe, Image.fromarray(pixels) if image_to_video else None)
    assert [kind for kind, _ in calls] == ["cfg", "stg", "modality"]
    cfg = calls[0][1]
    negative, positive = [tensor[:1] for tensor in cfg], [tensor[1:] for tensor in cfg]
    for name, outputs in (("negative prompt", negative), ("stg", calls[1][1]), ("modality", calls[2][1])):
        for stream, got, want in zip(("video", "audio"), outputs, positive, strict=True):
            change = float((got - want).abs().max() / want.abs().max())
            assert change > MIN_RELATIVE_CHANGE, f"the {name} pass equals the positive one on {stream} ({change:.1e})"
