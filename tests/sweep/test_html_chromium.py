"""matrix.html in headless Chromium: what a person sees, filters, sorting, the detail of a clicked cell, versions.

One browser for the module; besides the small hand-made report, a report whose diffs hold NaN/inf and a synthetic
sweep of 600 classes x 4 backends (sorting, the folded category list, colour codes stripped, all rows present).

Needs Debian's ``chromium`` and ``chromium-driver`` (``./dev setup`` installs them) and Python ``selenium``.
Their absence is a failure, not a skip: CI must run this test. ``CHROMIUM``/``CHROMEDRIVER`` override the paths.
"""

from __future__ import annotations

import functools
import math
import os
import shutil

import pytest

from sweep.matrix import build_matrix, write_matrix
from sweep.results import append_row, read_rows

PINS = {"torch": "2.13.0", "transformers": "5.23.0"}
INJECTION = "</script><img src=x onerror=\"document.title='pwned'\">"


def _row(model, backend, status, **extra):
    return {"model": model, "backend": backend, "shapes": "static" if backend == "eager" else "dynamic",
            "status": status, "pinned": PINS, "versions": {"torch": "2.13.0+cpu", "transformers": "5.24.0"},
            "model_type": model[:4].lower(), "mappings": ["causal_lm"], "wall_seconds": 4.2, "peak_rss_mb": 812.5,
            "seconds": {"build": 0.5, "export": 2.25}, **extra}


GUARD = dict(stage="export", error_type="GuardOnDataDependentSymNode",
             error="GuardOnDataDependentSymNode: Could not guard on data-dependent expression Eq(u0, 1)")
ROWS = [
    _row("LlamaForCausalLM", "eager", "pass"), _row("LlamaForCausalLM", "dynamo", "pass"),
    _row("LlamaForCausalLM", "onnx", "discrepancy", stage="compare",
         error="second shape: 1 of 2 leaves differ: logits: max abs diff 0.031, max rel diff 0.5",
         diffs={"second:logits": {"max_abs": 0.031, "max_rel": 0.5, "ok": False},
                "traced:logits": {"max_abs": 1e-6, "max_rel": 1e-5, "ok": True}}),
    _row("LlamaModel", "eager", "pass"), _row("LlamaModel", "dynamo", "fail", **GUARD),
    _row("BertModel", "eager", "pass"), _row("BertModel", "dynamo", "fail", **GUARD),
    _row("BertModel", "onnx", "crash", stage="run", error=f"the case process died (SIGSEGV) in stage 'run' {INJECTION}"),
    _row("ViTModel", "eager", "pass"), _row("ViTModel", "onnx", "timeout", stage="export",
                                            error="case ran past --case-timeout=600s in stage 'export'"),
    _row("ViTModel", "executorch", "skip", skiplist="ViTModel executorch: needs a kernel"),
]


def _executable(env: str, name: str) -> str:
    path = os.environ.get(env) or shutil.which(name)
    if not path:
        pytest.fail(f"no {name} found: the HTML test drives Debian's chromium with chromedriver; install them with "
                    f"`apt-get install chromium chromium-driver` (./dev setup does it) or set {env}", pytrace=False)
    return path


@pytest.fixture(scope="module")
def browser():
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.fail("Python selenium is missing: it is a test dependency (pip install -e '.[test]')", pytrace=False)
    options = webdriver.ChromeOptions()
    options.binary_location = _executable("CHROMIUM", "chromium")
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1400,1000"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(_executable("CHROMEDRIVER", "chromedriver")), options=options)
    yield driver
    driver.quit()


def _loader(browser, rows, directory):
    write_matrix(rows, directory)
    url = (directory / "matrix.html").as_uri()

    def load():
        browser.get_log("browser")  # drop what earlier pages logged
        browser.get(url)
        return browser
    return load


@pytest.fixture(scope="module")
def page(browser, tmp_path_factory):
    return _loader(browser, ROWS, tmp_path_factory.mktemp("report"))


def severe(driver):
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def by(driver, css):
    from selenium.webdriver.common.by import By

    return driver.find_elements(By.CSS_SELECTOR, css)


def visible_models(driver):
    return [tr.get_attribute("data-model") for tr in by(driver, "#heatmap tbody tr") if tr.is_displayed()]


