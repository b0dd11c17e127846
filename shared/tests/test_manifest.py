"""Weights manifests: schema, the shipped manifests, verify / pin / download, and the ``deliverykit weights`` CLI."""

from __future__ import annotations

import hashlib
import json
import sys
import types
from pathlib import Path

import pytest

from deliverykit.assets import manifest as wm
from deliverykit.errors import ExitCode, WeightsError
from deliverykit.tools.commands import SUBCOMMANDS, main

REPO = Path(__file__).resolve().parents[2]
DELIVERIES = ("trellis2-npu", "sulphur2-npu", "ursa-npu")
DINOV3_ID = "facebook/dinov3-vitl16-pretrain-lvd1689m"
DINOV3_DATA = REPO / "trellis2-npu" / "trellis2_npu" / "data"


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    """Content and mtime of every file under ``root``: verify must leave both alone."""
    return {str(p): (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(root.rglob("*")) if p.is_file()}


# A tiny two-model delivery: the main model has two required files and one optional; the auxiliary one file.
CONTENTS = {
    ("org/tiny-main", "weights/model.bin"): bytes(range(256)) * 12 + b"tail",
    ("org/tiny-main", "config.json"): b'{"hidden": 8}\n',
    ("org/tiny-main", "extra/optional.txt"): b"not needed by the pipeline\n",
    ("org/tiny-aux", "aux.safetensors"): b"\x00\x01aux-weights" * 50,
}
OPTIONAL = {"extra/optional.txt"}
LOCAL_DIRS = {"org/tiny-main": "tiny-main", "org/tiny-aux": "tiny-aux"}


def manifest_data(known: bool = True) -> dict:
    models = []
    for model_id, local_dir in LOCAL_DIRS.items():
        files = []
        for (owner, path), data in CONTENTS.items():
            if owner != model_id:
                continue
            files.append(
                {
                    "path": path,
                    "bytes": len(data) if known else None,
                    "sha256": sha256_bytes(data) if known else None,
                    "component": "test",
                    "required": path not in OPTIONAL,
                    "source": "test fixture",
                }
            )
        models.append(
            {
                "id": model_id,
                "role": "main" if model_id == "org/tiny-main" else "auxiliary",
                "revision": "0123456789abcdef0123456789abcdef01234567",
                "hub": {"huggingface": model_id, "modelscope": model_id if model_id == "org/tiny-main" else None},
                "license": "MIT",
                "gated": model_id == "org/tiny-aux",
                "local_dir": local_dir,
                "files": files,
            }
        )
    return {"schema_version": 1, "delivery": "tiny-npu", "models": models}


def write_weights(root: Path) -> None:
    for (model_id, path), data in CONTENTS.items():
        target = root / LOCAL_DIRS[model_id] / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Path, Path]:
    """(weights root with every file, manifest path with their true sizes and hashes)."""
    root = tmp_path / "weights"
    write_weights(root)
    manifest_path = tmp_path / "weights-manifest.json"
    manifest_path.write_text(json.dumps(manifest_data(), indent=2) + "\n")
    return root, manifest_path


def statuses(checks: list[wm.FileCheck]) -> dict[str, str]:
    return {c.path: c.status for c in checks}


# ---------------------------------------------------------------------------------------------------------------
# Shipped manifests


@pytest.mark.parametrize("delivery", DELIVERIES)
def test_shipped_manifest_validates(delivery: str) -> None:
    manifest = wm.load_manifest(REPO / delivery / "weights-manifest.json")
    assert manifest.delivery == delivery
    assert [m.role for m in manifest.models].count("main") == 1


def test_trellis2_dinov3_values_match_shipped_config_files(tmp_path: Path) -> None:
    """Ties the manifest to real bytes: the delivery ships DINOv3's config files, whose hashes weights.md pins."""
    manifest = wm.load_manifest(REPO / "trellis2-npu" / "weights-manifest.json")
    dinov3 = manifest.model(DINOV3_ID)
    assert {f.path for f in dinov3.files} == {"config.json", "model.safetensors", "preprocessor_config.json"}
    model_dir = tmp_path / dinov3.local_dir
    model_dir.mkdir()
    for name in ("config.json", "preprocessor_config.json"):
        data = (DINOV3_DATA / f"dinov3-vitl16-pretrain-lvd1689m.{name}").read_bytes()
        entry = next(f for f in dinov3.files if f.path == name)
        assert entry.bytes == len(data)
        assert entry.sha256 == sha256_bytes(data)
        (model_dir / name).write_bytes(data)
    # The same files in the HF repo layout verify as ok through the real code path.
    checks = wm.verify(manifest, tmp_path, models=[DINOV3_ID], files=["config.json", "preprocessor_config.json"])
    assert statuses(checks) == {"config.json": "ok", "preprocessor_config.json": "ok"}


