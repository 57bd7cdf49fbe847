"""Row files: concurrent appends, torn lines, strict JSON, corrupt lines, one row per case; --resume."""

from __future__ import annotations

import json
import multiprocessing

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.versions import pinned_versions
from sweep.results import (CorruptRow, RowFileError, append_row, case_id, dumps_strict, latest_rows, loads_strict,
                           read_rows, rows_path)
from tests.sweep.test_plugin import LOCAL_MODELS, rows, sweep  # noqa: F401  (the pytester sweep fixture)

pytest_plugins = ["pytester"]


def _writer(path, writer, count, size):
    for i in range(count):
        # rows far larger than PIPE_BUF and a page, so that an unlocked or split write would interleave
        append_row(path, {"model": f"W{writer}", "backend": "dynamo", "status": "pass", "i": i,
                          "pad": chr(ord("a") + writer) * (size + 997 * i)})


def _spawn(target, *args):
    return multiprocessing.get_context("spawn").Process(target=target, args=args)


def test_concurrent_writers_never_interleave_or_lose_rows(tmp_path):
    path = tmp_path / "results.jsonl"
    writers, count = 6, 25
    procs = [_spawn(_writer, path, w, count, 70_000) for w in range(writers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b"" and len(lines) == writers * count + 1
    got = [json.loads(line) for line in lines[:-1]]  # every line is one whole row
    for w in range(writers):
        mine = [r for r in got if r["model"] == f"W{w}"]
        assert [r["i"] for r in mine] == list(range(count))  # each writer's rows, all, in its order
        assert all(set(r["pad"]) == {chr(ord("a") + w)} for r in mine)


def test_a_torn_last_line_never_swallows_the_next_row(tmp_path):
    path = tmp_path / "results.jsonl"
    append_row(path, {"model": "A", "backend": "onnx", "status": "pass"})
    with open(path, "ab") as f:  # a writer killed mid-write: half a row, no newline
        f.write(b'{"model": "B", "backend": "onn')
    append_row(path, {"model": "C", "backend": "onnx", "status": "fail"})
    seen: list[CorruptRow] = []
    assert [r["model"] for r in read_rows(path, on_corrupt=seen.append)] == ["A", "C"]
    assert [c.line for c in seen] == [2]


_FLOATS = st.floats(allow_nan=True, allow_infinity=True)
_JSONISH = st.recursive(st.none() | st.booleans() | st.integers() | _FLOATS | st.text(max_size=8),
                        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
                        max_leaves=20)


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and a != a:
        return b != b
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(_same, a, b))
    return a == b


@settings(max_examples=150, deadline=None)
@given(_JSONISH.filter(lambda v: not _has_name(v)))
def test_strict_json_round_trips_nan_and_inf_and_is_valid_json(value):
    text = dumps_strict(value)
    json.loads(text, parse_constant=lambda name: pytest.fail(f"bare {name} in {text}"))  # what JSON.parse accepts
    assert _same(loads_strict(text), value)


def _has_name(value) -> bool:  # the three strings that stand for non-finite floats read back as floats
    if isinstance(value, str):
        return value in ("NaN", "Infinity", "-Infinity")
    if isinstance(value, dict):
        return any(_has_name(k) or _has_name(v) for k, v in value.items())
    return isinstance(value, list) and any(map(_has_name, value))


def test_old_row_files_with_bare_nan_still_read(tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_text('{"model": "A", "backend": "onnx", "status": "discrepancy", "diffs": {"x": {"max_abs": NaN}}}\n')
    (row,) = read_rows(path)
    assert row["diffs"]["x"]["max_abs"] != row["diffs"]["x"]["max_abs"]
    append_row(path, row)
    assert '"NaN"' in path.read_text().splitlines()[1]


def test_a_row_is_on_disk_when_append_returns(tmp_path):
    path = tmp_path / "deep" / "results.jsonl"
    append_row(path, {"model": "A", "backend": "eager", "status": "pass"})
    assert json.loads(path.read_text()) == {"model": "A", "backend": "eager", "status": "pass"}


def test_corrupt_lines_are_named_by_line_number(tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_text('{"model": "A", "backend": "onnx", "status": "pass"}\n'
                    '{"model": "B", "backe\n'
                    '\n'
                    '[1, 2]\n'
                    '{"model": "C", "backend": "onnx"}\n'
                    '{"model": "D", "backend": "onnx", "status": "fail"}\n')
    seen: list[CorruptRow] = []
    good = list(read_rows(path, on_corrupt=seen.append))
    assert [r["model"] for r in good] == ["A", "D"]
    assert [c.line for c in seen] == [2, 4, 5]
    assert "lacks status" in str(seen[2]) and str(seen[0]).startswith(f"{path}:2: corrupt row skipped")
    with pytest.raises(CorruptRow, match=r":2: corrupt row skipped"):
        list(read_rows(path))


def test_rows_path_accepts_a_file_or_a_report_folder(tmp_path):
    with pytest.raises(RowFileError, match="no row file: .* does not exist"):
        rows_path(tmp_path / "nope.jsonl")
    with pytest.raises(RowFileError, match="folder without results.jsonl"):
        rows_path(tmp_path)
    append_row(tmp_path / "results.jsonl", {"model": "A", "backend": "onnx", "status": "pass"})
    assert rows_path(tmp_path) == rows_path(tmp_path / "results.jsonl") == tmp_path / "results.jsonl"


_ROW = st.fixed_dictionaries({
    "model": st.sampled_from(["A", "B", "C"]), "backend": st.sampled_from(["eager", "onnx"]),
    "shapes": st.just("static"), "status": st.sampled_from(["pass", "fail"]), "started": st.integers(0, 5),
})


@settings(max_examples=80, deadline=None)
@given(st.lists(_ROW, max_size=25))
def test_latest_rows_keeps_one_row_per_case_the_last_started(rows_in):
    out = latest_rows(rows_in)
    ids = [case_id(r) for r in out]
    assert ids == sorted(set(case_id(r) for r in rows_in))
    for row in out:
        same = [(r["started"], i) for i, r in enumerate(rows_in) if case_id(r) == case_id(row)]
        assert rows_in[max(same)[1]] is row


def test_resume_runs_only_the_missing_cases(sweep, pytester):  # noqa: F811
    # an "interrupted" sweep: two of the four cases have rows (crafted: the resumed run must not touch them)
    path = pytester.path / "reports" / "results.jsonl"
    kept = [{"model": m, "backend": "dynamo", "shapes": "dynamic", "case_id": f"{m}-dynamo-dynamic", "status": s,
             "started": 1.0} for m, s in (("GoodModel", "pass"), ("DriftModel", "discrepancy"))]
    for row in kept:
        append_row(path, row)
    result = sweep("--models=GoodModel,OtherGoodModel,DriftModel,AbortModel", "--backend=dynamo", "--resume", "-n", "2")
    result.assert_outcomes(passed=1, failed=1)  # (xdist does not report the deselected count)
    result.stdout.fnmatch_lines(["*resumed: 2 cases already had a row*"])
    after = rows(pytester)
    assert sorted(r["case_id"] for r in after) == sorted(
        f"{m}-dynamo-dynamic" for m in ("GoodModel", "OtherGoodModel", "DriftModel", "AbortModel"))
    assert after[:2] == kept  # the earlier rows are untouched
    matrix = json.loads((pytester.path / "reports" / "matrix.json").read_text())
    assert matrix["cases"] == 4 and matrix["counts"]["dynamo-dynamic"] == {
        "pass": 2, "discrepancy": 1, "fail": 0, "skip": 0, "timeout": 0, "crash": 1}
    new = {r["model"]: r for r in after[2:]}
    assert new["AbortModel"]["category"] == "crash (SIGABRT) in eager"
    assert new["AbortModel"]["error_line"] == "the case process died (SIGABRT) in stage 'eager'"
    assert new["OtherGoodModel"]["peak_rss_mb"] > 10 and new["OtherGoodModel"]["category"] is None
    assert new["OtherGoodModel"]["pinned"]["torch"] == pinned_versions()["torch"]  # the pins of the checkout


def test_a_whole_file_write_gets_the_permissions_of_any_new_file(tmp_path):
    """``replace_file`` goes through ``mkstemp`` (owner-only); the matrix it writes must be readable like any file."""
    import os
    import stat

    from sweep.results import replace_file

    old = os.umask(0o022)
    try:
        replace_file(tmp_path / "matrix.md", "# matrix\n")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "matrix.md").stat().st_mode) == 0o644


@given(st.lists(st.tuples(st.sampled_from("ABC"), st.floats(0, 100), st.floats(0, 100)), max_size=12),
       st.sampled_from("ABC"), st.floats(0, 100))
def test_a_row_recorded_now_is_the_latest_of_its_case_whenever_its_case_started(earlier, case, started):
    """The latest-row rule cannot go backwards: a row recorded after the others (a reused row, whose case ran long
    ago) is its case's result, whatever its ``started``."""
    rows = [{"model": m, "backend": "eager", "status": "fail", "started": s, "recorded": r} for m, s, r in earlier]
    newest = max([r for _, _, r in earlier], default=0.0) + 1.0
    latest = {"model": case, "backend": "eager", "status": "pass", "started": started, "recorded": newest}
    by_case = {row["model"]: row for row in latest_rows([*rows, latest])}
    assert by_case[case] is latest
