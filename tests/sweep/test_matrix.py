"""Matrices from rows: counts, failures by category, version drift, Markdown for a PR comment; sharding."""

from __future__ import annotations

import json
import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sweep.html import render_matrix_html
from sweep.matrix import MARKDOWN_BUDGET, build_matrix, to_markdown, versions_table, write_matrix
from sweep.results import case_id, latest_rows
from sweep.shard import ShardError, parse_shard, select, shard_of

PINS = {"torch": "2.13.0", "transformers": "5.23.0"}
AT_PINS = {"torch": "2.13.0+cpu", "transformers": "5.23.0"}


def row(model, backend="dynamo", status="pass", shapes="dynamic", **extra):
    return {"model": model, "backend": backend, "shapes": shapes, "status": status, "versions": AT_PINS,
            "pinned": PINS, **extra}


GUARD = "GuardOnDataDependentSymNode: Could not guard on data-dependent expression Eq(u0, 1)"


def sample_rows():
    return [
        row("A", "eager", shapes="static"), row("A"), row("A", "onnx", "fail", stage="translate", error_type="DispatchError",
        error="DispatchError: No ONNX function found for <OpOverload(op='aten.bincount', overload='default')>\nmore"),
        row("B", "eager", shapes="static"), row("B", status="fail", stage="export", error_type="X", error=GUARD),
        row("C", status="fail", stage="export", error_type="X", error=GUARD.replace("u0", "u7")),
        row("C", "onnx", "discrepancy", stage="compare", error="traced shape: 1 of 1 leaves differ: logits: max abs diff 0.5",
            diffs={"traced:logits": {"max_abs": 0.5, "max_rel": 0.2, "ok": False}, "traced:x": {"max_abs": 0.0, "max_rel": 0.0, "ok": True}}),
        row("D", "onnx", "skip", skiplist="D onnx: reason"),
    ]


def test_counts_cells_and_columns_in_backend_order():
    m = build_matrix(sample_rows())
    assert m["columns"] == ["eager", "dynamo-dynamic", "onnx-dynamic"]
    assert m["counts"]["dynamo-dynamic"] == {"pass": 1, "discrepancy": 0, "fail": 2, "skip": 0, "timeout": 0, "crash": 0}
    assert m["counts"]["onnx-dynamic"]["skip"] == 1 and m["cases"] == 8
    cell = m["models"]["A"]["onnx-dynamic"]
    assert cell["error"] == "DispatchError: No ONNX function found for <OpOverload(op='aten.bincount', overload='default')>"
    assert cell["category"] == "onnx: no translation for aten.bincount" and cell["stage"] == "translate"
    assert list(m["models"]["C"]["onnx-dynamic"]["diffs"]) == ["traced:logits", "traced:x"]  # worst leaf first


def test_failures_are_grouped_by_category_largest_first():
    m = build_matrix(sample_rows())
    assert [(g["category"], g["count"]) for g in m["categories"]] == [
        ("torch.export: data-dependent branch or value", 2),
        ("discrepancy: values differ at the traced shape", 1),
        ("onnx: no translation for aten.bincount", 1),
    ]
    assert {c["model"] for c in m["categories"][0]["cases"]} == {"B", "C"}


def test_the_latest_row_of_a_case_wins():
    rows = [row("A", status="fail", started=1.0, error="E: x"), row("A", status="pass", started=2.0)]
    assert build_matrix(rows)["models"]["A"]["dynamo-dynamic"]["status"] == "pass"
    assert build_matrix(rows[::-1])["models"]["A"]["dynamo-dynamic"]["status"] == "pass"


def test_versions_flag_drift_and_missing_packages():
    rows = [row("A"), row("B", versions={"torch": "2.14.0", "transformers": "5.23.0"}),
            row("C", versions={"torch": "2.13.0", "transformers": None})]
    table = {v["package"]: v for v in versions_table(rows)}
    assert table["torch"] == {"package": "torch", "pinned": "2.13.0", "installed": ["2.13.0", "2.13.0+cpu", "2.14.0"],
                              "state": "drift"}
    assert table["transformers"]["state"] == "missing"
    assert versions_table([row("A")])[0]["state"] == "ok"  # 2.13.0+cpu is the 2.13.0 pin
    # rows without recorded pins fall back to the given (by default: the project's) pins
    assert versions_table([{"model": "A", "versions": {"torch": "2.12.0"}}], pins={"torch": "2.13.0"})[0]["state"] == "drift"