def test_weights_subcommand_is_registered() -> None:
    assert SUBCOMMANDS["weights"] == "weights"


# ---------------------------------------------------------------------------------------------------------------
# Schema failures


def test_schema_failure_names_json_path_and_file(tmp_path: Path) -> None:
    data = manifest_data()
    data["models"][0]["files"][1]["sha256"] = "not-a-hash"
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(WeightsError) as info:
        wm.load_manifest(path)
    message = str(info.value)
    assert "$.models[0].files[1].sha256" in message
    assert str(path) in message
    assert "\n" not in message
    assert info.value.exit_code == ExitCode.WEIGHTS


def test_schema_failure_missing_property_and_two_mains(tmp_path: Path) -> None:
    data = manifest_data()
    del data["models"][1]["files"][0]["required"]
    with pytest.raises(WeightsError, match=r"\$\.models\[1\]\.files\[0\].*'required' is a required property"):
        wm.validate_manifest_data(data)
    data = manifest_data()
    data["models"][1]["role"] = "main"
    with pytest.raises(WeightsError, match=r"at \$\.models"):
        wm.validate_manifest_data(data)


def test_duplicate_local_dir_is_rejected() -> None:
    data = manifest_data()
    data["models"][1]["local_dir"] = data["models"][0]["local_dir"]
    with pytest.raises(WeightsError, match=r"\$\.models\[1\]\.local_dir"):
        wm.parse_manifest(data)


def test_path_escaping_root_is_rejected() -> None:
    data = manifest_data()
    data["models"][0]["files"][0]["path"] = "../outside.bin"
    with pytest.raises(WeightsError, match=r"\$\.models\[0\]\.files\[0\]\.path"):
        wm.validate_manifest_data(data)


# ---------------------------------------------------------------------------------------------------------------
# verify


def test_verify_all_ok_and_read_only(setup: tuple[Path, Path]) -> None:
    root, manifest_path = setup
    before = snapshot(root)
    checks = wm.verify(manifest_path, root, progress=False)
    assert set(statuses(checks).values()) == {"ok"}
    assert all(c.actual_sha256 == c.expected_sha256 for c in checks)
    assert snapshot(root) == before


def test_verify_detects_missing_truncated_and_flipped(setup: tuple[Path, Path]) -> None:
    root, manifest_path = setup
    main_dir = root / "tiny-main"
    (main_dir / "config.json").unlink()
    model = main_dir / "weights" / "model.bin"
    model.write_bytes(CONTENTS[("org/tiny-main", "weights/model.bin")][:-1])  # one byte short
    aux = root / "tiny-aux" / "aux.safetensors"
    flipped = bytearray(CONTENTS[("org/tiny-aux", "aux.safetensors")])
    flipped[100] ^= 0x01
    aux.write_bytes(bytes(flipped))
    before = snapshot(root)

    full = statuses(wm.verify(manifest_path, root, progress=False))
    assert full == {
        "weights/model.bin": "wrong_size",
        "config.json": "missing",
        "extra/optional.txt": "ok",
        "aux.safetensors": "wrong_hash",
    }
    quick = wm.verify(manifest_path, root, quick=True, progress=False)
    assert statuses(quick)["aux.safetensors"] == "unchecked_hash"  # same size: quick mode cannot see the flip
    assert statuses(quick)["weights/model.bin"] == "wrong_size"
    assert all(c.actual_sha256 is None for c in quick)
    assert snapshot(root) == before


def test_verify_filters_and_null_hash(setup: tuple[Path, Path], tmp_path: Path) -> None:
    root, _ = setup
    data = manifest_data()
    data["models"][1]["files"][0]["sha256"] = None
    manifest = wm.parse_manifest(data)
    checks = wm.verify(manifest, root, models=["org/tiny-aux"], progress=False)
    assert statuses(checks) == {"aux.safetensors": "unchecked_hash"}
    assert checks[0].actual_sha256 == sha256_bytes(CONTENTS[("org/tiny-aux", "aux.safetensors")])
    assert wm.summarize_checks(checks).ok
    with pytest.raises(WeightsError, match="not a file of the selected models"):
        wm.verify(manifest, root, files=["nope.bin"])
    with pytest.raises(WeightsError, match="org/unknown is not in weights manifest"):
        wm.verify(manifest, root, models=["org/unknown"])
    with pytest.raises(WeightsError, match="does not exist"):
        wm.verify(manifest, tmp_path / "no-such-root")


