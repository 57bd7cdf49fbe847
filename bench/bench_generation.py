"""Seconds for export_for_generation per model and backend: ours vs transformers.exporters (the peer).

Run by hand:  ./dev bench bench_generation [--backends dynamo,onnx,executorch] [--models llama,t5] [--repeats 1]
                                          [--peer-multi-token]
Our decode component keeps its query length symbolic (one or several new tokens per step); the peer's default
decode takes exactly one token. ``--peer-multi-token`` asks the peer for the same kind of decode
(``multi_token_decode=True``), the like-for-like comparison; without it the peer does less.
Each measurement runs in a fresh process that imported both exporters and warmed torch.export and the backend
on a tiny module through the libraries themselves (neither exporter's code), so neither exporter inherits the
other's caches: in one process, whichever exports a model second reuses sympy's and the fake-tensor caches and
looked 30 % faster (Mamba2, dynamo). CPU seconds of the export are reported (wall time swings when other jobs
share the machine). A failing exporter is shown as such, with its first error line.
The peer exports fewer components for some models (no encoder for an encoder-decoder, no image path for LLaVA
under transformers 5.23), so a second ratio, ``like/peer``, leaves out the export seconds of the components
only ours makes (``GenerationComponents.seconds``).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from engine import AutoExporter  # noqa: E402
from bench.peer import peer_exporter  # noqa: E402
from tests.engine.test_generation import MODELS, generation_inputs  # noqa: E402


def ours(backend, model, inputs):
    return AutoExporter.export_for_generation(model, inputs, {"export_format": backend, "dynamic": True})


def peer(backend, model, inputs, multi_token=False):
    exporter, config = peer_exporter(backend)
    return exporter().export_for_generation(model, dict(inputs), config=config(dynamic=True),
                                              multi_token_decode=multi_token)


def measure(fn, backend, name):
    """CPU seconds of one export, the components it made and (ours) the seconds of each."""
    model = MODELS[name].model()
    start = time.process_time()
    try:
        components = fn(backend, model, generation_inputs(name, 0, "dynamic", model))
    except Exception as e:  # a failure is a result, shown as such
        return {"seconds": float("nan"), "note": f"{type(e).__name__}: {str(e).splitlines()[0][:100]}"}
    seconds = time.process_time() - start
    names = components.components if hasattr(components, "components") else components  # the peer's ExportedModel
    return {"seconds": seconds, "note": "", "components": sorted(names),
            "component_seconds": getattr(components, "seconds", {})}


def warm_libraries(backend):
    """First-use costs of torch.export and the backend, paid through the libraries on a tiny module."""
    from sweep.warmup import tiny_module

    module, inputs = tiny_module()
    program = torch.export.export(module, (), dict(inputs), dynamic_shapes={k: {0: torch.export.Dim.AUTO} for k in inputs})
    if backend == "onnx":
        torch.onnx.export(module, (), kwargs=dict(inputs), dynamo=True, optimize=True, verbose=False)
    elif backend == "executorch":
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
        from executorch.exir import to_edge_transform_and_lower

        to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()]).to_executorch()


def measure_in_child(label, backend, name, multi_token):
    """CPU seconds of one export in a fresh process (see the module docstring)."""
    command = [sys.executable, __file__, "--one", label, "--backends", backend, "--models", name]
    if multi_token:
        command.append("--peer-multi-token")
    done = subprocess.run(command, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"seconds": float("nan"), "note": f"child exited {done.returncode}: {tail[:100]}"}
    return json.loads(lines[-1])


def like_for_like(ours_row, peer_row):
    """Our seconds less the export of the components the peer does not make (an encoder, an image path)."""
    extra = set(ours_row.get("components", ())) - set(peer_row.get("components", ()))
    return ours_row["seconds"] - sum(ours_row.get("component_seconds", {}).get(c, 0.0) for c in extra), sorted(extra)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", default="dynamo,onnx,executorch")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--peer-multi-token", action="store_true", help="the peer's decode with a symbolic query length")
    parser.add_argument("--one", choices=("ours", "peer"), help=argparse.SUPPRESS)  # the child's side
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    if args.one:
        warm_libraries(args.backends)
        import transformers.exporters  # noqa: F401  (both exporters imported before the clock starts)

        fn = ours if args.one == "ours" else functools.partial(peer, multi_token=args.peer_multi_token)
        print(json.dumps(measure(fn, args.backends, args.models)))
        return
    print(f"{'model':<12} {'backend':<11} {'ours s':>8} {'peer s':>8} {'ours/peer':>10} {'like/peer':>10}  "
          "(like: ours less the components the peer does not export)", flush=True)
    ratios, like_ratios = [], []
    for backend in args.backends.split(","):
        for name in args.models.split(","):
            t_ours, t_peer, t_like, notes, extra = [], [], [], [], []
            for _ in range(args.repeats):
                rows = {label: measure_in_child(label, backend, name, args.peer_multi_token) for label in ("ours", "peer")}
                like, extra = like_for_like(rows["ours"], rows["peer"])
                t_ours.append(rows["ours"]["seconds"])
                t_peer.append(rows["peer"]["seconds"])
                t_like.append(like)
                notes += [f"{label} failed: {row['note']}" for label, row in rows.items() if row["note"]]
            o, p, lk = (statistics.median(t) for t in (t_ours, t_peer, t_like))
            if o == o and p == p:
                ratios.append(o / p)
                like_ratios.append(lk / p)
            if extra:
                notes.append(f"peer lacks {', '.join(extra)}")
            print(f"{name:<12} {backend:<11} {o:8.2f} {p:8.2f} {o / p:10.3f} {lk / p:10.3f}  {'; '.join(sorted(set(notes)))}",
                  flush=True)
    if ratios:
        print(f"median ours/peer over models both exported: {statistics.median(ratios):.3f} ({len(ratios)} pairs); "
              f"like for like: {statistics.median(like_ratios):.3f}")


if __name__ == "__main__":
    main()