def test_markdown_has_summary_categories_and_drift():
    rows = sample_rows() + [row("E", versions={"torch": "2.14.0", "transformers": "5.23.0"})]
    md = to_markdown(build_matrix(rows))
    assert "| dynamo-dynamic | 2 | 0 | 2 | 0 | 0 | 0 | 4 | 50.0% |" in md
    # the rate divides by every case of the column, skips included (as reports/README.md does)
    skipped = to_markdown(build_matrix(sample_rows() + [row("S", status="skip")]))
    assert "| dynamo-dynamic | 1 | 0 | 2 | 1 | 0 | 0 | 4 | 25.0% |" in skipped  # not 1 of 3 ran
    assert "**⚠ Version drift**: torch pinned 2.13.0, ran 2.13.0+cpu, 2.14.0." in md
    assert md.index("## Summary per backend") < md.index("## Failures by category (4 cases, 3 causes)") < md.index("## Versions")
    assert "<b>2</b> × torch.export: data-dependent branch or value" in md
    assert "&lt;OpOverload" in md  # error text cannot inject HTML into a PR comment
    assert "| torch | 2.13.0 | 2.13.0+cpu, 2.14.0 | ⚠ drift |" in md


def test_markdown_fits_a_pr_comment_for_a_large_sweep():
    rows = [row(f"Model{i}ForCausalLM", b, "fail", error_type="E", stage="export",
                error=f"ValueError: cause number {chr(65 + i % 26)}{chr(65 + i // 26 % 26)} " + "x" * 150)
            for i in range(1500) for b in ("dynamo", "onnx", "executorch")]
    md = to_markdown(build_matrix(rows))
    assert len(md) <= MARKDOWN_BUDGET
    assert "| dynamo-dynamic | 0 | 0 | 1500 | 0 | 0 | 0 | 1500 | 0.0% |" in md


def test_write_matrix_writes_json_md_and_self_contained_html(tmp_path):
    rows = sample_rows() + [row("X", status="fail", error_type="E", error="E: </script><script>alert(1)</script>")]
    paths = write_matrix(rows, tmp_path)
    assert json.loads(paths["json"].read_text()) == json.loads(json.dumps(build_matrix(rows)))
    page = paths["html"].read_text()
    assert page.count("</script>") == 2  # the data block and the code: the error text cannot close either
    assert "http://" not in page and "https://" not in page  # nothing is fetched
    assert page == render_matrix_html(build_matrix(rows))


def _no_constants(name):
    raise AssertionError(f"not strict JSON: bare {name}")


def test_matrix_json_is_strict_for_nan_and_inf_differences(tmp_path):
    diffs = {"traced:a": {"max_abs": 0.5, "max_rel": 0.1, "ok": False}, "traced:b": {"max_abs": math.nan, "max_rel": math.nan, "ok": False},
             "traced:c": {"max_abs": math.inf, "max_rel": -math.inf, "ok": False}, "traced:d": {"max_abs": 0.0, "max_rel": 0.0, "ok": True}}
    rows = sample_rows() + [row("N", "onnx", "discrepancy", stage="compare", error="traced shape: 3 of 4 leaves differ", diffs=diffs)]
    paths = write_matrix(rows, tmp_path)
    m = json.loads(paths["json"].read_text(), parse_constant=_no_constants)
    cell = m["models"]["N"]["onnx-dynamic"]
    assert cell["diffs"]["traced:b"] == {"max_abs": "NaN", "max_rel": "NaN", "ok": False}
    assert cell["diffs"]["traced:c"] == {"max_abs": "Infinity", "max_rel": "-Infinity", "ok": False}
    # NaN and inf are the worst differences of a cell
    assert list(build_matrix(rows)["models"]["N"]["onnx-dynamic"]["diffs"]) == ["traced:b", "traced:c", "traced:a", "traced:d"]
    # the data the page parses with JSON.parse is strict too
    data = re.search(r'<script type="application/json" id="matrix-data">(.*?)</script>', paths["html"].read_text(), re.S)
    assert json.loads(data.group(1), parse_constant=_no_constants)["models"]["N"]["onnx-dynamic"]["diffs"]["traced:c"]["max_abs"] == "Infinity"


