"""Seconds for export_for_generation per model and backend: ours vs transformers.exporters (the peer).

Run by hand:  ./dev bench bench_generation [--backends dynamo,onnx,executorch] [--models llama,t5] [--repeats 1]
                                          [--peer-multi-token]
Our decode component keeps its query length symbolic (one or several new tokens per step); the peer's default
decode takes exactly one token. ``--peer-multi-token`` asks the peer for the same kind of decode
(``multi_token_decode=True``), the like-for-like comparison; without it the peer does less.
CPU seconds of this process are reported (wall time swings when other jobs share the machine); the two
exporters alternate. A failing exporter is shown as such, with its first error line.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from engine import AutoExporter  # noqa: E402
from tests.engine.test_generate import MODELS, generation_inputs  # noqa: E402


def ours(backend, model, inputs):
    return AutoExporter.export_for_generation(model, inputs, {"export_format": backend, "dynamic": True})


def peer(backend, model, inputs, multi_token=False):
    import transformers.exporters as peer_exporters

    exporter, config = {
        "dynamo": (peer_exporters.DynamoExporter, peer_exporters.DynamoConfig),
        "onnx": (peer_exporters.OnnxExporter, peer_exporters.OnnxConfig),
        "executorch": (peer_exporters.ExecutorchExporter, peer_exporters.ExecutorchConfig),
    }[backend]
    return exporter().export_for_generation(model, dict(inputs), config=config(dynamic=True),
                                              multi_token_decode=multi_token)


def cpu_seconds(fn, backend, name):
    model = MODELS[name].model()
    start = time.process_time()
    try:
        fn(backend, model, generation_inputs(name, 0, "dynamic", model))
    except Exception as e:  # a failure is a result, shown as such
        return float("nan"), f"{type(e).__name__}: {str(e).splitlines()[0][:100]}"
    return time.process_time() - start, ""


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", default="dynamo,onnx,executorch")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--peer-multi-token", action="store_true", help="the peer's decode with a symbolic query length")
    args = parser.parse_args()
    peer_export = functools.partial(peer, multi_token=args.peer_multi_token)
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    print(f"{'model':<12} {'backend':<11} {'ours s':>8} {'peer s':>8} {'ours/peer':>10}")
    ratios = []
    for backend in args.backends.split(","):
        for name in args.models.split(","):
            t_ours, t_peer, notes = [], [], []
            for repeat in range(args.repeats):
                order = [("ours", ours), ("peer", peer_export)][:: 1 if repeat % 2 == 0 else -1]
                for label, fn in order:
                    seconds, note = cpu_seconds(fn, backend, name)
                    (t_ours if label == "ours" else t_peer).append(seconds)
                    if note:
                        notes.append(f"{label} failed: {note}")
            o, p = statistics.median(t_ours), statistics.median(t_peer)
            if o == o and p == p:
                ratios.append(o / p)
            print(f"{name:<12} {backend:<11} {o:8.2f} {p:8.2f} {o / p:10.3f}  {'; '.join(sorted(set(notes)))}")
    if ratios:
        print(f"median ours/peer over models both exported: {statistics.median(ratios):.3f} ({len(ratios)} pairs)")


if __name__ == "__main__":
    main()
