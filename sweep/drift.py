"""Drift: the sweep in a second environment holding other versions of the stack, compared with a baseline.

    ./dev env new torch==2.15.0                  # .venv-new: our pins, with these versions instead
    export-sweep drift .venv-new --models=smoke  # rows + compare in reports/drift/<YYYY-MM>-torch2.15.0/

The second environment installs this checkout (editable) with every pin of ``pyproject.toml`` except the ones
named, so the only difference between the two runs is the versions that moved. ``export-sweep drift`` runs the
sweep with that environment's Python (any pytest/sweep argument passes through; ``--resume`` continues a run in
pieces), then compares the rows with the baseline: ``compare.md``/``compare.html``/``compare.json`` beside the rows,
opening with the regressions and fixes by cause, exit 1 on a regression (or on a case of the baseline the run
lacks, unless the run covers some classes only). The folder is named by month and the versions that moved
(:func:`folder_name`); its ``versions.json`` holds the old and new version of every pinned package.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from datetime import date
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
_REQ = re.compile(r"^\s*([A-Za-z0-9_.\-]+)\s*(\[[^\]]*\])?\s*(.*)$")
_OVERRIDE = re.compile(r"^([A-Za-z0-9_.\-]+)==([A-Za-z0-9_.+!\-]+)$")
_SOURCE_TREE = re.compile(r"^([A-Za-z0-9_.\-]+)@(.+)$")
NAMED_FIRST = ("torch", "transformers")  # what a move is known by, first in its folder's name
MAX_NAME = 45  # characters of a drift folder's name; the packages past it are in its versions.json
VERSIONS_FILE = "versions.json"


class DriftError(Exception):
    """Bad input to ``./dev env`` or ``export-sweep drift``: one line saying what was wrong and what is allowed."""


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_overrides(specs: list[str]) -> dict[str, str]:
    """``["torch==2.14.1", "transformers@../transformers"]`` -> ``{"torch": "2.14.1", "transformers": "-e <abs path>"}``:
    exact pins, or a source tree installed editable (a library's own checkout), of packages we pin."""
    from engine.versions import pinned_versions

    pins = {_norm(n): n for n in pinned_versions()}
    out: dict[str, str] = {}
    for spec in specs:
        m = _OVERRIDE.match(spec.strip())
        tree = _SOURCE_TREE.match(spec.strip())
        if not m and not tree:
            raise DriftError(f"{spec!r}: expected PACKAGE==VERSION (an exact version, e.g. torch==2.14.1) or "
                             "PACKAGE@PATH (a source tree to install editable, e.g. transformers@../transformers)")
        name = (m or tree).group(1)
        if _norm(name) not in pins:
            raise DriftError(f"{name!r} is not pinned in pyproject.toml; pinned: {', '.join(sorted(pins.values()))}")
        if tree:
            path = Path(tree.group(2)).expanduser().resolve()
            if not ((path / "pyproject.toml").is_file() or (path / "setup.py").is_file()):
                raise DriftError(f"{spec!r}: {path} is not a source tree (no pyproject.toml or setup.py)")
            out[pins[_norm(name)]] = f"-e {path}"
        else:
            out[pins[_norm(name)]] = m.group(2)
    return out


def companion_pins(overrides: dict[str, str]) -> dict[str, str]:
    """``overrides`` with the packages built for one torch release moved with torch: torchvision ``0.(m+15).p`` for
    torch ``2.m.p`` (0.29.1 for 2.14.1), unless given. A torch whose companion the rule cannot tell (a source tree,
    another major) needs it given: :class:`DriftError` says so."""
    from engine.versions import pinned_versions

    torch = overrides.get("torch")
    if torch is None or "torchvision" in overrides or "torchvision" not in pinned_versions():
        return overrides
    found = re.fullmatch(r"2\.(\d+)\.(\d+)", torch.split("+", 1)[0])
    if found is None:
        raise DriftError(f"torch {torch}: torchvision is built for one torch release and moves with it, and its "
                         "version for this torch is not known here; give it too, e.g. torchvision==0.30.0")
    return {**overrides, "torchvision": f"0.{int(found.group(1)) + 15}.{found.group(2)}"}


def requirements(overrides: dict[str, str], extra: str = "test") -> list[str]:
    """The project's requirements with ``extra``'s (recursively through ``export-sweep[...]``), pins replaced
    (torch's companions moved with it: :func:`companion_pins`)."""
    overrides = companion_pins(overrides)
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project.get("optional-dependencies", {})
    reqs: list[str] = list(project.get("dependencies", []))
    todo, seen = [extra], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for req in extras.get(name, []):
            m = _REQ.match(req)
            if m and _norm(m.group(1)) == _norm(project["name"]):  # export-sweep[onnx,executorch]
                todo += [e.strip() for e in (m.group(2) or "[]")[1:-1].split(",") if e.strip()]
            else:
                reqs.append(req)
    wanted = {_norm(k): v for k, v in overrides.items()}
    out = []
    for req in reqs:
        m = _REQ.match(req)
        name = _norm(m.group(1)) if m else ""
        if name in wanted:
            out.append(wanted[name] if wanted[name].startswith("-e ") else f"{m.group(1)}=={wanted[name]}")
        else:
            out.append(req)
    return out


def env_versions(python: Path) -> dict[str, str | None]:
    """Installed versions of the pinned packages in the environment of ``python``."""
    code = "import json; from engine.versions import installed_versions as v; print(json.dumps(v()))"
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, cwd=REPO)
    if done.returncode:
        raise DriftError(f"{python} cannot import export-sweep's engine (make it with ./dev env NAME ...): "
                         f"{(done.stderr.strip().splitlines() or ['no output'])[-1]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def env_python(env: str) -> Path:
    """A venv folder (``.venv-new``) or a Python executable."""
    path = Path(env)
    python = path / "bin" / "python" if path.is_dir() else path
    if not python.is_file():
        raise DriftError(f"{env}: no such environment (a venv folder made by `./dev env NAME PKG==VER ...`, "
                         "or a python executable)")
    return python


def folder_name(old: dict[str, str], new: dict[str, str | None], when: date | None = None) -> str:
    """``2026-12-torch2.15.0``: the month and the packages of ``old`` (the baseline's versions) that moved, at their
    new versions, torch and transformers first. torchvision moving with torch (:func:`companion_pins`) is implied by
    torch; packages that do not fit in :data:`MAX_NAME` characters are left to the folder's ``versions.json``."""
    from engine.versions import release_version

    base = lambda v: release_version(v or "none")  # noqa: E731 (2.14.1+cu128 is 2.14.1)
    moved = [n for n in old if base(old[n]) != base(new.get(n))]
    if "torch" in moved and "torchvision" in moved:
        try:
            implied = companion_pins({"torch": base(new.get("torch"))}).get("torchvision")
        except DriftError:
            implied = None
        if implied == base(new.get("torchvision")):
            moved.remove("torchvision")
    moved.sort(key=lambda n: (NAMED_FIRST.index(n) if n in NAMED_FIRST else len(NAMED_FIRST), n))
    name = f"{when or date.today():%Y-%m}"
    if not moved:
        return f"{name}-same-versions"
    for i, n in enumerate(moved):
        part = f"-{n}{base(new.get(n))}"
        if i and len(name) + len(part) > MAX_NAME:
            break
        name += part
    return name


def write_versions(out: Path, old: dict[str, str | None], new: dict[str, str | None]) -> Path:
    """``out/versions.json``: ``{"old": {...}, "new": {...}}``, every pinned package's version in each run. Refuses
    a folder whose ``versions.json`` names other new versions: its rows come from another environment."""
    path = out / VERSIONS_FILE
    if path.is_file():
        there = json.loads(path.read_text()).get("new")
        if there != new:
            raise DriftError(f"{out} holds a drift run at other versions ({path}: {there}); give another --out")
    path.write_text(json.dumps({"old": old, "new": new}, indent=1, sort_keys=True) + "\n")
    return path


def run_drift(env: str, baseline: Path | None, out: Path | None, sweep_args: list[str],
              repros: Path | None = None) -> int:
    """Run the sweep in ``env`` into ``out`` and compare it with ``baseline`` (None: the packaged baseline), then
    the repros of ``repros`` (None: the skiplists') there; the compare's exit code."""
    from sweep.diff import compare_runs, headline, versions_of, write_comparison
    from sweep.packaged import baseline_row_files, skiplist_dir
    from sweep.repros import run_all
    from sweep.results import read_rows, rows_path
    from sweep.runs import read_runs

    python = env_python(env)
    try:
        files = [rows_path(baseline)] if baseline is not None else baseline_row_files()
        old_rows = [row for file in files for row in read_rows(file)]
    except Exception as e:  # RowFileError, PackagedDataError, OSError
        raise DriftError(f"baseline {baseline or '(packaged)'}: {e}") from None
    baseline = baseline or files[0].parent
    new_versions = env_versions(python)
    old_versions = versions_of(old_rows)
    out = out or REPO / "reports" / "drift" / folder_name(old_versions, new_versions)
    out.mkdir(parents=True, exist_ok=True)
    write_versions(out, {n: old_versions.get(n) for n in sorted(new_versions)}, new_versions)
    drifted = ", ".join(f"{n} {v}" for n, v in sorted(new_versions.items()) if v)
    print(f"drift: sweeping with {python} ({drifted}) into {out}", flush=True)
    swept = subprocess.run([str(python), "-m", "sweep", f"--report-dir={out}", *sweep_args], cwd=REPO)
    if swept.returncode not in (0, 1):  # 1: some case failed, which is what a drift run is for
        print(f"drift: the sweep exited {swept.returncode}; comparing the rows it wrote", file=sys.stderr)
    try:
        new_rows = list(read_rows(rows_path(out)))
    except Exception as e:
        raise DriftError(f"the sweep wrote no rows into {out}: {e}") from None
    comparison = compare_runs(old_rows, new_rows, old_label=str(baseline), new_label=str(out),
                              new_runs=read_runs(rows_path(out)))
    paths = write_comparison(comparison, out)
    print("drift: the skiplists' repros at these versions:", flush=True)
    run_all(repros or skiplist_dir() / "repros", python=str(python), out=out)  # repros.json: which causes are fixed there
    print(("REGRESSIONS: " if comparison.exit_code else "ok: ") + headline(comparison))
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return comparison.exit_code


def main(argv: list[str]) -> int:
    """``python -m sweep.drift requirements PKG==VER ...``: the requirement lines ``./dev env`` installs."""
    if argv[:1] != ["requirements"]:
        print("usage: python -m sweep.drift requirements [PKG==VER ...]", file=sys.stderr)
        return 2
    try:
        print("\n".join(requirements(parse_overrides(argv[1:]))))
    except DriftError as e:
        print(f"./dev env: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
