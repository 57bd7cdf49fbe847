"""matrix.html in headless Chromium: what a person sees, filters, the detail of a clicked cell, versions.

Needs Debian's ``chromium`` and ``chromium-driver`` (``./dev setup`` installs them) and Python ``selenium``.
Their absence is a failure, not a skip: CI must run this test. ``CHROMIUM``/``CHROMEDRIVER`` override the paths.
"""

from __future__ import annotations

import os
import shutil

import pytest

from sweep.matrix import write_matrix

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


@pytest.fixture(scope="module")
def page(browser, tmp_path_factory):
    directory = tmp_path_factory.mktemp("report")
    write_matrix(ROWS, directory)
    url = (directory / "matrix.html").as_uri()

    def load():
        browser.get(url)
        return browser
    return load


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
