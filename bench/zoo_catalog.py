"""Full-catalog zoo measurement, run by hand.

    HF_HUB_OFFLINE=1 taskset -c 1 .venv/bin/python bench/zoo_catalog.py [--out reports/zoo_catalog.jsonl]
        [--jobs 1] [--timeout 120] [--only NAME ...] [--limit N] [--fresh]

Every catalogued class is built with ``sweep.zoo.build.build_case`` in a worker subprocess (one torch thread each); a
class that crashes its worker (segfault) or runs past ``--timeout`` is recorded as such and the worker restarted,
so one class cannot kill the run. Results are appended as JSON lines as they come, so an interrupted run resumes
where it stopped (``--fresh`` starts over). At the end the summary (share built by mapping, median/p90 parameters
and seconds, failures grouped by reason) is printed and written next to the results as ``*.summary.json``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "reports" / "zoo_catalog.jsonl"


# -- worker ---------------------------------------------------------------------------------------------------


def worker() -> None:
    """Read class names on stdin, answer one JSON line each on stdout."""
    import gc
    import warnings

    import torch

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    from sweep.zoo.build import build_case
    from sweep.zoo.errors import ZooError

    out = sys.stdout
    sys.stdout = sys.stderr  # model code that prints must not corrupt the protocol
    for line in sys.stdin:
        name = line.strip()
        start = time.perf_counter()
        row = {"name": name}
        try:
            case = build_case(name)
            row.update(status="ok", num_parameters=case.num_parameters, profile=case.profile,
                       inputs=sorted(case.inputs))
            del case
        except ZooError as exc:
            row.update(status=exc.category, message=exc.message[:1500], package=exc.package)
        except Exception as exc:  # noqa: BLE001 - an unexpected zoo bug is recorded, never hidden
            row.update(status="zoo_bug", message=f"{type(exc).__name__}: {exc}"[:1500])
        row["seconds"] = round(time.perf_counter() - start, 3)
        gc.collect()
        out.write(json.dumps(row) + "\n")
        out.flush()


# -- controller -----------------------------------------------------------------------------------------------


class Worker:
    def __init__(self) -> None:
        env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
        self.proc = subprocess.Popen([sys.executable, __file__, "--worker"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
                                     cwd=ROOT)
        self.name: str | None = None
        self.started = 0.0

    def send(self, name: str) -> None:
        self.name, self.started = name, time.monotonic()
        self.proc.stdin.write(name + "\n")
        self.proc.stdin.flush()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


def run(names: list[str], out: Path, jobs: int, timeout: float) -> None:
    todo = collections.deque(names)
    workers = [Worker() for _ in range(min(jobs, len(names)))]
    done = 0
    with out.open("a") as sink:
        while todo or any(w.name for w in workers):
            for w in workers:
                if w.name is None and todo:
                    w.send(todo.popleft())
            busy = {w.proc.stdout.fileno(): w for w in workers if w.name}
            ready, _, _ = select.select(list(busy), [], [], 1.0)
            for fd in ready:
                w = busy[fd]
                line = w.proc.stdout.readline()
                if line:
                    row = json.loads(line)
                else:  # the worker died (segfault, abort)
                    row = {"name": w.name, "status": "crash", "message": f"worker exit {w.proc.wait()}",
                           "seconds": round(time.monotonic() - w.started, 3)}
                    workers[workers.index(w)] = Worker()
                w.name = None
                sink.write(json.dumps(row) + "\n")
                sink.flush()
                done += 1
                print(f"[{done}/{len(names)}] {row['name']}: {row['status']} {row.get('seconds')}s", flush=True)
            for i, w in enumerate(workers):
                if w.name and time.monotonic() - w.started > timeout:
                    row = {"name": w.name, "status": "timeout", "message": f"over {timeout}s",
                           "seconds": timeout}
                    w.kill()
                    workers[i] = Worker()
                    sink.write(json.dumps(row) + "\n")
                    sink.flush()
                    done += 1
                    print(f"[{done}/{len(names)}] {row['name']}: timeout", flush=True)
    for w in workers:
        w.kill()


# -- summary --------------------------------------------------------------------------------------------------


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def summarise(rows: dict[str, dict]) -> dict:
    from sweep.zoo import catalog

    records = catalog.catalog()
    ok = [r for r in rows.values() if r["status"] == "ok"]
    missing = {n for n, r in rows.items() if r["status"] == "missing_dependency"}
    by_mapping = {}
    for label, names in catalog.classes_by_mapping().items():
        measured = [n for n in names if n in rows]
        counted = [n for n in measured if n not in missing]
        built = [n for n in counted if rows[n]["status"] == "ok"]
        by_mapping[label] = {"classes": len(names), "measured": len(measured), "missing_dependency":
                             len(measured) - len(counted), "ok": len(built),
                             "share": round(len(built) / len(counted), 4) if counted else None}
    failures = collections.defaultdict(list)
    for name, r in sorted(rows.items()):
        if r["status"] != "ok":
            failures[r["status"]].append({"name": name, "package": r.get("package"),
                                          "message": (r.get("message") or "")[:300]})
    params = [r["num_parameters"] for r in ok]
    seconds = [r["seconds"] for r in ok]
    counted_total = len([n for n in rows if n not in missing])
    return {
        "catalog_classes": len(records),
        "measured": len(rows),
        "ok": len(ok),
        "missing_dependency": len(missing),
        "share_ok_excluding_missing_dependency": round(len(ok) / counted_total, 4) if counted_total else None,
        "num_parameters": {"median": _percentile(params, 0.5), "p90": _percentile(params, 0.9),
                           "over_5M": sorted(r["name"] for r in ok if r["num_parameters"] > 5_000_000)},
        "seconds": {"median": _percentile(seconds, 0.5), "p90": _percentile(seconds, 0.9)},
        "profiles": collections.Counter(r.get("profile") for r in ok),
        "by_mapping": by_mapping,
        "failures": dict(failures),
    }


def print_summary(s: dict) -> None:
    print(f"\n{s['ok']}/{s['measured']} measured classes build and run eagerly "
          f"({s['missing_dependency']} missing_dependency); share excluding those: "
          f"{s['share_ok_excluding_missing_dependency']}; catalog has {s['catalog_classes']}")
    p, t = s["num_parameters"], s["seconds"]
    print(f"parameters: median {p['median']}, p90 {p['p90']}, over 5M: {len(p['over_5M'])}")
    print(f"build+forward seconds: median {t['median']}, p90 {t['p90']}; profiles used: {dict(s['profiles'])}")
    print("\nby mapping (ok / counted, missing_dependency excluded):")
    for label, m in sorted(s["by_mapping"].items()):
        if m["measured"]:
            counted = m["measured"] - m["missing_dependency"]
            print(f"  {label:32s} {m['ok']:4d}/{counted:<4d} {m['share']}  (+{m['missing_dependency']} missing dep)")
    print("\nfailures by reason:")
    for status, items in sorted(s["failures"].items()):
        print(f"  {status}: {len(items)}")
        for item in items:
            extra = f" [{item['package']}]" if item.get("package") else ""
            message = " ".join(item["message"].split())
            print(f"    {item['name']}{extra}: {message[:160]}")


def load_rows(out: Path) -> dict[str, dict]:
    rows = {}
    if out.exists():
        for line in out.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                rows[row["name"]] = row
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--only", nargs="*", help="class names (default: the whole catalog)")
    parser.add_argument("--limit", type=int, help="measure only every k-th class so that about N are measured")
    parser.add_argument("--fresh", action="store_true", help="discard earlier results in --out")
    parser.add_argument("--summary-only", action="store_true")
    args = parser.parse_args(argv)
    if args.worker:
        return worker()
    sys.path.insert(0, str(ROOT))
    from sweep.zoo import catalog

    args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.fresh and args.out.exists():
        args.out.unlink()
    names = args.only or catalog.all_classes()
    if args.limit:
        names = names[:: max(1, len(names) // args.limit)]
    if not args.summary_only:
        done = set(load_rows(args.out))
        run([n for n in names if n not in done], args.out, args.jobs, args.timeout)
    rows = {n: r for n, r in load_rows(args.out).items() if n in set(names)}
    summary = summarise(rows)
    args.out.with_suffix(".summary.json").write_text(json.dumps(summary, indent=1, default=str))
    print_summary(summary)


if __name__ == "__main__":
    main()
