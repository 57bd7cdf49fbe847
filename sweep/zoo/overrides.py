"""Per-model overrides of the generic shrinker, read from ``sweep/zoo/data/overrides.yaml`` and validated."""

from __future__ import annotations

import functools
from pathlib import Path

import yaml

DATA = Path(__file__).parent / "data" / "overrides.yaml"
KEYS = {"reason", "config", "profiles", "over_budget", "inputs", "generation_config"}


class OverrideError(ValueError):
    pass


@functools.cache
def load(path: Path = DATA) -> dict[str, dict]:
    data = yaml.safe_load(path.read_text()) or {}
    for key, entry in data.items():
        if not isinstance(entry, dict) or not str(entry.get("reason", "")).strip():
            raise OverrideError(f"{path.name}: {key!r} needs a one-line `reason`")
        unknown = set(entry) - KEYS
        if unknown:
            raise OverrideError(f"{path.name}: {key!r} has unknown keys {sorted(unknown)}")
        if "\n" in str(entry["reason"]).strip():
            raise OverrideError(f"{path.name}: {key!r} reason must be one line")
    return data


def for_class(class_name: str, model_type: str) -> dict:
    """The override for a class: its own entry, else its model type's, else none."""
    data = load()
    return dict(data.get(class_name) or data.get(model_type) or {})
