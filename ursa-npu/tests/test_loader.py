"""A URSA weights folder is checked before anything is loaded; each problem names the component and the fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deliverykit.errors import ExitCode, WeightsError
from ursa_npu.loader import COMPONENTS, RANDOM_WEIGHTS_MARKER, check_weights_folder

INDEX = {
    "_class_name": "URSAPipeline",
    "transformer": ["diffnext.models.transformers.transformer_ursa", "URSATransformer3DModel"],
    "vae": ["__vae__", "AutoencoderVQ"],  # NOVA-style shim entries are accepted: only the class name is read
    "scheduler": ["diffnext.schedulers.scheduling_dfm", "KineticOptimalScheduler"],
    "tokenizer": ["transformers", "Qwen2Tokenizer"],
}


def make_folder(root: Path, index: dict | None = None, skip: str | None = None) -> Path:
    (root / "model_index.json").write_text(json.dumps(index or INDEX))
    for name, (_, files) in COMPONENTS.items():
        for file in files:
            path = root / name / file
            if f"{name}/{file}" != skip:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps({"spatial_stride": 16, "num_vq_embeddings": 131072}))
    return root


def test_complete_folder_gives_the_vq_grid(tmp_path):
    folder = check_weights_folder(make_folder(tmp_path))
    assert (folder.spatial_stride, folder.codebook_size, folder.random_weights) == (16, 131072, False)
    (tmp_path / RANDOM_WEIGHTS_MARKER).write_text("")
    assert check_weights_folder(tmp_path).random_weights


def test_no_model_index(tmp_path):
    with pytest.raises(WeightsError, match=r"has no model_index\.json: not a URSA pipeline folder") as err:
        check_weights_folder(tmp_path)
    assert err.value.exit_code == ExitCode.WEIGHTS


@pytest.mark.parametrize("missing", ["transformer/config.json", "scheduler/scheduler_model.pth", "tokenizer/"])
def test_missing_component_file_is_named(tmp_path, missing):
    make_folder(tmp_path, skip=missing if not missing.endswith("/") else "tokenizer/tokenizer_config.json")
    name = missing.split("/")[0]
    with pytest.raises(WeightsError, match=f"component '{name}' is incomplete: {name}/"):
        check_weights_folder(tmp_path)


def test_component_absent_from_the_index_or_of_another_model(tmp_path):
    make_folder(tmp_path, {key: value for key, value in INDEX.items() if key != "vae"})
    with pytest.raises(WeightsError, match="has no 'vae' component"):
        check_weights_folder(tmp_path)
    make_folder(tmp_path, {**INDEX, "transformer": ["diffnext", "NOVATransformer3DModel"]})
    with pytest.raises(WeightsError, match=r"names NOVATransformer3DModel for .transformer.*not a URSA model"):
        check_weights_folder(tmp_path)


@pytest.mark.parametrize(("text", "match"), [("{not json", "is not valid JSON"), ("[1, 2]", "holds a JSON list")])
def test_a_component_config_that_is_not_a_json_object_names_the_file_and_the_fix(tmp_path, text, match):
    folder = make_folder(tmp_path)
    (folder / "vae" / "config.json").write_text(text)
    with pytest.raises(WeightsError) as caught:
        check_weights_folder(folder)
    message = str(caught.value)
    assert message.startswith(f"{folder / 'vae' / 'config.json'} ") and match in message
    assert "deliverykit weights download --manifest ursa-npu/weights-manifest.json" in message
    assert caught.value.exit_code == ExitCode.WEIGHTS
