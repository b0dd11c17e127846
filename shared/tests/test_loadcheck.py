"""The check before loading: missing or corrupt files are refused, valid files that differ from the release warn."""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save as save_safetensors

from deliverykit.assets import loadcheck
from deliverykit.errors import ExitCode, WeightsError

MODEL_ID = "org/tiny-dino"
LOCAL_DIR = "tiny-dino"
CONFIG = b'{"model_type": "dinov3_vit", "hidden_size": 8}'  # the "released" bytes
WEIGHTS = save_safetensors({"a": np.arange(6, dtype=np.float32), "b": np.ones((2, 3), dtype=np.float16)})


def _entry(path: str, data: bytes, required: bool = True) -> dict:
    digest = hashlib.sha256(data).hexdigest()
    return {"path": path, "bytes": len(data), "sha256": digest, "component": "m", "required": required, "source": "t"}


@pytest.fixture
def release(tmp_path: Path) -> tuple[Path, Path]:
    """(manifest path, model folder named like its local_dir) holding exactly the released files."""
    data = {
        "schema_version": 1,
        "delivery": "tiny-npu",
        "models": [
            {
                "id": MODEL_ID,
                "role": "main",
                "revision": None,
                "hub": {"huggingface": MODEL_ID, "modelscope": None},
                "license": "MIT",
                "gated": False,
                "local_dir": LOCAL_DIR,
                "files": [
                    _entry("config.json", CONFIG),
                    _entry("model.safetensors", WEIGHTS),
                    _entry("extra.bin", b"0123456789"),
                ],
            }
        ],
    }
    manifest = tmp_path / "weights-manifest.json"
    manifest.write_text(json.dumps(data))
    folder = tmp_path / "root" / LOCAL_DIR
    folder.mkdir(parents=True)
    (folder / "config.json").write_bytes(CONFIG)
    (folder / "model.safetensors").write_bytes(WEIGHTS)
    (folder / "extra.bin").write_bytes(b"0123456789")
    return manifest, folder


def test_the_release_loads_silently_and_is_recorded(release, capsys) -> None:
    manifest, folder = release
    loaded = loadcheck.check_weights_for_loading(manifest, folder.parent, MODEL_ID)  # the root works too
    assert capsys.readouterr().err == ""
    records = {Path(r["path"]).name: r for r in loadcheck.weights_record(loaded)}
    assert records["model.safetensors"] == {
        "path": str(folder / "model.safetensors"),
        "bytes": len(WEIGHTS),
        "sha256": hashlib.sha256(WEIGHTS).hexdigest(),
        "sha256_source": "computed",  # small: hashed at load
        "status": "release",
    }
    assert {r["status"] for r in records.values()} == {"release"}


def test_large_files_take_the_manifest_sha256_when_their_size_matches(release, monkeypatch) -> None:
    manifest, folder = release
    monkeypatch.setattr(loadcheck, "CHEAP_HASH_BYTES", 20)  # config.json (46 B) and the weights are now "large"
    (folder / "config.json").write_bytes(CONFIG.replace(b"8", b"9"))  # same size, other bytes: not noticed
    loaded = {f.path.name: f for f in loadcheck.check_weights_for_loading(manifest, folder, MODEL_ID)}
    assert loaded["model.safetensors"].sha256_source == "manifest"
    assert loaded["model.safetensors"].sha256 == hashlib.sha256(WEIGHTS).hexdigest()
    assert (loaded["config.json"].status, loaded["extra.bin"].sha256_source) == ("release", "computed")


def test_a_reserialised_config_loads_with_one_warning_line(release, capsys, monkeypatch) -> None:
    """What save_pretrained or a mirror produces: valid JSON, other bytes; the strict load is the real guarantee."""
    manifest, folder = release
    monkeypatch.delenv(loadcheck.STRICT_ENV_VAR, raising=False)
    (folder / "config.json").write_text(json.dumps(json.loads(CONFIG), indent=2, sort_keys=True) + "\n")
    loaded = loadcheck.check_weights_for_loading(manifest, folder, MODEL_ID)
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("warning: ") and "config.json (" in err[0]
    assert "model.safetensors" not in err[0] and "figures may differ from the release" in err[0]
    assert [f.status for f in loaded] == ["differs", "release", "release"]

    same_size = CONFIG.replace(b"8", b"9")  # same length, other sha256: small files are hashed, so it is seen
    (folder / "config.json").write_bytes(same_size)
    loadcheck.check_weights_for_loading(manifest, folder, MODEL_ID)
    assert "config.json (same size, other sha256)" in capsys.readouterr().err


