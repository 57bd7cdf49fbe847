"""``--reuse-from DIR``: a case whose fingerprint matches its row in an earlier report folder is not run again.

Every row records its fingerprint (:mod:`sweep.fingerprint`). With ``--reuse-from``, a case looks up its latest row
in that folder: when every part of the fingerprint is equal and the row's status is a result (pass, fail,
discrepancy, skip), the row is copied into this run, marked ``reused_from`` (the folder, and when and how long the
original ran), and counts in the matrix like any row. Otherwise the case runs and its row says why
(``rerun_reason``: a new case, a status worth retrying, or the parts that changed). Timeouts and crashes are always
run again: they depend on the machine's load as much as on the case.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path

from sweep.fingerprint import reusable
from sweep.results import RowFileError, case_id, latest_rows, read_rows, rows_path

#: statuses that are a property of the case (a timeout or a crash may be the machine's, and is retried)
REUSABLE_STATUSES = frozenset({"pass", "fail", "discrepancy", "skip"})
#: fields of the original row that describe the run, not the case: the reused row gets this run's
RUN_FIELDS = ("started", "wall_seconds", "worker", "shard", "selection", "pinned", "reused_from", "rerun_reason")


class ReuseError(ValueError):
    """``--reuse-from`` names no readable report folder."""


def check_source(path: Path) -> Path:
    """The row file of ``--reuse-from PATH``, or a :class:`ReuseError` saying what was wrong."""
    try:
        return rows_path(path)
    except RowFileError as e:
        raise ReuseError(f"--reuse-from {path}: {e} (give an earlier run's report folder, e.g. reports/baseline)") from None


@functools.cache
def _index(rows_file: Path) -> dict[str, dict]:
    return {case_id(row): row for row in latest_rows(list(read_rows(rows_file)))}


def find(source: Path, case: str, parts: dict[str, str]) -> tuple[dict | None, str]:
    """``(the row to reuse, "")``, or ``(None, why the case runs)``."""
    row = _index(check_source(source)).get(case)
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


def reused_row(row: dict, source: Path, run_fields: dict) -> dict:
    """``row`` as a row of this run: its result unchanged, this run's fields, and where it came from."""
    out = {k: v for k, v in row.items() if k not in RUN_FIELDS}
    out.update(run_fields)
    out["started"] = time.time()
    out["wall_seconds"] = 0.0
    ran = row.get("reused_from") or row  # a row reused before: where the case last truly ran
    out["reused_from"] = {"dir": str(source), "started": ran.get("started"), "wall_seconds": ran.get("wall_seconds")}
    return out
