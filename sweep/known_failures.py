"""Classes known not to build or run, with the reason (``sweep/data/known_failures.yaml``)."""

from __future__ import annotations

import functools
from pathlib import Path

import yaml

DATA = Path(__file__).parent / "data" / "known_failures.yaml"


@functools.cache
def load(path: Path = DATA) -> dict[str, str]:
    """Class name -> one-line reason (category first)."""
    data = yaml.safe_load(path.read_text()) or {}
    for name, reason in data.items():
        if not isinstance(reason, str) or not reason.strip() or "\n" in reason.strip():
            raise ValueError(f"{path.name}: {name!r} needs a one-line reason")
    return data
