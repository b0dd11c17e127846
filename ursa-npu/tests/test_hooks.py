"""The hooks the patched diffnext calls: the only ursa-npu module the patches import, transformers 5 rope_theta,
and the scheduler codebook file read without unpickling."""

from __future__ import annotations

import pickle
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers.models.qwen3.configuration_qwen3 import Qwen3Config

from deliverykit.assets import patches
from ursa_npu import hooks

DELIVERY_DIR = Path(__file__).resolve().parents[1]


def test_the_patches_import_only_ursa_npu_hooks_and_call_what_it_defines():
    added = [
        line[1:]
        for patch in patches.find_patches(DELIVERY_DIR)
        for line in patch.read_text(encoding="utf-8").splitlines()
        if line.startswith("+") and not line.startswith("+++")
    ]
    ours = [line.strip() for line in added if re.search(r"\b(ursa_npu|deliverykit)\b", line.split("#")[0])]
    imports = {line for line in ours if re.match(r"(from|import) ", line)}
    assert {line.split("#")[0].strip() for line in imports} == {"from ursa_npu import hooks"}, imports
    called = set(re.findall(r"\bhooks\.(\w+)\(", "\n".join(added)))
    assert called == set(hooks.__all__), called  # every hook is used, and nothing else is reached through it


def test_rope_theta_on_the_installed_transformers_and_the_old_attribute():
    config = Qwen3Config.from_dict({"hidden_size": 64, "num_attention_heads": 4, "rope_theta": 123456.0})
    assert hooks.rope_theta(config) == 123456.0  # the value URSA's config.json passes, wherever it is stored
    assert hooks.rope_theta(SimpleNamespace(rope_theta=10000)) == 10000.0
    with pytest.raises(ValueError, match="neither rope_theta nor"):
        hooks.rope_theta(SimpleNamespace(rope_parameters={}))


def test_codebook_round_trip_keeps_dtype_and_values(tmp_path):
    codebook = torch.randn(64, 4, generator=torch.Generator().manual_seed(0)).half()
    path = hooks.save_codebook(tmp_path / "scheduler", codebook)
    assert path.name == "scheduler_model.pth"
    loaded = hooks.load_codebook(tmp_path / "scheduler")
    assert loaded.dtype == torch.float16
    torch.testing.assert_close(loaded, codebook, rtol=0, atol=0)


class _Payload:
    def __reduce__(self):
        return (print, ("unpickled!",))


def test_codebook_file_with_code_is_refused(tmp_path):
    torch.save({"path.emb": _Payload()}, tmp_path / "scheduler_model.pth")  # what weights_only=False would run
    with pytest.raises(pickle.UnpicklingError):
        hooks.load_codebook(tmp_path)
    torch.save({"other": torch.zeros(1)}, tmp_path / "scheduler_model.pth")
    with pytest.raises(ValueError, match="must hold"):
        hooks.load_codebook(tmp_path)
