"""transformers 5 rope_theta, and the scheduler codebook file read without unpickling."""

from __future__ import annotations

import pickle
from types import SimpleNamespace

import pytest
import torch
from transformers.models.qwen3.configuration_qwen3 import Qwen3Config

from ursa_npu import compat


def test_rope_theta_on_the_installed_transformers_and_the_old_attribute():
    config = Qwen3Config.from_dict({"hidden_size": 64, "num_attention_heads": 4, "rope_theta": 123456.0})
    assert compat.rope_theta(config) == 123456.0  # the value URSA's config.json passes, wherever it is stored
    assert compat.rope_theta(SimpleNamespace(rope_theta=10000)) == 10000.0
    with pytest.raises(ValueError, match="neither rope_theta nor"):
        compat.rope_theta(SimpleNamespace(rope_parameters={}))


def test_codebook_round_trip_keeps_dtype_and_values(tmp_path):
    codebook = torch.randn(64, 4, generator=torch.Generator().manual_seed(0)).half()
    path = compat.save_codebook(tmp_path / "scheduler", codebook)
    assert path.name == "scheduler_model.pth"
    loaded = compat.load_codebook(tmp_path / "scheduler")
    assert loaded.dtype == torch.float16
    torch.testing.assert_close(loaded, codebook, rtol=0, atol=0)


class _Payload:
    def __reduce__(self):
        return (print, ("unpickled!",))


def test_codebook_file_with_code_is_refused(tmp_path):
    torch.save({"path.emb": _Payload()}, tmp_path / "scheduler_model.pth")  # what weights_only=False would run
    with pytest.raises(pickle.UnpicklingError):
        compat.load_codebook(tmp_path)
    torch.save({"other": torch.zeros(1)}, tmp_path / "scheduler_model.pth")
    with pytest.raises(ValueError, match="must hold"):
        compat.load_codebook(tmp_path)
