"""The full pipeline's weights check (no upstream needed): every model folder it loads, one rule, one warning line."""

from __future__ import annotations

import json

import pytest
from safetensors.torch import save_file

from deliverykit.errors import ExitCode, WeightsError
from trellis2_npu import loader
from trellis2_npu.tiny import RELEASED_PIPELINE

from .conftest import DELIVERY_DIR


def _fake_release(root, local_dir: str, model_id: str) -> None:
    """Every required file of ``model_id``, valid but small (so of another size than the release, except
    pipeline.json, the released bytes)."""
    import torch

    manifest = json.loads((DELIVERY_DIR / "weights-manifest.json").read_text())
    [model] = [m for m in manifest["models"] if m["id"] == model_id]
    for entry in model["files"]:
        if not entry["required"]:
            continue
        path = root / local_dir / entry["path"]
        path.parent.mkdir(parents=True, exist_ok=True)
        if entry["path"] == "pipeline.json":
            path.write_bytes(RELEASED_PIPELINE.read_bytes())
        elif path.suffix == ".safetensors":
            save_file({"w": torch.zeros(2)}, path)
        else:
            path.write_text("{}")


def test_full_pipeline_checks_each_model_folder_with_one_warning(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("DELIVERYKIT_STRICT_MANIFEST", raising=False)
    _fake_release(tmp_path, "TRELLIS.2-4B", loader.MAIN_MODEL)
    _fake_release(tmp_path, "TRELLIS-image-large", "microsoft/TRELLIS-image-large")
    loaded = loader.check_weights(tmp_path)  # the root works like the TRELLIS.2-4B folder
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "TRELLIS-image-large in" in warnings[0] and "pipeline.json" not in warnings[0]
    assert {f.path.name: f.status for f in loaded}["pipeline.json"] == "release"
    with pytest.raises(WeightsError, match="differ from the pinned release") as info:
        loader.check_weights(tmp_path / "TRELLIS.2-4B", strict=True)
    assert info.value.exit_code == ExitCode.WEIGHTS

    (tmp_path / "TRELLIS-image-large" / "ckpts" / "ss_dec_conv3d_16l8_fp16.safetensors").write_bytes(b"\x08")
    with pytest.raises(WeightsError, match="incomplete or corrupt") as info:
        loader.check_weights(tmp_path)
    assert f"--root {tmp_path} --model microsoft/TRELLIS-image-large" in str(info.value)
