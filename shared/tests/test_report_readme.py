"""Run reports (schema, evidence lines), README backfill, exit-code mapping, atomic files and `deliverykit env`."""

from __future__ import annotations

import json
import os

import pytest

from deliverykit.errors import ExitCode, InputError, OutputError, run_main
from deliverykit.files import atomic_path, ensure_writable_dir, write_json_atomic
from deliverykit.report import (
    EVIDENCE_KEYS,
    SCHEMA_PATH,
    RunRecord,
    build_report,
    delivery_report,
    environment_fingerprint,
    evidence_lines,
    format_evidence_value,
    parse_evidence,
    portable_paths,
    write_report,
)
from deliverykit.tools.commands import main as cli_main
from deliverykit.tools.readme import ReadmeError, backfill, render_table, replace_section

jsonschema = pytest.importorskip("jsonschema")


def _report(**results):
    return build_report(
        "accuracy",
        "demo-delivery",
        random_weights=True,
        environment=environment_fingerprint("cpu"),
        command=["python", "run.py", "--flag"],
        results=results,
    )


def test_report_validates_against_schema_and_records_environment():
    report = _report(tables=[])
    jsonschema.validate(report, json.loads(SCHEMA_PATH.read_text()))
    env = report["environment"]
    assert env["packages"]["torch"] and env["device"] == "cpu" and env["device_name"]
    assert report["random_weights"] is True and report["schema_version"] == 1


def test_delivery_report_names_the_delivery_by_folder_and_fingerprints_its_checkout(tmp_path):
    delivery = tmp_path / "demo-npu"
    delivery.mkdir()
    report = delivery_report("benchmark", delivery, device="cpu", random_weights=False, results={"tables": []})
    jsonschema.validate(report, json.loads(SCHEMA_PATH.read_text()))
    assert report["kind"] == "benchmark" and report["delivery"] == "demo-npu"
    assert report["random_weights"] is False and report["results"] == {"tables": []}
    assert report["environment"]["device"] == "cpu"
    assert report["environment"]["git_commit"] is None  # tmp_path is outside any git checkout
    here = delivery_report("accuracy", os.path.dirname(__file__), device=None, random_weights=True)
    assert here["environment"]["git_commit"]  # this test file sits in the monorepo's checkout


def test_run_record_builds_the_documented_head_and_the_delivery_report(tmp_path):
    delivery = tmp_path / "demo-npu"
    delivery.mkdir()
    record = RunRecord(delivery, "cpu", random_weights=True)
    times = [30.0, 10.0, 20.0]
    head = record.evidence_head(
        model_device="cpu", cpu_fallback=False, output_shape=(2, 3), total_ms=times, peak_memory_bytes=2**21
    )
    assert list(head) == [key for key in EVIDENCE_KEYS if key in head]  # the documented keys, in their order
    assert head["INPUT_DEVICE"] == head["OUTPUT_DEVICE"] == "cpu" and head["OUTPUT_SHAPE"] == [2, 3]
    assert (head["TIMING_MEDIAN_MS"], head["TIMING_P90_MS"], head["PEAK_MEMORY_MB"]) == (20.0, 28.0, 2.0)
    assert "LATENT_SHAPE" not in head and "TIMING_MEDIAN_MS" not in record.evidence_head(
        model_device="cpu", cpu_fallback=True, output_shape=(1,)
    )
    report = record.report("inference", head, results={"tables": []})
    jsonschema.validate(report, json.loads(SCHEMA_PATH.read_text()))
    assert (report["delivery"], report["random_weights"], report["evidence"]["PEAK_MEMORY_MB"]) == (
        "demo-npu", True, "2.0000",
    )  # fmt: skip


def test_portable_paths_leave_no_path_of_this_machine(tmp_path):
    root, checkout = tmp_path / "repo", tmp_path / "up" / "trellis2"
    (root / ".venv" / "bin").mkdir(parents=True)
    checkout.mkdir(parents=True)
    environ = {"TRELLIS2_SRC": str(checkout), "HOME": str(tmp_path)}  # only *_SRC variables stand for a path
    command = [
        f"{root}/.venv/bin/python", f"{root}/trellis2-npu/inference.py", "--upstream", f"{checkout}/",
        f"--weights-dir={tmp_path}/w", "--output", f"{tmp_path}/out.glb", "--", f"{tmp_path}/seed.png",
        "/usr/local/Ascend/ascend-toolkit/set_env.sh", "/v1/videos", f"{checkout}/trellis2/models",
    ]  # fmt: skip
    assert portable_paths(command, root=root, environ=environ) == [
        ".venv/bin/python", "trellis2-npu/inference.py", "--upstream", "$TRELLIS2_SRC", "--weights-dir=WEIGHTS_DIR",
        "--output", "OUTPUT", "--", "DIR/seed.png", "/usr/local/Ascend/ascend-toolkit/set_env.sh", "/v1/videos",
        "$TRELLIS2_SRC/trellis2/models",
    ]  # fmt: skip
    text = f"{root}/.venv/bin/python x.py --upstream {checkout} (see {tmp_path}/a.json, https://github.com/a/b, 1/3)"
    assert portable_paths({"command": text, "runs": [1, f"{tmp_path}/b"]}, root=root, environ=environ) == {
        "command": ".venv/bin/python x.py --upstream $TRELLIS2_SRC (see DIR/a.json, https://github.com/a/b, 1/3)",
        "runs": [1, "DIR/b"],
    }
    once = portable_paths(command, root=root, environ=environ)
    assert portable_paths(once, root=root, environ=environ) == once  # nothing left to change


