"""Comparing two runs on crafted row files: regressions, missing cases, subsets, fixes, new/gone classes, times."""

from __future__ import annotations

import json

from sweep.cli import main
from sweep.diff import by_cause, compare_runs, to_html, to_markdown
from sweep.results import append_row


def row(model, status="pass", backend="dynamo", seconds=10.0, versions=None, **extra):
    return {"model": model, "backend": backend, "shapes": "dynamic", "status": status, "wall_seconds": seconds,
            "versions": versions or {"torch": "2.13.0", "transformers": "5.23.0"}, **extra}


OLD = [row("Stable"), row("Breaks"), row("Drifts"), row("Healed", "fail", error="ValueError: x", stage="export"),
       row("Gone"), row("Slower", seconds=10.0), row("Noisy", seconds=1.0), row("Moves", "fail", error_type="A",
       error="DispatchError: No ONNX function found for <OpOverload(op='aten.bincount', overload='default')>"),
       row("Stable", backend="onnx")]
NEW_VERSIONS = {"torch": "2.13.0", "transformers": "5.24.0"}
NEW = [row(r["model"], r["status"], r["backend"], r["wall_seconds"], NEW_VERSIONS, **{k: r[k] for k in ("error", "stage", "error_type") if k in r})
       for r in OLD if r["model"] == "Stable" and r["backend"] == "dynamo"]
NEW += [row("Breaks", "fail", stage="export", error_type="GuardOnDataDependentSymNode", versions=NEW_VERSIONS,
            error="GuardOnDataDependentSymNode: Could not guard on data-dependent expression Eq(u0, 1)"),
        row("Drifts", "discrepancy", stage="compare", error="traced shape: 1 of 1 leaves differ", versions=NEW_VERSIONS),
        row("Healed", versions=NEW_VERSIONS), row("Fresh", versions=NEW_VERSIONS),
        row("Slower", seconds=31.0, versions=NEW_VERSIONS), row("Noisy", seconds=2.5, versions=NEW_VERSIONS),
        row("Moves", "fail", error_type="B", error="RuntimeError: Missing out variants: {'aten::bincount'}", versions=NEW_VERSIONS),
        row("Stable", backend="executorch", versions=NEW_VERSIONS)]


def test_regressions_fixes_changes_classes_and_times():
    c = compare_runs(OLD, NEW, time_threshold=0.5, min_seconds=5.0)
    assert [(x.model, x.old, x.new, x.category) for x in c.regressions] == [
        ("Breaks", "pass", "fail", "torch.export: data-dependent branch or value"),
        ("Drifts", "pass", "discrepancy", "discrepancy: values differ at the traced shape")]
    assert [(x.model, x.old, x.new) for x in c.fixes] == [("Healed", "fail", "pass")]
    assert [(x.model, x.category) for x in c.changed] == [("Moves", "executorch: no out variant for aten.bincount")]
    assert c.new_classes == ["Fresh"] and c.gone_classes == ["Gone"]
    assert c.new_cases_list == ["Stable-executorch-dynamic"] and c.gone_cases_list == ["Stable-onnx-dynamic"]
    assert [(t.case, t.old_seconds, t.new_seconds) for t in c.time_changes] == [("Slower-dynamo-dynamic", 10.0, 31.0)]
    assert c.versions == [{"package": "transformers", "old": "5.23.0", "new": "5.24.0"}]
    assert c.missing == ["Gone-dynamo-dynamic", "Stable-onnx-dynamic"]
    assert c.exit_code == 1


def test_no_regression_means_exit_code_zero_and_thresholds_apply():
    c = compare_runs(OLD, OLD)
    assert c.exit_code == 0 and not (c.regressions or c.fixes or c.changed or c.time_changes or c.versions)
    assert len(compare_runs(OLD, NEW, time_threshold=2.5).time_changes) == 0  # x3.1 is within +250%
    assert {t.case for t in compare_runs(OLD, NEW, min_seconds=1.0).time_changes} == {"Slower-dynamo-dynamic",
                                                                                    "Noisy-dynamo-dynamic"}
    # pass -> skip is a change, not a regression
    assert compare_runs([row("A")], [row("A", "skip")]).exit_code == 0


def test_markdown_and_html_show_the_sections():
    c = compare_runs(OLD, NEW, old_label="baseline", new_label="pr")
    md = to_markdown(c)
    assert ("❌ **regressions**: 2 regressions, 2 missing cases, 1 fixes, 1 other changes, 1 new classes, "
            "0 new cases not passing, 1 gone classes, 1 time changes.") in md
    for title in ("## Versions that moved (1)", "## Regressions (pass → not passing) (2)", "## Fixes (now passing) (1)",
                  "## Missing cases (in the old run or selected by the new one, not written) (2)",
                  "## New classes (1)", "## Gone classes (1)", "## Time changes (beyond ±50% and ≥ 5 s) (1)"):
        assert title in md
    assert "| Breaks-dynamo-dynamic | pass | fail | export | torch.export: data-dependent branch or value |" in md
    page = to_html(c)
    assert '<table class="regressions">' in page and "Breaks-dynamo-dynamic" in page and "&lt;OpOverload" not in page


