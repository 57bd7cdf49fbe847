"""The export-sweep command: help, named errors, corrupt lines, matrix rebuild, merge.

(Merged shards equal a single run: ``tests/sweep/test_plugin.py``, which runs the shards.)
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from sweep.cli import main
from sweep.results import append_row


def cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "sweep.cli", *args], capture_output=True, text=True, cwd=cwd)


def rows_file(path, n=3):
    for i in range(n):
        append_row(path, {"model": f"M{i}", "backend": "onnx", "shapes": "dynamic", "status": "pass" if i else "fail",
                          "error": "ValueError: x", "versions": {"torch": "2.13.0"}, "pinned": {"torch": "2.13.0"}})
    return path


def test_help_lists_the_commands_and_their_options():
    result = cli("--help")
    assert result.returncode == 0
    assert "{matrix,merge,compare,skiplist,drift,repros}" in result.stdout and "exit 1 on regressions" in result.stdout
    for command, option in (("matrix", "--out"), ("merge", "--out"), ("compare", "--time-threshold")):
        sub = cli(command, "--help")
        assert sub.returncode == 0 and option in sub.stdout and "--strict" in sub.stdout
    sub = cli("drift", "--help")
    assert sub.returncode == 0 and "--baseline" in sub.stdout and "./dev env" in sub.stdout


def test_only_drift_passes_unknown_arguments_on():
    """``drift`` hands what it does not know to the sweep; every other command still rejects it."""
    result = cli("matrix", "x.jsonl", "--models=smoke")
    assert result.returncode == 2 and "unrecognized arguments: --models=smoke" in result.stderr


@pytest.mark.parametrize("args, message", [
    (["matrix", "{tmp}/absent.jsonl"], "export-sweep: error: no row file: {tmp}/absent.jsonl does not exist"),
    (["matrix", "{tmp}"], "export-sweep: error: no row file: {tmp} is a folder without results.jsonl"),
    (["compare", "{tmp}/ok.jsonl", "{tmp}/absent"], "export-sweep: error: no row file: {tmp}/absent does not exist"),
    (["matrix", "{tmp}/empty.jsonl"], "export-sweep: error: no rows in {tmp}/empty.jsonl"),
    (["compare", "{tmp}/ok.jsonl", "{tmp}/ok.jsonl", "--time-threshold", "0"], "export-sweep: error: --time-threshold must be > 0, got 0.0"),
])
def test_errors_are_one_line_with_exit_code_2(tmp_path, args, message):
    rows_file(tmp_path / "ok.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    result = cli(*(a.format(tmp=tmp_path) for a in args))
    assert result.returncode == 2
    assert result.stderr.strip() == message.format(tmp=tmp_path)  # one line, no traceback


def test_unknown_command_is_a_usage_error():
    result = cli("plot")
    assert result.returncode == 2 and "invalid choice: 'plot'" in result.stderr


def test_corrupt_lines_are_reported_with_line_numbers_and_skipped(tmp_path, capsys):
    path = rows_file(tmp_path / "results.jsonl")
    with open(path, "a") as f:
        f.write('{"model": "Half", "backend": "on\n')
        f.write('"just a string"\n')
    append_row(path, {"model": "Late", "backend": "onnx", "shapes": "dynamic", "status": "pass"})
    assert main(["matrix", str(tmp_path)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and err[0].startswith(f"export-sweep: warning: {path}:4: corrupt row skipped: Invalid control")
    assert err[1] == f"export-sweep: warning: {path}:5: corrupt row skipped: a row is a JSON object"
    matrix = json.loads((tmp_path / "matrix.json").read_text())
    assert sorted(matrix["models"]) == ["Late", "M0", "M1", "M2"]
    assert (tmp_path / "matrix.md").is_file() and (tmp_path / "matrix.html").is_file()
    assert main(["matrix", str(tmp_path), "--strict"]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"export-sweep: error: 2 corrupt line(s) in {path} (first: line 4); --strict stops here")


def test_merge_joins_row_files_one_row_per_case(tmp_path, capsys):
    a, b = tmp_path / "a" / "results.jsonl", tmp_path / "b.jsonl"
    append_row(a, {"model": "A", "backend": "onnx", "status": "fail", "started": 1})
    append_row(a, {"model": "B", "backend": "onnx", "status": "pass", "started": 1})
    append_row(b, {"model": "A", "backend": "onnx", "status": "pass", "started": 2})  # re-run later elsewhere
    assert main(["merge", str(tmp_path / "a"), str(b), "--out", str(tmp_path / "all")]) == 0
    captured = capsys.readouterr()
    assert "1 case(s) appear in several row files" in captured.err
    assert "merged 2 cases from 2 row files" in captured.out
    merged = [json.loads(x) for x in (tmp_path / "all" / "results.jsonl").read_text().splitlines()]
    assert [(r["model"], r["status"]) for r in merged] == [("A", "pass"), ("B", "pass")]
    assert json.loads((tmp_path / "all" / "matrix.json").read_text())["counts"]["onnx-static"]["pass"] == 2


def test_skiplist_drafts_entries_for_the_unlisted_failures(tmp_path, capsys):
    from sweep.results import append_row

    rows = [{"model": "BertModel", "backend": b, "shapes": "dynamic", "status": "fail", "stage": "export",
             "error_type": "GuardOnDataDependentSymNode",
             "error": "GuardOnDataDependentSymNode: Could not guard on data-dependent expression Eq(u0, 1)"}
            for b in ("dynamo", "onnx")]
    rows += [{"model": "GPT2Model", "backend": "dynamo", "shapes": "dynamic", "status": "fail", "stage": "export",
              "error_type": "GuardOnDataDependentSymNode", "error": "GuardOnDataDependentSymNode: Eq(u3, 2)"},
             {"model": "GPT2Model", "backend": "onnx", "shapes": "dynamic", "status": "pass"},
             {"model": "T5Model", "backend": "onnx", "shapes": "dynamic", "status": "discrepancy", "stage": "compare",
              "error": "traced shape: 1 of 3 leaves differ"},
             {"model": "LlamaModel", "backend": "onnx", "shapes": "dynamic", "status": "timeout", "stage": "export"},
             {"model": "OPTModel", "backend": "onnx", "shapes": "dynamic", "status": "skip"}]
    for row in rows:
        append_row(tmp_path / "run" / "results.jsonl", row)
    lists = tmp_path / "lists"
    lists.mkdir()
    (lists / "export_skip.yaml").write_text("- classes: [Llama*]\n  backends: [onnx]\n  reason: r\n  todo: t\n")
    assert main(["skiplist", str(tmp_path / "run"), "--skiplist-dir", str(lists)]) == 0
    captured = capsys.readouterr()
    assert "4 non-passing cases" in captured.err  # the listed timeout, the skip and the pass are not drafted
    entries = yaml.safe_load(captured.out)
    assert [(e["classes"], e["backends"]) for e in entries] == [
        (["BertModel"], ["dynamo", "onnx"]), (["GPT2Model"], ["dynamo"]), (["T5Model"], ["onnx"])]
    assert all(e["todo"].startswith("TODO") and "data-dependent" in entries[0]["reason"] for e in entries)
    assert "# torch.export: data-dependent branch or value (1 classes)" in captured.out