def test_reports_are_written_without_paths_of_this_machine(tmp_path, monkeypatch):
    monkeypatch.setenv("URSA_SRC", str(tmp_path / "ursa"))
    report = build_report(
        "inference", "demo-npu", random_weights=True, command=["run.py", "--upstream", str(tmp_path / "ursa")]
    )
    report["upstream"] = {"path": str(tmp_path / "ursa")}  # added after build_report: write_report still mends it
    written = json.loads(write_report(tmp_path / "report.json", report).read_text())
    assert written["command"] == ["run.py", "--upstream", "$URSA_SRC"] and written["upstream"]["path"] == "$URSA_SRC"


def test_environment_records_whitelisted_variables_only(monkeypatch):
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "0")
    monkeypatch.setenv("HF_TOKEN", "secret-value")
    env = environment_fingerprint(None)["env"]
    assert env["ASCEND_RT_VISIBLE_DEVICES"] == "0"
    assert "HF_TOKEN" not in env and "secret-value" not in json.dumps(env)


def test_evidence_lines_format_and_parse_back():
    evidence = {
        "INPUT_DEVICE": "npu:0",
        "CPU_FALLBACK": False,
        "LATENT_SHAPE": [1, 1029, 1024],
        "EMBEDDING_HEAD": [0.51574, -0.153, 0.4796, 0.5728],
        "TIMING_MEDIAN_MS": 30.7412,
        "PEAK_MEMORY_MB": None,
        "NOT_A_KEY": 1,
    }
    lines = evidence_lines(evidence)
    assert lines == [
        "INPUT_DEVICE=npu:0",
        "CPU_FALLBACK=false",
        "LATENT_SHAPE=[1, 1029, 1024]",
        "EMBEDDING_HEAD=[0.5157, -0.1530, 0.4796, 0.5728]",
        "TIMING_MEDIAN_MS=30.7412",
        "PEAK_MEMORY_MB=n/a",
    ]
    assert evidence_lines(evidence, ["NOT_A_KEY"]) == [*lines, "NOT_A_KEY=1"]
    parsed = parse_evidence("noise\n" + "\n".join(lines) + "\nEXIT_CODE=0\n")
    assert parsed["LATENT_SHAPE"] == "[1, 1029, 1024]" and parsed["EXIT_CODE"] == "0"
    assert json.loads(parsed["EMBEDDING_HEAD"]) == [0.5157, -0.153, 0.4796, 0.5728]
    assert format_evidence_value(True) == "true"


def test_run_main_maps_errors_to_one_line_and_exit_code(capsys):
    def bad_input():
        raise InputError("input image x.png does not exist; pass an existing file to --image")

    assert run_main(bad_input) == ExitCode.INPUT
    captured = capsys.readouterr()
    assert captured.err.strip() == "error: input image x.png does not exist; pass an existing file to --image"
    assert captured.out.strip() == "EXIT_CODE=3"
    assert run_main(lambda: 0) == 0 and capsys.readouterr().out.strip() == "EXIT_CODE=0"

    def bug():
        raise KeyError("boom")

    assert run_main(bug) == ExitCode.FAILURE
    assert "Traceback" in capsys.readouterr().err  # bugs keep their traceback


def test_atomic_path_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "out.json"
    target.write_text("previous")
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("interrupted")
    assert target.read_text() == "previous" and list(tmp_path.iterdir()) == [target]
    write_json_atomic(target, {"a": 1})
    assert json.loads(target.read_text()) == {"a": 1}
    assert oct(target.stat().st_mode & 0o777) == oct(0o666 & ~_umask())


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_ensure_writable_dir(tmp_path):
    assert ensure_writable_dir(tmp_path / "a" / "b").is_dir()
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(OutputError, match="not a folder"):
        ensure_writable_dir(blocker)
    with pytest.raises(OutputError, match="choose a writable --output"):
        ensure_writable_dir(blocker / "sub")


README = """# Demo
Intro.

<!-- accuracy:BEGIN -->
(to be generated)
<!-- accuracy:END -->

Outro.
"""