def test_heat_map_shows_every_class_and_column_with_status_colours(page):
    d = page()
    assert visible_models(d) == ["BertModel", "LlamaForCausalLM", "LlamaModel", "ViTModel"]
    assert [th.text for th in by(d, "#heatmap th.col")] == ["eager", "dynamo-dynamic", "onnx-dynamic", "executorch-dynamic"]
    row = {td.get_attribute("data-col"): (td.get_attribute("data-status"), td.text)
           for td in by(d, "#heatmap tr[data-model=BertModel] td.cell")}
    assert row == {"eager": ("pass", "✓"), "dynamo-dynamic": ("fail", "✗"), "onnx-dynamic": ("crash", "☠"),
                   "executorch-dynamic": ("none", "")}
    colours = {s: by(d, f"#heatmap td.status-{s}")[0].value_of_css_property("background-color") for s in ("pass", "fail")}
    assert colours["pass"] != colours["fail"]
    assert d.title == "export-sweep matrix"  # the error text in the data did not run as markup
    assert not [e for e in d.get_log("browser") if e["level"] == "SEVERE"]


def test_counts_per_backend_and_status(page):
    d = page()
    counts = {tr.get_attribute("data-col"): [td.text for td in by(tr, "td")] for tr in by(d, "#summary tr[data-col]")}
    #                                 backend     pass discr fail skip time crash total
    assert counts["dynamo-dynamic"] == ["dynamo-dynamic", "1", "0", "2", "0", "0", "0", "3"]
    assert counts["onnx-dynamic"] == ["onnx-dynamic", "0", "1", "0", "0", "1", "1", "3"]
    assert counts["executorch-dynamic"][4] == "1"


def test_versions_table_and_banner_flag_drift(page):
    d = page()
    banner = by(d, "#drift-banner")[0]
    assert banner.is_displayed() and banner.text == "⚠ Version drift: transformers pinned 5.23.0, ran 5.24.0"
    flags = {tr.get_attribute("data-package"): by(tr, "td.flag")[0].text for tr in by(d, "#versions tr[data-package]")}
    assert flags == {"torch": "ok", "transformers": "⚠ drift"}


def test_filter_by_name_status_and_category(page):
    from selenium.webdriver.support.ui import Select

    d = page()
    by(d, "#filter-name")[0].send_keys("llama")
    assert visible_models(d) == ["LlamaForCausalLM", "LlamaModel"]
    assert by(d, "#shown-count")[0].text == "2 of 4 model classes shown"
    Select(by(d, "#filter-status")[0]).select_by_value("fail")
    assert visible_models(d) == ["LlamaModel"]
    dimmed = {td.get_attribute("data-col") for td in by(d, "#heatmap tr[data-model=LlamaModel] td.cell.dim")}
    assert dimmed == {"eager", "onnx-dynamic", "executorch-dynamic"}  # only the failing cell stays bright
    by(d, "#filter-reset")[0].click()
    assert len(visible_models(d)) == 4
    # the category list sets the category filter
    item = by(d, "#categories li[data-category='torch.export: data-dependent branch or value']")[0]
    assert item.text == "2 × torch.export: data-dependent branch or value"
    item.click()
    assert visible_models(d) == ["BertModel", "LlamaModel"]
    Select(by(d, "#filter-category")[0]).select_by_value("timeout in export")
    assert visible_models(d) == ["ViTModel"]


def test_clicking_a_cell_shows_its_error_and_differences(page):
    d = page()
    by(d, "#heatmap tr[data-model=LlamaForCausalLM] td[data-col=onnx-dynamic]")[0].click()
    assert by(d, "#detail-title")[0].text == "LlamaForCausalLM · onnx-dynamic"
    facts = by(d, "#detail-facts")[0].text
    assert "status discrepancy" in facts and "category discrepancy: values differ at the second (dynamic) shape" in facts
    assert "peak RSS 813 MiB" in facts and "model type llam" in facts
    assert by(d, "#detail-error")[0].text.startswith("second shape: 1 of 2 leaves differ")
    diffs = [[td.text for td in by(tr, "td")] for tr in by(d, "#detail-diffs tr")[1:]]
    assert diffs == [["second:logits", "0.0310", "0.500", "NO"], ["traced:logits", "1.00e-6", "1.00e-5", "yes"]]
    # a crash: the error is shown as text, markup in it stays text
    by(d, "#heatmap tr[data-model=BertModel] td[data-col=onnx-dynamic]")[0].click()
    assert by(d, "#detail-error")[0].text == f"the case process died (SIGSEGV) in stage 'run' {INJECTION}"
    assert d.title == "export-sweep matrix"
    assert len(by(d, "#heatmap td.cell.selected")) == 1


