"""The difference between two sweeps (e.g. before and after a pin moves): ``compare.md`` and ``compare.html``.

Cases are matched by case id (``Model-backend-shapes``), one row per case (the latest). A *regression* is a
case that passed before and now ends in fail, discrepancy, timeout or crash; a *fix* is the reverse (any
non-passing status before, pass now). Other status changes and changed failure causes are listed apart, as are
cases the old run lacks (new classes, new cases of old ones: each with its status; ``strict_new`` fails on one that
does not pass), classes that disappear, cases whose wall time moved beyond a relative threshold (and an absolute
floor, so that noise on fast cases stays out), and packages whose installed version moved.

What counts as *missing* comes from the new folder's run records (:mod:`sweep.runs`): a case a run selected and did
not write, and a case of the old run inside a scope the new runs covered whole (the catalog on a backend) that they
lack. A case of the old run outside every scope was *not run*: the comparison is a subset, said in one line
(``subset=True``, ``--subset``, forces it). A folder without run records falls back to the rows' ``selection``.
``export-sweep compare`` exits non-zero on a regression or a missing case, for CI gating. The report opens with
the regressions and fixes grouped by cause (:func:`by_cause`: a regression by its new failure, a fix by the failure
it had), each with the upstream link of the skiplist entry that lists its cases where the rows name one. The
Markdown lists at most :data:`MARKDOWN_ROWS` rows per section, for a PR comment; ``compare.html`` and
``compare.json`` hold all.

Named ``diff`` (the CLI subcommand stays ``compare``) so that it does not read as :mod:`engine.compare`, which
compares a case's output leaves.
"""

from __future__ import annotations

import html
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sweep.categories import categorize, first_line
from sweep.matrix import NOT_PASSING, md_cell
from sweep.results import case_id, dumps_strict, latest_rows
from sweep.skiplist import LINK_URL

MARKDOWN_ROWS = 25  # rows per section in compare.md (a PR comment); compare.html has them all
_UPSTREAM = re.compile(LINK_URL)  # a skiplist entry's link, quoted in a row's skiplist reason


@dataclass
class Change:
    case: str
    model: str
    old: str | None
    new: str | None
    stage: str | None = None
    category: str | None = None
    error: str | None = None
    backend: str | None = None
    link: str | None = None  # the upstream issue or PR of the skiplist entry listing the case, where a row names one


@dataclass
class TimeChange:
    case: str
    old_seconds: float
    new_seconds: float

    @property
    def ratio(self) -> float:
        return self.new_seconds / self.old_seconds if self.old_seconds else float("inf")


@dataclass
class Comparison:
    old_label: str
    new_label: str
    old_cases: int
    new_cases: int
    regressions: list[Change] = field(default_factory=list)
    fixes: list[Change] = field(default_factory=list)
    changed: list[Change] = field(default_factory=list)  # other status changes, and new causes of a failure
    new_classes: list[str] = field(default_factory=list)
    gone_classes: list[str] = field(default_factory=list)
    new_cases_list: list[str] = field(default_factory=list)  # cases of classes present in both runs
    new_results: list[Change] = field(default_factory=list)  # every case the old run lacks, with its status
    strict_new: bool = False  # a new case that does not pass fails the comparison
    gone_cases_list: list[str] = field(default_factory=list)
    time_changes: list[TimeChange] = field(default_factory=list)
    versions: list[dict[str, Any]] = field(default_factory=list)  # packages whose installed version moved
    time_threshold: float = 0.5
    min_seconds: float = 5.0
    subset: bool = False  # only the cases both runs have were compared
    not_run: int = 0  # subset: cases of the old run the new one did not run
    missing: list[str] = field(default_factory=list)  # not a subset: old cases the new run lacks

    @property
    def new_failing(self) -> list[Change]:
        return [c for c in self.new_results if c.new in NOT_PASSING]

    @property
    def exit_code(self) -> int:
        return 1 if self.regressions or self.missing or (self.strict_new and self.new_failing) else 0

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["exit_code"] = self.exit_code
        return data


def _seconds(row: dict[str, Any]) -> float | None:
    if row.get("wall_seconds") is not None:
        return float(row["wall_seconds"])
    if row.get("seconds"):
        return float(sum(row["seconds"].values()))
    return None


def versions_of(rows: list[dict[str, Any]]) -> dict[str, str]:
    seen: dict[str, set] = {}
    for row in rows:
        for name, version in (row.get("versions") or {}).items():
            seen.setdefault(name, set()).add(str(version))
    return {name: ", ".join(sorted(v)) for name, v in seen.items()}


def _change(cid: str, old: dict | None, new: dict) -> Change:
    """A changed case, described by its failure: a fix by the one it had (the old row), anything else by the new."""
    cause = old if old is not None and new["status"] == "pass" else new
    entries = [str(row.get("skiplist") or "") for row in (cause, old, new) if row]
    link = next((m.group(0) for text in entries if (m := _UPSTREAM.search(text))), None)
    return Change(cid, new["model"], old["status"] if old else None, new["status"], cause.get("stage"),
                  categorize(cause), (first_line(cause.get("error")) or "")[:300] or None, new.get("backend"), link)


