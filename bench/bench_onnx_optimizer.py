"""CPU seconds of the onnxscript optimizer on our exports, with and without one of our ONNX patches.

Run by hand:  ./dev bench bench_onnx_optimizer [--patch NAME] [--models Lfm2Model,LlamaForCausalLM]
Each model (a catalog class built by the sweep's zoo) is exported once with ``optimize=False``; the same
unoptimized model is then optimized with the patch and without it, and the two results are compared byte for byte.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from engine.exporter_onnx import OnnxExporter  # noqa: E402
from engine.patches import apply_patches, patch_disabled  # noqa: E402
from sweep.zoo import build_case  # noqa: E402

DEFAULT_MODELS = "LlamaForCausalLM,T5ForConditionalGeneration,FalconH1Model,Lfm2Model"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--patch", default="_patch_multi_output_match_checks_its_first_node")
    parser.add_argument("--models", default=DEFAULT_MODELS)
    args = parser.parse_args()
    import onnx_ir as ir

    torch.set_num_threads(1)
    print(f"| model | nodes | optimize with {args.patch} | without | ratio | same model |\n|---|---|---|---|---|---|")
    for name in args.models.split(","):
        case = build_case(name)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            program = OnnxExporter().export(case.model, case.inputs, {"dynamic": True, "optimize": False})
        unoptimized = ir.serde.serialize_model(program.model)
        seconds, written = {}, {}
        for patched in (True, False):
            program.model = ir.serde.deserialize_model(unoptimized)
            without = contextlib.nullcontext() if patched else patch_disabled("onnx", args.patch)
            started = time.process_time()
            with without, apply_patches("onnx"):
                program.optimize()
            seconds[patched] = time.process_time() - started
            written[patched] = ir.serde.serialize_model(program.model).SerializeToString()
        print(f"| {name} | {len(unoptimized.graph.node)} | {seconds[True]:.2f} | {seconds[False]:.2f} "
              f"| {seconds[True] / seconds[False]:.2f} | {written[True] == written[False]} |", flush=True)


if __name__ == "__main__":
    main()
