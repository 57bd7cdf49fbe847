"""How even the shards of a CI sweep are: the hash split against the duration-balanced split. Run by hand:

    .venv/bin/python bench/shard_balance.py [--rows reports/baseline --rows reports/generate] [--counts 4,8,16]

A case costs its latest row's ``wall_seconds`` (the export cases and the generation cases together). For each
shard count N it prints the longest shard's seconds against the mean (total / N), as a ratio and as the percent
above the mean, for ``shard_of`` (hash of the case id) and ``balanced_shards`` (longest first onto the least
loaded shard), for the whole catalog and for the ExecuTorch cases alone. ``floor`` is what no split can beat:
the mean or the longest single case, whichever is more. The balanced split is fed the baseline's durations; by
default it is scored on the same durations (its best case), with ``--noise SIGMA`` on durations each multiplied by
a log-normal factor (``exp(N(0, SIGMA))``, seeded): a next run's times, which differ from the baseline's.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DEFAULT_ROWS = ("reports/baseline", "reports/generate")


def longest(durations: dict[str, float], shards: dict[str, int], count: int) -> float:
    loads = [0.0] * count
    for case_id, seconds in durations.items():
        loads[shards[case_id] - 1] += seconds
    return max(loads)


def table(title: str, durations: dict[str, float], counts: list[int], noise: float = 0.0, seed: int = 0) -> None:
    import math
    import random

    from sweep.shard import balanced_shards, shard_of

    planned = durations
    if noise:
        rng = random.Random(seed)
        durations = {case: seconds * math.exp(rng.gauss(0.0, noise)) for case, seconds in sorted(planned.items())}
        title += f" (run times: the baseline's x exp(N(0, {noise})), seed {seed})"
    total = sum(durations.values())
    print(f"{title}: {len(durations)} cases, {total / 3600:.2f} case-hours, "
          f"longest case {max(durations.values()):.0f} s")
    print(f"  {'N':>3} {'mean s':>8} {'floor s':>8} | {'hash max s':>10} {'ratio':>6} {'+%':>7} | "
          f"{'balanced max s':>14} {'ratio':>6} {'+%':>7}")
    for count in counts:
        mean = total / count
        floor = max(mean, max(durations.values()))
        hashed = longest(durations, {case_id: shard_of(case_id, count) for case_id in durations}, count)
        balanced = longest(durations, balanced_shards(planned, planned, count), count)
        print(f"  {count:>3} {mean:>8.0f} {floor:>8.0f} | {hashed:>10.0f} {hashed / mean:>6.4f} "
              f"{100 * (hashed / mean - 1):>6.2f}% | {balanced:>14.0f} {balanced / mean:>6.4f} "
              f"{100 * (balanced / mean - 1):>6.2f}%")


def main(argv: list[str] | None = None) -> None:
    from sweep.results import case_id, read_rows, rows_path
    from sweep.shard import durations_from_rows

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", action="append", type=Path, help="row file or report folder (repeatable; "
                        f"default {' and '.join(DEFAULT_ROWS)})")
    parser.add_argument("--counts", default="4,8,16", help="shard counts, comma-separated (default 4,8,16)")
    parser.add_argument("--noise", type=float, default=0.0, help="score on run times with this log-normal spread")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rows = [row for folder in args.rows or [ROOT / f for f in DEFAULT_ROWS] for row in read_rows(rows_path(folder))]
    counts = [int(n) for n in args.counts.split(",")]
    backend_of = {case_id(row): row["backend"] for row in rows}
    durations = durations_from_rows(rows)
    table("all backends", durations, counts, args.noise, args.seed)
    table("--backend=executorch",
          {case_id: s for case_id, s in durations.items() if backend_of[case_id] == "executorch"}, counts,
          args.noise, args.seed)


if __name__ == "__main__":
    main()