def is_partial_run(rows: list[dict]) -> bool:
    """Rows written before run records: whether they come from a sweep of some classes only (their ``selection``)."""
    return any(r.get("selection") not in (None, "all") for r in rows)


def compare_runs(old_rows: list[dict], new_rows: list[dict], *, old_label: str = "old", new_label: str = "new",
                 time_threshold: float = 0.5, min_seconds: float = 5.0, subset: bool | None = None,
                 new_runs: list[dict] | None = None, strict_new: bool = False) -> Comparison:
    """Compare two runs' rows. Time changes: ``|new - old| >= min_seconds`` and a ratio beyond ``1 + time_threshold``.

    ``new_runs``: the new folder's run records (what it selected); ``subset=True``: only the selected cases count
    as missing (``None``: decided by the records, or by the rows' ``selection`` without records)."""
    from sweep.runs import coverage

    old = {case_id(r): r for r in latest_rows(old_rows)}
    new = {case_id(r): r for r in latest_rows(new_rows)}
    result = Comparison(old_label, new_label, len(old), len(new), time_threshold=time_threshold,
                        min_seconds=min_seconds, strict_new=strict_new)
    old_models = {r["model"] for r in old.values()}
    new_models = {r["model"] for r in new.values()}
    result.new_classes = sorted(new_models - old_models)
    gone = old.keys() - new.keys()
    if new_runs:
        covered = coverage(new_runs)
        unwritten = covered.selected - new.keys()
        in_whole = set() if subset else {c for c in gone
                                         if covered.in_whole_scope(old[c]["backend"], old[c].get("shapes", "static"))}
        missing = unwritten | in_whole
        result.subset = bool(gone - missing)
        result.not_run = len(gone - missing)
        result.missing = sorted(missing)
        result.gone_classes = sorted({old[c]["model"] for c in in_whole} - new_models)
        result.gone_cases_list = sorted(c for c in in_whole if old[c]["model"] in new_models)
    else:
        result.subset = is_partial_run(list(new.values())) if subset is None else subset
        if result.subset:
            result.not_run = len(gone)
        else:
            result.gone_classes = sorted(old_models - new_models)
            result.missing = sorted(gone)
            result.gone_cases_list = sorted(c for c in gone if old[c]["model"] in new_models)
    result.new_cases_list = sorted(c for c in new.keys() - old.keys() if new[c]["model"] in old_models)
    result.new_results = [_change(cid, None, new[cid]) for cid in sorted(new.keys() - old.keys())]
    for cid in sorted(old.keys() & new.keys()):
        before, after = old[cid], new[cid]
        if before["status"] == "pass" and after["status"] in NOT_PASSING:
            result.regressions.append(_change(cid, before, after))
        elif before["status"] != "pass" and after["status"] == "pass":
            result.fixes.append(_change(cid, before, after))
        elif before["status"] != after["status"] or categorize(before) != categorize(after):
            result.changed.append(_change(cid, before, after))
        t0, t1 = _seconds(before), _seconds(after)
        if t0 is not None and t1 is not None and abs(t1 - t0) >= min_seconds:
            ratio = t1 / t0 if t0 > 0 else float("inf")
            if ratio >= 1 + time_threshold or ratio <= 1 / (1 + time_threshold):
                result.time_changes.append(TimeChange(cid, t0, t1))
    result.time_changes.sort(key=lambda t: -abs(t.new_seconds - t.old_seconds))
    v0, v1 = versions_of(list(old.values())), versions_of(list(new.values()))
    result.versions = [{"package": p, "old": v0.get(p), "new": v1.get(p)}
                       for p in sorted(v0.keys() | v1.keys()) if v0.get(p) != v1.get(p)]
    return result


def by_cause(c: Comparison) -> list[dict[str, Any]]:
    """The regressions and fixes grouped by cause (the category, else the error's first line): one row per change
    kind and cause with its backends, cases, classes and upstream link; regressions first, then most cases first."""
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for kind, changes in (("regression", c.regressions), ("fix", c.fixes)):
        for x in changes:
            cause = x.category or x.error or f"{x.old} -> {x.new}"
            g = groups.setdefault((kind, cause), {"change": kind, "cause": cause, "backends": set(), "cases": 0,
                                                  "classes": set(), "link": None})
            g["backends"].add(x.backend or "?")
            g["cases"] += 1
            g["classes"].add(x.model)
            g["link"] = g["link"] or x.link
    rows = [{**g, "backends": sorted(g["backends"]), "classes": sorted(g["classes"])} for g in groups.values()]
    return sorted(rows, key=lambda g: (g["change"] != "regression", -g["cases"], g["cause"]))


# ─── Rendering ───────────────────────────────────────────────────────────────────────────────────