def test_strict_manifest_refuses_differing_files(release, monkeypatch) -> None:
    manifest, folder = release
    (folder / "config.json").write_text(json.dumps(json.loads(CONFIG), indent=2))
    with pytest.raises(WeightsError, match=rf"differ from the pinned release: {MODEL_ID} in .*: config\.json") as info:
        loadcheck.check_weights_for_loading(manifest, folder, MODEL_ID, strict=True)
    assert info.value.exit_code == ExitCode.WEIGHTS and "--strict-manifest" in str(info.value)
    monkeypatch.setenv(loadcheck.STRICT_ENV_VAR, "1")
    with pytest.raises(WeightsError, match="differ from the pinned release"):
        loadcheck.check_weights_for_loading(manifest, folder, MODEL_ID)


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda f: (f / "model.safetensors").write_bytes(WEIGHTS[:-5]), "data bytes but the file holds"),
        (lambda f: (f / "model.safetensors").write_bytes(WEIGHTS[:30]), "its header claims"),
        (lambda f: (f / "model.safetensors").write_bytes(WEIGHTS + b"\0"), "data bytes but the file holds"),
        (lambda f: (f / "config.json").write_bytes(CONFIG[:-3]), "not valid JSON"),
        (lambda f: (f / "extra.bin").write_bytes(b"01234"), "5 bytes instead of 10"),
        (lambda f: (f / "model.safetensors").unlink(), "is missing"),
    ],
    ids=["truncated", "cut-in-header", "appended", "cut-json", "short-other-format", "missing"],
)
def test_missing_or_corrupt_files_are_refused(release, damage, reason) -> None:
    manifest, folder = release
    damage(folder)
    with pytest.raises(WeightsError, match="incomplete or corrupt") as info:
        loadcheck.check_weights_for_loading(manifest, folder, MODEL_ID)
    message = str(info.value)
    assert reason in message and info.value.exit_code == ExitCode.WEIGHTS and "\n" not in message
    # the folder is named like local_dir: its parent is the --root that refills it
    assert f"--root {folder.parent} --model {MODEL_ID}" in message


def test_the_download_hint_never_nests_the_folder_in_itself(release, tmp_path) -> None:
    """A model folder of another name (save_pretrained output, a mirror) is refilled with --model-dir, in place."""
    manifest, folder = release
    mine = folder.rename(tmp_path / "my-dino")
    (mine / "model.safetensors").write_bytes(WEIGHTS[:-1])
    with pytest.raises(WeightsError) as info:
        loadcheck.check_weights_for_loading(manifest, mine, MODEL_ID)
    message = str(info.value)
    assert f"--model-dir {mine} " in message and f"{mine}/{LOCAL_DIR}" not in message and "--root" not in message
    with pytest.raises(WeightsError, match="not found"):
        loadcheck.check_weights_for_loading(manifest, tmp_path / "absent", MODEL_ID)


def test_a_single_file_not_in_the_release_differs(release, capsys, tmp_path) -> None:
    manifest, folder = release
    finetune = tmp_path / "my-finetune.safetensors"
    finetune.write_bytes(WEIGHTS)
    record = loadcheck.check_file_for_loading(manifest, finetune, MODEL_ID)
    assert (
        record.status == "differs" and "my-finetune.safetensors (not a file of the release)" in capsys.readouterr().err
    )
    assert loadcheck.check_file_for_loading(manifest, folder / "model.safetensors", MODEL_ID).status == "release"
    finetune.write_bytes(WEIGHTS[:-1])
    with pytest.raises(WeightsError, match="download it again from where it came from"):
        loadcheck.check_file_for_loading(manifest, finetune, MODEL_ID)


