"""Pass/fail/discrepancy matrices built from result rows: ``matrix.json``, ``matrix.md`` and ``matrix.html``.

The matrix is a pure function of the rows (one per case: the latest, see :func:`sweep.results.latest_rows`),
so it can be rebuilt from ``results.jsonl`` at any time (``export-sweep matrix REPORT_DIR``). Error categories
are recomputed by :func:`sweep.categories.categorize`; versions compare the pins recorded in the rows (or, for
rows without them, the project's current pins) with the installed versions the rows recorded.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from sweep.categories import categorize, first_line, strip_ansi
from sweep.results import case_id, dumps_strict, latest_rows, replace_file

STATUSES = ("pass", "discrepancy", "fail", "skip", "timeout", "crash")
NOT_PASSING = ("discrepancy", "fail", "timeout", "crash")
BACKEND_ORDER = ("eager", "dynamo", "onnx", "executorch")
MAX_DIFFS = 12  # output leaves kept per cell (the worst first)
MARKDOWN_BUDGET = 60_000  # a GitHub comment holds 65,536 characters


def column(row: dict[str, Any]) -> str:
    return row["backend"] if row["backend"] == "eager" else f"{row['backend']}-{row.get('shapes', 'static')}"


def _column_key(col: str) -> tuple:
    backend, _, shapes = col.partition("-")
    rank = BACKEND_ORDER.index(backend) if backend in BACKEND_ORDER else len(BACKEND_ORDER)
    return rank, backend, shapes


def _worst_diffs(diffs: dict[str, dict] | None) -> dict[str, dict]:
    if not diffs:
        return {}
    def badness(item):
        name, d = item
        worst = d.get("max_abs") or 0.0
        if not isinstance(worst, (int, float)) or math.isnan(worst):
            worst = math.inf  # a NaN difference is as bad as it gets
        return (bool(d.get("ok", True)), -worst, name)
    return dict(sorted(diffs.items(), key=badness)[:MAX_DIFFS])


def _cell(row: dict[str, Any]) -> dict[str, Any]:
    error = strip_ansi(row.get("error"))
    return {
        "case_id": case_id(row),
        "status": row["status"],
        "stage": row.get("stage"),
        "category": categorize(row),
        "error_type": strip_ansi(row.get("error_type")),
        "error": (first_line(error) or "")[:300] or None,
        "error_detail": error[:2000] if error and row["status"] != "pass" else None,
        "seconds": row.get("seconds") or {},
        "wall_seconds": row.get("wall_seconds"),
        "peak_rss_mb": row.get("peak_rss_mb"),
        "diffs": _worst_diffs(row.get("diffs")),
        "skiplist": row.get("skiplist"),
    }


def _base(version: str | None) -> str | None:
    return version.split("+", 1)[0] if version else version


def versions_table(rows: list[dict[str, Any]], pins: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """One entry per pinned package: the pin, the installed versions the rows saw, and whether they drift.

    ``state`` is ``ok`` (every row ran at the pin), ``drift`` (some row ran another version) or ``missing``
    (some row ran without the package installed).
    """
    pinned: dict[str, str] = {}
    for row in rows:
        pinned.update(row.get("pinned") or {})
    if not pinned:
        if pins is None:
            from engine.versions import pinned_versions

            pins = pinned_versions()
        pinned = dict(pins)
    installed: dict[str, set] = defaultdict(set)
    for row in rows:
        for name, version in (row.get("versions") or {}).items():
            installed[name].add(version)
    table = []
    for name in sorted(set(pinned) | set(installed)):
        seen = installed.get(name, set())
        pin = pinned.get(name)
        if None in seen:
            state = "missing"
        elif pin is not None and any(_base(v) != pin for v in seen):
            state = "drift"
        else:
            state = "ok"
        shown = sorted(v for v in seen if v is not None) + (["not installed"] if None in seen else [])
        table.append({"package": name, "pinned": pin, "installed": shown, "state": state})
    return table


def build_matrix(rows: list[dict[str, Any]], pins: dict[str, str] | None = None) -> dict[str, Any]:
    rows = latest_rows(rows)
    cells: dict[str, dict[str, dict]] = defaultdict(dict)
    info: dict[str, dict] = {}
    counts: dict[str, Counter] = defaultdict(Counter)
    groups: dict[str, list] = defaultdict(list)
    for row in rows:
        col = column(row)
        cell = cells[row["model"]][col] = _cell(row)
        counts[col][row["status"]] += 1
        info.setdefault(row["model"], {"model_type": row.get("model_type"), "mappings": row.get("mappings") or []})
        if row["status"] in NOT_PASSING:
            groups[cell["category"]].append({"model": row["model"], "column": col, "status": row["status"],
                                             "stage": cell["stage"], "error": cell["error"]})
    columns = sorted(counts, key=_column_key)
    categories = [{"category": name, "count": len(cases), "cases": cases}
                  for name, cases in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))]
    versions = versions_table(rows, pins)
    return {
        "columns": columns,
        "models": {m: cells[m] for m in sorted(cells)},
        "model_info": {m: info[m] for m in sorted(info)},
        "counts": {c: {s: counts[c][s] for s in STATUSES} for c in columns},
        "categories": categories,
        "versions": versions,
        "drift": [v["package"] for v in versions if v["state"] != "ok"],
        "cases": len(rows),
        "reused": dict(Counter(r["reused_from"]["dir"] for r in rows if r.get("reused_from"))),
    }


# ─── Markdown ────────────────────────────────────────────────────────────────────────────────────

def md_cell(text: Any) -> str:
    text = str(text if text is not None else "").replace("|", "\\|").replace("\n", " ")
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")  # GitHub renders inline HTML


def _drift_line(matrix: dict[str, Any]) -> str:
    bad = [v for v in matrix["versions"] if v["state"] != "ok"]
    if not bad:
        return "Versions: every pinned package ran at its pin."
    listing = "; ".join(f"{v['package']} pinned {v['pinned']}, ran {', '.join(v['installed'])}" for v in bad)
    return f"**⚠ Version drift**: {listing}."


def to_markdown(matrix: dict[str, Any], examples: int = 10) -> str:
    """A PR-comment-sized report: summary per backend, failures grouped by category, versions."""
    for limit in (examples, 3, 0):
        text = _markdown(matrix, limit)
        if len(text) <= MARKDOWN_BUDGET:
            return text
    return text[: MARKDOWN_BUDGET - 40] + "\n\n… (truncated to fit a comment)\n"


def _markdown(matrix: dict[str, Any], examples: int) -> str:
    lines = ["# export-sweep matrix", "",
             f"{matrix['cases']} cases, {len(matrix['models'])} model classes. {_drift_line(matrix)}"
             + "".join(f" {n} rows reused from `{where}` (unchanged fingerprint)." for where, n in matrix.get("reused", {}).items()),
             "",
             "## Summary per backend", "",
             "| backend | " + " | ".join(STATUSES) + " | total | pass rate (of total) |",
             "|---|" + "---:|" * (len(STATUSES) + 2)]
    for col in matrix["columns"]:
        c = matrix["counts"][col]
        total = sum(c.values())
        rate = f"{100 * c['pass'] / total:.1f}%" if total else "–"  # skips count: reports/README.md divides so too
        lines.append(f"| {col} | " + " | ".join(str(c[s]) for s in STATUSES) + f" | {total} | {rate} |")
    categories = matrix["categories"]
    if categories:
        failing = sum(g["count"] for g in categories)
        lines += ["", f"## Failures by category ({failing} cases, {len(categories)} causes)", ""]
        for group in categories:
            lines.append(f"<details><summary><b>{group['count']}</b> × {md_cell(group['category'])}</summary>")
            lines.append("")
            if examples:
                lines += ["| model | case | status | stage | error |", "|---|---|---|---|---|"]
                for case in group["cases"][:examples]:
                    lines.append(f"| {md_cell(case['model'])} | {case['column']} | {case['status']} | {md_cell(case['stage'])} "
                                 f"| {md_cell((case['error'] or '')[:200])} |")
                more = group["count"] - examples
                if more > 0:
                    lines.append(f"| … and {more} more | | | | |")
            else:
                lines.append(", ".join(f"{c['model']} ({c['column']})" for c in group["cases"][:30])
                             + (" …" if group["count"] > 30 else ""))
            lines += ["", "</details>", ""]
    if matrix["versions"]:
        lines += ["", "## Versions", "", "| package | pinned | installed | |", "|---|---|---|---|"]
        for v in matrix["versions"]:
            flag = {"ok": "", "drift": "⚠ drift", "missing": "⚠ not installed"}[v["state"]]
            lines.append(f"| {v['package']} | {v['pinned'] or '–'} | {', '.join(v['installed']) or '–'} | {flag} |")
    return "\n".join(lines) + "\n"


def write_matrix(rows: list[dict[str, Any]], directory: Path, pins: dict[str, str] | None = None) -> dict[str, Path]:
    """Write ``matrix.json``, ``matrix.md`` and ``matrix.html`` for ``rows`` into ``directory``."""
    from sweep.html import render_matrix_html

    directory.mkdir(parents=True, exist_ok=True)
    matrix = build_matrix(rows, pins)
    paths = {"json": directory / "matrix.json", "md": directory / "matrix.md", "html": directory / "matrix.html"}
    texts = {"json": dumps_strict(matrix, indent=1, sort_keys=True), "md": to_markdown(matrix),
             "html": render_matrix_html(matrix)}
    for kind, path in paths.items():  # whole files only: two sweeps sharing the folder may finish together
        replace_file(path, texts[kind])
    return paths