def test_the_report_opens_with_regressions_and_fixes_by_cause():
    """Regressions first, then the cause with most cases; a fix is grouped by the failure it had, with the upstream
    link of the skiplist entry its row names."""
    guard = "GuardOnDataDependentSymNode: Could not guard on data-dependent expression Eq(u0, 1)"
    listed = "a reason (https://github.com/pytorch/executorch/issues/19152) [export_skip: X on executorch]"
    old = [row("A"), row("B"), row("B", backend="onnx"), row("C"), row("D", "fail", error="ValueError: x"),
           row("E", "fail", backend="executorch", error="RuntimeError: Output node is already in the inputs",
               skiplist=listed), row("F", "fail", backend="executorch", error="RuntimeError: Output node is "
                                     "already in the inputs", skiplist=listed)]
    new = [row("A", "discrepancy", error="traced shape: 1 of 1 leaves differ"),
           row("B", "fail", error=guard), row("B", "fail", backend="onnx", error=guard), row("C", "fail", error=guard),
           row("D"), row("E", backend="executorch"), row("F", backend="executorch")]
    c = compare_runs(old, new)
    summary = [(g["change"], g["cause"], g["backends"], g["cases"], len(g["classes"]), g["link"]) for g in by_cause(c)]
    assert summary == [
        ("regression", "torch.export: data-dependent branch or value", ["dynamo", "onnx"], 3, 2, None),
        ("regression", "discrepancy: values differ at the traced shape", ["dynamo"], 1, 1, None),
        ("fix", "RuntimeError: Output node is already in the inputs", ["executorch"], 2, 2,
         "https://github.com/pytorch/executorch/issues/19152"),
        ("fix", "ValueError: x", ["dynamo"], 1, 1, None)]
    md = to_markdown(c)
    assert md.index("## Regressions and fixes by cause (4)") < md.index("## Regressions (pass → not passing)")
    assert ("| fix | RuntimeError: Output node is already in the inputs | executorch | 2 | 2 | "
            "https://github.com/pytorch/executorch/issues/19152 |") in md
    assert "| D-dynamo-dynamic | fail | pass |  | ValueError: x | ValueError: x |" in md  # a fix shows what it had


def write(path, rows):
    for r in rows:
        append_row(path, r)


def test_compare_command_gates_on_regressions(tmp_path, capsys):
    write(tmp_path / "old" / "results.jsonl", OLD)
    write(tmp_path / "new.jsonl", NEW)
    assert main(["compare", str(tmp_path / "old"), str(tmp_path / "new.jsonl"), "--out", str(tmp_path / "cmp")]) == 1
    out = capsys.readouterr().out
    assert out.startswith("REGRESSIONS: 2 regressions") and "regression: Breaks-dynamo-dynamic: pass -> fail" in out
    assert (tmp_path / "cmp" / "compare.md").read_text().startswith("# export-sweep compare")
    assert json.loads((tmp_path / "cmp" / "compare.json").read_text())["exit_code"] == 1
    assert (tmp_path / "cmp" / "compare.html").is_file()
    # the other way round the two regressions are fixes (and the fix a regression); output goes to NEW's folder
    assert main(["compare", str(tmp_path / "new.jsonl"), str(tmp_path / "old")]) == 1
    assert "1 regressions, 2 missing cases, 2 fixes" in (tmp_path / "old" / "compare.md").read_text()
    assert main(["compare", str(tmp_path / "old"), str(tmp_path / "old"), "--out", str(tmp_path / "same")]) == 0
    assert capsys.readouterr().out.splitlines()[-2].startswith("ok: 0 regressions")


def test_a_case_missing_from_the_new_run_fails_unless_it_is_a_subset(tmp_path, capsys):
    old = [row("A"), row("A", backend="onnx"), row("B"), row("C")]
    new = [row("A"), row("B")]
    c = compare_runs(old, new)
    assert c.missing == ["A-onnx-dynamic", "C-dynamo-dynamic"] and not c.regressions and c.exit_code == 1
    declared = compare_runs(old, new, subset=True)
    assert declared.exit_code == 0 and declared.not_run == 2 and not declared.gone_classes
    assert "subset: 2 cases of the old run were not run" in to_markdown(declared)
    # a sweep of some classes only records its selection: compared as a subset without being told
    partial = [row("A", selection="A,B"), row("B", selection="A,B")]
    assert compare_runs(old, partial).subset and compare_runs(old, partial).exit_code == 0
    assert compare_runs(old, [row("A", "fail", selection="A"), row("B", selection="A")]).exit_code == 1  # still gates
    write(tmp_path / "old.jsonl", old)
    write(tmp_path / "new.jsonl", new)
    assert main(["compare", str(tmp_path / "old.jsonl"), str(tmp_path / "new.jsonl")]) == 1
    assert "missing: A-onnx-dynamic" in capsys.readouterr().out
    assert main(["compare", str(tmp_path / "old.jsonl"), str(tmp_path / "new.jsonl"), "--subset"]) == 0
    assert capsys.readouterr().out.startswith("ok: 0 regressions, 0 missing cases")


