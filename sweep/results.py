"""Result rows: one JSON object per case, appended to ``results.jsonl`` before the next case starts.

Appends from many processes (xdist workers, machines sharing a folder) never interleave: each row is one
``write`` of one line under an exclusive ``flock``, followed by ``fsync``. Reading is strict about what a row
is (a JSON object with ``model``, ``backend`` and ``status``) and names the line of anything else.
A row file may hold several rows of one case (a resumed or re-run shard): :func:`latest_rows` keeps the last.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROWS_FILE = "results.jsonl"
REQUIRED = ("model", "backend", "status")


class RowFileError(OSError):
    """A row file (or report folder) that is missing or unreadable."""


def rows_path(path: Path) -> Path:
    """A row file given as itself or as the report folder holding ``results.jsonl``; it must exist."""
    path = Path(path)
    candidate = path / ROWS_FILE if path.is_dir() else path
    if not candidate.is_file():
        where = f"{path} is a folder without {ROWS_FILE}" if path.is_dir() else f"{path} does not exist"
        raise RowFileError(f"no row file: {where}")
    return candidate


def case_id(row: dict[str, Any]) -> str:
    """The case a row belongs to: ``Model-backend-shapes`` (as in the pytest ids)."""
    return row.get("case_id") or f"{row['model']}-{row['backend']}-{row.get('shapes', 'static')}"


def latest_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per case, the one that started last (file order breaks ties), sorted by case id."""
    latest: dict[str, tuple[float, int, dict]] = {}
    for order, row in enumerate(rows):
        key = (float(row.get("started") or 0.0), order)
        cid = case_id(row)
        if cid not in latest or key >= latest[cid][:2]:
            latest[cid] = (*key, row)
    return [latest[cid][2] for cid in sorted(latest)]


def drop_rows(path: Path, predicate) -> int:
    """Remove, in place and under the writers' lock, the rows for which ``predicate(row)`` holds.

    Concurrent appenders keep working: they write to the same inode after the rewrite. Lines that are not
    valid rows are kept as they are. Returns the number of rows removed.
    """
    if not path.is_file():
        return 0
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            with os.fdopen(os.dup(fd), "rb") as f:
                lines = f.read().splitlines(keepends=True)
            kept, dropped = [], 0
            for line in lines:
                try:
                    row = json.loads(line)
                    drop = isinstance(row, dict) and all(k in row for k in REQUIRED) and predicate(row)
                except ValueError:
                    drop = False
                if drop:
                    dropped += 1
                else:
                    kept.append(line if line.endswith(b"\n") else line + b"\n")
            if dropped:
                os.ftruncate(fd, 0)
                os.lseek(fd, 0, os.SEEK_SET)
                _write_all(fd, b"".join(kept))
                os.fsync(fd)
            return dropped
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def append_row(path: Path, row: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(row, sort_keys=True, default=str) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            _write_all(fd, line)
            os.fsync(fd)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


class CorruptRow(ValueError):
    def __init__(self, path: Path, line: int, problem: str):
        super().__init__(f"{path}:{line}: {problem}")
        self.path, self.line = path, line


def read_rows(path: Path, on_corrupt=None) -> Iterator[dict[str, Any]]:
    """Rows of a row file; a corrupt line is passed to ``on_corrupt(CorruptRow)`` (default: raise) and skipped."""
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, text in enumerate(f, 1):
            if not text.strip():
                continue
            try:
                row = json.loads(text)
                if not isinstance(row, dict):
                    raise ValueError("a row is a JSON object")
                missing = [k for k in REQUIRED if k not in row]
                if missing:
                    raise ValueError(f"a row needs {', '.join(REQUIRED)}; this one lacks {', '.join(missing)}")
            except ValueError as e:
                problem = CorruptRow(path, number, f"corrupt row skipped: {e}")
                if on_corrupt is None:
                    raise problem from e
                on_corrupt(problem)
                continue
            yield row