def test_the_page_loads_nothing_from_outside(page):
    d = page()
    urls = d.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    assert [u for u in urls if not u.startswith(("file:", "data:"))] == []
    assert not by(d, "script[src], link[href], img[src]")


# ─── Non-finite differences ──────────────────────────────────────────────────────────────────────

NAN_DIFFS = {"traced:logits": {"max_abs": math.nan, "max_rel": math.nan, "ok": False, "problem": "NaN where eager has none"},
             "traced:scores": {"max_abs": math.inf, "max_rel": -math.inf, "ok": False},
             "traced:hidden": {"max_abs": 0.5, "max_rel": 0.1, "ok": False}}


@pytest.fixture(scope="module")
def nan_page(browser, tmp_path_factory):
    directory = tmp_path_factory.mktemp("nan-report")
    rows_file = directory / "results.jsonl"  # through the row file, as a sweep writes and the matrix command reads it
    for row in ROWS[:3] + [_row("FalconModel", "eager", "pass"),
                           _row("FalconModel", "onnx", "discrepancy", stage="compare", diffs=NAN_DIFFS,
                                error="traced shape: 3 of 3 leaves differ: logits: max abs diff nan")]:
        append_row(rows_file, row)
    return _loader(browser, list(read_rows(rows_file)), directory)


def test_a_row_with_nan_and_inf_differences_renders(nan_page):
    d = nan_page()
    assert d.execute_script("return document.querySelectorAll('#heatmap tbody tr').length") == 2
    assert by(d, "#heatmap tr[data-model=FalconModel] td[data-col=onnx-dynamic]")[0].get_attribute("data-status") == "discrepancy"
    by(d, "#heatmap tr[data-model=FalconModel] td[data-col=onnx-dynamic]")[0].click()
    diffs = [[td.text for td in by(tr, "td")] for tr in by(d, "#detail-diffs tr")[1:]]
    assert diffs == [["traced:logits", "NaN", "NaN", "NO: NaN where eager has none"],  # NaN and inf count as worst
                     ["traced:scores", "Infinity", "-Infinity", "NO"], ["traced:hidden", "0.500", "0.100", "NO"]]
    assert not severe(d)


# ─── A sweep-sized report ────────────────────────────────────────────────────────────────────────

BACKENDS = ("eager", "dynamo", "onnx", "executorch")
CAUSES = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo", "lima")
N_CLASSES = 600


def _synthetic_rows():
    rows = []
    for i in range(N_CLASSES):
        model = f"{CAUSES[i * 7 % 12].title()}{i:03d}ForCausalLM"  # name order differs from any status order
        for k, backend in enumerate(BACKENDS):
            pick = (i * 5 + k * 3) % 11
            if backend == "eager" or pick < 5:
                rows.append(_row(model, backend, "pass"))
            elif pick < 8:
                cause = CAUSES[(i + k) % len(CAUSES)]
                rows.append(_row(model, backend, "fail", stage="export", error_type="ValueError",
                                 error=f"\x1b[1mValueError\x1b[0m: unsupported operator {cause} in graph\n"
                                       f"\x1b[31mfrom\x1b[0m \x1b[2Kthe \x1b[1;33mexporter\x1b[0m"))
            elif pick < 10:
                rows.append(_row(model, backend, "discrepancy", stage="compare", diffs=NAN_DIFFS if pick == 9 else
                                 {"traced:logits": {"max_abs": 0.25, "max_rel": 0.5, "ok": False}},
                                 error="traced shape: 1 of 1 leaves differ: logits"))
            else:
                rows.append(_row(model, backend, "timeout", stage="export",
                                 error="case ran past --case-timeout=600s in stage 'export'"))
    return rows


SYNTHETIC = _synthetic_rows()


