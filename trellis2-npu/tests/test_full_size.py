"""``--smoke full``: the released architectures (sizes against the manifest), the pinned sparse structure, and the
per-stage model loading that keeps a CPU run within host memory."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from trellis2_npu import full_size, tiny
from trellis2_npu.offload import OffloadedModel, lazy_model_loading

MANIFEST = Path(__file__).resolve().parents[1] / "weights-manifest.json"


def manifest_bytes() -> dict[str, int]:
    """Released safetensors bytes per model key (the manifest's ``component``)."""
    models = json.loads(MANIFEST.read_text(encoding="utf-8"))["models"]
    return {
        file["component"]: file["bytes"]
        for model in models
        if model["id"].startswith("microsoft/")
        for file in model["files"]
        if file["path"].endswith(".safetensors")
    }


def test_safetensors_bytes_is_the_writers_size(tmp_path):
    """The size formula against the safetensors writer itself: mixed dtypes (alignment order), metadata, names that
    sort differently from their insertion order."""
    tensors = {
        "b.weight": torch.zeros(3, 5, dtype=torch.float16),
        "a.bias": torch.zeros(7, dtype=torch.float32),
        "c": torch.zeros(2, 2, 2, dtype=torch.bfloat16),
        "a.weight": torch.zeros(11, dtype=torch.float16),
    }
    for metadata in (None, {"format": "pt", "deliverykit_random_weights": "true"}):
        save_file(tensors, tmp_path / "x.safetensors", metadata=metadata)
        assert full_size.safetensors_bytes(tensors, metadata) == (tmp_path / "x.safetensors").stat().st_size


def test_every_released_size_equals_the_manifest(patched):
    """Built on the meta device (no memory): each model's file, in the released dtypes and without our metadata,
    is exactly the manifest's byte count, so every parameter count and shape matches the release. Exact: a
    parameter more or less changes the size by 2 bytes."""
    from trellis2_npu import upstream

    upstream.import_pipeline_class(patched)
    expected = manifest_bytes()
    keys = [*full_size.released_pipeline_config()["args"]["models"], *full_size.ENCODER_STEMS]
    assert set(keys) == set(expected)
    for key in keys:
        assert full_size.safetensors_bytes(full_size.meta_tensors(key)) == expected[key], key


def test_pinned_shell_has_the_asked_voxel_count_and_is_a_shell():
    logits = full_size.shell_logits(64, 9_600)
    occupied = torch.argwhere(logits[0, 0] > 0).float()
    assert occupied.shape[0] == 9_600 and int((logits < 0).sum()) == 64**3 - 9_600
    radius = ((occupied + 0.5) / 64 - 0.5).norm(dim=1)
    assert (radius - full_size.SHELL_RADIUS).abs().max() < 2 / 64  # within two cells of the sphere


def test_pin_occupancy_replaces_the_decoder_output():
    decoder = torch.nn.Conv3d(1, 1, 1)
    full_size.pin_occupancy(decoder, voxels=100)
    out = decoder(torch.randn(2, 1, 16, 16, 16))
    assert out.shape == (2, 1, 16, 16, 16) and [int((o > 0).sum()) for o in out] == [100, 100]


class Counter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.tensor(2.0))
        self.resolution = 16

    def forward(self, x):
        return self.scale * x

    def upsample(self, x):
        return x + 1


def test_offloaded_model_loads_per_use_and_frees_at_cpu():
    """Upstream's low_vram bracket ``to(device)`` … ``cpu()``: one build per bracket, nothing held after it."""
    proxy = OffloadedModel(Counter, Counter)
    assert isinstance(proxy, torch.nn.Module) and isinstance(proxy, Counter)  # upstream's isinstance checks
    assert not proxy.is_loaded
    original = proxy.forward
    proxy.forward = lambda *a: 10 * original(*a)  # a timing wrapper, as generate.run_pipeline sets one
    assert callable(proxy.upsample)  # a method: resolves when called
    assert not proxy.is_loaded and proxy.loads == 0
    proxy.to("cpu")
    assert proxy(torch.tensor(3.0)) == 60 and proxy.upsample(torch.tensor(1.0)) == 2 and proxy.resolution == 16
    proxy.cpu()
    assert not proxy.is_loaded and proxy.loads == 1
    proxy.to("cpu")
    proxy.low_vram = True  # an attribute: set on the model
    assert proxy.low_vram is True and proxy.loads == 2
    del proxy.forward
    assert proxy(torch.tensor(3.0)) == 6


