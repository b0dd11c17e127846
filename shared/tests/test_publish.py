"""Publishing one delivery: the staged tree, its checks, and pushes (dry run, a local bare repository, a fake SDK).

The out-of-tree check (fresh venv, pip install, smoke run and tests in the staged tree) is test_publish_selftest.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path
from typing import ClassVar

import pytest

from deliverykit.errors import ExitCode, OutputError
from deliverykit.tools import publish
from deliverykit.tools.commands import SUBCOMMANDS, main

from .conftest import GIT_ENV

REPO = Path(__file__).resolve().parents[2]
TRELLIS = REPO / "trellis2-npu"
TOKEN = "gct-FAKE-token-5f1c0ffee42"


def git(*args: str, cwd: Path) -> str:
    env = {**os.environ, **GIT_ENV}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["publish", *[str(arg) for arg in argv]])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture(scope="module")
def staged(tmp_path_factory) -> Path:
    """trellis2-npu staged for ModelScope. Do not modify."""
    return publish.stage_delivery(TRELLIS, tmp_path_factory.mktemp("staged") / "trellis2-npu").path


@pytest.fixture
def fake_delivery(tmp_path) -> Path:
    """A small delivery outside git, in a monorepo-like folder (LICENSE, ci/requirements-dev.txt), with caches."""
    shutil.copy(REPO / "LICENSE", tmp_path / "LICENSE")
    (tmp_path / "ci").mkdir()
    shutil.copy(REPO / "ci" / "requirements-dev.txt", tmp_path / "ci" / "requirements-dev.txt")
    delivery = tmp_path / "fake-npu"
    files = {
        "README.md": "# Fake on NPU\n\nIntro.\n\n## Run\n\n`python fake-npu/inference.py`\n",
        "requirements.txt": (TRELLIS / "requirements.txt").read_text(),
        "weights-manifest.json": (TRELLIS / "weights-manifest.json").read_text(),
        "publish.json": json.dumps(
            {"schema_version": 1, "task": "text-to-image-synthesis", "base_model": "org/base", "library_name": "x"}
        ),
        "pyproject.toml": '[project]\nname = "fake-npu"\ndependencies = ["deliverykit"]\n\n'
        '[tool.setuptools.packages.find]\ninclude = ["fake_npu*"]\n',
        "inference.py": "print('hello')\n",
        "tests/test_fake.py": "def test_ok():\n    pass\n",
        "__pycache__/inference.cpython-311.pyc": "",
        "tests/__pycache__/test_fake.cpython-311.pyc": "",
        ".pytest_cache/v/cache/lastfailed": "{}",
        "outputs/run/report.json": "{}",
    }
    for path, text in files.items():
        (delivery / path).parent.mkdir(parents=True, exist_ok=True)
        (delivery / path).write_text(text)
    return delivery


def leftovers(folder: Path) -> list[str]:
    """Hidden work folders staging may have left next to its output."""
    return sorted(path.name for path in folder.iterdir() if path.name.startswith("."))


def front_matter(readme: str) -> dict:
    yaml = pytest.importorskip("yaml")
    assert readme.startswith("---\n")
    return yaml.safe_load(readme.split("---\n", 2)[1])


# ----------------------------------------------------------------------------------------------------------------
# Staging


def test_publish_is_a_subcommand():
    assert SUBCOMMANDS["publish"] == "publish"


def test_stage_trellis2_tree(staged):
    files = set(publish.walk_files(staged))
    tracked = set(git("ls-files", "--cached", "--", ".", cwd=TRELLIS).split())
    delivery = {path for path in tracked if (TRELLIS / path).is_file()} | set(publish.REQUIRED_FILES)
    vendored = {f"deliverykit/{path}" for path in publish.walk_files(REPO / "shared" / "deliverykit")}
    generated = {"LICENSE", "NOTICE", "pytest.ini", "requirements-test.txt"}
    assert files == delivery | vendored | generated
    assert {"inference.py", "tests/conftest.py", "publish.json", "deliverykit/__init__.py"} <= files
    assert "deliverykit/schemas/weights_manifest.schema.json" in files
    assert not [path for path in files if "__pycache__" in path or path.endswith(".pyc")]
    for path in delivery - {"README.md", "pyproject.toml"}:
        assert (staged / path).read_bytes() == (TRELLIS / path).read_bytes(), path
    for path in vendored:
        assert (staged / path).read_bytes() == (REPO / "shared" / path).read_bytes(), path
    assert os.access(staged / "inference.py", os.X_OK) == os.access(TRELLIS / "inference.py", os.X_OK)


def test_staged_pyproject_packages_the_vendored_deliverykit(staged):
    import tomllib

    project = tomllib.loads((staged / "pyproject.toml").read_text())
    assert project["project"]["name"] == "trellis2-npu"
    assert project["project"]["dependencies"] == []
    assert project["tool"]["setuptools"]["packages"]["find"]["include"] == ["trellis2_npu*", "deliverykit*"]
    data = project["tool"]["setuptools"]["package-data"]
    assert data == {"deliverykit": ["schemas/*.json"], "trellis2_npu": ["data/*"]}


def test_staged_pyproject_refuses_a_file_without_the_deliverykit_dependency():
    with pytest.raises(publish.PublishError, match="dependencies"):
        publish.staged_pyproject('[project]\nname = "x-npu"\n', "x-npu")


def test_stage_requirements_license_notice_and_pytest_config(staged):
    assert (staged / "requirements.txt").read_text() == (TRELLIS / "requirements.txt").read_text()
    test_requirements = (staged / "requirements-test.txt").read_text()
    dev_lines = (REPO / "ci" / "requirements-dev.txt").read_text().splitlines()
    assert next(line for line in dev_lines if line.startswith("pytest==")) in test_requirements.splitlines()
    assert "ruff" not in test_requirements
    assert (staged / "LICENSE").read_bytes() == (REPO / "LICENSE").read_bytes()
    assert "Apache License" in (staged / "LICENSE").read_text()

    notice = (staged / "NOTICE").read_text()
    assert "Apache License, Version 2.0" in notice
    assert "microsoft/TRELLIS.2 at commit 5565d240c4a494caaf9ece7a554542b76ffa36d3" in notice
    for model in json.loads((TRELLIS / "weights-manifest.json").read_text())["models"]:
        assert f"- {model['id']} ({model['role']}, revision {model['revision'][:12]}): {model['license']}" in notice

    ini = (staged / "pytest.ini").read_text()
    assert f"addopts = {publish.PYTEST_ADDOPTS}\n" in ini and "testpaths = tests\n" in ini
    tomllib = pytest.importorskip("tomllib")
    root = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert root["addopts"] == publish.PYTEST_ADDOPTS  # the staged tests run the way the monorepo runs them
    assert root["markers"] == list(publish.PYTEST_MARKERS)  # and know its markers (-m "not heavy" selects by one)
    assert "".join(f"    {marker}\n" for marker in root["markers"]) in ini


@pytest.mark.parametrize(
    ("hub", "expected"),
    [
        (
            "modelscope",
            {
                "license": "apache-2.0",
                "frameworks": ["PyTorch"],
                "tasks": ["image-to-3d"],
                "base_model": "microsoft/TRELLIS.2-4B",
            },
        ),
        (
            "modelers",
            {"license": "apache-2.0", "hardwares": ["NPU"], "frameworks": ["PyTorch"], "library_name": "pytorch"},
        ),
        ("gitcode", None),
    ],
)
def test_stage_readme_per_hub(tmp_path, hub, expected):
    readme = publish.stage_delivery(TRELLIS, tmp_path / "out", hub).path.joinpath("README.md").read_text()
    original = (TRELLIS / "README.md").read_text()
    if expected is None:
        assert readme.startswith("# ")
        body = readme
    else:
        assert front_matter(readme) == expected
        body = readme.split("---\n", 2)[2].lstrip("\n")
    smoke = publish.load_hub_metadata(TRELLIS).smoke  # its publish.json's: the DINOv3 conditioning smoke
    section = publish.standalone_section(
        "trellis2-npu", npu_requirements=True, smoke=smoke, app=True, serve=True
    )  # trellis2-npu ships app.py and serve.py
    assert section in body and body.index(section) < body.index("## Install")
    assert "python scripts/conditioning.py --smoke tiny --device cpu" in section and "python -m pytest" in section
    assert body.replace(section, "") == original  # the rest of the README is not rewritten


def test_stage_says_how_to_launch_a_web_demo_and_the_server(fake_delivery, tmp_path):
    (fake_delivery / "app.py").write_text("print('app')\n")
    (fake_delivery / "serve.py").write_text("print('serve')\n")
    (fake_delivery / "requirements-app.txt").write_text("gradio==6.31.0\n")
    staged = publish.stage_delivery(fake_delivery, tmp_path / "staged").path
    readme = (staged / "README.md").read_text()
    assert "pip install -r requirements-app.txt" in readme and "python app.py --smoke" in readme
    assert "python serve.py --smoke" in readme and (staged / "serve.py").is_file()
    assert (staged / "app.py").is_file() and (staged / "requirements-app.txt").is_file()
    assert "requirements-app.txt" not in publish.standalone_section("fake-npu", npu_requirements=False)


def test_stage_outside_git_skips_caches_and_outputs(fake_delivery, tmp_path, capsys):
    code, out, err = run_cli(capsys, "stage", "--delivery", fake_delivery, "--out", tmp_path / "staged")
    assert code == 0, err
    files = publish.walk_files(tmp_path / "staged")
    assert "inference.py" in files and "tests/test_fake.py" in files and "deliverykit/tools/publish.py" in files
    on_disk = [p.relative_to(tmp_path / "staged").as_posix() for p in (tmp_path / "staged").rglob("*") if p.is_file()]
    assert sorted(on_disk) == files  # nothing hidden under a skipped name either
    assert not [path for path in files if path.startswith(("outputs/", ".pytest_cache/")) or "__pycache__" in path]
    assert f"{len(files)} file(s)" in out
    assert leftovers(tmp_path) == []
    readme = (tmp_path / "staged" / "README.md").read_text()
    assert front_matter(readme)["tasks"] == ["text-to-image-synthesis"]
    assert "npu-requirements.txt" not in readme  # this delivery has none
    assert "Upstream code: none" in (tmp_path / "staged" / "NOTICE").read_text()


def test_stage_refuses_a_delivery_git_does_not_track(fake_delivery, tmp_path):
    git("init", "-q", cwd=tmp_path)
    with pytest.raises(publish.PublishError, match="git tracks no file in"):
        publish.stage_delivery(fake_delivery, tmp_path / "staged")
    git("add", "fake-npu/inference.py", cwd=tmp_path)
    staged = publish.stage_delivery(fake_delivery, tmp_path / "staged")
    assert "inference.py" in staged.files and "tests/test_fake.py" not in staged.files
    assert "tests/test_fake.py" in staged.untracked and "README.md" in staged.files  # required files always go


def test_stage_refuses_non_empty_out(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    code, _, err = run_cli(capsys, "stage", "--delivery", TRELLIS, "--out", out)
    assert code == ExitCode.OUTPUT
    assert err.count("\n") == 1 and err.startswith("error: ") and "not empty" in err
    assert [p.name for p in out.iterdir()] == ["keep.txt"] and (out / "keep.txt").read_text() == "mine"
    assert leftovers(tmp_path) == []


def test_stage_into_empty_folder(tmp_path):
    (tmp_path / "out").mkdir()
    assert (publish.stage_delivery(TRELLIS, tmp_path / "out", "gitcode").path / "deliverykit").is_dir()


def test_stage_failure_leaves_nothing(tmp_path, monkeypatch):
    def broken_copytree(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(publish.shutil, "copytree", broken_copytree)
    with pytest.raises(OutputError, match="nothing was left there"):
        publish.stage_delivery(TRELLIS, tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


def test_stage_catches_a_missing_pin(fake_delivery, tmp_path, capsys):
    requirements = fake_delivery / "requirements.txt"
    requirements.write_text(
        "".join(line + "\n" for line in requirements.read_text().splitlines() if "jsonschema" not in line)
    )
    code, _, err = run_cli(capsys, "stage", "--delivery", fake_delivery, "--out", tmp_path / "staged")
    assert code == ExitCode.INPUT
    assert err.count("\n") == 1
    assert "jsonschema (assets/manifest.py, assets/patches.py)" in err and "jsonschema-specifications" not in err
    assert str(requirements) in err
    assert not (tmp_path / "staged").exists() and leftovers(tmp_path) == []


def test_required_imports(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "a.py").write_text(
        "from __future__ import annotations\nimport os.path\nimport numpy as np\nfrom . import b\nfrom pkg import c\n"
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pandas\nelse:\n    import yaml\n"
        "try:\n    import torch_npu\nexcept ImportError:\n    torch_npu = None\n"
        "def f():\n    from PIL import Image\n"
        "    try:\n        import requests\n    except ImportError as err:\n        raise OSError('pip') from err\n"
    )
    (package / "sub").mkdir()
    (package / "sub" / "b.py").write_text("import numpy.linalg\n")
    required = publish.required_imports(package)
    assert required == {"PIL": ["a.py"], "numpy": ["a.py", "sub/b.py"], "requests": ["a.py"], "yaml": ["a.py"]}
    pinned = publish.requirement_names("# pins\nNumPy==2.2.6\npillow==12.0.0 ; python_version >= '3'\n-r x.txt\n")
    assert pinned == {"numpy", "pillow"}
    with pytest.raises(publish.PublishError, match=r"imports requests \(a\.py\), yaml \(a\.py\), which r.txt does"):
        publish.check_requirements_cover(package, pinned, "r.txt")
    publish.check_requirements_cover(package, pinned | {"requests", "pyyaml"}, "r.txt")


def test_deliverykit_optional_imports_stay_optional():
    required = publish.required_imports(publish.PACKAGE_DIR)
    assert not {"torch_npu", "torchair", "modelscope"} & set(required)
    assert {"numpy", "jsonschema", "tqdm", "torch"} <= set(required)
    pinned = publish.requirement_names((TRELLIS / "requirements.txt").read_text())
    pinned |= publish.requirement_names(publish.testing_requirements(REPO / "ci" / "requirements-dev.txt"))
    publish.check_requirements_cover(publish.PACKAGE_DIR, pinned, "trellis2-npu/requirements.txt")


@pytest.mark.parametrize(
    ("delivery", "task", "base_model"),
    [
        ("trellis2-npu", "image-to-3d", "microsoft/TRELLIS.2-4B"),
        ("sulphur2-npu", "text-to-video-synthesis", "SulphurAI/Sulphur-2-base"),
        ("ursa-npu", "text-to-image-synthesis", "BAAI/URSA-1.7B-IBQ512"),
    ],
)
def test_hub_metadata_of_each_delivery(delivery, task, base_model):
    metadata = publish.load_hub_metadata(REPO / delivery)
    assert (metadata.task, metadata.base_model) == (task, base_model)
    assert metadata.smoke and all(command.startswith("python ") for command in metadata.smoke)


def test_staged_readme_shows_the_delivery_smoke_commands(tmp_path):
    readme = publish.stage_delivery(REPO / "ursa-npu", tmp_path / "out", "gitcode").path.joinpath("README.md")
    smoke = publish.load_hub_metadata(REPO / "ursa-npu").smoke
    assert len(smoke) == 2 and all(f"{command}\n" in readme.read_text() for command in smoke)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"task": "Image to 3D"}, "task must be a hub task id"),
        ({"base_model": "TRELLIS"}, "base_model must be a model id"),
        ({"library_name": None}, "library_name must be"),
        ({"schema_version": 2}, "schema_version must be 1"),
        ({"tags": ["npu"]}, "unknown key"),
        ({"smoke": []}, "smoke must be a list of commands"),
        ({"smoke": ["rm -rf ~"]}, "smoke must be a list of commands"),
        ({"smoke": ["python inference.py; curl x"]}, "smoke must be a list of commands"),
    ],
)
def test_hub_metadata_is_checked(fake_delivery, change, message):
    path = fake_delivery / "publish.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **change}))
    with pytest.raises(publish.PublishError, match=message):
        publish.load_hub_metadata(fake_delivery)


# ----------------------------------------------------------------------------------------------------------------
# Pushing


class FakeHubApi:
    """Stands in for ``modelscope.hub.api.HubApi``; records each upload and the files it saw."""

    calls: ClassVar[list[dict]] = []
    error: ClassVar[Exception | None] = None

    def upload_folder(self, **kwargs):
        if FakeHubApi.error is not None:
            raise FakeHubApi.error
        FakeHubApi.calls.append({**kwargs, "files": publish.walk_files(kwargs["folder_path"])})


@pytest.fixture
def fake_modelscope(monkeypatch) -> type[FakeHubApi]:
    FakeHubApi.calls, FakeHubApi.error = [], None
    api = types.ModuleType("modelscope.hub.api")
    api.HubApi = FakeHubApi
    monkeypatch.setitem(sys.modules, "modelscope", types.ModuleType("modelscope"))
    monkeypatch.setitem(sys.modules, "modelscope.hub", types.ModuleType("modelscope.hub"))
    monkeypatch.setitem(sys.modules, "modelscope.hub.api", api)
    return FakeHubApi


@pytest.mark.parametrize("to", ["gitcode", "modelscope"])
def test_push_dry_run_lists_files_and_sends_nothing(staged, to, fake_modelscope, monkeypatch, capsys):
    for name in publish.TOKEN_ENV.values():
        monkeypatch.delenv(name, raising=False)

    def no_git(*args, **kwargs):
        raise AssertionError("a dry run ran git")

    monkeypatch.setattr(publish, "_git", no_git)
    code, out, err = run_cli(capsys, "push", "--staged", staged, "--to", to, "--repo", "me/trellis2-npu", "--dry-run")
    assert code == 0, err
    files = publish.walk_files(staged)
    assert f"would push {len(files)} file(s)" in out and "nothing sent" in out
    assert (
        "https://gitcode.com/me/trellis2-npu.git (main)" if to == "gitcode" else "modelscope me/trellis2-npu"
    ) in out
    assert [line.strip() for line in out.splitlines()[1:]] == files
    assert fake_modelscope.calls == []


@pytest.mark.parametrize("to", ["gitcode", "modelscope"])
def test_push_without_token_names_the_variable(staged, to, monkeypatch, capsys):
    monkeypatch.delenv(publish.TOKEN_ENV[to], raising=False)
    code, _, err = run_cli(capsys, "push", "--staged", staged, "--to", to, "--repo", "me/trellis2-npu")
    assert code == ExitCode.INPUT
    assert err.count("\n") == 1 and f"{publish.TOKEN_ENV[to]} is not set" in err


def test_push_refuses_a_folder_that_is_not_staged(tmp_path, capsys):
    code, _, err = run_cli(capsys, "push", "--staged", tmp_path, "--to", "gitcode", "--repo", "me/x", "--dry-run")
    assert code == ExitCode.INPUT and "not a staged delivery" in err


def test_push_gitcode_to_a_bare_repository(staged, tmp_path, monkeypatch, capsys):
    for key, value in GIT_ENV.items():
        if key.startswith("GIT_CONFIG"):  # no identity: the push must bring its own
            monkeypatch.setenv(key, value)
    monkeypatch.setenv("GITCODE_TOKEN", TOKEN)
    bare = tmp_path / "remote.git"
    git("init", "-q", "--bare", str(bare), cwd=tmp_path)
    seed = tmp_path / "seed"  # the hub made the repository with a README of its own
    seed.mkdir()
    git("init", "-q", cwd=seed)
    (seed / "README.md").write_text("# created on the hub\n")
    (seed / "hub-only.txt").write_text("not in the staged tree\n")
    git("add", "-A", cwd=seed)
    git("commit", "-q", "-m", "initial commit", cwd=seed)
    git("push", "-q", bare.as_uri(), "HEAD:refs/heads/main", cwd=seed)

    push = ["push", "--staged", staged, "--to", "gitcode", "--repo", "me/trellis2-npu", "--remote-url", bare.as_uri()]
    code, out, err = run_cli(capsys, *push)
    assert code == 0, err
    clone = tmp_path / "clone"
    git("clone", "-q", "--branch", "main", bare.as_uri(), str(clone), cwd=tmp_path)
    files = publish.walk_files(staged)
    assert publish.walk_files(clone) == files  # hub-only.txt is gone from the new commit
    for path in files:
        assert (clone / path).read_bytes() == (staged / path).read_bytes(), path
    assert git("log", "--format=%s", cwd=clone).splitlines() == [
        "Publish trellis2-npu with deliverykit",
        "initial commit",
    ]
    assert out.startswith(f"pushed {len(files)} file(s) to {bare.as_uri()} (main) as ")

    code, again, err = run_cli(capsys, *push)
    assert code == 0, err
    assert "already holds" in again
    assert len(git("rev-list", "--all", cwd=bare).split()) == 2

    stored = [path.read_bytes() for path in bare.rglob("*") if path.is_file()]
    objects = subprocess.run(
        ["git", "cat-file", "--batch-all-objects", "--batch"], cwd=bare, capture_output=True, check=True
    ).stdout
    staged_bytes = [path.read_bytes() for path in staged.rglob("*") if path.is_file()]
    for blob in [*stored, objects, *staged_bytes, (out + again + err).encode()]:
        assert TOKEN.encode() not in blob


def test_git_gets_the_token_from_the_environment_only(tmp_path):
    store = tmp_path / "stored-credentials"
    user_config = tmp_path / "gitconfig"
    user_config.write_text(f"[credential]\n\thelper = store --file {store}\n")  # would write the token to disk
    env = {**os.environ, **GIT_ENV, "GIT_CONFIG_GLOBAL": str(user_config), "GIT_TERMINAL_PROMPT": "0"}
    env.update(GITCODE_TOKEN=TOKEN, DELIVERYKIT_GIT_USER="me")
    request = "protocol=https\nhost=gitcode.com\npath=me/x.git\n\n"

    def credential(action: str, given: str) -> str:
        command = ["git", *publish._GIT_AUTH, "credential", action]
        return subprocess.run(command, input=given, env=env, cwd=tmp_path, capture_output=True, text=True).stdout

    answer = credential("fill", request)
    assert "username=me\n" in answer and f"password={TOKEN}\n" in answer
    credential("approve", answer)  # what git does after a successful push
    assert not store.exists()
    assert TOKEN not in " ".join(publish._GIT_AUTH)


def test_push_gitcode_failure_is_one_masked_line(staged, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GITCODE_TOKEN", TOKEN)
    missing = (tmp_path / TOKEN / "nowhere.git").as_uri()  # a URL carrying the token: it must not be echoed
    code, out, err = run_cli(
        capsys, "push", "--staged", staged, "--to", "gitcode", "--repo", "me/x", "--remote-url", missing
    )
    assert code == ExitCode.OUTPUT
    assert err.count("\n") == 1 and "failed" in err and "GITCODE_TOKEN may write" in err
    assert TOKEN not in out + err


def test_push_modelscope_uploads_a_copy_with_the_token(staged, fake_modelscope, monkeypatch, capsys):
    monkeypatch.setenv("MODELSCOPE_API_TOKEN", TOKEN)
    code, out, err = run_cli(capsys, "push", "--staged", staged, "--to", "modelscope", "--repo", "me/trellis2-npu")
    assert code == 0, err
    [call] = fake_modelscope.calls
    assert call["repo_id"] == "me/trellis2-npu" and call["token"] == TOKEN and call["repo_type"] == "model"
    assert call["commit_message"] == "Publish trellis2-npu with deliverykit"
    assert call["files"] == publish.walk_files(staged)
    assert Path(call["folder_path"]) != staged and not Path(call["folder_path"]).exists()  # a temporary copy
    assert "https://modelscope.cn/models/me/trellis2-npu" in out and TOKEN not in out + err


def test_push_modelscope_error_masks_the_token(staged, fake_modelscope, monkeypatch, capsys):
    monkeypatch.setenv("MODELSCOPE_API_TOKEN", TOKEN)
    fake_modelscope.error = RuntimeError(f"401 Unauthorized: token {TOKEN} is invalid\ntraceback...")
    code, _, err = run_cli(capsys, "push", "--staged", staged, "--to", "modelscope", "--repo", "me/trellis2-npu")
    assert code == ExitCode.OUTPUT
    assert err.count("\n") == 1 and "token *** is invalid" in err and TOKEN not in err


def test_push_modelscope_without_sdk(staged, monkeypatch, capsys):
    monkeypatch.setenv("MODELSCOPE_API_TOKEN", TOKEN)
    monkeypatch.setitem(sys.modules, "modelscope", None)  # makes the import fail
    code, _, err = run_cli(capsys, "push", "--staged", staged, "--to", "modelscope", "--repo", "me/trellis2-npu")
    assert code == ExitCode.INPUT and "pip install modelscope" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--to", "gitcode", "--repo", "not-an-id"], "is not owner/name"),
        (["--to", "modelscope", "--repo", "me/x", "--remote-url", "file:///x"], "--remote-url is for --to gitcode"),
    ],
)
def test_push_usage_errors(staged, argv, message, capsys):
    code, _, err = run_cli(capsys, "push", "--staged", staged, *argv, "--dry-run")
    assert code == ExitCode.INPUT and message in err