@functools.cache
def synthetic_matrix():
    return build_matrix(SYNTHETIC)

RANK = {"crash": 0, "timeout": 1, "fail": 2, "discrepancy": 3, "pass": 4, "skip": 5, "none": 6}


@pytest.fixture(scope="module")
def big_page(browser, tmp_path_factory):
    directory = tmp_path_factory.mktemp("big-report")
    load = _loader(browser, SYNTHETIC, directory)
    text = (directory / "matrix.html").read_text()
    assert "\x1b" not in text and "\\u001b" not in text  # no colour code travels in the page's data
    return load


def row_order(d):
    return d.execute_script("return Array.from(document.querySelectorAll('#heatmap tbody tr'), tr => tr.dataset.model)")


def test_a_sweep_sized_report_renders_every_row(big_page):
    d = big_page()
    models = sorted({r["model"] for r in SYNTHETIC})
    assert row_order(d) == models
    assert d.execute_script("return document.querySelectorAll('#heatmap td.cell').length") == 4 * N_CLASSES
    assert by(d, "#shown-count")[0].text == f"{N_CLASSES} of {N_CLASSES} model classes shown"
    assert int(d.execute_script("return document.body.dataset.renderMs")) < 5000  # one HTML string, not per-cell DOM calls
    assert not severe(d)
    # the matrix comes before the long sections
    top = {sel: d.execute_script(f"return document.querySelector('{sel}').getBoundingClientRect().top")
           for sel in ("#summary", "#heatmap", "#categories-fold", "#versions")}
    assert top["#summary"] < top["#heatmap"] < top["#categories-fold"] < top["#versions"]


def test_clicking_a_header_sorts_the_rows_both_ways(big_page):
    d = big_page()
    m = synthetic_matrix()
    names = sorted(m["models"])
    status = {name: m["models"][name]["onnx-dynamic"]["status"] for name in names}
    header = by(d, "#heatmap th[data-sort=onnx-dynamic]")[0]
    header.click()
    worst_first = sorted(names, key=lambda n: (RANK[status[n]], n))
    assert row_order(d) == worst_first != names
    assert header.get_attribute("aria-sort") == "ascending"
    assert [status[n] for n in row_order(d)[:1]] == ["timeout"]
    header.click()
    assert row_order(d) == sorted(names, key=lambda n: (-RANK[status[n]], n))
    assert header.get_attribute("aria-sort") == "descending"
    name_header = by(d, "#heatmap th[data-sort=model]")[0]
    name_header.click()
    assert row_order(d) == names and header.get_attribute("aria-sort") == "none"
    name_header.click()
    assert row_order(d) == names[::-1] and name_header.get_attribute("aria-sort") == "descending"
    # filters still apply to the sorted rows
    by(d, "#filter-name")[0].send_keys("Alpha")
    shown = d.execute_script("return Array.from(document.querySelectorAll('#heatmap tbody tr'))"
                             ".filter(tr => tr.style.display !== 'none').map(tr => tr.dataset.model)")
    assert shown == [n for n in names[::-1] if "alpha" in n.lower()] and shown
    assert not severe(d)


def test_the_long_category_list_is_folded(big_page):
    d = big_page()
    fold = by(d, "details#categories-fold")[0]
    assert fold.get_attribute("open") is None  # closed: the list is long
    items = by(d, "#categories li[data-category]")
    assert len(items) == len(synthetic_matrix()["categories"]) > 8
    assert not items[0].is_displayed()
    by(d, "#categories-fold > summary")[0].click()
    assert items[0].is_displayed()
    assert "ValueError: unsupported operator" in by(d, "#categories")[0].text


def test_no_colour_codes_in_the_page(big_page):
    d = big_page()
    by(d, "#categories-fold > summary")[0].click()
    failing = next(r for r in SYNTHETIC if r["status"] == "fail")
    by(d, f"#heatmap tr[data-model={failing['model']}] td[data-col={failing['backend']}-dynamic]")[0].click()
    error = by(d, "#detail-error")[0].text
    assert error.startswith("ValueError: unsupported operator ") and error.endswith("from the exporter")
    assert "\x1b" not in d.execute_script("return document.body.innerText")
    assert "[0m" not in d.execute_script("return document.body.innerText")
