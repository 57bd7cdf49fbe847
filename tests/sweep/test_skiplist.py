"""Skiplist validation: every malformed entry is rejected with file and line."""

from __future__ import annotations

import pytest

from sweep.skiplist import SkiplistError, load_skiplist, load_skiplists

KNOWN = {"GoodModel", "OtherModel"}.__contains__


@pytest.mark.parametrize(
    "content, message",
    [
        ("- class: GoodModel\n  backends: [onnx]\n  link: https://github.com/a/b/issues/1\n", ":1: GoodModel: 'reason' is required"),
        ("- class: GoodModel\n  reason: r\n", ":1: GoodModel: give 'link' (the upstream issue) or 'todo'"),
        ("- class: GoodModel\n  reason: r\n  link: https://example.com/x\n", "is not a GitHub issue or pull request URL"),
        ("- class: GoodModel\n  reason: r\n  todo: t\n- class: NoSuchModel\n  reason: r\n  todo: t\n", ":4: unknown model class 'NoSuchModel'"),
        ("- class: GoodModel\n  reason: r\n  todo: t\n- class: GoodModel\n  reason: r\n  todo: t\n", ":4: GoodModel on eager: duplicate entry (first at line 1)"),
        ("- class: GoodModel\n  reason: [unclosed\n", ":3: malformed YAML"),
        ("- class: GoodModel\n  reason: r\n  todo: t\n  backends: [tpu]\n", "unknown backend(s) ['tpu']"),
        ("- class: GoodModel\n  reason: r\n  todo: t\n  why: x\n", "unknown key(s) ['why']"),
        ("class: GoodModel\n", ":1: a skiplist is a YAML list of entries"),
        ("- class: GoodModel\n  reason: r\n  todo: t\n  versions: {torch: '~=banana'}\n", "'~=banana' is not a version range"),
        ("- class: GoodModel\n  reason: r\n  todo: t\n  versions: [torch]\n", "'versions' maps package names to version ranges"),
    ],
)
def test_invalid_entries(tmp_path, content, message):
    path = tmp_path / "export_skip.yaml"
    path.write_text(content)
    with pytest.raises(SkiplistError) as info:
        load_skiplist(path, "export_skip", KNOWN)
    assert str(path) in str(info.value) and message in str(info.value)


def test_valid_entries_and_lookup(tmp_path):
    (tmp_path / "export_skip.yaml").write_text(
        "- class: GoodModel\n  backends: [onnx, executorch]\n  reason: loops over tiles\n"
        "  link: https://github.com/huggingface/transformers/issues/1\n"
        "- class: OtherModel\n  reason: everything fails\n  todo: vectorise the loop\n"
    )
    lists = load_skiplists(tmp_path, KNOWN)
    assert lists.find("export_skip", "GoodModel", "onnx").line == 1
    assert lists.find("export_skip", "GoodModel", "dynamo") is None
    other = lists.find("export_skip", "OtherModel", "eager")
    assert other.backends == ("eager", "dynamo", "onnx", "executorch") and other.reference == "TODO: vectorise the loop"
    assert lists.entries["generate_skip"] == []


def test_an_entry_with_versions_is_in_force_only_inside_its_ranges(tmp_path):
    """A cause that a release brings is listed for the versions that have it: outside its ranges the case runs, and
    another entry may list the same case with the cause found at other versions."""
    import torch

    now = torch.__version__.split("+")[0]
    (tmp_path / "export_skip.yaml").write_text(
        f"- class: GoodModel\n  backends: [onnx]\n  reason: fails at this torch\n  todo: t\n"
        f"  versions: {{torch: '=={now}', pyyaml: '>=1'}}\n"
        f"- class: GoodModel\n  backends: [onnx]\n  reason: failed before\n  todo: t\n  versions: {{torch: '<1'}}\n"
        f"- class: OtherModel\n  backends: [onnx]\n  reason: fails elsewhere\n  todo: t\n  versions: {{torch: '!={now}'}}\n"
        f"- classes: [ModelOfANewerRelease, 'Newer*']\n  reason: r\n  todo: t\n  versions: {{torch: '>=99'}}\n"
    )
    lists = load_skiplists(tmp_path, KNOWN)
    entry = lists.find("export_skip", "GoodModel", "onnx")
    assert entry.reason == "fails at this torch" and entry.versions == (("pyyaml", ">=1"), ("torch", f"=={now}"))
    assert lists.find("export_skip", "OtherModel", "onnx") is None
    assert [e.in_force for e in lists.entries["export_skip"]] == [True, False, False, False]
    (tmp_path / "export_skip.yaml").write_text("- class: ModelOfANewerRelease\n  reason: r\n  todo: t\n"
                                               "  versions: {torch: '>=1'}\n")
    with pytest.raises(SkiplistError, match="unknown model class 'ModelOfANewerRelease'"):
        load_skiplists(tmp_path, KNOWN)


