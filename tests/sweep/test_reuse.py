"""``--reuse-from``: an unchanged case is copied from an earlier run, a changed one runs, and its row says why."""

from __future__ import annotations

import json
from pathlib import Path

from sweep.reuse import find, reused_row
from tests.sweep.test_plugin import rows, sweep  # noqa: F401  (the fixture: a sweep over local models)

pytest_plugins = ["pytester"]

MODELS = "--models=GoodModel,OtherGoodModel,AbortModel"


def _by_case(pytester, report_dir):
    return {r["case_id"]: r for r in rows(pytester, report_dir)}


def test_unchanged_cases_are_reused_and_changed_ones_rerun(sweep, pytester):
    first = sweep("--backend=eager,dynamo", MODELS)
    assert first.ret == 1  # AbortModel crashes
    ran = _by_case(pytester, "reports")
    assert all(r["fingerprint"] and r["fingerprint_parts"] for r in ran.values())

    again = sweep("--backend=eager,dynamo", MODELS, f"--reuse-from={pytester.path / 'reports'}",
                  f"--report-dir={pytester.path / 'again'}")
    assert again.ret == 1
    again.stdout.fnmatch_lines(["*reused: 4 of 6 cases from *reports; ran 2 (was crash 2)*"])
    reused = _by_case(pytester, "again")
    for case, row in reused.items():
        if case.startswith("AbortModel"):  # a crash may be the machine's: always run again
            assert "reused_from" not in row and row["rerun_reason"] == "was crash"
            continue
        marker = row.pop("reused_from")
        assert marker["dir"] == str(pytester.path / "reports") and marker["at"] > ran[case]["started"]
        # the row is this run's now: its run id and when it was recorded, so that it is the latest of its case
        assert row.pop("run") != ran[case].pop("run") and row.pop("recorded") > ran[case].pop("recorded")
        assert row == ran[case]  # otherwise the row as the run that computed it wrote it
    matrix = json.loads((pytester.path / "again" / "matrix.json").read_text())
    assert matrix["cases"] == 6  # reused rows count like any row

    # a tolerance is part of the case: everything runs again, and says why
    looser = sweep("--backend=eager,dynamo", MODELS, "--atol=1e-3", f"--reuse-from={pytester.path / 'reports'}",
                   f"--report-dir={pytester.path / 'looser'}")
    looser.stdout.fnmatch_lines(["*reused: 0 of 6 cases*changed: case 4*"])

    # the model's own source is part of it too
    module = pytester.path / "local_models.py"
    module.write_text(module.read_text() + "\n# touched\n")
    touched = sweep("--backend=eager", "--models=GoodModel", f"--reuse-from={pytester.path / 'reports'}",
                    f"--report-dir={pytester.path / 'touched'}")
    assert touched.ret == 0
    assert _by_case(pytester, "touched")["GoodModel-eager-static"]["rerun_reason"] == "changed: local"


def test_a_missing_source_is_a_usage_error(sweep, pytester):
    result = sweep("--backend=eager", "--models=GoodModel", f"--reuse-from={pytester.path / 'nowhere'}")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["*--reuse-from *nowhere: no row file: *nowhere does not exist (give an earlier run's report folder*"])


def _source(tmp_path: Path, **row) -> Path:
    base = {"model": "M", "backend": "eager", "shapes": "static", "case_id": "M-eager-static", "status": "pass",
            "started": 1.0, "wall_seconds": 2.0, "fingerprint_parts": {"case": "a", "model": "b"}}
    (tmp_path / "results.jsonl").write_text(json.dumps({**base, **row}) + "\n")
    return tmp_path / "results.jsonl"


def test_find_names_why_a_case_runs(tmp_path):
    parts = {"case": "a", "model": "b"}
    for sub, row, reason in [
        ("same", {}, ""),
        ("timeout", {"status": "timeout"}, "was timeout"),
        ("old", {"fingerprint_parts": None}, "no fingerprint in the earlier row"),
        ("moved", {"fingerprint_parts": {"case": "a", "model": "c"}}, "changed: model"),
    ]:
        (tmp_path / sub).mkdir()
        found, why = find([_source(tmp_path / sub, **row)], "M-eager-static", parts)
        assert why == reason and (found is not None) == (reason == "")
    same = [tmp_path / "same" / "results.jsonl"]
    assert find(same, "Other-eager-static", parts) == (None, "new case")
    assert find(same, "M-eager-static", {**parts, "model": "unknown: x"})[1] == "unknown: model"


def test_a_torn_line_in_the_source_is_skipped_with_a_warning(tmp_path):
    import pytest

    from sweep.reuse import ReuseWarning

    source = _source(tmp_path)
    with open(source, "a") as f:
        f.write('{"model": "N", "backend": "eager", "sta')  # a writer killed mid-row
    with pytest.warns(ReuseWarning, match="results.jsonl:2: corrupt row skipped"):
        found, why = find([source], "M-eager-static", {"case": "a", "model": "b"})
    assert found is not None and why == ""


def test_a_row_reused_twice_keeps_the_run_that_computed_it(tmp_path):
    original = {"model": "M", "status": "pass", "started": 1.0, "wall_seconds": 5.0, "worker": "gw0"}
    twice = reused_row(reused_row(original, [tmp_path / "a" / "results.jsonl"]), [tmp_path / "b" / "results.jsonl"])
    assert twice.pop("reused_from")["dir"] == str(tmp_path / "b")
    assert twice == original


def test_a_reused_row_is_the_latest_of_its_case_in_the_folder_it_joins(sweep, pytester):
    """An older failure in the destination folder (a case that started after the source's pass was computed) does
    not win over the pass reused into it: a row is ordered by when it was recorded, not when its case started."""
    import time

    from sweep.results import append_row

    assert sweep("--backend=eager", "--models=GoodModel", f"--report-dir={pytester.path / 'src'}").ret == 0
    append_row(pytester.path / "dest" / "results.jsonl",
               {"model": "GoodModel", "backend": "eager", "shapes": "static", "case_id": "GoodModel-eager-static",
                "status": "fail", "started": time.time(), "error": "ValueError: an older failure"})
    again = sweep("--backend=eager", "--models=GoodModel", f"--reuse-from={pytester.path / 'src'}",
                  f"--report-dir={pytester.path / 'dest'}")
    assert again.ret == 0
    matrix = json.loads((pytester.path / "dest" / "matrix.json").read_text())
    assert [cell["status"] for cell in matrix["models"]["GoodModel"].values()] == ["pass"]
    # the row names this run, whose record holds the selection (rows no longer repeat it)
    reused = rows(pytester, "dest")[-1]
    runs = [json.loads(line) for line in (pytester.path / "dest" / "runs.jsonl").read_text().splitlines()]
    assert "selection" not in reused and [r["run"] for r in runs] == [reused["run"]]
    assert runs[0]["models"] == "GoodModel" and runs[0]["selected"] == ["GoodModel-eager-static"]
