"""CPU seconds spent inside one named function while a benchmark runs (``--timed`` of the patch benchmarks)."""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Iterator

from engine.swap import resolve_dotted_path


@contextlib.contextmanager
def timed(dotted: str) -> Iterator[list[float]]:
    """Wrap the function ``dotted`` names (a module's function, or a class's method or staticmethod); yields the
    list of CPU seconds of each call made inside the block, and puts the original back after it."""
    owner, attribute = resolve_dotted_path(dotted)
    own = vars(owner).get(attribute) if isinstance(owner, type) else getattr(owner, attribute)
    if isinstance(own, classmethod):
        raise ValueError(f"{dotted} is a classmethod; time the function it calls instead")
    function = own.__func__ if isinstance(own, staticmethod) else getattr(owner, attribute)
    spent: list[float] = []

    @functools.wraps(function)
    def call(*args, **kwargs):
        started = time.process_time()
        try:
            return function(*args, **kwargs)
        finally:
            spent.append(time.process_time() - started)

    setattr(owner, attribute, staticmethod(call) if isinstance(own, staticmethod) else call)
    try:
        yield spent
    finally:
        if own is None:  # inherited: the subclass did not define it
            delattr(owner, attribute)
        else:
            setattr(owner, attribute, own)