def test_the_repository_skiplists_are_valid():
    from pathlib import Path

    from sweep.zoo import catalog
    from sweep.selection import is_known_class

    load_skiplists(Path(__file__).resolve().parents[2] / "skiplists", is_known_class, catalog.all_classes)


def test_globs_and_class_lists_cover_several_classes_and_overlaps_are_named(tmp_path):
    names = ["GoodModel", "GoodForMaskedLM", "OtherModel"]
    (tmp_path / "export_skip.yaml").write_text(
        "- classes: [\"Good*\"]\n  backends: [onnx]\n  reason: one cause\n  todo: t\n"
        "- classes: [OtherModel, GoodModel]\n  backends: [dynamo]\n  reason: another cause\n  todo: t\n")
    lists = load_skiplists(tmp_path, set(names).__contains__, lambda: names)
    assert lists.find("export_skip", "GoodForMaskedLM", "onnx").reason == "one cause"
    assert lists.find("export_skip", "GoodModel", "dynamo").reason == "another cause"
    assert lists.find("export_skip", "OtherModel", "onnx") is None
    (tmp_path / "export_skip.yaml").write_text(
        "- classes: [\"Good*\"]\n  reason: r\n  todo: t\n- class: GoodModel\n  backends: [onnx]\n  reason: r\n  todo: t\n")
    with pytest.raises(SkiplistError, match=r":4: GoodModel on onnx: duplicate entry \(first at line 1\)"):
        load_skiplists(tmp_path, set(names).__contains__, lambda: names)
    (tmp_path / "export_skip.yaml").write_text("- classes: [\"Nope*\"]\n  reason: r\n  todo: t\n")
    with pytest.raises(SkiplistError, match="glob 'Nope\\*' matches no model class"):
        load_skiplists(tmp_path, set(names).__contains__, lambda: names)


@pytest.mark.parametrize("report", ["baseline", "generate"])
def test_every_non_passing_baseline_case_is_listed_with_its_cause(report):
    """The CI gate's premise: a catalog run at the pins is green because every known failure is listed. A new
    baseline row (or generation row) that fails without an entry (its cause and link, or a TODO) fails here."""
    from pathlib import Path

    from sweep.zoo import catalog
    from sweep.results import latest_rows, read_rows
    from sweep.selection import is_known_class
    from sweep.skiplist import unlisted

    root = Path(__file__).resolve().parents[2]
    lists = load_skiplists(root / "skiplists", is_known_class, catalog.all_classes)
    rows = latest_rows(list(read_rows(root / "reports" / report / "results.jsonl")))
    missing = unlisted(rows, lists)
    assert not missing, (f"{len(missing)} non-passing cases of reports/{report} have no skiplist entry "
                         f"(draft them with `export-sweep skiplist reports/{report}`), e.g. "
                         + ", ".join(f"{r['model']}-{r['backend']}" for r in missing[:10]))


@pytest.mark.parametrize("report", ["baseline", "generate"])
def test_a_passing_baseline_row_carries_no_skiplist_reason(report):
    """A row is true: a case that passes names no skiplist entry (a stale reference is one of an entry since removed
    or reworded; a current one is an entry whose cases pass, to be removed)."""
    from pathlib import Path

    from sweep.results import latest_rows, read_rows

    root = Path(__file__).resolve().parents[2]
    rows = latest_rows(list(read_rows(root / "reports" / report / "results.jsonl")))
    listed = [f"{r['model']}-{r['backend']}" for r in rows if r["status"] == "pass" and r.get("skiplist")]
    assert not listed, f"{len(listed)} passing cases of reports/{report} carry a skiplist reason, e.g. {listed[:10]}"
