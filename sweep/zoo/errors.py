"""Why a class could not be built: :class:`ZooError` and its categories.

Categories, in the order a build reaches them: ``config_error`` (the shrunk config fails validation),
``init_error`` (the model's ``__init__`` fails), ``forward_error`` (no synthesised input runs the eager forward).
``missing_dependency`` names the package a class needs; :func:`installable` says whether the test install can
provide it (then a missing one is a setup bug, not a reason to skip), from ``data/dependencies.yaml``.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import yaml

CONFIG_ERROR = "config_error"
INIT_ERROR = "init_error"
FORWARD_ERROR = "forward_error"
MISSING_DEPENDENCY = "missing_dependency"
STAGE_ORDER = (CONFIG_ERROR, INIT_ERROR, FORWARD_ERROR, MISSING_DEPENDENCY)

DATA = Path(__file__).parent / "data" / "dependencies.yaml"


class ZooError(Exception):
    """A class that could not be built and run, with the category of the reason."""

    def __init__(self, class_name: str, category: str, message: str, package: str | None = None):
        assert category in STAGE_ORDER, category
        super().__init__(f"{class_name}: {category}: {message}")
        self.class_name = class_name
        self.category = category
        self.message = message
        self.package = package

    def as_dict(self) -> dict:
        return {"category": self.category, "message": self.message[:2000], "package": self.package}


# transformers' `requires_backends` says "requires the X library"; Python says "No module named 'x'".
_PATTERNS = (re.compile(r"requires the ([\w.\-]+) library"), re.compile(r"No module named '([\w.\-]+)'"),
             re.compile(r"requires ([\w.\-]+) to be installed"), re.compile(r"`?([\w\-]+)`? is not installed"))


@functools.cache
def _dependencies() -> dict:
    return yaml.safe_load(DATA.read_text())


def package_of(exc: BaseException) -> str:
    """The pip name of the package an import error is about."""
    name = getattr(exc, "name", None)
    message = str(exc)
    if not name:
        for pattern in _PATTERNS:
            found = pattern.search(message)
            if found:
                name = found.group(1)
                break
    name = (name or "unknown").split(".")[0].strip("`'\"").lower()
    return _dependencies()["pip_names"].get(name, name)


def installable(package: str | None) -> bool:
    """Whether the test install provides ``package`` (a missing one must then fail, not skip)."""
    return package not in _dependencies()["not_installable"]


def as_missing_dependency(class_name: str, exc: BaseException) -> ZooError:
    package = package_of(exc)
    return ZooError(class_name, MISSING_DEPENDENCY, f"{type(exc).__name__}: {exc}", package=package)

