"""``export-sweep``: rebuild, merge and compare sweep reports from their row files.

    export-sweep matrix reports/                     # matrix.{json,md,html} from reports/results.jsonl
    export-sweep merge shard-*/ --out reports/all    # join the shards' rows into one report
    export-sweep compare reports/                    # against the packaged baseline; exit 1 on regressions or missing cases
    export-sweep compare old-run/ reports/           # against another run
    export-sweep skiplist reports/baseline           # draft skiplist entries for the unlisted non-passing cases
    export-sweep drift .venv-new --models=smoke      # sweep in another environment, compare with the baseline

Paths are row files or report folders (holding ``results.jsonl``). A corrupt line is reported on stderr with
its file and line number and skipped (``--strict`` makes it an error). Exit codes: 0 fine, 1 regressions or
missing cases (``compare``), 2 an error (missing file, no rows, corrupt line under ``--strict``), with a one-line message.
Without the installed script: ``python -m sweep.cli ...``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sweep.results import (ROWS_FILE, CorruptRow, RowFileError, case_id, dumps_strict, latest_rows, read_rows,
                           replace_file, rows_path)

PROG = "export-sweep"


class CliError(Exception):
    """An error reported as one line on stderr, with exit code 2."""


def _load(path: str, strict: bool) -> tuple[Path, list[dict]]:
    try:
        file = rows_path(Path(path))
    except RowFileError as e:
        raise CliError(str(e)) from None
    corrupt: list[CorruptRow] = []

    def on_corrupt(problem: CorruptRow) -> None:
        corrupt.append(problem)
        print(f"{PROG}: warning: {problem}", file=sys.stderr)

    try:
        rows = list(read_rows(file, on_corrupt=on_corrupt))
    except OSError as e:
        raise CliError(f"cannot read {file}: {e.strerror or e}") from None
    if corrupt and strict:
        raise CliError(f"{len(corrupt)} corrupt line(s) in {file} (first: line {corrupt[0].line}); --strict stops here")
    if not rows:
        raise CliError(f"no rows in {file}" + (f" ({len(corrupt)} corrupt lines)" if corrupt else ""))
    return file, rows


def _say(paths: dict[str, Path]) -> None:
    print("wrote " + ", ".join(str(p) for p in paths.values()))


def cmd_matrix(args: argparse.Namespace) -> int:
    from sweep.matrix import write_matrix

    file, rows = _load(args.rows, args.strict)
    _say(write_matrix(rows, Path(args.out) if args.out else file.parent))
    return 0


def _runs(file: Path) -> list[dict]:
    from sweep.runs import read_runs

    return read_runs(file, on_corrupt=lambda problem: print(f"{PROG}: warning: {problem}", file=sys.stderr))


def cmd_merge(args: argparse.Namespace) -> int:
    from sweep.matrix import write_matrix
    from sweep.runs import append_run, runs_path

    everything: list[dict] = []
    sources: dict[str, list[str]] = {}
    runs: dict[str, dict] = {}
    for path in args.rows:
        file, rows = _load(path, args.strict)
        everything += rows
        runs.update((run["run"], run) for run in _runs(file))
        for cid in {case_id(r) for r in rows}:
            sources.setdefault(cid, []).append(str(file))
    repeated = {cid: files for cid, files in sources.items() if len(files) > 1}
    if repeated:
        cid, files = next(iter(sorted(repeated.items())))
        print(f"{PROG}: note: {len(repeated)} case(s) appear in several row files (e.g. {cid} in "
              f"{', '.join(files)}); the latest row of each case is kept", file=sys.stderr)
    merged = latest_rows(everything)
    out = Path(args.out)
    replace_file(out / ROWS_FILE, "".join(dumps_strict(row, sort_keys=True) + "\n" for row in merged))
    replace_file(runs_path(out / ROWS_FILE), "")
    for run in runs.values():  # what each merged run selected, so that compare knows the merged folder's selection
        append_run(out / ROWS_FILE, run)
    paths = write_matrix(merged, out)
    print(f"merged {len(merged)} cases from {len(args.rows)} row files into {out / ROWS_FILE}")
    _say(paths)
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from sweep.diff import compare_runs, headline, verdict, write_comparison

    if args.time_threshold <= 0:
        raise CliError(f"--time-threshold must be > 0, got {args.time_threshold}")
    if args.new is None:  # one folder: compared with the baseline export-sweep ships for its pins
        args.old, args.new = None, args.old
    old_label, old_rows = _baseline(args.strict) if args.old is None else _load(args.old, args.strict)
    new_file, new_rows = _load(args.new, args.strict)
    comparison = compare_runs(old_rows, new_rows, old_label=str(old_label), new_label=str(new_file),
                              time_threshold=args.time_threshold, min_seconds=args.min_seconds,
                              subset=True if args.subset else None, new_runs=_runs(new_file),
                              strict_new=args.strict_new)
    paths = write_comparison(comparison, Path(args.out) if args.out else new_file.parent)
    print((verdict(comparison).upper() + ": " if comparison.exit_code else "ok: ") + headline(comparison))
    for change in comparison.regressions[:20]:
        print(f"  regression: {change.case}: {change.old} -> {change.new} ({change.category})")
    for case in comparison.missing[:20]:
        print(f"  missing: {case} (selected by or expected of {new_file}, no row there)")
    for change in (comparison.new_failing if args.strict_new else [])[:20]:
        print(f"  new, not passing: {change.case}: {change.new} ({change.category})")
    _say(paths)
    return comparison.exit_code


def _baseline(strict: bool) -> tuple[str, list[dict]]:
    """The packaged baseline's rows (export and generation cases), as one old run."""
    from sweep.packaged import PackagedDataError, baseline_row_files, describe_baseline

    try:
        files = baseline_row_files()
    except PackagedDataError as e:
        raise CliError(str(e)) from None
    return describe_baseline(), [row for file in files for row in _load(str(file), strict)[1]]


