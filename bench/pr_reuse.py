"""How much of the catalog a library's pull request reruns with ``--reuse-from`` (run by hand).

    .venv/bin/python bench/pr_reuse.py reference /tmp/ref            # the baseline's rows, fingerprinted at this code
    ./dev env devtf transformers@/path/to/transformers-checkout        # the library's tree, installed editable
    time .venv-devtf/bin/python -m sweep --models=all --backend=all -n 2 --reuse-from=/tmp/ref --report-dir=/tmp/pr

``reference`` writes the committed baseline's rows (``reports/baseline``) with each case's fingerprint as this
checkout, in this environment, computes it today: the stand-in for "the last CI run of this code at the pins" (the
committed rows come from older code states, so nothing would be reused from them as they are). Statuses, errors
and times are the baseline's. Then the sweep in the second environment reuses every case whose fingerprint the
tree left as it was and reruns the others; its summary says how many and why (``rerun_reason``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def reference(out: Path, timeout: float = 600.0) -> None:
    from sweep.fingerprint import fingerprint, fingerprint_parts
    from sweep.packaged import skiplist_dir
    from sweep.plugin.collection import cases
    from sweep.plugin.options import BACKENDS, SHAPES, SweepSettings
    from sweep.results import ROWS_FILE, case_id, dumps_strict, latest_rows, read_rows, replace_file
    from sweep.selection import is_known_class
    from sweep.skiplist import load_skiplists
    from sweep.zoo import catalog

    skiplists = load_skiplists(skiplist_dir(), is_known_class, catalog.all_classes)
    settings = SweepSettings(BACKENDS, catalog.all_classes(), SHAPES["dynamic"], 1e-4, 1e-4, timeout, out, False,
                             skiplists, {})
    rows = {case_id(r): r for r in latest_rows(list(read_rows(ROOT / "reports" / "baseline" / ROWS_FILE)))}
    written = []
    for param in cases(settings):
        spec = param.values[0]
        row = rows.get(param.id)
        if row is None:
            continue
        parts = fingerprint_parts(spec, {"timeout": timeout, "run_skipped": False if spec.get("skiplist") else None})
        if spec.get("skiplist"):  # a default run skips a listed case (the baseline ran it: --run-skipped)
            row = {k: v for k, v in row.items() if k not in ("error", "error_line", "error_type", "traceback", "stage",
                                                                 "category", "diffs")}
            row.update(status="skip", skip_reason=f"skiplist: {spec['skiplist']}")
        written.append({**row, "fingerprint": fingerprint(parts), "fingerprint_parts": parts,
                        "skiplist": spec.get("skiplist")})
    replace_file(out / ROWS_FILE, "".join(dumps_strict(r, sort_keys=True) + "\n" for r in written))
    print(f"{len(written)} of {len(rows)} baseline rows fingerprinted at this code into {out / ROWS_FILE}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("reference", help="the baseline's rows with today's fingerprints")
    p.add_argument("out", type=Path)
    args = parser.parse_args()
    reference(args.out)


if __name__ == "__main__":
    main()
