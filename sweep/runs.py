"""Run records: what each sweep run selected, written once per run beside its rows (``runs.jsonl``).

A row says which run wrote it (``run``); the run's record says what that run set out to do: its ``--models``,
backends, shapes, ``--generate``, ``--shard`` and the case ids it selected after every deselection (``-k``, ``-m``,
``--lf``, case ids given as arguments). So a folder knows its own selection, and ``export-sweep compare`` gates on
it instead of on a guess: a case a run selected and never wrote (its worker killed) is *missing*; a case of the old
run outside every run's scope was *not run*; a case inside a *whole* scope (the catalog, unfiltered, every shard of
it present) that the folder lacks is missing too (a class gone from the catalog). Records are appended like rows
(one locked ``write``), so runs sharing a folder, resumed runs and merged shards each keep theirs.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RUNS_FILE = "runs.jsonl"


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


def runs_path(rows_file: Path) -> Path:
    """The run records beside a row file."""
    return Path(rows_file).parent / RUNS_FILE


def record(run: str, *, models: str, backends: Iterable[str], shapes: Iterable[str], generate: bool,
           shard: str | None, filtered: bool, selected: Iterable[str], args: Iterable[str] = ()) -> dict[str, Any]:
    """A run's record: ``filtered`` when ``-k``, ``-m``, ``--lf`` or case-id arguments left out cases of its scope."""
    return {"run": run, "started": time.time(), "models": models, "backends": list(backends),
            "shapes": list(shapes), "generate": generate, "shard": shard, "filtered": filtered,
            "selected": sorted(selected), "args": list(args)}


def append_run(rows_file: Path, run: dict[str, Any]) -> None:
    from sweep.results import append_row  # the same locked, torn-line-safe append as rows

    append_row(runs_path(rows_file), run)


def read_runs(rows_file: Path, on_corrupt=None) -> list[dict[str, Any]]:
    """The run records beside ``rows_file`` (none for a folder written before runs were recorded)."""
    path = runs_path(rows_file)
    if not path.is_file():
        return []
    out = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, text in enumerate(f, 1):
            if not text.strip():
                continue
            try:
                run = json.loads(text)
                if not isinstance(run, dict) or "run" not in run:
                    raise ValueError("a run record is a JSON object with 'run'")
            except ValueError as e:
                if on_corrupt is None:
                    raise
                from sweep.results import CorruptRow

                on_corrupt(CorruptRow(path, number, f"corrupt run record skipped: {e}"))
                continue
            out.append(run)
    return out


@dataclass(frozen=True)
class _Scope:
    backends: frozenset[str]
    shapes: frozenset[str]
    generate: bool

    def holds(self, backend: str, shapes: str) -> bool:
        if backend not in self.backends:
            return False
        if shapes == "generate":
            return self.generate and backend != "eager"
        return shapes in self.shapes or (backend == "eager" and shapes == "static")


@dataclass
class Coverage:
    """What the runs of a folder selected (``selected``) and the scopes they ran whole (``whole``)."""
    selected: set[str] = field(default_factory=set)
    whole: list[_Scope] = field(default_factory=list)

    def in_whole_scope(self, backend: str, shapes: str) -> bool:
        return any(scope.holds(backend, shapes) for scope in self.whole)


def coverage(runs: list[dict[str, Any]]) -> Coverage:
    """A scope is whole when an unfiltered catalog run (``--models=all``) covered it, in one piece or in every
    shard ``i/N`` of it."""
    result = Coverage()
    shards: dict[tuple, set[int]] = {}
    for run in runs:
        result.selected.update(run.get("selected") or ())
        if run.get("models") != "all" or run.get("filtered"):
            continue
        scope = _Scope(frozenset(run.get("backends") or ()), frozenset(run.get("shapes") or ()),
                       bool(run.get("generate")))
        shard = run.get("shard")
        if not shard:
            result.whole.append(scope)
            continue
        index, count = (int(x) for x in str(shard).split("/"))
        shards.setdefault((scope, count), set()).add(index)
    result.whole += [scope for (scope, count), seen in shards.items() if seen >= set(range(1, count + 1))]
    return result
