"""Median export seconds: DynamoExporter vs bare torch.export vs transformers.exporters (the peer).

Run by hand:  ./dev bench bench_dynamo [--repeats 5] [--models llama,gpt2]
Each exporter gets one warm-up export per model, then ``--repeats`` timed exports; the table shows medians
and the ratios ours/bare (target <= 1.10) and ours/peer.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from engine import DynamoConfig, DynamoExporter  # noqa: E402
from engine.prepare import split_inputs  # noqa: E402
from engine.pytree import register_pytree_nodes  # noqa: E402
from tests.engine.tiny_models import TINY_MODELS  # noqa: E402


def bare(model, inputs):
    traced, _ = split_inputs(inputs)
    return torch.export.export(model, (), kwargs=traced, strict=False)


def ours(model, inputs):
    return DynamoExporter().export(model, inputs, config=DynamoConfig())


def peer(model, inputs):
    from transformers.exporters import DynamoConfig as PeerConfig
    from transformers.exporters import DynamoExporter as PeerExporter

    return PeerExporter().export(model, dict(inputs), config=PeerConfig())


def median_seconds(fns, model, inputs, repeats):
    """Median seconds per exporter; exporters take turns within each repeat, so load on the machine
    during the run affects all of them alike. A failing exporter gets NaN."""
    times = {name: [] for name in fns}
    failed = set()
    for attempt in range(repeats + 1):  # the first round is the warm-up
        for name, fn in fns.items():
            if name in failed:
                continue
            start = time.perf_counter()
            try:
                fn(model, inputs)
            except Exception as e:  # the peer failing on a model is a result, shown as such
                print(f"  {name} failed: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
                failed.add(name)
                continue
            if attempt:
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) if t else float("nan") for name, t in times.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--models", default=",".join(TINY_MODELS))
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    register_pytree_nodes()  # bare torch.export needs cache pytrees for decoder outputs

    rows = []
    print(f"{'model':<12} {'bare s':>8} {'ours s':>8} {'peer s':>8} {'ours/bare':>10} {'ours/peer':>10}")
    for name in args.models.split(","):
        tiny = TINY_MODELS[name]
        model, inputs = tiny.model(), tiny.inputs()
        medians = median_seconds({"bare": bare, "ours": ours, "peer": peer}, model, inputs, args.repeats)
        t_bare, t_ours, t_peer = medians["bare"], medians["ours"], medians["peer"]
        rows.append((name, t_bare, t_ours, t_peer))
        print(f"{name:<12} {t_bare:8.3f} {t_ours:8.3f} {t_peer:8.3f} {t_ours / t_bare:10.3f} {t_ours / t_peer:10.3f}")
    ratios_bare = [o / b for _, b, o, _ in rows]
    ratios_peer = [o / p for _, _, o, p in rows if p == p]
    print(f"median ours/bare: {statistics.median(ratios_bare):.3f}   median ours/peer: {statistics.median(ratios_peer):.3f}")


if __name__ == "__main__":
    main()
