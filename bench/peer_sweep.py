"""Pass counts on the same tiny models: the engine against ``transformers.exporters`` (the peer), per backend.

Each class runs through the sweep's own case (build, eager, export, run at the traced and a second shape,
compare every leaf at the same tolerance), isolated in a child process, with the peer's exporter for the backend
standing in for ours. The peer's artifact runs in memory on its own runtime (ours is also saved and loaded in
the sweep rows, a stricter test). Our side is read from a sweep row file of the same classes, e.g.:

    ./dev sweep --models=all --backend=dynamo --report-dir=reports/baseline --resume
    ./dev bench peer_sweep --ours reports/baseline/results.jsonl --shard 1/10 --out reports/peer/dynamo.jsonl
    ./dev bench peer_sweep --backend=executorch --models=smoke --ours reports/smoke/results.jsonl \
        --out reports/peer/smoke_executorch.jsonl

``--shard i/n`` takes the same deterministic slice of the catalog the sweep's ``--shard`` does.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.peer import peer_exporter  # noqa: E402
from sweep.case import run_case  # noqa: E402
from sweep.categories import categorize, first_line  # noqa: E402
from sweep.isolation import run_isolated, warm_backends  # noqa: E402
from sweep.results import append_row, case_id, read_rows  # noqa: E402
from sweep.selection import resolve_models  # noqa: E402
from sweep.shard import parse_shard, shard_of  # noqa: E402


def peer_export(model, inputs, config):
    """The peer's exporter for the case's backend, with the same ``dynamic`` setting the sweep asks of ours.

    Dynamo: its ExportedProgram, run like ours. ONNX and ExecuTorch: a function that runs the peer's own
    runtime (onnxruntime, the ExecuTorch runtime) through its ``ExportedModel``, which returns what the model
    returns, so the leaves are compared under the same names as ours."""
    exporter, peer_config = peer_exporter(config["export_format"])
    exported = exporter().export(model, inputs, config=peer_config(dynamic=config["dynamic"]))
    if config["export_format"] == "dynamo":
        return exported.program

    def run(run_inputs):
        return exported(**run_inputs)

    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ours", type=Path, required=True, help="our sweep rows (results.jsonl) for the same classes")
    parser.add_argument("--models", default="all", help="as the sweep's --models (default: all)")
    parser.add_argument("--shard", default=None, metavar="I/N", help="the same slice as the sweep's --shard I/N")
    parser.add_argument("--backend", choices=("dynamo", "onnx", "executorch"), default="dynamo")
    parser.add_argument("--out", type=Path, default=None, help="default: reports/peer/<backend>.jsonl")
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args(argv)
    backend = args.backend
    args.out = args.out or Path(f"reports/peer/{backend}.jsonl")

    ours = {r["model"]: r for r in read_rows(args.ours) if r["backend"] == backend and r.get("shapes") == "dynamic"}
    models = resolve_models(args.models)
    if args.shard:
        index, count = parse_shard(args.shard)
        models = [m for m in models if shard_of(f"{m}-{backend}-dynamic", count) == index]
    models = [m for m in models if m in ours]
    done = {r["model"]: r for r in read_rows(args.out) if r["backend"] == backend} if args.out.is_file() else {}
    print(f"{len(models)} classes with a row of ours; {len(done)} already measured for the peer", flush=True)
    # the forkserver the sweep gives our cases: the backend's stack imported and torch.export's first-use costs
    # paid once (the warm-up exports a tiny module), so no peer case pays them either
    warm_backends([backend])
    for i, model in enumerate(models, 1):
        if model in done:
            continue
        spec = {"model": model, "backend": backend, "shapes": "dynamic", "atol": 1e-4, "rtol": 1e-4, "seed": 0,
                "exporter": "bench.peer_sweep:peer_export"}
        started = time.time()
        result = run_isolated(run_case, spec, args.timeout)
        row = {"model": model, "backend": backend, "shapes": "dynamic", "exporter": "transformers.exporters",
               "wall_seconds": round(time.time() - started, 3), **result}
        row["case_id"] = case_id(row)
        row["error_line"] = first_line(row.get("error"))
        row["category"] = categorize(row)
        row.pop("traceback", None)
        append_row(args.out, row)
        done[model] = row
        print(f"[{i}/{len(models)}] {model}: peer {row['status']}, ours {ours[model]['status']}", flush=True)

    peer_counts = Counter(done[m]["status"] for m in models)
    our_counts = Counter(ours[m]["status"] for m in models)
    print(f"\n{len(models)} classes, {backend}, dynamic shapes, atol=rtol=1e-4")
    for name, counts in (("ours", our_counts), ("peer", peer_counts)):
        print(f"  {name:<5} " + ", ".join(f"{s} {counts[s]}" for s in ("pass", "discrepancy", "fail", "timeout", "crash", "skip")))
    only_ours = sorted(m for m in models if ours[m]["status"] == "pass" and done[m]["status"] != "pass")
    only_peer = sorted(m for m in models if done[m]["status"] == "pass" and ours[m]["status"] != "pass")
    print(f"  pass with ours only: {len(only_ours)}; with the peer only: {len(only_peer)}")
    for m in only_peer:
        print(f"    peer only: {m} (ours: {ours[m]['status']} in {ours[m].get('stage')}: {ours[m].get('error_line')})")
    reasons = Counter(done[m].get("category") for m in only_ours)
    for reason, n in reasons.most_common(8):
        print(f"    ours only, peer fails with: {reason} x{n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
