"""A deterministic sample of catalogued classes spread over every task mapping (the CI eager test's set).

Within each mapping the classes are ordered by a stable hash of their name; the sample takes them round-robin
over the mappings, so every mapping is represented and the sample does not drift when unrelated classes are
added to transformers.
"""

from __future__ import annotations

import hashlib

from sweep.zoo import catalog

DEFAULT_SIZE = 160


def stable_key(name: str) -> str:
    """A class name's place in an order that does not move when other classes are added."""
    return hashlib.sha1(name.encode()).hexdigest()


def eager_sample(size: int = DEFAULT_SIZE) -> list[str]:
    """``size`` class names, round-robin over the mappings (each mapping's classes in stable-hash order)."""
    queues = {label: sorted(names, key=stable_key) for label, names in catalog.classes_by_mapping().items()}
    chosen: list[str] = []
    seen: set[str] = set()
    while len(chosen) < size and any(queues.values()):
        for label in sorted(queues):
            queue = queues[label]
            while queue and queue[0] in seen:
                queue.pop(0)
            if queue and len(chosen) < size:
                name = queue.pop(0)
                chosen.append(name)
                seen.add(name)
    return sorted(chosen)
