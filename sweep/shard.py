"""Sharding: ``--shard i/n`` runs part ``i`` (1-based) of ``n`` of the sweep's cases, so n CI jobs together run
every case exactly once (their row files are joined with ``export-sweep merge``).

With recorded durations (a baseline's ``wall_seconds``) the cases are spread longest-first onto the least loaded
shard (pytest-split's ``least_duration``), so the shards end at about the same time; this needs every shard to
see the same case ids and durations. Without durations, :func:`shard_of` hashes the case id: stable whatever
else is collected, but blind to a case's cost.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Iterable
from typing import NamedTuple


class ShardError(ValueError):
    """A ``--shard`` value that is not ``i/n`` with 1 <= i <= n."""


def parse_shard(text: str) -> tuple[int, int]:
    """``"2/4"`` -> ``(2, 4)``."""
    found = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text or "")
    if not found:
        raise ShardError(f"--shard {text!r}: write it as i/n, e.g. --shard 1/4 (part 1 of 4)")
    index, count = int(found.group(1)), int(found.group(2))
    if count < 1 or not 1 <= index <= count:
        raise ShardError(f"--shard {text}: need 1 <= i <= n (parts are numbered from 1)")
    return index, count


def shard_of(case_id: str, count: int) -> int:
    """The 1-based shard of ``case_id`` among ``count`` shards, by a stable hash of the id."""
    digest = hashlib.sha256(case_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % count + 1


def select(case_ids: Iterable[str], index: int, count: int) -> list[str]:
    """The ids of hash shard ``index`` of ``count``, in their given order."""
    return [case_id for case_id in case_ids if shard_of(case_id, count) == index]


class _Item(NamedTuple):
    """The part of a pytest item that pytest-split reads."""

    nodeid: str


def balanced_shards(case_ids: Iterable[str], durations: dict[str, float], count: int) -> dict[str, int]:
    """Case id -> 1-based shard among ``count``, balanced by ``durations`` (seconds by case id).

    A case without a duration counts as the mean of the known ones among ``case_ids``. The ids are sorted
    first, so the result does not depend on their order.
    """
    from pytest_split.algorithms import Algorithms

    if count < 1:
        raise ShardError(f"{count} shards: need at least 1")
    items = [_Item(case_id) for case_id in sorted(set(case_ids))]
    groups = Algorithms.least_duration.value(count, items, durations)
    return {item.nodeid: shard for shard, group in enumerate(groups, start=1) for item in group.selected}


def durations_from_rows(rows: Iterable[dict]) -> dict[str, float]:
    """Case id -> ``wall_seconds`` of the latest row of each case that has one (a finite number)."""
    from sweep.results import case_id, latest_rows

    timed = [row for row in rows if _seconds(row.get("wall_seconds")) is not None]
    return {case_id(row): float(row["wall_seconds"]) for row in latest_rows(timed)}


def _seconds(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        return None
    return float(value)
