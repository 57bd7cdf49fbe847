"""``--models``: names, globs, ``@file`` lists and named sets (``smoke``, ``all``) to a sorted list of classes.

A token that matches nothing is a usage error with the closest names, never an empty sweep.
"""

from __future__ import annotations

import difflib
import fnmatch
import functools
from pathlib import Path

import yaml

from sweep.zoo import catalog

SMOKE_FILE = Path(__file__).parent / "data" / "smoke.yaml"


class SelectionError(ValueError):
    """A ``--models`` token names no model class."""


@functools.cache
def smoke_set() -> tuple[str, ...]:
    return tuple(entry["class"] for entry in yaml.safe_load(SMOKE_FILE.read_text()))


#: named sets, computed only when named: the catalog imports ~20 model modules (seconds), which a sweep of
#: ``--model-module`` models alone never needs
NAMED_SETS = {"smoke": smoke_set, "all": catalog.all_classes}


@functools.cache
def _catalog() -> frozenset[str]:
    return frozenset(catalog.all_classes())


def is_known_class(name: str) -> bool:
    """In an auto mapping, or a top-level PreTrainedModel no mapping lists (those can be named explicitly)."""
    if name in _catalog():
        return True
    import transformers

    try:
        cls = getattr(transformers, name)
    except (AttributeError, ImportError):
        return False
    return isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel)


def _tokens(spec: str) -> list[str]:
    out = []
    for token in (t.strip() for t in spec.split(",")):
        if not token:
            continue
        if token.startswith("@"):
            path = Path(token[1:])
            if not path.is_file():
                raise SelectionError(f"--models {token}: no such file {path}")
            lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
            out.extend(line for line in lines if line)
        else:
            out.append(token)
    return out


def resolve_models(spec: str, extra: dict | None = None) -> list[str]:
    """``extra``: names provided by ``--model-module`` modules, selectable by name or glob."""
    extra = extra or {}
    chosen: set[str] = set()
    for token in _tokens(spec):
        if token in NAMED_SETS:
            chosen.update(NAMED_SETS[token]())
        elif any(ch in token for ch in "*?["):
            matched = fnmatch.filter([*catalog.all_classes(), *extra], token)
            if not matched:
                raise SelectionError(f"--models {token!r} matches no model class in the catalog")
            chosen.update(matched)
        elif token in extra or is_known_class(token):
            chosen.add(token)
        else:
            close = difflib.get_close_matches(token, catalog.all_classes(), n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise SelectionError(f"--models {token!r} is not a model class, a glob, an @file or one of {sorted(NAMED_SETS)}{hint}")
    if not chosen:
        raise SelectionError(f"--models {spec!r} selects no model class")
    return sorted(chosen)