def test_sha256_is_streamed_in_bounded_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = bytes(range(256)) * 40 + b"x"  # 10,241 bytes: many chunks and a short last one
    path = tmp_path / "big.bin"
    path.write_bytes(data)
    reads: list[object] = []
    real_open = open

    class RecordingFile:
        def __init__(self, stream):
            self._stream = stream

        def read(self, size=-1):
            reads.append(size)
            return self._stream.read(size)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self._stream.close()

    def recording_open(file, mode="r", *args, **kwargs):
        assert mode == "rb", "verify must only read"
        return RecordingFile(real_open(file, mode, *args, **kwargs))

    monkeypatch.setattr(wm, "CHUNK_SIZE", 1024)
    monkeypatch.setattr(wm, "open", recording_open, raising=False)
    assert wm.sha256_file(path) == sha256_bytes(data)
    assert reads and all(isinstance(n, int) and 0 < n <= 1024 for n in reads)
    assert len(reads) == len(data) // 1024 + 2  # full chunks, the short one, then the empty read at EOF

    # verify() hashes through the same bounded path.
    reads.clear()
    model = {"path": "big.bin", "bytes": len(data), "sha256": sha256_bytes(data)}
    data_manifest = manifest_data()
    data_manifest["models"][0]["files"] = [{**model, "component": "t", "required": True, "source": "t"}]
    (tmp_path / "tiny-main").mkdir()
    (tmp_path / "tiny-main" / "big.bin").write_bytes(data)
    checks = wm.verify(wm.parse_manifest(data_manifest), tmp_path, models=["org/tiny-main"], progress=False)
    assert statuses(checks) == {"big.bin": "ok"}
    assert reads and max(reads) <= 1024


# ---------------------------------------------------------------------------------------------------------------
# pin


def test_pin_fills_nulls(setup: tuple[Path, Path]) -> None:
    root, manifest_path = setup
    manifest_path.write_text(json.dumps(manifest_data(known=False), indent=2) + "\n")
    (root / "tiny-main" / "extra" / "optional.txt").unlink()
    before = snapshot(root)

    report = wm.pin(manifest_path, root, progress=False)
    assert report.ok and report.written
    assert {e.path: e.action for e in report.entries}["extra/optional.txt"] == "missing"
    assert len(report.filled) == 3
    pinned = wm.load_manifest(manifest_path)
    for model in pinned.models:
        for file in model.files:
            if file.path in OPTIONAL:
                assert file.bytes is None and file.sha256 is None
                continue
            data = CONTENTS[(model.id, file.path)]
            assert (file.bytes, file.sha256) == (len(data), sha256_bytes(data))
            assert "pinned from a local file" in file.source
    assert snapshot(root) == before  # pin reads the weights, it never writes them

    again = wm.pin(manifest_path, root, progress=False)  # idempotent: nothing left to fill
    assert not again.written and not again.filled


def test_pin_refuses_conflicting_hash(setup: tuple[Path, Path]) -> None:
    root, manifest_path = setup
    data = manifest_data()
    data["models"][0]["files"][0]["bytes"] = None  # something to fill ...
    data["models"][1]["files"][0]["bytes"] = None
    data["models"][1]["files"][0]["sha256"] = "0" * 64  # ... and a known hash the file contradicts
    manifest_path.write_text(json.dumps(data, indent=2) + "\n")
    text_before = manifest_path.read_bytes()

    report = wm.pin(manifest_path, root, progress=False)
    assert not report.ok and not report.written
    assert [(e.model_id, e.path) for e in report.conflicts] == [("org/tiny-aux", "aux.safetensors")]
    assert manifest_path.read_bytes() == text_before

    assert main(["weights", "pin", "--manifest", str(manifest_path), "--root", str(root)]) == ExitCode.WEIGHTS
    assert manifest_path.read_bytes() == text_before


