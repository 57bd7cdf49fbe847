"""Named exceptions for everything the engine rejects or fails at.

Bad input is rejected before torch sees it, with what was wrong and what is allowed. A failure inside
a pipeline stage is wrapped in :class:`ExportStageError` so callers (the sweep) know *which* stage
failed; the original exception stays attached as ``__cause__``.
"""

from __future__ import annotations


class ExportSweepError(Exception):
    """Base class of every error raised by the engine on purpose."""


class ConfigError(ExportSweepError, ValueError):
    """An export config is malformed: unknown key, wrong type, unsupported value."""


class InputError(ExportSweepError, ValueError):
    """The inputs cannot be used: not a mapping, a name the model or the artifact does not take, a value of the wrong
    type, dtype, rank or size, an index out of range.

    ``input`` names the input (its leaf name) when one is at fault and ``problem`` says what is wrong, one of
    :data:`PROBLEMS`: every runner of :func:`engine.run_exported` raises the same ``(problem, input)`` and the same
    message after the model's name for the same mistake, whatever the backend.
    """

    #: ``missing`` / ``unknown`` input names, a value that is not a ``type`` the runner takes (a tensor, or a list
    #: or array it converts), a ``dtype`` of another kind, a ``rank``, a ``size`` outside the exported bounds or
    #: breaking a constraint between dims, an ``index`` out of range, an ``empty`` dim the program fails on
    PROBLEMS = ("missing", "unknown", "type", "dtype", "rank", "size", "index", "empty")

    def __init__(self, message: str, *, input: str | None = None, problem: str | None = None):  # noqa: A002
        super().__init__(message)
        self.input = input
        self.problem = problem


class ModelError(ExportSweepError, TypeError):
    """The object given as a model is not something the engine can export."""


class MissingDependencyError(ExportSweepError, ImportError):
    """An optional backend package is not installed; the message names the extra to install."""


class PlannedMemoryError(ExportSweepError, ValueError):
    """An ExecuTorch program would plan a tensor larger than the runtime can be given at the dim bounds chosen:
    refused at export (the runtime fails to allocate it, or XNNPACK runs out of memory or the process dies at run)."""


class ExportStageError(ExportSweepError, RuntimeError):
    """A pipeline stage raised. ``stage`` names it (e.g. ``"export"``, ``"lower"``, ``"run"``)."""

    def __init__(self, stage: str, model_name: str, cause: BaseException):
        self.stage = stage
        self.model_name = model_name
        super().__init__(f"stage '{stage}' failed for {model_name}: {type(cause).__name__}: {first_line(cause)}")


def first_line(error: BaseException) -> str:
    """The first line of an exception's message (a runtime's often runs to pages)."""
    return (str(error).strip().splitlines() or [""])[0]


def require(module: str, extra: str):
    """Import ``module`` or raise :class:`MissingDependencyError` naming the pip extra that provides it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise MissingDependencyError(
            f"'{module}' is not installed; install the '{extra}' extra: pip install 'export-sweep[{extra}]'"
        ) from e
