"""Background removal for images without alpha: which folder, its checks before loading, its offline loading.

No upstream checkout needed; the runs of ``inference.py`` with an RGB photo are in ``test_pipeline_upstream.py``.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from deliverykit.errors import InputError, WeightsError
from trellis2_npu import hooks, rembg

AUTO_MAP = {"AutoConfig": "tiny_config.TinyConfig", "AutoModelForImageSegmentation": "tiny_model.TinySegmenter"}
CONFIG_CODE = """from transformers import PretrainedConfig


class TinyConfig(PretrainedConfig):
    model_type = "tiny_segmenter"
"""
MODEL_CODE = """import torch
from transformers import PreTrainedModel

from .tiny_config import TinyConfig


class TinySegmenter(PreTrainedModel):
    config_class = TinyConfig

    def __init__(self, config):
        super().__init__(config)
        self.conv = torch.nn.Conv2d(3, 1, 1)
        self.post_init()

    def forward(self, pixel_values):
        return [self.conv(pixel_values)]
"""


def remote_code_folder(folder: Path, *, weights: bool = True, extra_import: str = "") -> Path:
    """A BiRefNet-shaped folder: ``config.json`` with an ``auto_map``, its two code files, ``model.safetensors``."""
    folder.mkdir(parents=True)
    config = {"model_type": "tiny_segmenter", "auto_map": AUTO_MAP, "architectures": ["TinySegmenter"]}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "tiny_config.py").write_text(CONFIG_CODE)
    (folder / "tiny_model.py").write_text(extra_import + MODEL_CODE)
    if weights:
        save_file({"conv.weight": torch.ones(1, 3, 1, 1), "conv.bias": torch.zeros(1)}, folder / "model.safetensors")
    return folder


def test_default_is_rmbg_then_birefnet_under_the_root_and_none_for_the_smoke_models(tmp_path: Path):
    assert rembg.find_rembg_model(None, tmp_path) is None
    assert rembg.find_rembg_model(None, None) is None  # --smoke: no root, no model
    (tmp_path / "BiRefNet").mkdir()
    found = rembg.find_rembg_model(None, tmp_path)
    assert (found.folder, found.model_id, found.license) == (tmp_path / "BiRefNet", "ZhengPeng7/BiRefNet", "MIT")
    (tmp_path / "RMBG-2.0").mkdir()
    found = rembg.find_rembg_model(None, tmp_path)
    assert found.model_id == "briaai/RMBG-2.0" and found.license.startswith("CC BY-NC 4.0")
    assert rembg.find_rembg_model("BiRefNet", tmp_path).folder == tmp_path / "BiRefNet"  # a name under the root
    assert rembg.find_rembg_model("ZhengPeng7/BiRefNet", tmp_path).folder == tmp_path / "BiRefNet"  # or its hub id
    other = tmp_path / "mine"
    other.mkdir()
    assert rembg.find_rembg_model(str(other), tmp_path) == rembg.RembgModel(other, None)
    with pytest.raises(WeightsError, match="--rembg-model nowhere: no folder at nowhere"):
        rembg.find_rembg_model("nowhere", tmp_path)


def test_no_model_is_one_line_naming_every_way_out(tmp_path: Path):
    with pytest.raises(InputError) as err:
        rembg.require_rembg_model(None, None)
    message = str(err.value)
    assert "\n" not in message and "smoke models" in message
    for fix in ("--rembg-model DIR", "RGBA", "--no-rembg", "--model ZhengPeng7/BiRefNet --all-files"):
        assert fix in message
    assert str(tmp_path / "RMBG-2.0") in rembg.no_model_message(tmp_path)


def test_a_folder_without_weights_or_code_is_refused_before_loading(tmp_path: Path):
    folder = remote_code_folder(tmp_path / "BiRefNet", weights=False)
    with pytest.raises(WeightsError, match=r"has no weights .*--root .* --model ZhengPeng7/BiRefNet --all-files"):
        rembg.check_rembg_model(rembg.RembgModel(folder, "ZhengPeng7/BiRefNet"))
    save_file({"x": torch.zeros(4)}, folder / "model.safetensors")
    (folder / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes()[:-4])  # cut short
    with pytest.raises(WeightsError, match="incomplete or corrupt"):
        rembg.check_rembg_model(rembg.RembgModel(folder, None))
    (folder / "tiny_model.py").unlink()
    with pytest.raises(WeightsError, match=r"has no tiny_model\.py"):
        rembg.check_rembg_model(rembg.RembgModel(folder, None))
    (folder / "config.json").write_text("{}")
    with pytest.raises(WeightsError, match="no auto_map for AutoModelForImageSegmentation"):
        rembg.check_rembg_model(rembg.RembgModel(folder, None))


def test_packages_the_remote_code_needs_are_checked_before_loading(tmp_path: Path):
    folder = remote_code_folder(tmp_path / "mine", extra_import="import not_a_package_here_xyz  # noqa\n")
    with pytest.raises(InputError) as err:
        rembg.check_rembg_model(rembg.RembgModel(folder, None))
    message = str(err.value)
    assert "not_a_package_here_xyz" in message and "--no-rembg" in message and "RGBA" in message


def test_loads_from_the_folder_only_with_its_licence_and_never_the_hub(tmp_path: Path, monkeypatch, capsys):
    """Remote code from the local folder with every socket blocked; upstream's reference name is not used."""
    folder = remote_code_folder(tmp_path / "BiRefNet")
    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "modules"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    attempts = []

    def refuse(*args, **kwargs):
        attempts.append(args)
        raise OSError("network blocked by the test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    try:
        rembg.select_rembg_model(rembg.RembgModel(folder, "ZhengPeng7/BiRefNet"))
        model = hooks.load_background_removal("briaai/RMBG-2.0")
        mask = model(torch.ones(1, 3, 4, 4))[-1]
    finally:
        rembg.select_rembg_model(None)
    assert mask.shape == (1, 1, 4, 4) and torch.allclose(mask, torch.full_like(mask, 3.0))  # our weights loaded
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("background removal:")]
    assert lines == [f"background removal: ZhengPeng7/BiRefNet from {folder}; licence MIT"]
    assert attempts == []
    with pytest.raises(InputError, match="--no-rembg"):
        hooks.load_background_removal("briaai/RMBG-2.0")  # nothing selected: the one-line error, no hub


def test_sparse_backend_line_names_what_runs_on_the_device():
    hooks.set_pipeline_device("cpu")
    try:
        line = hooks.sparse_backends_line("flex_gemm", "flash_attn")
        assert line.startswith("[SPARSE] Conv backend: trellis2_npu.sparse_conv")
        assert "Attention backend: trellis2_npu.attention varlen, torch SDPA" in line
        assert "flex_gemm;" not in line and "flash_attn" not in line
        assert hooks.sparse_backends_line("spconv", "npu").startswith("[SPARSE] Conv backend: spconv;")  # upstream's
    finally:
        hooks.set_pipeline_device(None)
