"""Result rows: one JSON object per case, appended to ``results.jsonl`` before the next case starts.

Appends from many processes (xdist workers, sweeps sharing a folder) never interleave: each row is one
``write`` of one line under an exclusive ``flock``, followed by ``fsync``. Nothing ever deletes rows: a case run
again gets a newer row. Reading is strict about what a row
is (a JSON object with ``model``, ``backend`` and ``status``) and names the line of anything else.
A row file may hold several rows of one case (a resumed or re-run shard): :func:`latest_rows` keeps the one
recorded last. A row file may be gzipped (``results.jsonl.gz``: the baseline packaged with export-sweep).
"""

from __future__ import annotations

import fcntl
import gzip
import json
import math
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROWS_FILE = "results.jsonl"
PACKED_ROWS_FILE = ROWS_FILE + ".gz"
REQUIRED = ("model", "backend", "status")

# ─── Strict JSON ─────────────────────────────────────────────────────────────────────────────────
# json.dumps writes a NaN or an infinite diff as bare ``NaN``/``Infinity``, which is not JSON: a browser's
# JSON.parse rejects the whole matrix page. Non-finite floats are written as these strings and read back as floats.
NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def _finite_or_name(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: _finite_or_name(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_or_name(v) for v in value]
    return value


def _name_to_float(value: Any) -> Any:
    if isinstance(value, str):
        return NON_FINITE.get(value, value)
    if isinstance(value, dict):
        return {k: _name_to_float(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_name_to_float(v) for v in value]
    return value


def dumps_strict(data: Any, **kwargs) -> str:
    """``json.dumps`` that always writes strict JSON: NaN/inf as ``"NaN"``, ``"Infinity"``, ``"-Infinity"``."""
    return json.dumps(_finite_or_name(data), allow_nan=False, default=str, **kwargs)


def loads_strict(text: str) -> Any:
    """The inverse of :func:`dumps_strict` (also reads the bare ``NaN`` of older files)."""
    return _name_to_float(json.loads(text))


class RowFileError(OSError):
    """A row file (or report folder) that is missing or unreadable."""


def rows_path(path: Path) -> Path:
    """A row file given as itself or as the report folder holding ``results.jsonl`` (or ``.gz``); it must exist."""
    path = Path(path)
    candidate = path / ROWS_FILE if path.is_dir() else path
    if path.is_dir() and not candidate.is_file() and (path / PACKED_ROWS_FILE).is_file():
        candidate = path / PACKED_ROWS_FILE
    if not candidate.is_file():
        where = f"{path} is a folder without {ROWS_FILE}" if path.is_dir() else f"{path} does not exist"
        raise RowFileError(f"no row file: {where}")
    return candidate


def case_id(row: dict[str, Any]) -> str:
    """The case a row belongs to: ``Model-backend-shapes`` (as in the pytest ids)."""
    return row.get("case_id") or f"{row['model']}-{row['backend']}-{row.get('shapes', 'static')}"


def recorded_at(row: dict[str, Any]) -> float:
    """When a row was written into its run (a reused row: when it was reused; rows of older files: when their case
    started)."""
    when = row.get("recorded")
    return float(when if when is not None else row.get("started") or 0.0)


def latest_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per case, the one recorded last (file order breaks ties), sorted by case id."""
    latest: dict[str, tuple[float, int, dict]] = {}
    for order, row in enumerate(rows):
        key = (recorded_at(row), order)
        cid = case_id(row)
        if cid not in latest or key >= latest[cid][:2]:
            latest[cid] = (*key, row)
    return [latest[cid][2] for cid in sorted(latest)]


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def append_row(path: Path, row: dict[str, Any]) -> None:
    """Append one row; a torn last line (a writer killed mid-write) is ended first, so it never swallows this row."""
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (dumps_strict(row, sort_keys=True) + "\n").encode()
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                line = b"\n" + line
            _write_all(fd, line)
            os.fsync(fd)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def replace_file(path: Path, text: str) -> None:
    """Write ``path`` whole or not at all (a temporary file in the same folder, synced, then renamed over it): a
    reader, or another sweep writing the same file, never sees half of it. The file gets the permissions any new
    file gets (``mkstemp`` makes it owner-only: a matrix others cannot read)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-", suffix=".tmp")
    umask = os.umask(0)
    os.umask(umask)
    os.fchmod(fd, 0o666 & ~umask)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class CorruptRow(ValueError):
    def __init__(self, path: Path, line: int, problem: str):
        super().__init__(f"{path}:{line}: {problem}")
        self.path, self.line = path, line


def read_rows(path: Path, on_corrupt=None, required: tuple[str, ...] = REQUIRED) -> Iterator[dict[str, Any]]:
    """Rows of a row file (JSON objects holding ``required``; a run record file holds ``run``); a corrupt line is
    passed to ``on_corrupt(CorruptRow)`` (default: raise) and skipped."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as f:
        for number, text in enumerate(f, 1):
            if not text.strip():
                continue
            try:
                row = loads_strict(text)
                if not isinstance(row, dict):
                    raise ValueError("a row is a JSON object")
                missing = [k for k in required if k not in row]
                if missing:
                    raise ValueError(f"a row needs {', '.join(required)}; this one lacks {', '.join(missing)}")
            except ValueError as e:
                problem = CorruptRow(path, number, f"corrupt row skipped: {e}")
                if on_corrupt is None:
                    raise problem from e
                on_corrupt(problem)
                continue
            yield row
