"""Median ONNX export seconds: our OnnxExporter vs transformers.exporters.OnnxExporter (the peer).

Run by hand:  taskset -c 0 .venv/bin/python bench/bench_onnx.py [--repeats 3] [--models llama,gpt2]
Both export the tiny test models with ``dynamic=True`` and the onnxscript optimiser on, each at its own default
opset, from a freshly built model each time. One warm-up export per exporter first, then per model
``--repeats`` rounds in which the exporters take turns, the first exporter alternating between rounds.
Times are CPU seconds of this process (single-threaded torch), which other jobs on a shared machine barely
move; wall seconds are shown beside them. The optimiser's seconds are measured for both by timing
``torch.onnx.ONNXProgram.optimize`` (the pass both call). Target: median ours/peer <= 0.8.
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
from engine import OnnxConfig  # noqa: E402
from engine.exporter_onnx import OnnxExporter  # noqa: E402
from tests.engine.tiny_models import TINY_MODELS  # noqa: E402

OPTIMIZER_SECONDS: list[float] = []  # CPU seconds


def time_the_optimizer() -> None:
    """Wrap ``ONNXProgram.optimize`` (called by both exporters) to record its seconds."""
    original = torch.onnx.ONNXProgram.optimize

    @functools.wraps(original)
    def optimize(self):
        start = time.process_time()
        try:
            return original(self)
        finally:
            OPTIMIZER_SECONDS.append(time.process_time() - start)

    torch.onnx.ONNXProgram.optimize = optimize


def ours(model, inputs):
    program = OnnxExporter().export(model, inputs, config=OnnxConfig(dynamic=True))
    return program.model.opset_imports.get("")


def peer(model, inputs):
    from transformers.exporters import OnnxConfig as PeerConfig
    from transformers.exporters import OnnxExporter as PeerExporter

    exported = PeerExporter().export(model, dict(inputs), config=PeerConfig(dynamic=True))
    program = next(iter(exported.components.values())).program  # an onnx_ir.Model
    return program.opset_imports.get("")


def timed(fn, tiny):
    """(CPU seconds, optimiser CPU seconds, wall seconds, opset) of one export of a fresh model."""
    model, inputs = tiny.model(), tiny.inputs()
    OPTIMIZER_SECONDS.clear()
    wall, cpu = time.perf_counter(), time.process_time()
    opset = fn(model, inputs)
    return time.process_time() - cpu, sum(OPTIMIZER_SECONDS), time.perf_counter() - wall, opset


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", default=",".join(TINY_MODELS))
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    time_the_optimizer()
    exporters = {"ours": ours, "peer": peer}

    warm = TINY_MODELS["vit"]
    for fn in exporters.values():  # first-export costs (imports, registries) are paid here, once
        timed(fn, warm)

    rows = []
    print(f"{'model':<12} {'ours cpu':>9} {'optim':>6} {'peer cpu':>9} {'optim':>6} {'ours/peer':>10}  {'wall ours':>9} {'wall peer':>9}  opsets")
    for name in args.models.split(","):
        tiny = TINY_MODELS[name]
        runs = {n: [] for n in exporters}
        opsets = {}
        for round_ in range(args.repeats):
            order = list(exporters) if round_ % 2 == 0 else list(reversed(exporters))
            for n in order:
                if runs[n] is None:
                    continue
                try:
                    cpu, optim, wall, opsets[n] = timed(exporters[n], tiny)
                    runs[n].append((cpu, optim, wall))
                except Exception as e:  # a failing exporter is a result, shown as NaN
                    print(f"  {n} failed on {name}: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
                    runs[n] = None
        med = {
            n: tuple(statistics.median(x[i] for x in r) for i in range(3)) if r else (float("nan"),) * 3
            for n, r in runs.items()
        }
        (oc, oo, ow), (pc, po, pw) = med["ours"], med["peer"]
        rows.append((name, oc, oo, pc, po))
        print(
            f"{name:<12} {oc:9.2f} {100 * oo / oc:5.0f}% {pc:9.2f} {100 * po / pc:5.0f}% {oc / pc:10.3f}  {ow:9.2f} {pw:9.2f}"
            f"  ours={opsets.get('ours')} peer={opsets.get('peer')}",
            flush=True,
        )
    ratios = [o / p for _, o, _, p, _ in rows if p == p and o == o]
    share = [oo / o for _, o, oo, _, _ in rows if o == o]
    print(f"median ours/peer (CPU s): {statistics.median(ratios):.3f}   median optimiser share of ours: {100 * statistics.median(share):.0f}%")
    print(f"total CPU seconds: ours {sum(r[1] for r in rows):.1f}, peer {sum(r[3] for r in rows if r[3] == r[3]):.1f}")


if __name__ == "__main__":
    main()