def test_pin_reports_a_fully_pinned_entry_its_local_file_contradicts(setup: tuple[Path, Path], capsys) -> None:
    """The entry has bytes and sha256; the file on disk is another one. Filling a second entry must not hide it."""
    root, manifest_path = setup
    data = manifest_data()
    data["models"][0]["files"][0]["sha256"] = None  # something to fill, so a rewrite would happen
    manifest_path.write_text(json.dumps(data, indent=2) + "\n")
    text_before = manifest_path.read_bytes()
    aux = root / "tiny-aux" / "aux.safetensors"
    aux.write_bytes(b"\x00" * aux.stat().st_size)  # same size, other content: only the hash tells

    report = wm.pin(manifest_path, root, progress=False)
    assert [(e.model_id, e.path, e.action) for e in report.conflicts] == [
        ("org/tiny-aux", "aux.safetensors", "conflict")
    ]
    assert "manifest says" in report.conflicts[0].detail and not report.written
    assert manifest_path.read_bytes() == text_before

    code, out, _ = run_cli(capsys, "weights", "pin", "--manifest", str(manifest_path), "--root", str(root))
    assert code == ExitCode.WEIGHTS and "left unchanged" in out
    assert manifest_path.read_bytes() == text_before


def test_a_manifest_that_is_not_json_names_the_line_and_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "weights-manifest.json"
    path.write_text('{"schema_version": 1,\n  oops\n}')
    with pytest.raises(WeightsError) as info:
        wm.load_manifest(path)
    message = str(info.value)
    assert message.startswith(f"weights manifest {path} is not valid JSON (line 2: ")
    assert f"git checkout -- {path}" in message and "\n" not in message


# ---------------------------------------------------------------------------------------------------------------
# CLI