def test_backfill_renders_tables_with_provenance_and_is_idempotent(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(README)
    results = tmp_path / "results" / "accuracy.json"
    results.parent.mkdir()
    table = {"title": "Accuracy", "columns": ["seed", "max_abs", "verdict"], "rows": [[0, 3.48e-05, "pass"]]}
    write_json_atomic(results, _report(tables=[table]))
    assert backfill(readme, {"accuracy": results}) is True
    text = readme.read_text()
    assert "| 0 | 3.48e-05 | pass |" in text and "(to be generated)" not in text
    assert "random weights" in text and "[`results/accuracy.json`](results/accuracy.json)" in text
    assert "`python run.py --flag`" in text
    assert text.startswith("# Demo\nIntro.") and text.endswith("Outro.\n")
    assert backfill(readme, {"accuracy": results}) is False  # twice changes nothing
    assert readme.read_text() == text


def test_backfill_refuses_bad_markers_and_bad_results_without_touching(tmp_path):
    readme = tmp_path / "README.md"
    results = tmp_path / "accuracy.json"
    write_json_atomic(results, _report(tables=[{"columns": ["a"], "rows": [[1]]}]))
    for broken in (README.replace("<!-- accuracy:END -->", ""), README + "<!-- accuracy:BEGIN -->", "# none\n"):
        readme.write_text(broken)
        with pytest.raises(ReadmeError, match="exactly one"):
            backfill(readme, {"accuracy": results})
        assert readme.read_text() == broken
    swapped = "<!-- accuracy:END -->\n<!-- accuracy:BEGIN -->\n"
    with pytest.raises(ReadmeError, match="comes before"):
        replace_section(swapped, "accuracy", "x")
    readme.write_text(README)
    results.write_text(json.dumps({"schema_version": 99}))
    with pytest.raises(ReadmeError, match="not a run report"):
        backfill(readme, {"accuracy": results})
    results.write_text("{broken")
    with pytest.raises(ReadmeError, match="not valid JSON"):
        backfill(readme, {"accuracy": results})
    assert readme.read_text() == README


def test_backfill_cli_bad_files_are_one_exit_3_line(tmp_path, capsys):
    """A README that is not UTF-8, a results file holding a JSON list: exit 3, one line, both files untouched."""
    readme, results = tmp_path / "README.md", tmp_path / "accuracy.json"
    latin1 = README.replace("Intro.", "Intro: caf\xe9.").encode("latin-1")
    readme.write_bytes(latin1)
    write_json_atomic(results, _report(tables=[{"columns": ["a"], "rows": [[1]]}]))
    cases = [(latin1, "is not UTF-8 text (byte 0xe9 at offset"), (README.encode(), "holds a JSON list")]
    for content, match in cases:
        readme.write_bytes(content)
        if match == "holds a JSON list":
            results.write_text("[1, 2]")
        code = run_main(lambda: cli_main(["readme", "backfill", "--readme", str(readme), "--results", str(results)]))
        captured = capsys.readouterr()
        errors = [line for line in captured.err.splitlines() if line.strip()]
        assert code == ExitCode.INPUT and "Traceback" not in captured.err, captured.err
        assert len(errors) == 1 and errors[0].startswith("error: ") and match in errors[0]
        assert readme.read_bytes() == content
    assert results.read_text() == "[1, 2]"


def test_render_table_checks_row_width():
    assert render_table(["a", "b"], [[1, None]]) == "| a | b |\n|---|---|\n| 1 | n/a |"
    with pytest.raises(ReadmeError, match="2 cells for 3 columns"):
        render_table(["a", "b", "c"], [[1, 2]])


def test_readme_cli(tmp_path, capsys):
    readme = tmp_path / "README.md"
    readme.write_text(README)
    results = tmp_path / "accuracy.json"
    write_json_atomic(results, _report(tables=[{"columns": ["a"], "rows": [[1]]}]))
    assert cli_main(["readme", "backfill", "--readme", str(readme), "--results", str(results)]) == 0
    assert "updated" in capsys.readouterr().out
    readme.write_text("# no markers\n")
    code = cli_main(["readme", "backfill", "--readme", str(readme), "--results", str(results)])
    assert code == ExitCode.INPUT and capsys.readouterr().err.startswith("error: README needs exactly one")


def test_env_cli_passes_on_cpu_and_fails_on_missing_accelerator(capsys, monkeypatch):
    monkeypatch.delenv("DELIVERY_DEVICE", raising=False)
    assert cli_main(["env", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "[PASS] torch:" in out and "[PASS] device: cpu -> cpu" in out and "torch_npu" in out
    assert cli_main(["env", "--device", "npu"]) == 1
    assert "[FAIL] device:" in capsys.readouterr().out
