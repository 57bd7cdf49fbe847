"""CPU seconds of one ONNX export step on our exports, with and without one of our ONNX patches.

Run by hand:  ./dev bench bench_onnx_patch [--patch NAME] [--step optimize|export] [--models Lfm2Model,LlamaForCausalLM]
                                     [--repeats 2] [--timed torch.onnx.export]
Each model is a catalog class built by the sweep's zoo. ``--step optimize`` (for an optimizer patch) exports it
once with ``optimize=False`` and optimizes that same model with the patch and without it. ``--step export`` (for a
patch of torch.onnx.export) exports it with ``optimize=False`` with the patch and without it and times
``torch.onnx.export`` (the exporter's ``onnx-export`` step) or the function ``--timed`` names (e.g. the torch.onnx
pass the patch speeds up); exports alternate between the sides, as a later export reuses sympy's caches. Either way
the two models are compared byte for byte (``tests/engine/onnx_bytes.py``): a speed-up patch must not change them.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from engine.exporter_onnx import OnnxExporter  # noqa: E402
from engine.patches import apply_patches, patch_disabled  # noqa: E402
from sweep.zoo.build import build_case  # noqa: E402
from bench.timing import timed  # noqa: E402
from sweep.warmup import warm  # noqa: E402
from tests.engine.onnx_bytes import comparable_bytes  # noqa: E402

DEFAULT_MODELS = "LlamaForCausalLM,T5ForConditionalGeneration,FalconH1Model,Lfm2Model"
DEFAULT_PATCH = {"optimize": "_patch_multi_output_match_checks_its_first_node",
                 "export": "_patch_type_promotion_reads_node_values"}


def export(case, without, function: str):
    """The unoptimized ONNX model and the CPU seconds spent inside ``function`` (a dotted name)."""
    with without, timed(function) as spent, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = OnnxExporter().export(case.model, case.inputs, {"dynamic": True, "optimize": False})
    return program, sum(spent)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--step", choices=sorted(DEFAULT_PATCH), default="optimize")
    parser.add_argument("--patch", help="the patch factory's name (default: the step's newest speed-up)")
    parser.add_argument("--models", default=DEFAULT_MODELS)
    parser.add_argument("--timed", default="torch.onnx.export",
                        help="with --step export: the function whose CPU seconds are shown (a module attribute)")
    parser.add_argument("--repeats", type=int, default=2, help="exports per side with --step export (median shown)")
    args = parser.parse_args()
    patch = args.patch or DEFAULT_PATCH[args.step]
    import onnx_ir as ir

    torch.set_num_threads(1)
    warm(["onnx"])  # the first export in a process pays one-off costs; neither side of the comparison should
    shown = args.timed if args.step == "export" else "optimize"
    print(f"| model | nodes | {shown} with {patch} | without | ratio | same model |\n|---|---|---|---|---|---|")
    for name in args.models.split(","):
        case = build_case(name)
        seconds, written = {}, {}
        if args.step == "export":
            runs = {True: [], False: []}
            for patched in [False, True] * args.repeats:  # alternating: a later export reuses sympy's caches
                without = contextlib.nullcontext() if patched else patch_disabled("onnx", patch)
                program, spent = export(case, without, args.timed)
                runs[patched].append(spent)
                written[patched] = comparable_bytes(program.model)
            seconds = {patched: statistics.median(spent) for patched, spent in runs.items()}
            nodes = len(program.model.graph)
        else:
            program, _ = export(case, contextlib.nullcontext(), "torch.onnx.export")
            unoptimized = ir.serde.serialize_model(program.model)
            nodes = len(unoptimized.graph.node)
            for patched in (True, False):
                program.model = ir.serde.deserialize_model(unoptimized)
                without = contextlib.nullcontext() if patched else patch_disabled("onnx", patch)
                started = time.process_time()
                with without, apply_patches("onnx"):
                    program.optimize()
                seconds[patched] = time.process_time() - started
                written[patched] = comparable_bytes(program.model)
        print(f"| {name} | {nodes} | {seconds[True]:.2f} | {seconds[False]:.2f} "
              f"| {seconds[True] / seconds[False]:.2f} | {written[True] == written[False]} |", flush=True)


if __name__ == "__main__":
    main()