def run_cli(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_verify_exit_codes(setup: tuple[Path, Path], capsys: pytest.CaptureFixture) -> None:
    root, manifest_path = setup
    args = ("weights", "verify", "--manifest", str(manifest_path), "--root", str(root))

    code, out, _ = run_cli(capsys, *args)
    assert code == 0 and "weights OK" in out and "tiny-main/config.json" in out

    (root / "tiny-main" / "extra" / "optional.txt").unlink()  # optional: still 0
    code, out, _ = run_cli(capsys, *args)
    assert code == 0 and "1 optional file(s) not ok" in out

    aux = root / "tiny-aux" / "aux.safetensors"
    flipped = bytearray(aux.read_bytes())
    flipped[0] ^= 0xFF
    aux.write_bytes(bytes(flipped))
    code, out, _ = run_cli(capsys, *args)
    assert code == ExitCode.WEIGHTS and "wrong_hash" in out and "weights download" in out

    code, out, _ = run_cli(capsys, *args, "--quick")  # sizes only: passes, and says so
    assert code == 0 and "sha256 NOT checked" in out and "quick mode" in out

    code, out, _ = run_cli(capsys, *args, "--model", "org/tiny-main")
    assert code == 0


def test_cli_errors_are_one_line(setup: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    root, manifest_path = setup
    code, _, err = run_cli(capsys, "weights", "verify", "--manifest", str(tmp_path / "none.json"), "--root", str(root))
    assert code == ExitCode.WEIGHTS and err.startswith("error: ") and err.count("\n") == 1

    code, _, err = run_cli(capsys, "weights", "verify", "--manifest", str(manifest_path), "--root", str(tmp_path / "x"))
    assert code == ExitCode.WEIGHTS and "does not exist" in err and err.count("\n") == 1

    bad = tmp_path / "bad.json"
    data = manifest_data()
    data["models"][0]["revision"] = "main"
    bad.write_text(json.dumps(data))
    code, _, err = run_cli(capsys, "weights", "verify", "--manifest", str(bad), "--root", str(root))
    assert code == ExitCode.WEIGHTS and "$.models[0].revision" in err and err.count("\n") == 1

    with pytest.raises(SystemExit) as info:
        main(["weights", "verify", "--manifest", str(manifest_path)])  # --root missing
    assert info.value.code == ExitCode.USAGE


# ---------------------------------------------------------------------------------------------------------------
# download


def test_snapshot_download_kwargs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("MODELSCOPE_API_TOKEN", raising=False)
    manifest = wm.parse_manifest(manifest_data())
    tiny = manifest.model("org/tiny-main")

    kwargs = wm.snapshot_download_kwargs(tiny, tmp_path, "hf")
    assert kwargs == {
        "repo_id": "org/tiny-main",
        "revision": "0123456789abcdef0123456789abcdef01234567",
        "local_dir": str(tmp_path / "tiny-main"),
        "allow_patterns": ["weights/model.bin", "config.json"],
    }
    assert "extra/optional.txt" in wm.snapshot_download_kwargs(tiny, tmp_path, include_optional=True)["allow_patterns"]

    monkeypatch.setenv("MODELSCOPE_API_TOKEN", "ms-secret")
    kwargs = wm.snapshot_download_kwargs(tiny, tmp_path, "modelscope")
    assert kwargs["model_id"] == "org/tiny-main" and kwargs["token"] == "ms-secret"
    assert "revision" not in kwargs  # a Hugging Face commit means nothing on ModelScope

    with pytest.raises(WeightsError, match=r"no ModelScope id.*--hub hf"):
        wm.snapshot_download_kwargs(manifest.model("org/tiny-aux"), tmp_path, "modelscope")


def test_download_calls_hub_and_verifies(
    setup: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    _, manifest_path = setup
    calls: list[dict] = []

    def snapshot_download(repo_id, *, revision=None, local_dir=None, allow_patterns=None, token=None):
        calls.append({"repo_id": repo_id, "revision": revision, "allow_patterns": allow_patterns, "token": token})
        model_id = repo_id
        for pattern in allow_patterns:  # a well-behaved hub: write exactly the allowed files
            target = Path(local_dir) / pattern
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(CONTENTS[(model_id, pattern)])
        return local_dir

    fake_hub = types.ModuleType("huggingface_hub")
    fake_hub.snapshot_download = snapshot_download
    monkeypatch.setitem(sys.modules, "huggingface_hub", fake_hub)
    monkeypatch.setenv("HF_TOKEN", "hf-secret-token")

    root = tmp_path / "fresh"
    checks = wm.download(manifest_path, root, progress=False)
    assert [c["repo_id"] for c in calls] == ["org/tiny-main", "org/tiny-aux"]
    assert calls[0]["allow_patterns"] == ["weights/model.bin", "config.json"]
    assert calls[0]["token"] == "hf-secret-token"
    assert statuses(checks) == {"weights/model.bin": "ok", "config.json": "ok", "aux.safetensors": "ok"}

    code, out, err = run_cli(
        capsys, "weights", "download", "--manifest", str(manifest_path), "--root", str(tmp_path / "cli")
    )
    assert code == 0 and "weights OK" in out
    assert "hf-secret-token" not in out + err

    # --model-dir: the files land in that folder itself, whatever its name (the hint for a renamed model folder)
    mine = tmp_path / "my-copy"
    args = ("--manifest", str(manifest_path), "--model", "org/tiny-main", "--model-dir", str(mine))
    code, out, _ = run_cli(capsys, "weights", "download", *args)
    assert code == 0 and (mine / "config.json").read_bytes() == CONTENTS[("org/tiny-main", "config.json")]
    assert not (mine / "tiny-main").exists()
    assert run_cli(capsys, "weights", "verify", *args)[0] == 0
    with pytest.raises(WeightsError, match="--model-dir names one model's folder"):
        wm.download(manifest_path, None, progress=False, model_dir=mine)
    with pytest.raises(WeightsError, match=f"download with: .* --model-dir {tmp_path / 'none'} --model org/tiny-main"):
        wm.verify(manifest_path, None, models=["org/tiny-main"], model_dir=tmp_path / "none")


def test_download_without_hub_package(setup: tuple[Path, Path], tmp_path: Path, monkeypatch) -> None:
    _, manifest_path = setup
    monkeypatch.setitem(sys.modules, "modelscope", None)  # makes `import modelscope` raise ImportError
    with pytest.raises(WeightsError, match="needs the modelscope package: pip install modelscope"):
        wm.download(manifest_path, tmp_path / "w", "modelscope", models=["org/tiny-main"])


def test_download_refuses_old_hub_signature(setup: tuple[Path, Path], tmp_path: Path, monkeypatch) -> None:
    _, manifest_path = setup
    old_hub = types.ModuleType("huggingface_hub")
    old_hub.snapshot_download = lambda repo_id, revision=None: None  # no local_dir / allow_patterns
    monkeypatch.setitem(sys.modules, "huggingface_hub", old_hub)
    with pytest.raises(WeightsError, match="pip install -U huggingface_hub"):
        wm.download(manifest_path, tmp_path / "w", models=["org/tiny-main"])


def test_download_failure_is_one_line_with_gated_hint(setup: tuple[Path, Path], tmp_path: Path, monkeypatch) -> None:
    _, manifest_path = setup
    monkeypatch.delenv("HF_TOKEN", raising=False)

    def snapshot_download(**kwargs):
        raise RuntimeError("401 Client Error\nmore detail")

    hub = types.ModuleType("huggingface_hub")
    hub.snapshot_download = snapshot_download
    monkeypatch.setitem(sys.modules, "huggingface_hub", hub)
    with pytest.raises(WeightsError) as info:
        wm.download(manifest_path, tmp_path / "w", models=["org/tiny-aux"])
    message = str(info.value)
    assert "401 Client Error" in message and "gated" in message and "HF_TOKEN" in message
    assert "\n" not in message