def test_errors_lose_their_terminal_colour_codes(tmp_path):
    coloured = ("\x1b[1mDispatchError\x1b[0m: No ONNX function found for \x1b[31maten.bincount\x1b[0m\n"
                "\x1b[2K\x1b[1;33mhint\x1b[0m: register one")
    rows = [row("A", "onnx", "fail", stage="translate", error_type="\x1b[1mDispatchError\x1b[0m", error=coloured)]
    paths = write_matrix(rows, tmp_path)
    cell = build_matrix(rows)["models"]["A"]["onnx-dynamic"]
    assert cell["error"] == "DispatchError: No ONNX function found for aten.bincount"
    assert cell["error_detail"] == "DispatchError: No ONNX function found for aten.bincount\nhint: register one"
    assert cell["error_type"] == "DispatchError"
    for path in paths.values():
        text = path.read_text()
        assert "\x1b" not in text and "\\u001b" not in text and "[0m" not in text, path.name


# ─── Sharding ────────────────────────────────────────────────────────────────────────────────────

@pytest.mark.parametrize("text, message", [("3", "write it as i/n"), ("0/4", "1 <= i <= n"), ("5/4", "1 <= i <= n"),
                                           ("1/0", "1 <= i <= n"), ("a/b", "write it as i/n")])
def test_shard_syntax_errors(text, message):
    with pytest.raises(ShardError, match=message):
        parse_shard(text)
    assert parse_shard(" 2/4 ") == (2, 4)


_IDS = st.lists(st.from_regex(r"[A-Z][a-z]{1,8}Model-(dynamo|onnx|executorch)-(static|dynamic)", fullmatch=True),
                unique=True, max_size=60)


@given(_IDS, st.integers(1, 9))
def test_shards_partition_the_cases_whatever_their_order(ids, n):
    parts = [select(ids, i, n) for i in range(1, n + 1)]
    assert sorted(x for part in parts for x in part) == sorted(ids)  # every case in exactly one shard
    assert [select(list(reversed(ids)), i, n) for i in range(1, n + 1)] == [part[::-1] for part in parts]
    assert all(shard_of(x, n) == shard_of(x, n) for x in ids)


def test_shard_assignment_is_stable_across_processes_and_balanced():
    assert [shard_of(f"M{i}-onnx-dynamic", 4) for i in range(8)] == [shard_of(f"M{i}-onnx-dynamic", 4) for i in range(8)]
    assert shard_of("LlamaForCausalLM-dynamo-dynamic", 4) == 2  # a fixed value: no salted hash()
    sizes = [len(select([f"M{i}-onnx-dynamic" for i in range(4000)], k, 4)) for k in range(1, 5)]
    assert min(sizes) > 900


_ROWS = st.lists(st.fixed_dictionaries({
    "model": st.sampled_from(["A", "B", "C", "D", "E"]), "backend": st.sampled_from(["eager", "dynamo", "onnx"]),
    "shapes": st.sampled_from(["static", "dynamic"]), "started": st.integers(0, 3),
    "status": st.sampled_from(["pass", "fail", "discrepancy", "crash"]),
    "error": st.sampled_from([None, GUARD, "RuntimeError: boom 3"]),
}), max_size=30)


@settings(max_examples=60, deadline=None)
@given(_ROWS, st.integers(1, 5), st.randoms())
def test_merging_shards_equals_the_single_run(rows, n, rnd):
    rows = latest_rows(rows)  # a single run: one row per case
    shards = [[r for r in rows if shard_of(case_id(r), n) == i] for i in range(1, n + 1)]
    for part in shards:
        rnd.shuffle(part)
    rnd.shuffle(shards)
    merged = latest_rows([r for part in shards for r in part])
    assert build_matrix(merged, pins=PINS) == build_matrix(rows, pins=PINS)