def test_forward_hooks_of_the_built_model_run():
    proxy = OffloadedModel(Counter, Counter)
    proxy.register_forward_hook(lambda module, inputs, output: output + 1)
    assert proxy(torch.tensor(1.0)) == 3


def test_lazy_model_loading_defers_only_large_checkpoints(tmp_path):
    loaded = []

    def from_pretrained(path, **kwargs):
        loaded.append(path)
        return Counter()

    models = types.SimpleNamespace(from_pretrained=from_pretrained, Counter=Counter)
    for name, size in (("small", 10), ("large", 100)):
        (tmp_path / f"{name}.json").write_text(json.dumps({"name": "Counter", "args": {}}))
        (tmp_path / f"{name}.safetensors").write_bytes(b"\0" * size)
    with lazy_model_loading(models, min_bytes=50):
        small = models.from_pretrained(str(tmp_path / "small"))
        large = models.from_pretrained(str(tmp_path / "large"))
    assert models.from_pretrained is from_pretrained
    assert isinstance(small, Counter) and isinstance(large, OffloadedModel) and loaded == [str(tmp_path / "small")]
    assert large(torch.tensor(1.0)) == 2 and loaded[-1] == str(tmp_path / "large")


@pytest.mark.parametrize("key", ["shape_slat_flow_model_1024", "tex_slat_flow_model_1024"])
def test_1024_flows_share_the_512_architecture(key):
    """Why write_full_weights may hard-link them: the released JSONs differ in the resolution only."""
    name, args, dtype = full_size.model_config(key)
    name_512, args_512, dtype_512 = full_size.model_config(key.replace("1024", "512"))
    assert (name, dtype) == (name_512, dtype_512) and args["resolution"] == 2 * args_512["resolution"]
    assert {k: v for k, v in args.items() if k != "resolution"} == {
        k: v for k, v in args_512.items() if k != "resolution"
    }


def _save_upstream_model(models, folder: Path, name: str, args: dict) -> torch.nn.Module:
    """An upstream model built as released (``use_fp16``), saved as ``<name>.{json,safetensors}``."""
    torch.manual_seed(0)
    model = getattr(models, name)(**args)
    (folder / f"{name}.json").write_text(json.dumps({"name": name, "args": args}), encoding="utf-8")
    save_file({key: value.contiguous() for key, value in model.state_dict().items()}, folder / f"{name}.safetensors")
    return model


def test_fp16_models_load_in_fp32_through_upstreams_loader(patched, tmp_path):
    """On a CPU without fp16 arithmetic the released fp16 decoders stall (emulated fp16 Conv3d): loaded within
    ``fp32_half_models`` they compute in fp32. The sparse-structure decoder's occupancy equals the same architecture
    built in fp32 from the saved (fp16-valued) weights, within fp32 rounding of a few convolutions; the SC-VAE
    decoder, whose own ``convert_to_fp32`` leaves ``dtype`` at fp16, has it fp32 too. Without the context both stay
    fp16 (the loader is upstream's)."""
    from trellis2_npu import precision, upstream

    upstream.import_pipeline_class(patched)
    from trellis2 import models

    ss_args = {**tiny.CONFIGS["sparse_structure_decoder"][1], "use_fp16": True}
    sc_args = {"out_channels": 6, **tiny.SC_DECODER, "pred_subdiv": False, "use_fp16": True}
    _save_upstream_model(models, tmp_path, "SparseStructureDecoder", ss_args)
    _save_upstream_model(models, tmp_path, "SparseUnetVaeDecoder", sc_args)
    as_released = models.from_pretrained(str(tmp_path / "SparseUnetVaeDecoder"))
    assert as_released.dtype == torch.float16
    with precision.fp32_half_models(models):
        decoder = models.from_pretrained(str(tmp_path / "SparseStructureDecoder"))
        sc_decoder = models.from_pretrained(str(tmp_path / "SparseUnetVaeDecoder"))
    assert models.from_pretrained(str(tmp_path / "SparseStructureDecoder")).dtype == torch.float16  # restored
    for model in (decoder, sc_decoder):
        assert model.dtype == torch.float32
        assert {parameter.dtype for parameter in model.parameters()} == {torch.float32}

    reference = models.SparseStructureDecoder(**{**ss_args, "use_fp16": False})
    reference.load_state_dict(decoder.state_dict())
    latent = torch.randn(1, 8, 4, 4, 4, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got, expected = decoder(latent), reference(latent)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())
