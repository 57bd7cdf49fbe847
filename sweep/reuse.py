"""``--reuse-from DIR``: a case whose fingerprint matches its row in an earlier report folder is not run again.

Every row records its fingerprint (:mod:`sweep.fingerprint`). With ``--reuse-from``, a case looks up its latest row
in that folder: when every part of the fingerprint is equal and the row's status is a result (pass, fail,
discrepancy, skip), the row is copied into this run as it is (byte for byte, with the time, worker and seconds of
the run that computed it) plus a ``reused_from`` marker (the folder, and when it was reused), and counts in the
matrix like any row. Otherwise the case runs and its row says why
(``rerun_reason``: a new case, a status worth retrying, or the parts that changed). Timeouts and crashes are always
run again: they depend on the machine's load as much as on the case.
"""

from __future__ import annotations

import functools
import time
import warnings
from pathlib import Path

from sweep.fingerprint import reusable
from sweep.results import case_id, latest_rows, read_rows

#: statuses that are a property of the case (a timeout or a crash may be the machine's, and is retried)
REUSABLE_STATUSES = frozenset({"pass", "fail", "discrepancy", "skip"})


class ReuseWarning(UserWarning):
    """A line of an earlier run's row file could not be read (a torn last row); it is left out."""


@functools.cache
def _index(rows_files: tuple[Path, ...]) -> dict[str, dict]:
    def skip(problem) -> None:  # as --resume does: said once, left out
        warnings.warn(ReuseWarning(f"--reuse-from: {problem}"), stacklevel=2)

    rows = [row for path in rows_files for row in read_rows(path, on_corrupt=skip)]
    return {case_id(row): row for row in latest_rows(rows)}


def find(sources: list[Path], case: str, parts: dict[str, str]) -> tuple[dict | None, str]:
    """``(the row to reuse, "")``, or ``(None, why the case runs)``; ``sources``: row files (for a case in several,
    the row recorded last)."""
    row = _index(tuple(sources)).get(case)
    if row is None:
        return None, "new case"
    if row.get("status") not in REUSABLE_STATUSES:
        return None, f"was {row.get('status')}"
    old = row.get("fingerprint_parts")
    if not old:
        return None, "no fingerprint in the earlier row"
    if not reusable(parts):
        unknown = sorted(k for k, v in parts.items() if not reusable({k: v}))
        return None, f"unknown: {', '.join(unknown)}"
    changed = sorted(k for k in parts.keys() | old.keys() if parts.get(k) != old.get(k))
    if changed:
        return None, f"changed: {', '.join(changed)}"
    return row, ""


def reused_row(row: dict, sources: list[Path]) -> dict:
    """``row`` as it is (its result, and when, where and how long the case really ran), with the reuse marker:
    the folder it came from and when it was reused (a row reused before gets the new marker). The run that reuses
    it makes it its own (``run``, ``recorded``: sweep.plugin.running)."""
    where = ", ".join(str(Path(p).parent) for p in sources)
    return {**row, "reused_from": {"dir": where, "at": time.time()}}