def test_the_markdown_stays_short_enough_for_a_pr_comment():
    from sweep.diff import MARKDOWN_ROWS

    old = [row(f"M{i:04d}") for i in range(1500)]
    new = [row(f"M{i:04d}", "fail", error="ValueError: broke") for i in range(1500)]
    md = to_markdown(compare_runs(old, new))
    assert len(md) < 20_000 and f"… and {1500 - MARKDOWN_ROWS} more" in md
    assert "M1499-dynamo-dynamic" in to_html(compare_runs(old, new))


# ─── The gate reads what the new run selected (its run records) ──────────────────────────────────

def run_record(selected, models="all", backends=("dynamo",), shard=None, filtered=False, run="r1"):
    from sweep.runs import record

    rec = record(run, models=models, backends=backends, shapes=("dynamic",), generate=False, shard=shard,
                 filtered=filtered, selected=selected)
    return rec


def test_a_case_the_run_selected_and_did_not_write_is_missing():
    old = [row("A"), row("B"), row("C"), row("A", backend="onnx")]
    # --models=A,B (not the catalog): B was selected, its worker died before writing it
    runs = [run_record(["A-dynamo-dynamic", "B-dynamo-dynamic"], models="A,B", filtered=False)]
    c = compare_runs(old, [row("A")], new_runs=runs)
    assert c.missing == ["B-dynamo-dynamic"] and c.exit_code == 1
    assert c.subset and c.not_run == 2  # C and A on onnx were not selected: not run, not missing
    # a catalog run on dynamo lacks C: C is in its scope (a class gone from the catalog), so it is missing too
    whole = [run_record(["A-dynamo-dynamic", "B-dynamo-dynamic"])]
    c = compare_runs(old, [row("A"), row("B")], new_runs=whole)
    assert c.missing == ["C-dynamo-dynamic"] and c.not_run == 1  # A on onnx is outside the dynamo run's scope
    assert compare_runs(old, [row("A"), row("B")], new_runs=whole, subset=True).exit_code == 0


def test_shards_of_a_catalog_run_cover_it_whole_only_together():
    old = [row("A"), row("B"), row("C")]
    shards = [run_record(["A-dynamo-dynamic"], shard="1/2", run="s1"),
              run_record(["B-dynamo-dynamic"], shard="2/2", run="s2")]
    c = compare_runs(old, [row("A"), row("B")], new_runs=shards)
    assert c.missing == ["C-dynamo-dynamic"]
    c = compare_runs(old, [row("A")], new_runs=shards[:1])  # one shard alone is not the whole catalog
    assert c.missing == [] and c.not_run == 2 and c.exit_code == 0


def test_a_new_class_that_fails_is_shown_with_its_status_and_strict_new_fails_on_it():
    old = [row("A")]
    new = [row("A"), row("Fresh", "crash", stage="export", error="Fatal Python error: Aborted"), row("Ok")]
    c = compare_runs(old, new)
    assert [(x.case, x.new) for x in c.new_failing] == [("Fresh-dynamo-dynamic", "crash")]
    md = to_markdown(c)
    assert c.exit_code == 0 and "## New cases not passing (not in the old run) (1)" in md
    assert "| Fresh-dynamo-dynamic |  | crash | export |" in md and "1 new cases not passing" in md
    strict = compare_runs(old, new, strict_new=True)
    assert strict.exit_code == 1 and "❌ **new cases failing**" in to_markdown(strict)


def test_compare_with_one_folder_uses_the_packaged_baseline_and_its_runs(tmp_path, capsys, monkeypatch):
    from sweep import packaged
    from sweep.runs import append_run

    base = tmp_path / "pkg" / "baseline"
    write(base / "results.jsonl", [row("A"), row("B")])
    monkeypatch.setattr(packaged, "baseline_folders", lambda: [base])
    new = tmp_path / "new"
    write(new / "results.jsonl", [row("A"), row("Fresh", "fail", error="ValueError: x")])
    append_run(new / "results.jsonl", run_record(["A-dynamo-dynamic", "B-dynamo-dynamic", "Fresh-dynamo-dynamic"],
                                                 models="A,B,Fresh"))
    assert main(["compare", str(new)]) == 1
    out = capsys.readouterr().out
    assert out.startswith("MISSING CASES: 0 regressions, 1 missing cases") and "missing: B-dynamo-dynamic" in out
    write(new / "results.jsonl", [row("B")])
    assert main(["compare", str(new)]) == 0
    assert main(["compare", str(new), "--strict-new"]) == 1
    assert "new, not passing: Fresh-dynamo-dynamic: fail" in capsys.readouterr().out