def cmd_skiplist(args: argparse.Namespace) -> int:
    from sweep.packaged import skiplist_dir
    from sweep.selection import is_known_class
    from sweep.skiplist import SkiplistError, draft, load_skiplists, unlisted
    from sweep.zoo import catalog

    _, rows = _load(args.rows, args.strict)
    try:
        lists = load_skiplists(Path(args.skiplist_dir or skiplist_dir()), is_known_class, catalog.all_classes)
    except SkiplistError as e:
        raise CliError(str(e)) from None
    missing = unlisted(latest_rows(rows), lists)
    print(f"# {len(missing)} non-passing cases of {args.rows} that no entry in {args.skiplist_dir or skiplist_dir()} explains;"
          " a draft to edit, grouped by error category (not yet by cause)", file=sys.stderr)
    sys.stdout.write(draft(missing))
    return 0


def cmd_drift(args: argparse.Namespace, sweep_args: list[str]) -> int:
    from sweep.drift import DriftError, run_drift

    try:
        return run_drift(args.env, Path(args.baseline) if args.baseline else None, Path(args.out) if args.out else None,
                         sweep_args)
    except DriftError as e:
        raise CliError(str(e)) from None


def cmd_repros(args: argparse.Namespace) -> int:
    from sweep.packaged import skiplist_dir
    from sweep.repros import run_all

    folder = Path(args.dir) if args.dir else skiplist_dir() / "repros"
    if not folder.is_dir():
        raise CliError(f"no repro folder {folder}")
    results = run_all(folder, python=args.python or sys.executable, timeout=args.timeout,
                      out=Path(args.out) if args.out else None)
    bad = [r for r in results if r.verdict in ("broken", "timeout") or (args.strict and r.verdict == "passes now")]
    return 1 if bad else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    sub = parser.add_subparsers(dest="command", required=True, metavar="{matrix,merge,compare,skiplist,drift,repros}")

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--strict", action="store_true", help="a corrupt line is an error (default: reported and skipped)")

    p = sub.add_parser("matrix", help="rebuild matrix.json, matrix.md and matrix.html from a row file")
    p.add_argument("rows", metavar="ROWS", help="row file or report folder")
    p.add_argument("--out", help="folder for the matrices (default: the row file's folder)")
    common(p)
    p.set_defaults(func=cmd_matrix)

    p = sub.add_parser("merge", help="join the row files of shards (or machines) into one report")
    p.add_argument("rows", metavar="ROWS", nargs="+", help="row files or report folders")
    p.add_argument("--out", required=True, help="folder for the merged results.jsonl and its matrices")
    common(p)
    p.set_defaults(func=cmd_merge)

    p = sub.add_parser("compare", help="compare two runs; exit 1 on regressions (pass -> fail/discrepancy/...) "
                                       "or cases missing from the new run")
    p.add_argument("old", metavar="OLD", help="row file or report folder of the earlier run; given alone, it is NEW "
                                               "and OLD is the baseline export-sweep ships for its pins")
    p.add_argument("new", metavar="NEW", nargs="?", help="row file or report folder of the later run")
    p.add_argument("--out", help="folder for compare.md, compare.html, compare.json (default: NEW's folder)")
    p.add_argument("--time-threshold", type=float, default=0.5,
                   help="report cases whose wall time changed by more than this fraction (default 0.5 = 50%%)")
    p.add_argument("--min-seconds", type=float, default=5.0,
                   help="... and by at least this many seconds (default 5)")
    p.add_argument("--subset", action="store_true",
                   help="only the cases NEW's runs selected count as missing (by default, also OLD's cases in a "
                        "scope NEW's runs covered whole, e.g. the catalog on a backend)")
    p.add_argument("--strict-new", action="store_true",
                   help="a case OLD lacks (a new class, a new case) that does not pass fails the comparison")
    common(p)
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("skiplist", help="print draft skiplist entries (YAML) for the non-passing cases no entry explains")
    p.add_argument("rows", metavar="ROWS", help="row file or report folder (e.g. reports/baseline)")
    p.add_argument("--skiplist-dir", default=None, help="the skiplists to check against (default: the ones shipped)")
    common(p)
    p.set_defaults(func=cmd_skiplist)

    p = sub.add_parser("drift", help="run the sweep in another environment (./dev env NAME PKG==VER ...) and compare "
                                     "its rows with a baseline; other arguments go to the sweep (python -m sweep)")
    p.add_argument("env", metavar="ENV", help="a venv folder made by ./dev env (e.g. .venv-new) or a python executable")
    p.add_argument("--baseline", default=None, help="the run to compare with (default: the packaged baseline)")
    p.add_argument("--out", help="report folder (default reports/drift/<YYYY-MM>-<moved packages at their new "
                                  "versions>, e.g. reports/drift/2026-12-torch2.15.0; versions.json inside names all)")
    p.set_defaults(func=cmd_drift, passes_through=True)

    p = sub.add_parser("repros", help="run the standalone repros of the skiplists' failures (skiplists/repros/) and "
                                      "say which still reproduce, which pass now, which broke; exit 1 on a broken one")
    p.add_argument("--dir", default=None, help="the repro folder (default: the shipped skiplists' repros/)")
    p.add_argument("--python", default=None, help="the interpreter to run them with (default: this one)")
    p.add_argument("--timeout", type=float, default=300, help="seconds a repro may run (default 300)")
    p.add_argument("--out", default=None, help="also write repros.json into this folder")
    p.add_argument("--strict", action="store_true", help="a repro that passes now (a stale entry) is an error too")
    p.set_defaults(func=cmd_repros)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if rest and not getattr(args, "passes_through", False):
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        return args.func(args, rest) if getattr(args, "passes_through", False) else args.func(args)
    except CliError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
