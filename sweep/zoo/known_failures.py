"""The zoo's recorded exceptions: classes known not to build or run, and classes over the parameter budget.

Both are data (``sweep/zoo/data/known_failures.yaml``, ``sweep/zoo/data/over_budget.yaml``), regenerated from a
full-catalog run (``bench/zoo_catalog.py``) and checked by the CI eager test.
"""

from __future__ import annotations

import functools
from pathlib import Path

import yaml

DATA = Path(__file__).parent / "data"


def _one_line_map(path: Path) -> dict[str, str]:
    data = yaml.safe_load(path.read_text()) or {}
    for name, reason in data.items():
        if not isinstance(reason, str) or not reason.strip() or "\n" in reason.strip():
            raise ValueError(f"{path.name}: {name!r} needs a one-line reason")
    return data


@functools.cache
def load(path: Path = DATA / "known_failures.yaml") -> dict[str, str]:
    """Class name -> "category: reason" for classes known to fail."""
    return _one_line_map(path)


@functools.cache
def over_budget(path: Path = DATA / "over_budget.yaml") -> dict[str, str]:
    """Class name -> why its tiny model stays over the parameter budget (with the measured size)."""
    return _one_line_map(path)