def verdict(c: Comparison) -> str:
    if c.regressions:
        return "regressions"
    if c.missing:
        return "missing cases"
    return "new cases failing" if c.exit_code else "no regressions"


def headline(c: Comparison) -> str:
    text = (f"{len(c.regressions)} regressions, {len(c.missing)} missing cases, {len(c.fixes)} fixes, "
            f"{len(c.changed)} other changes, {len(c.new_classes)} new classes, {len(c.new_failing)} new cases "
            f"not passing{' (--strict-new)' if c.strict_new else ''}, {len(c.gone_classes)} gone classes, "
            f"{len(c.time_changes)} time changes")
    if c.subset:
        text += f"; subset: {c.not_run} cases of the old run were not run"
    return text


def _sections(c: Comparison) -> list[tuple[str, list[str], list[list[Any]]]]:
    """(title, headers, rows) of every non-empty section, shared by the Markdown and the HTML; the summary by
    cause first."""
    change_headers = ["case", "before", "now", "stage", "category", "error"]

    def change_rows(changes):
        return [[x.case, x.old, x.new, x.stage or "", x.category or "", x.error or ""] for x in changes]

    pct = f"±{c.time_threshold:.0%} and ≥ {c.min_seconds:g} s"
    sections = [
        ("Regressions and fixes by cause", ["change", "cause", "backends", "cases", "classes", "upstream"],
         [[g["change"], g["cause"], ", ".join(g["backends"]), g["cases"], len(g["classes"]), g["link"] or "–"]
          for g in by_cause(c)]),
        ("Versions that moved", ["package", "before", "now"], [[v["package"], v["old"] or "–", v["new"] or "–"] for v in c.versions]),
        ("Regressions (pass → not passing)", change_headers, change_rows(c.regressions)),
        ("Missing cases (in the old run or selected by the new one, not written)", ["case"], [[x] for x in c.missing]),
        ("New cases not passing (not in the old run)", change_headers, change_rows(c.new_failing)),
        ("Fixes (now passing)", change_headers, change_rows(c.fixes)),
        ("Other changes (status or cause)", change_headers, change_rows(c.changed)),
        ("New classes", ["model class"], [[m] for m in c.new_classes]),
        ("Gone classes", ["model class"], [[m] for m in c.gone_classes]),
        ("New cases of existing classes", ["case"], [[x] for x in c.new_cases_list]),
        ("Gone cases of remaining classes", ["case"], [[x] for x in c.gone_cases_list]),
        (f"Time changes (beyond {pct})", ["case", "before s", "now s", "change"],
         [[t.case, f"{t.old_seconds:.1f}", f"{t.new_seconds:.1f}", f"×{t.ratio:.2f}"] for t in c.time_changes]),
    ]
    return [s for s in sections if s[2]]


def to_markdown(c: Comparison) -> str:
    mark = "❌ **" + verdict(c) + "**" if c.exit_code else "✅ " + verdict(c)
    lines = ["# export-sweep compare", "", f"`{c.old_label}` ({c.old_cases} cases) → `{c.new_label}` ({c.new_cases} cases)",
             "", f"{mark}: {headline(c)}."]
    for title, headers, rows in _sections(c):
        lines += ["", f"## {title} ({len(rows)})", "", "| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
        for row in rows[:MARKDOWN_ROWS]:
            lines.append("| " + " | ".join(md_cell(x) for x in row) + " |")
        if len(rows) > MARKDOWN_ROWS:
            lines += ["", f"… and {len(rows) - MARKDOWN_ROWS} more (compare.html, compare.json)."]
    return "\n".join(lines) + "\n"


def to_html(c: Comparison) -> str:
    from sweep.html import static_page

    esc = html.escape
    banner = f'<div class="banner {"drift" if c.exit_code else "ok"}" id="verdict">{esc(verdict(c))}: '
    body = [f"<p><code>{esc(c.old_label)}</code> ({c.old_cases} cases) → <code>{esc(c.new_label)}</code> "
            f"({c.new_cases} cases)</p>", f"{banner}{esc(headline(c))}</div>"]
    for title, headers, rows in _sections(c):
        klass = ' class="regressions"' if title.startswith(("Regressions", "New cases not passing")) else ""
        body.append(f"<h2>{esc(title)} ({len(rows)})</h2><table{klass}><tr>"
                    + "".join(f"<th>{esc(h)}</th>" for h in headers) + "</tr>")
        body += ["<tr>" + "".join(f"<td>{esc(str(x))}</td>" for x in row) + "</tr>" for row in rows]
        body.append("</table>")
    return static_page("export-sweep compare", "\n".join(body), "table.regressions td{background:#ffebe9}")


def write_comparison(c: Comparison, directory: Path) -> dict[str, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = {"md": directory / "compare.md", "html": directory / "compare.html", "json": directory / "compare.json"}
    paths["md"].write_text(to_markdown(c))
    paths["html"].write_text(to_html(c))
    paths["json"].write_text(dumps_strict(c.to_json(), indent=1, sort_keys=True))
    return paths
