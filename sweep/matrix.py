"""Pass/fail/discrepancy matrices built from result rows: ``matrix.json`` and ``matrix.md``.

The matrix is a pure function of the rows, so it can be rebuilt from ``results.jsonl`` at any time.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

STATUSES = ("pass", "discrepancy", "fail", "skip", "timeout", "crash")


def column(row: dict[str, Any]) -> str:
    return row["backend"] if row["backend"] == "eager" else f"{row['backend']}-{row['shapes']}"


def build_matrix(rows: list[dict[str, Any]]) -> dict[str, Any]:
    cells: dict[str, dict[str, dict]] = defaultdict(dict)
    counts: dict[str, Counter] = defaultdict(Counter)
    versions: dict[str, Any] = {}
    for row in rows:
        col = column(row)
        cells[row["model"]][col] = {
            "status": row["status"],
            "stage": row.get("stage"),
            "error": (row.get("error") or "").splitlines()[0][:300] if row.get("error") else None,
        }
        counts[col][row["status"]] += 1
        versions = row.get("versions") or versions
    columns = sorted(counts)
    return {
        "columns": columns,
        "models": {m: cells[m] for m in sorted(cells)},
        "counts": {c: {s: counts[c][s] for s in STATUSES} for c in columns},
        "versions": versions,
    }


def to_markdown(matrix: dict[str, Any]) -> str:
    columns = matrix["columns"]
    lines = ["# export-sweep matrix", "", "| backend | " + " | ".join(STATUSES) + " | total |",
             "|---|" + "---:|" * (len(STATUSES) + 1)]
    for col in columns:
        c = matrix["counts"][col]
        lines.append(f"| {col} | " + " | ".join(str(c[s]) for s in STATUSES) + f" | {sum(c.values())} |")
    failures = [(m, col, cell) for m, cells in matrix["models"].items() for col, cell in cells.items()
                if cell["status"] not in ("pass", "skip")]
    if failures:
        lines += ["", "## Not passing", "", "| model | case | status | stage | error |", "|---|---|---|---|---|"]
        for m, col, cell in failures:
            error = (cell["error"] or "").replace("|", "\\|")
            lines.append(f"| {m} | {col} | {cell['status']} | {cell['stage'] or ''} | {error} |")
    if matrix["versions"]:
        lines += ["", "Versions: " + ", ".join(f"{k} {v}" for k, v in sorted(matrix["versions"].items()))]
    return "\n".join(lines) + "\n"


def write_matrix(rows: list[dict[str, Any]], directory: Path) -> dict[str, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    matrix = build_matrix(rows)
    paths = {"json": directory / "matrix.json", "md": directory / "matrix.md"}
    paths["json"].write_text(json.dumps(matrix, indent=1, sort_keys=True))
    paths["md"].write_text(to_markdown(matrix))
    return paths