def test_a_single_file_listed_in_a_subfolder_is_matched_by_name(release, capsys, tmp_path) -> None:
    """A release file under ``loras/`` is the release wherever the user keeps it; a changed byte is still refused."""
    manifest, folder = release
    data = json.loads(manifest.read_text())
    data["models"][0]["files"].append(_entry("loras/fast.safetensors", WEIGHTS, required=False))
    manifest.write_text(json.dumps(data))
    for where in (folder / "loras", tmp_path / "elsewhere"):
        where.mkdir()
        (where / "fast.safetensors").write_bytes(WEIGHTS)
        assert loadcheck.check_file_for_loading(manifest, where / "fast.safetensors", MODEL_ID).status == "release"
    assert "differs" not in capsys.readouterr().err
    flipped = bytearray(WEIGHTS)
    flipped[-1] ^= 1
    (tmp_path / "elsewhere" / "fast.safetensors").write_bytes(bytes(flipped))
    record = loadcheck.check_file_for_loading(manifest, tmp_path / "elsewhere" / "fast.safetensors", MODEL_ID)
    assert record.status == "differs"


def test_format_problem_reads_the_safetensors_layout(tmp_path) -> None:
    """Checked against the format's definition (u64 header length, JSON header, data_offsets), not our writer."""
    header = json.dumps({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    path = tmp_path / "hand.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 8)
    assert loadcheck.format_problem(path) is None
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 7)
    assert loadcheck.format_problem(path) == "its tensors need 8 data bytes but the file holds 7"
    path.write_bytes(struct.pack("<Q", len(header)) + header[:-1] + b"x" + b"\0" * 8)
    assert "not valid JSON" in loadcheck.format_problem(path)
    (tmp_path / "notes.txt").write_text("anything")
    assert loadcheck.format_problem(tmp_path / "notes.txt") is None  # unknown format: the size rule decides


def test_smoke_weights_are_hashed_with_relative_paths(tmp_path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "model.safetensors").write_bytes(WEIGHTS)
    (tmp_path / "config.json").write_bytes(CONFIG)
    records = loadcheck.weights_record(loadcheck.smoke_weights(tmp_path))
    assert records == [
        {
            "path": "config.json",
            "bytes": len(CONFIG),
            "sha256": hashlib.sha256(CONFIG).hexdigest(),
            "sha256_source": "computed",
            "status": "random",
        },
        {
            "path": "sub/model.safetensors",
            "bytes": len(WEIGHTS),
            "sha256": hashlib.sha256(WEIGHTS).hexdigest(),
            "sha256_source": "computed",
            "status": "random",
        },
    ]


def test_strict_manifest_env_values(monkeypatch) -> None:
    for value, expected in (("1", True), ("true", True), ("0", False), ("", False)):
        monkeypatch.setenv(loadcheck.STRICT_ENV_VAR, value)
        assert loadcheck.strict_manifest() is expected
    assert loadcheck.strict_manifest(True) is True


def test_same_weights_ignores_where_the_folders_were() -> None:
    here = [{"path": "/a/model.safetensors", "bytes": 3, "sha256": "1" * 64}]
    there = [{"path": "/b/model.safetensors", "bytes": 3, "sha256": "1" * 64}]
    assert loadcheck.same_weights(here, there)
    assert not loadcheck.same_weights(here, [{**there[0], "sha256": "2" * 64}])
    assert not loadcheck.same_weights(here, [])


def test_several_models_differing_give_one_warning_line(release, capsys, tmp_path) -> None:
    """The full pipeline checks several model folders: still one line, naming each folder's files."""
    manifest, folder = release
    (folder / "config.json").write_text(json.dumps(json.loads(CONFIG), indent=2))
    copy = shutil.copytree(folder, tmp_path / "copy")
    (copy / "model.safetensors").write_bytes(save_safetensors({"a": np.zeros(3, dtype=np.float32)}))
    loaded = loadcheck.check_models_for_loading(manifest, [(folder, MODEL_ID), (copy, MODEL_ID)])
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("warning: ") and len(loaded) == 6
    assert f"{folder}: config.json (" in err[0] and f"{copy}: config.json (" in err[0]
    assert (
        "model.safetensors (" in err[0].split(f"{copy}:")[1] and "model.safetensors" not in err[0].split(f"{copy}:")[0]
    )
