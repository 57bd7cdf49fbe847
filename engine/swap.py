"""Reversible attribute swaps, and dotted paths resolved to their owner: the tools every patch and trace context
is applied with (:mod:`engine.patches.registry`), which model patches and the pipeline also call directly."""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from typing import Any


def resolve_dotted_path(path: str) -> tuple[Any, str]:
    """Split ``"pkg.module.Class.attr"`` into ``(owner object, "attr")`` by importing the longest module prefix."""
    parts = path.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            owner = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:-1]:
            owner = getattr(owner, attr)
        return owner, parts[-1]
    raise ImportError(f"cannot import any module prefix of {path!r}")


_MISSING = object()


@contextlib.contextmanager
def swap_attributes(swaps: list[tuple[Any, str, Any]]) -> Iterator[None]:
    """Set ``owner.attr = value`` for each swap; restore every original on exit, in reverse order.

    An attribute the owner did not define *itself* (inherited, or absent) is deleted on exit rather
    than set, so the class hierarchy is exactly as before.
    """
    done: list[tuple[Any, str, Any]] = []
    try:
        for owner, attr, value in swaps:
            own = vars(owner).get(attr, _MISSING) if hasattr(owner, "__dict__") else getattr(owner, attr, _MISSING)
            setattr(owner, attr, value)
            done.append((owner, attr, own))
        yield
    finally:
        for owner, attr, original in reversed(done):
            if original is _MISSING:
                with contextlib.suppress(AttributeError):
                    delattr(owner, attr)
            else:
                setattr(owner, attr, original)
