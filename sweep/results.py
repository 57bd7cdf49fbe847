"""Result rows: one JSON object per case, appended to ``results.jsonl`` before the next case starts.

Appends from many processes (xdist workers, machines sharing a folder) never interleave: each row is one
``write`` of one line under an exclusive ``flock``, followed by ``fsync``.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROWS_FILE = "results.jsonl"


def append_row(path: Path, row: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(row, sort_keys=True, default=str) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            os.write(fd, line)
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
    with open(path, encoding="utf-8") as f:
        for number, text in enumerate(f, 1):
            if not text.strip():
                continue
            try:
                row = json.loads(text)
                if not isinstance(row, dict):
                    raise ValueError("a row is a JSON object")
            except ValueError as e:
                problem = CorruptRow(path, number, f"corrupt row skipped: {e}")
                if on_corrupt is None:
                    raise problem from e
                on_corrupt(problem)
                continue
            yield row
