"""Pinned versus installed versions of the stack, and the one-time drift warning.

The pins are declared once, in ``pyproject.toml``. An installed ``export-sweep`` exposes them through
its package metadata; a source checkout that was never installed falls back to reading the file.
"""

from __future__ import annotations

import functools
import importlib.metadata as md
import logging
import re
import warnings
from collections.abc import Iterable
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.version import Version

logger = logging.getLogger("engine")

DISTRIBUTION = "export-sweep"
_PIN = re.compile(r"^\s*([A-Za-z0-9_.\-]+)\s*==\s*([^;,\s]+)")
#: extras that pin tools of the checkout (the layout checks), not the stack an export runs on
TOOL_EXTRAS = ("lint",)


class VersionDriftWarning(UserWarning):
    """The installed version of a pinned package differs from the pin."""


def _requirement_strings() -> list[str]:
    pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
    if pyproject.is_file():  # source checkout (editable installs included): the file is the truth
        import tomllib

        project = tomllib.loads(pyproject.read_text())["project"]
        reqs = list(project.get("dependencies", []))
        for name, extra in project.get("optional-dependencies", {}).items():
            if name not in TOOL_EXTRAS:
                reqs.extend(extra)
        return reqs
    return [r for r in md.requires(DISTRIBUTION) or [] if not any(f'extra == "{e}"' in r for e in TOOL_EXTRAS)]


@functools.cache
def pinned_versions() -> dict[str, str]:
    """``{package: version}`` for every ``==`` pin of the project (core and extras)."""
    pins = {}
    for req in _requirement_strings():
        m = _PIN.match(req)
        if m:
            pins[m.group(1).lower()] = m.group(2)
    return pins


def installed_versions() -> dict[str, str | None]:
    """``{package: installed version or None}`` for every pinned package."""
    out: dict[str, str | None] = {}
    for name in pinned_versions():
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = None
    return out


def release_version(version: str) -> str:
    """``2.13.0+cpu`` -> ``2.13.0``: a local build tag is not part of the pin."""
    return version.split("+", 1)[0]


def installed_in(ranges: Iterable[tuple[str, str]]) -> bool:
    """True when every ``(package, specifier)`` names an installed package at a version inside the range
    (``("torch", ">=2.12,<2.14")``; a local build tag such as ``+cpu`` is ignored)."""
    for package, spec in ranges:
        try:
            installed = Version(release_version(md.version(package)))
        except md.PackageNotFoundError:
            return False
        if installed not in SpecifierSet(spec):
            return False
    return True


def version_drift() -> dict[str, tuple[str, str]]:
    """``{package: (pinned, installed)}`` for installed packages whose version differs from the pin."""
    pins = pinned_versions()
    return {
        name: (pins[name], got)
        for name, got in installed_versions().items()
        if got is not None and release_version(got) != pins[name]
    }


_warned = False


def warn_on_version_drift() -> None:
    """Warn once per process, naming every drifted package with its pinned and installed version."""
    global _warned
    if _warned:
        return
    _warned = True
    drift = version_drift()
    if drift:
        listing = ", ".join(f"{n} {pinned} pinned, {got} installed" for n, (pinned, got) in sorted(drift.items()))
        message = f"export-sweep patches target the pinned versions; drift detected: {listing}"
        warnings.warn(message, VersionDriftWarning, stacklevel=3)
