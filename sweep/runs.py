"""Run records: what each sweep run selected, written once per run beside its rows (``runs.jsonl``).

A row names its run; the run's record holds its ``--models``, backends, shapes, ``--generate``, ``--shard`` and the
case ids it selected after ``-k``/``-m``/``--lf``/case-id arguments. ``export-sweep compare`` reads it: a case a run
selected and never wrote is missing, and so is an old case inside a scope the runs covered whole (the catalog on a
backend, every shard present); other old cases were not run.
"""

from __future__ import annotations

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
    """The run records beside ``rows_file`` (none for a folder written before runs were recorded), read as rows are
    (:func:`sweep.results.read_rows`)."""
    from sweep.results import read_rows

    path = runs_path(rows_file)
    return list(read_rows(path, on_corrupt=on_corrupt, required=("run",))) if path.is_file() else []


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
