"""Standalone reproductions of the skiplists' failures (``skiplists/repros/*.py``), and ``export-sweep repros``.

A repro is a short script, no zoo and no sweep, that shows one known failure at the pins in seconds. It exits
:data:`REPRODUCED` (10) after checking that the failure is the one its skiplist entry describes, and 0 when the
operation it tries now works and computes what eager computes: an upstream release that fixes the cause shows up
by name. Any other exit (an import error, another error) is a broken repro. Its docstring's first line says what
fails; a line ``Tracker: <owner/name>`` says where the bug belongs, so that a maintainer can file the script as it is.

``export-sweep repros`` runs every repro with the interpreter it runs under (so in a drift environment, at that
environment's versions), each in its own process with a timeout, and prints which still reproduce, which pass now
(their entries are stale there) and which broke. ``export-sweep drift`` runs them in the drift environment too.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

#: the exit code of a repro whose failure still happens
REPRODUCED = 10
VERDICTS = {REPRODUCED: "reproduces", 0: "passes now"}


@dataclass(frozen=True)
class ReproResult:
    repro: str
    verdict: str  # "reproduces", "passes now", "broken", "timeout"
    seconds: float
    summary: str  # the repro's first docstring line
    tracker: str | None
    detail: str  # the last line it printed (its error for a broken one)


def describe(path: Path) -> tuple[str, str | None]:
    """A repro's first docstring line and its ``Tracker:`` (``owner/name``), read without running it."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    tracker = next((line.split(":", 1)[1].strip() for line in doc.splitlines() if line.startswith("Tracker:")), None)
    return doc.split("\n", 1)[0], tracker


def run_repro(path: Path, python: str = sys.executable, timeout: float = 300) -> ReproResult:
    summary, tracker = describe(path)
    start = time.perf_counter()
    try:
        done = subprocess.run([python, str(path)], capture_output=True, text=True, timeout=timeout, cwd=path.parent)
    except subprocess.TimeoutExpired:
        return ReproResult(path.name, "timeout", round(time.perf_counter() - start, 2), summary, tracker,
                           f"no exit in {timeout:g} s")
    output = [line for line in (done.stdout + "\n" + done.stderr).splitlines() if line.strip()]
    return ReproResult(path.name, VERDICTS.get(done.returncode, "broken"), round(time.perf_counter() - start, 2),
                       summary, tracker, output[-1][:300] if output else f"exit {done.returncode}")


def repro_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("*.py") if not p.name.startswith("_"))


def run_all(folder: Path, python: str = sys.executable, timeout: float = 300, out: Path | None = None) -> list[ReproResult]:
    """Run every repro of ``folder``, printing one line each; ``out``: also write ``repros.json`` there."""
    results = []
    if "/" in python:  # a path given relative to here: each repro runs in its own folder
        python = str(Path(python).absolute())
    for path in repro_files(folder):
        result = run_repro(path, python, timeout)
        results.append(result)
        print(f"{result.verdict:<11} {result.seconds:>6.1f} s  {result.repro}: {result.detail}", flush=True)
    counts = {v: sum(r.verdict == v for r in results) for v in ("reproduces", "passes now", "broken", "timeout")}
    print(f"{len(results)} repros: " + ", ".join(f"{n} {v}" for v, n in counts.items() if n)
          + f" ({sum(r.seconds for r in results):.0f} s)")
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "repros.json").write_text(json.dumps([asdict(r) for r in results], indent=1) + "\n")
    return results
