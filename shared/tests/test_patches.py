"""Upstream patches: metadata schema, pin check, ordered all-or-none application (git and plain trees), status, clone.

The "upstream" is a small git repository made here (base -> c1 -> c2); the delivery's patches are ``git diff base c1``
and ``git diff c1 c2``, so a fully patched tree must equal the repository at c2. Clones come from a bare copy.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from deliverykit.assets import patches as up
from deliverykit.errors import ExitCode, OutputError
from deliverykit.tools.commands import SUBCOMMANDS, main

from .conftest import GIT_ENV

REPO = Path(__file__).resolve().parents[2]
PINS = {
    "trellis2-npu": ("microsoft/TRELLIS.2", "5565d240c4a494caaf9ece7a554542b76ffa36d3"),
    "ursa-npu": ("baaivision/URSA", "29284bb0c1457d61dea5affe36f5275621295b51"),
    "sulphur2-npu": ("Lightricks/LTX-2", "400fd31054597515f47125691032c04b1c3ee24e"),
}
needs_patch = pytest.mark.skipif(
    shutil.which("patch") is None,
    reason="the patch command is not installed (apt-get install patch); trees without git are patched with it",
)
KINDS = ["git", pytest.param("plain", marks=needs_patch)]

BASE_FILES = {
    "pkg/model.py": "import torch\n\n\ndef build():\n    device = 'cuda'\n    return torch.zeros(1, device=device)\n",
    "README.md": "# tiny upstream\n\nHello.\n",
    "old_name.py": "VALUE = 1\n",
    "obsolete/notes.txt": "to be deleted\n",
    "run.sh": "#!/bin/sh\necho run\n",
}


def git(*args: str, cwd: Path) -> str:
    env = {**os.environ, **GIT_ENV}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout.strip()


def edit(root: Path, path: str, old: str, new: str) -> None:
    file = root / path
    file.write_text(file.read_text().replace(old, new))


def commit(root: Path, message: str) -> str:
    git("add", "-A", cwd=root)
    git("commit", "-q", "-m", message, cwd=root)
    return git("rev-parse", "HEAD", cwd=root)


def snapshot(root: Path) -> dict[str, object]:
    """Every file's bytes and mode and every folder under ``root`` (``.git`` aside): what "untouched" means."""
    state: dict[str, object] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if rel == ".git" or rel.startswith(".git/"):
            continue
        state[rel] = "folder" if path.is_dir() else (path.read_bytes(), stat.S_IMODE(path.stat().st_mode))
    return state


