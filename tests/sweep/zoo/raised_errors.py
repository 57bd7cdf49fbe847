"""Errors with a real traceback, as a failing model leaves them, for the lesson tests to learn from."""

from __future__ import annotations

#: a message no lesson knows: every lesson returns None (or False) for it
UNRELATED = "RuntimeError: something no lesson knows about"


def raised_by(fn, *args) -> BaseException:
    """The exception ``fn(*args)`` raises, its traceback holding ``fn``'s frames."""
    try:
        fn(*args)
    except Exception as exc:  # noqa: BLE001 - a real traceback, as the model would leave
        return exc
    raise AssertionError("no error")


def raised(exc: BaseException) -> BaseException:
    """``exc``, raised and caught so that it carries a traceback."""
    return raised_by(lambda: (_ for _ in ()).throw(exc))
