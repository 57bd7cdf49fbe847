"""Catalog cost of a sweep in case-hours: summed over a full-catalog run, or extrapolated from a fixed stratified
sample of classes. Run by hand:

    .venv/bin/python bench/sweep_cost.py sample [--size 200] > /tmp/sample.txt
    taskset -c 1 .venv/bin/python -m sweep --models=@/tmp/sample.txt --backend=eager,dynamo,onnx,executorch \\
        -n 1 --report-dir=/tmp/cost
    .venv/bin/python bench/sweep_cost.py report /tmp/cost [--against reports/baseline]

The sample is stratified by each class's first task mapping: every stratum gets a share of the sample in
proportion to its size (largest remainders, at least one class), its classes taken in stable-hash order, so the
sample is the same on every machine and does not move when unrelated classes are added. ``report`` sums the rows'
case seconds (``wall_seconds``: one case at a time with single-threaded torch, so wall is the case's CPU time) per
stratum and backend and scales each stratum by its size over its sample count (the stratified estimator of the
catalog total). Listed failures are skipped by a default run and cost nothing; ``--run-skipped`` runs measure
them too. ``--against`` lists the sample's cases whose status differs from another report (the baseline).
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

BACKENDS = ("eager", "dynamo", "onnx", "executorch")


def strata() -> dict[str, list[str]]:
    """Each catalogued class under its first task mapping (sorted labels), in stable-hash order."""
    from sweep.zoo import catalog
    from sweep.zoo.sample import stable_key

    by_stratum: dict[str, list[str]] = collections.defaultdict(list)
    for name in catalog.all_classes():
        labels = sorted(catalog.mappings_of(name))
        by_stratum[labels[0] if labels else "-"].append(name)
    return {label: sorted(names, key=stable_key) for label, names in by_stratum.items()}


def allocate(sizes: dict[str, int], size: int) -> dict[str, int]:
    """Proportional allocation of ``size`` over strata of ``sizes`` by largest remainders, at least one each."""
    total = sum(sizes.values())
    exact = {label: size * n / total for label, n in sizes.items()}
    counts = {label: max(1, min(sizes[label], int(share))) for label, share in exact.items()}
    for label in sorted(exact, key=lambda label: exact[label] - int(exact[label]), reverse=True):
        if sum(counts.values()) >= size:
            break
        if counts[label] < sizes[label]:
            counts[label] += 1
    return counts


def sample(size: int) -> dict[str, list[str]]:
    """The fixed sample: ``{stratum: classes}``."""
    groups = strata()
    counts = allocate({label: len(names) for label, names in groups.items()}, size)
    return {label: groups[label][: counts[label]] for label in groups}


def _rows(folder: Path) -> list[dict]:
    """Each case's latest row (a rerun appends one), as the sweep's counts read them."""
    from sweep.results import latest_rows, read_rows, rows_path

    return latest_rows(list(read_rows(rows_path(folder))))


def report(folder: Path, against: Path | None) -> None:
    groups = strata()
    stratum_of = {name: label for label, names in groups.items() for name in names}
    rows = _rows(folder)
    seconds: dict[tuple[str, str], float] = collections.defaultdict(float)
    run_models: dict[str, set[str]] = collections.defaultdict(set)
    cases = collections.Counter()
    for row in rows:
        label = stratum_of.get(row["model"])
        if label is None:
            continue
        run_models[label].add(row["model"])
        if row["status"] != "skip":
            seconds[(label, row["backend"])] += row.get("wall_seconds") or 0.0
            cases[row["backend"]] += 1
    sampled = sum(len(models) for models in run_models.values())
    missing = sorted(label for label in groups if label not in run_models)
    catalog = sum(len(n) for n in groups.values())
    states = collections.Counter((row.get("fingerprint_parts") or {}).get("export-sweep") for row in rows)
    state, count = states.most_common(1)[0] if states else (None, 0)
    print(f"{folder}: {sampled} sampled classes in {len(run_models)} of {len(groups)} strata, "
          f"{catalog} classes in the catalog")
    print(f"  rows from {len(states)} code states, the largest ({state}) {count} of {len(rows)}")
    if missing:
        print(f"  strata without a sampled class (their cost is not estimated): {', '.join(missing)}")
    # every class ran: the catalog figure is the rows' own sum, not an extrapolation
    column = "catalog h (measured)" if sampled == catalog else "catalog h (estimate)"
    print(f"  {'backend':<11} {'cases run':>9} {'sample h':>9} {column:>21}")
    total_sample = total_catalog = 0.0
    for backend in BACKENDS:
        spent = sum(seconds[(label, backend)] for label in run_models)
        estimate = sum(seconds[(label, backend)] * len(groups[label]) / len(run_models[label]) for label in run_models)
        total_sample += spent
        total_catalog += estimate
        print(f"  {backend:<11} {cases[backend]:>9} {spent / 3600:>9.2f} {estimate / 3600:>21.2f}")
    print(f"  {'all':<11} {sum(cases.values()):>9} {total_sample / 3600:>9.2f} {total_catalog / 3600:>21.2f}")
    if against is not None:
        before = {row["case_id"]: row["status"] for row in _rows(against)}
        changed = [(row["case_id"], before[row["case_id"]], row["status"]) for row in rows
                   if row["status"] != "skip" and row["case_id"] in before and before[row["case_id"]] != row["status"]]
        print(f"  status changes against {against}: {len(changed)}")
        for case_id, old, new in changed:
            print(f"    {case_id}: {old} -> {new}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    sample_parser = commands.add_parser("sample", help="print the fixed sample's class names, one per line")
    sample_parser.add_argument("--size", type=int, default=200)
    report_parser = commands.add_parser("report", help="the catalog case-hours a sample run extrapolates to")
    report_parser.add_argument("folder", type=Path)
    report_parser.add_argument("--against", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.command == "sample":
        print("\n".join(sorted(name for names in sample(args.size).values() for name in names)))
    else:
        report(args.folder, args.against)


if __name__ == "__main__":
    main()
