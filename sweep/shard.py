"""Deterministic sharding: ``--shard i/n`` runs part ``i`` (1-based) of ``n`` of the sweep's cases.

A case's shard is a stable hash of its id (``Model-backend-shapes``) modulo ``n``: it does not depend on the
order of collection, the machine, the Python hash seed, or which other cases exist, so adding a model to the
catalog moves no other case to another shard, and n CI jobs that each run one shard together run every case
exactly once. The row files of the shards are joined with ``export-sweep merge``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable


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
    """The 1-based shard of ``case_id`` among ``count`` shards."""
    digest = hashlib.sha256(case_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % count + 1


def select(case_ids: Iterable[str], index: int, count: int) -> list[str]:
    """The ids of shard ``index`` of ``count``, in their given order."""
    return [case_id for case_id in case_ids if shard_of(case_id, count) == index]
