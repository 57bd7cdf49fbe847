"""The skiplists and the baseline rows for the pins: the checkout's folders, or their copies inside the package.

A source checkout (or an editable install of one) reads ``skiplists/``, ``reports/baseline/`` and
``reports/generate/`` where they are committed. A wheel carries copies under ``sweep/packaged/`` (made by
``setup.py``'s build step: the YAML files as they are, the rows gzipped), so ``pip install export-sweep`` finds them
with no path: the sweep's skiplists, ``export-sweep compare NEW``, ``--reuse-from`` with no folder, and the shard
durations all default to these. ``--skiplist-dir`` and an explicit folder override them.
"""

from __future__ import annotations

from pathlib import Path

CHECKOUT = Path(__file__).resolve().parent.parent
PACKAGED = Path(__file__).resolve().parent / "packaged"
#: the folders of baseline rows: the export cases, and the generation cases (``--generate``)
BASELINE_FOLDERS = {"baseline": "reports/baseline", "generate": "reports/generate"}


class PackagedDataError(FileNotFoundError):
    """Neither a checkout nor the package holds what was asked for."""


def in_checkout() -> bool:
    return (CHECKOUT / "pyproject.toml").is_file() and (CHECKOUT / "skiplists").is_dir()


def skiplist_dir() -> Path:
    """The skiplists that hold at the pins."""
    return CHECKOUT / "skiplists" if in_checkout() else PACKAGED / "skiplists"


def baseline_folders() -> list[Path]:
    """The baseline's report folders (export cases, then generation cases)."""
    if in_checkout():
        folders = [CHECKOUT / path for path in BASELINE_FOLDERS.values()]
    else:
        folders = [PACKAGED / name for name in BASELINE_FOLDERS]
    found = [folder for folder in folders if folder.is_dir()]
    if not found:
        raise PackagedDataError(f"no baseline rows in {', '.join(str(f) for f in folders)} (a checkout holds them "
                                "under reports/, a wheel under sweep/packaged/)")
    return found


def baseline_row_files() -> list[Path]:
    from sweep.results import RowFileError, rows_path

    files = []
    for folder in baseline_folders():
        try:
            files.append(rows_path(folder))
        except RowFileError:
            continue
    if not files:
        raise PackagedDataError(f"the baseline folders {', '.join(map(str, baseline_folders()))} hold no row file")
    return files


def describe_baseline() -> str:
    return "the packaged baseline (" + ", ".join(str(f) for f in baseline_row_files()) + ")"