@pytest.fixture(scope="module")
def origin(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The upstream repository (work tree at c2), its commits and the patch texts made from it."""
    root = tmp_path_factory.mktemp("origin")
    git("init", "-q", "-b", "main", cwd=root)
    for path, text in BASE_FILES.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    base = commit(root, "base")

    # A side branch, so that "bad" is a real git diff whose context ("Goodbye.") is nowhere on main.
    git("checkout", "-q", "-b", "other", cwd=root)
    edit(root, "README.md", "Hello.", "Goodbye.")
    commit(root, "other 1")
    edit(root, "README.md", "Goodbye.", "Bye.")
    commit(root, "other 2")
    bad = git("diff", "other~1", "other", cwd=root)
    git("checkout", "-q", "main", cwd=root)

    # c1: a modification, an empty new file in a new package, a rename, a deletion and an exec bit.
    edit(root, "pkg/model.py", "'cuda'", "'npu'")
    (root / "pkg/npu").mkdir()
    (root / "pkg/npu/__init__.py").write_text("")
    (root / "pkg/npu/ops.py").write_text("def op():\n    return 1\n")
    git("mv", "old_name.py", "new_name.py", cwd=root)
    git("rm", "-q", "obsolete/notes.txt", cwd=root)  # also removes the emptied folder, as a checkout of c1 has none
    (root / "run.sh").chmod(0o755)
    c1 = commit(root, "npu device")
    # c2 builds on c1: it changes lines that c1 wrote.
    edit(root, "pkg/model.py", "'npu'", "'npu:0'")
    edit(root, "pkg/npu/ops.py", "return 1", "return 2")
    c2 = commit(root, "follow-up")

    texts = {"npu": git("diff", "-M", base, c1, cwd=root), "follow": git("diff", "-M", c1, c2, cwd=root), "bad": bad}
    bare = tmp_path_factory.mktemp("remote") / "upstream.git"
    git("clone", "-q", "--bare", str(root), str(bare), cwd=root)
    return {"root": root, "bare": bare, "base": base, "c2": c2, "texts": {k: v + "\n" for k, v in texts.items()}}


def make_delivery(tmp_path: Path, origin: dict, names: tuple[str, ...] = ("npu", "follow")) -> Path:
    """A delivery folder whose patches are the given texts, numbered in order, pinned at ``base``."""
    delivery = tmp_path / "tiny-npu"
    (delivery / "patches").mkdir(parents=True)
    metadata = {
        "schema_version": 1,
        "name": "example/tiny",
        "urls": ["https://github.com/example/tiny"],
        "commit": origin["base"],
        "notes": "test fixture",
    }
    (delivery / "patches" / "upstream.json").write_text(json.dumps(metadata))
    for number, name in enumerate(names, start=1):
        (delivery / "patches" / f"{number:04d}-{name}.patch").write_text(origin["texts"][name])
    return delivery


def make_tree(tmp_path: Path, origin: dict, kind: str) -> Path:
    """The upstream at ``base``: a git checkout, or its files without ``.git`` inside another checkout."""
    checkout = tmp_path / "checkout"
    git("clone", "-q", str(origin["root"]), str(checkout), cwd=tmp_path)
    git("checkout", "-q", "--detach", origin["base"], cwd=checkout)
    if kind == "git":
        return checkout
    outer = tmp_path / "outer"  # like a tarball extracted inside some project: its HEAD says nothing
    outer.mkdir()
    git("init", "-q", cwd=outer)
    plain = outer / "upstream"
    shutil.copytree(checkout, plain, ignore=shutil.ignore_patterns(".git"))
    shutil.rmtree(checkout)
    return plain


def cli(capsys: pytest.CaptureFixture, *argv: object) -> tuple[int, str, str]:
    code = main([str(arg) for arg in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def expected_final(origin: dict) -> dict[str, object]:
    return snapshot(origin["root"])


# ---------------------------------------------------------------------------------------------------------------
# Shipped metadata and schema


@pytest.mark.parametrize("delivery", sorted(PINS))
def test_shipped_metadata_validates(delivery: str) -> None:
    upstream = up.load_upstream(REPO / delivery)
    assert (upstream.name, upstream.commit) == PINS[delivery]
    assert upstream.urls[0] == f"https://github.com/{PINS[delivery][0]}"
    up.find_patches(REPO / delivery)  # no misnamed or duplicate patch file
    editor_schema = json.loads(upstream.path.read_text())["$schema"]
    assert (upstream.path.parent / editor_schema).resolve() == up.SCHEMA_PATH.resolve()


def test_subcommands_are_registered() -> None:
    assert SUBCOMMANDS["patches"] == "patches"
    assert SUBCOMMANDS["upstream"] == "upstream"


def test_metadata_failing_schema_is_one_line_error(tmp_path: Path, origin: dict, capsys) -> None:
    delivery = make_delivery(tmp_path, origin)
    metadata = delivery / "patches" / "upstream.json"
    metadata.write_text(json.dumps({**json.loads(metadata.read_text()), "commit": "5565d24"}))
    tree = make_tree(tmp_path, origin, "git")
    code, _, err = cli(capsys, "patches", "check", "--delivery", delivery, "--upstream", tree)
    assert code == ExitCode.INPUT
    assert err.count("\n") == 1 and err.startswith("error: ")
    assert "$.commit" in err and str(metadata) in err


@pytest.mark.parametrize(
    "change",
    [{"urls": ["http://example.com/x"]}, {"urls": []}, {"extra": 1}, {"name": "no-owner"}, {"schema_version": 2}],
)
def test_schema_rejects(change: dict) -> None:
    data = {"schema_version": 1, "name": "a/b", "urls": ["https://github.com/a/b"], "commit": "0" * 40, "notes": ""}
    up.validate_upstream_data(data)
    with pytest.raises(up.PatchError, match=r"is invalid at \$"):
        up.validate_upstream_data({**data, **change})


def test_missing_metadata_names_the_fix(tmp_path: Path) -> None:
    with pytest.raises(up.PatchError, match="pass the delivery folder"):
        up.load_upstream(tmp_path)


def test_misnamed_or_duplicate_patch_files_are_refused(tmp_path: Path) -> None:
    (tmp_path / "patches").mkdir()
    (tmp_path / "patches" / "0001-a.patch").write_text("")
    (tmp_path / "patches" / "0001-b.patch").write_text("")
    with pytest.raises(up.PatchError, match="share a number"):
        up.find_patches(tmp_path)
    (tmp_path / "patches" / "0001-b.patch").unlink()
    (tmp_path / "patches" / "fix.patch").write_text("")
    with pytest.raises(up.PatchError, match=r"not named NNNN-<name>\.patch"):
        up.find_patches(tmp_path)


# ---------------------------------------------------------------------------------------------------------------
# Reading patch headers


def test_patch_paths_reads_git_headers_and_skips_hunk_bodies(tmp_path: Path) -> None:
    text = (
        "diff --git a/src/sp ace.py b/src/sp ace.py\n"
        "old mode 100644\n"
        "new mode 100755\n"
        "diff --git a/old.py b/new.py\n"
        "similarity index 100%\n"
        "rename from old.py\n"
        "rename to new.py\n"
        "diff --git a/pkg/__init__.py b/pkg/__init__.py\n"
        "new file mode 100644\n"
        "index 0000000..e69de29\n"
        'diff --git "a/caf\\303\\251.lua" "b/caf\\303\\251.lua"\n'
        '--- "a/caf\\303\\251.lua"\n'
        '+++ "b/caf\\303\\251.lua"\n'
        "@@ -1,2 +1,2 @@\n"
        "--- a/removed-comment-line\n"
        "+-- added comment line\n"
        " context\n"
        "diff --git a/gone.txt b/gone.txt\n"
        "deleted file mode 100644\n"
        "--- a/gone.txt\n"
        "+++ /dev/null\n"
        "@@ -1 +0,0 @@\n"
        "-bye\n"
    )
    patch = tmp_path / "0001-x.patch"
    patch.write_text(text)
    assert up.patch_paths(patch) == sorted(
        ["src/sp ace.py", "old.py", "new.py", "pkg/__init__.py", "café.lua", "gone.txt"]
    )


def test_patch_outside_the_tree_is_refused(tmp_path: Path) -> None:
    patch = tmp_path / "0001-evil.patch"
    patch.write_text("--- a/../evil\n+++ b/../evil\n@@ -1 +1 @@\n-a\n+b\n")
    with pytest.raises(up.PatchError, match="outside the source tree"):
        up.patch_paths(patch)


# ---------------------------------------------------------------------------------------------------------------
# Pin


def test_pin_matches_at_the_pinned_commit(tmp_path: Path, origin: dict, capsys, monkeypatch) -> None:
    delivery, tree = make_delivery(tmp_path, origin), make_tree(tmp_path, origin, "git")
    assert up.check_pin(up.open_tree(tree), up.load_upstream(delivery)) is None
    monkeypatch.chdir(tmp_path)  # relative paths, as typed in a shell (the tools run in another folder)
    code, out, err = cli(capsys, "patches", "check", "--delivery", delivery.name, "--upstream", tree.name)
    assert code == ExitCode.OK, err
    assert err == "" and "2 patch(es) apply to" in out


def test_wrong_commit_is_refused_unless_forced(tmp_path: Path, origin: dict, capsys) -> None:
    delivery, tree = make_delivery(tmp_path, origin), make_tree(tmp_path, origin, "git")
    (tree / "unrelated.txt").write_text("local change\n")
    head = commit(tree, "local commit")
    before = snapshot(tree)

    code, _, err = cli(capsys, "patches", "apply", "--delivery", delivery, "--upstream", tree)
    assert code == ExitCode.INPUT
    assert err.count("\n") == 1 and head in err and origin["base"] in err and "--force" in err
    assert f"checkout {origin['base']}" in err
    assert snapshot(tree) == before

    code, out, err = cli(capsys, "patches", "apply", "--delivery", delivery, "--upstream", tree, "--force")
    assert code == ExitCode.OK
    assert err.startswith("warning: ") and "--force" in err
    assert "2 patch(es) applied to" in out
    assert (tree / "pkg/npu/ops.py").read_text() == "def op():\n    return 2\n"


def test_plain_tree_warns_that_the_commit_is_unknown(tmp_path: Path, origin: dict) -> None:
    tree = up.open_tree(make_tree(tmp_path, origin, "plain"))
    assert tree.commit is None and tree.tool == "patch"  # although it sits inside another git checkout
    warning = up.check_pin(tree, up.load_upstream(make_delivery(tmp_path, origin)))
    assert "commit is unknown" in warning and origin["base"] in warning


def test_plain_tree_without_patch_command_names_the_fix(tmp_path: Path, origin: dict, monkeypatch) -> None:
    tree = up.open_tree(make_tree(tmp_path, origin, "plain"))
    which = shutil.which
    monkeypatch.setattr(up.shutil, "which", lambda name: None if name == "patch" else which(name))
    with pytest.raises(up.PatchError, match=r"the patch command is not installed.*apt-get install patch"):
        up.check_patches(tree, up.find_patches(make_delivery(tmp_path, origin)))


# ---------------------------------------------------------------------------------------------------------------
# check / apply / status


@pytest.mark.parametrize("kind", KINDS)
def test_patches_apply_in_order(tmp_path: Path, origin: dict, kind: str, capsys) -> None:
    delivery, tree_path = make_delivery(tmp_path, origin), make_tree(tmp_path, origin, kind)
    tree, patches = up.open_tree(tree_path), up.find_patches(delivery)
    assert tree.tool == ("git" if kind == "git" else "patch")
    before = snapshot(tree_path)

    assert [r.state for r in up.check_patches(tree, patches)] == [up.OK, up.OK]
    # The second patch only applies on top of the first: the check is cumulative.
    assert up.check_patches(tree, patches[1:])[0].state == up.FAILS
    assert snapshot(tree_path) == before  # checking reads only

    code, out, _ = cli(capsys, "patches", "apply", "--delivery", delivery, "--upstream", tree_path)
    assert code == ExitCode.OK
    assert snapshot(tree_path) == expected_final(origin)  # renamed, deleted, new empty file, exec bit included
    assert [r.state for r in up.patch_status(tree, patches)] == [up.APPLIED, up.APPLIED]

    code, out, _ = cli(capsys, "patches", "apply", "--delivery", delivery, "--upstream", tree_path)
    assert code == ExitCode.OK and "already applied" in out
    assert snapshot(tree_path) == expected_final(origin)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("names", [("npu", "bad"), ("bad", "npu")], ids=["fails-2nd-of-2", "fails-1st-of-2"])
def test_failing_patch_applies_nothing(tmp_path: Path, origin: dict, kind: str, names: tuple, capsys) -> None:
    delivery, tree = make_delivery(tmp_path, origin, names), make_tree(tmp_path, origin, kind)
    before = snapshot(tree)

    code, out, err = cli(capsys, "patches", "apply", "--delivery", delivery, "--upstream", tree)
    assert code == ExitCode.INPUT
    error = err.splitlines()[-1]  # after the plain tree's warning that its commit is unknown
    assert error.startswith("error: ") and err.count("error: ") == 1
    assert "-bad.patch does not apply" in error and "nothing was applied" in error
    assert "README.md" in error  # the tool's reason names the file
    failing = 2 if names[1] == "bad" else 1
    assert f"{failing:04d}-bad.patch  fails" in out
    if failing == 1:
        assert "0002-npu.patch  not checked" in out
    assert snapshot(tree) == before


@pytest.mark.parametrize("kind", KINDS)
def test_status_reports_applied_and_not_applied(tmp_path: Path, origin: dict, kind: str, capsys) -> None:
    delivery, tree_path = make_delivery(tmp_path, origin), make_tree(tmp_path, origin, kind)
    tree, patches = up.open_tree(tree_path), up.find_patches(delivery)
    assert [r.state for r in up.patch_status(tree, patches)] == [up.NOT_APPLIED, up.NOT_APPLIED]

    assert [r.state for r in up.apply_patches(tree, patches[:1])] == [up.OK]
    code, out, _ = cli(capsys, "patches", "status", "--delivery", delivery, "--upstream", tree_path)
    assert code == ExitCode.OK
    assert "0001-npu.patch     applied" in out and "0002-follow.patch  not applied" in out
    assert "1 of 2 patch(es) applied" in out

    code, _, _ = cli(capsys, "patches", "check", "--delivery", delivery, "--upstream", tree_path)
    assert code == ExitCode.INPUT  # half applied is neither "applies" nor "already applied"


def test_write_error_while_moving_results_changes_nothing(tmp_path: Path, origin: dict, monkeypatch) -> None:
    delivery, tree_path = make_delivery(tmp_path, origin), make_tree(tmp_path, origin, "git")
    before = snapshot(tree_path)
    real_stage, calls = up._stage, []

    def failing_stage(source: Path, target: Path) -> Path:
        calls.append(target)
        if len(calls) == 4:
            raise OSError(28, "No space left on device")
        return real_stage(source, target)

    monkeypatch.setattr(up, "_stage", failing_stage)
    with pytest.raises(OutputError, match="nothing was changed"):
        up.apply_patches(up.open_tree(tree_path), up.find_patches(delivery))
    assert snapshot(tree_path) == before  # staged copies and the new pkg/npu folder are gone again


# ---------------------------------------------------------------------------------------------------------------
# clone


def test_clone_tries_urls_in_order_then_applies(tmp_path: Path, origin: dict, capsys) -> None:
    delivery = make_delivery(tmp_path, origin)
    unrelated = tmp_path / "unrelated"  # reachable, but without the pinned commit
    unrelated.mkdir()
    git("init", "-q", cwd=unrelated)
    (unrelated / "x").write_text("x\n")
    commit(unrelated, "unrelated")
    into = tmp_path / "work" / "upstream"
    into.mkdir(parents=True)  # an empty folder is fine

    urls = [(tmp_path / "missing.git").as_uri(), unrelated.as_uri(), origin["bare"].as_uri()]
    argv = ["upstream", "clone", "--delivery", delivery, "--into", into]
    code, out, err = cli(capsys, *argv, *(arg for url in urls for arg in ("--url", url)))
    assert code == ExitCode.OK, err
    assert err.count("warning: ") == 2 and urls[0] in err and urls[1] in err
    assert f"cloned from {urls[2]}" in out and "2 patch(es) applied" in out
    assert git("rev-parse", "HEAD", cwd=into) == origin["base"]
    assert snapshot(into) == expected_final(origin)
    assert sorted(p.name for p in into.parent.iterdir()) == ["upstream"]  # no clone attempt left behind


def test_clone_into_a_relative_path(tmp_path: Path, origin: dict, capsys, monkeypatch) -> None:
    delivery = make_delivery(tmp_path, origin)
    monkeypatch.chdir(tmp_path)
    argv = ["upstream", "clone", "--delivery", delivery, "--into", "nested/upstream", "--url", origin["bare"].as_uri()]
    code, _, err = cli(capsys, *argv)
    assert code == ExitCode.OK, err
    assert snapshot(tmp_path / "nested" / "upstream") == expected_final(origin)


def test_clone_into_non_empty_folder_is_refused(tmp_path: Path, origin: dict, capsys) -> None:
    into = tmp_path / "busy"
    into.mkdir()
    (into / "mine.txt").write_text("keep me\n")
    argv = ["upstream", "clone", "--delivery", make_delivery(tmp_path, origin), "--into", into]
    code, _, err = cli(capsys, *argv, "--url", origin["bare"].as_uri())
    assert code == ExitCode.OUTPUT
    assert err.count("\n") == 1 and "not empty" in err
    assert [p.name for p in into.iterdir()] == ["mine.txt"] and (into / "mine.txt").read_text() == "keep me\n"


def test_clone_fails_when_no_url_serves_the_commit(tmp_path: Path, origin: dict, capsys) -> None:
    into = tmp_path / "new"
    argv = ["upstream", "clone", "--delivery", make_delivery(tmp_path, origin), "--into", into]
    code, _, err = cli(capsys, *argv, "--url", (tmp_path / "nowhere.git").as_uri())
    assert code == ExitCode.INPUT
    assert err.count("\n") == 1 and "nowhere.git" in err and "--url" in err
    assert not into.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["tiny-npu"]


# ---------------------------------------------------------------------------------------------------------------
# Using a patched tree from a delivery


def test_find_upstream_tree_prefers_the_flag_then_the_variable(tmp_path: Path, origin: dict, monkeypatch) -> None:
    delivery, tree = make_delivery(tmp_path, origin), make_tree(tmp_path, origin, "git")
    monkeypatch.delenv("TINY_SRC", raising=False)
    with pytest.raises(up.PatchError, match=r"no --upstream, no \$TINY_SRC.*upstream clone --delivery tiny-npu"):
        up.find_upstream_tree(delivery, env_var="TINY_SRC", marker="pkg/model.py")
    monkeypatch.setenv("TINY_SRC", str(tree))
    assert up.find_upstream_tree(delivery, env_var="TINY_SRC", marker="pkg/model.py") == tree
    with pytest.raises(up.PatchError, match=r"--upstream .* is not the upstream checkout \(pkg/model.py missing\)"):
        up.find_upstream_tree(delivery, tmp_path, env_var="TINY_SRC", marker="pkg/model.py")
    monkeypatch.setenv("TINY_SRC", str(tmp_path))
    with pytest.raises(up.PatchError, match=r"\$TINY_SRC .* is not the upstream checkout"):
        up.find_upstream_tree(delivery, env_var="TINY_SRC", marker="pkg/model.py")


def test_require_patched_names_missing_patches_and_wrong_commits(tmp_path: Path, origin: dict) -> None:
    delivery, tree_path = make_delivery(tmp_path, origin), make_tree(tmp_path, origin, "git")
    with pytest.raises(up.PatchError, match=r"lacks the patches 0001-npu.patch, 0002-follow.patch; fix with: python"):
        up.require_patched(delivery, tree_path)
    tree = up.open_tree(tree_path)
    up.apply_patches(tree, up.find_patches(delivery))
    assert up.require_patched(delivery, tree_path).commit == origin["base"]
    git("checkout", "-q", "--force", origin["c2"], cwd=tree_path)
    with pytest.raises(up.PatchError, match=f"is at {origin['c2'][:12]}, but tiny-npu needs example/tiny at"):
        up.require_patched(delivery, tree_path)


def test_find_patched_upstream_refuses_an_unpatched_tree_then_takes_it(tmp_path: Path, origin: dict) -> None:
    delivery, tree_path = make_delivery(tmp_path, origin), make_tree(tmp_path, origin, "git")
    with pytest.raises(up.PatchError, match="lacks the patches"):
        up.find_patched_upstream(delivery, tree_path, env_var="TINY_SRC", marker="pkg/model.py")
    up.apply_patches(up.open_tree(tree_path), up.find_patches(delivery))
    assert up.find_patched_upstream(delivery, tree_path, env_var="TINY_SRC", marker="pkg/model.py") == tree_path


def test_import_from_checkout_finds_the_checkouts_packages_first_and_nothing_else(tmp_path: Path, monkeypatch) -> None:
    for name, value in (("first", 1), ("second", 2)):
        (tmp_path / name / f"mod_{name}").mkdir(parents=True)
        (tmp_path / name / f"mod_{name}" / "__init__.py").write_text(f"VALUE = {value}\n")
        (tmp_path / name / f"mod_{name}" / "sub.py").write_text(f"from mod_first import VALUE\nSUB = VALUE + {value}\n")
    (tmp_path / "first" / "stray_helper.py").write_text("VALUE = 'shadow'\n")  # a script, not a package
    (tmp_path / "first" / "json").mkdir()  # a folder without __init__.py is not a package of the checkout
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    path_before = list(sys.path)
    try:
        assert up.import_from_checkout("mod_second.sub", tmp_path / "first", tmp_path / "second").SUB == 3
        assert sys.path == path_before  # nothing added
        with pytest.raises(ModuleNotFoundError):
            __import__("stray_helper")
        import json

        assert json.__file__ and "first" not in json.__file__
        finders = len(sys.meta_path)
        up.import_from_checkout("mod_first", tmp_path / "first", tmp_path / "second")
        assert len(sys.meta_path) == finders  # one finder per set of folders
    finally:
        for name in ("mod_first", "mod_second", "mod_second.sub"):
            sys.modules.pop(name, None)
