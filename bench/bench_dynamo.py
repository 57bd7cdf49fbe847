"""Median export seconds: DynamoExporter vs bare torch.export vs transformers.exporters (the peer).

Run by hand:  ./dev bench bench_dynamo [--repeats 5] [--models llama,gpt2] [--dynamic] [--classes A,B]
Each exporter gets one warm-up export per model, then ``--repeats`` timed exports; the table shows medians
and the ratios ours/bare (target <= 1.10; with ``--dynamic`` <= 0.8: ours with ``dynamic=True`` against a bare
``torch.export`` marking every dim ``Dim.AUTO``) and ours/peer. ``--classes`` takes catalog classes (their zoo
models, :func:`sweep.zoo.build.build_case`) in place of the tiny models; ``--classes=smoke-dynamo`` is the smoke
set's decoder, encoder-decoder and vision classes. ``--batch-of-one`` keeps the first row of every input (the
size-1 dims the exporter widens).
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


#: the smoke set's decoder, encoder-decoder and vision classes (sweep/data/smoke.yaml), but Swin: a bare export
#: with its image height and width Dim.AUTO did not finish in 7 minutes (the symbolic window partition; ours keeps
#: configured image sizes static: engine.shapes)
SMOKE_DYNAMO = ("LlamaForCausalLM,GPT2LMHeadModel,Qwen3ForCausalLM,PhiForCausalLM,T5ForConditionalGeneration,"
                "BartForConditionalGeneration,WhisperForConditionalGeneration,ViTForImageClassification,"
                "ConvNextForImageClassification")


def all_dims_auto(traced):
    """Every dim of every tensor leaf ``Dim.AUTO``, the bare tool's dynamic export."""
    return torch.utils._pytree.tree_map(
        lambda v: {d: torch.export.Dim.AUTO for d in range(v.ndim)} if isinstance(v, torch.Tensor) else None, traced)


def exporters(dynamic: bool):
    def bare(model, inputs):
        traced, _ = split_inputs(inputs)
        shapes = all_dims_auto(traced) if dynamic else None
        return torch.export.export(model, (), kwargs=traced, dynamic_shapes=shapes, strict=False)

    def ours(model, inputs):
        return DynamoExporter().export(model, inputs, config=DynamoConfig(dynamic=dynamic))

    def peer(model, inputs):
        from transformers.exporters import DynamoConfig as PeerConfig
        from transformers.exporters import DynamoExporter as PeerExporter

        return PeerExporter().export(model, dict(inputs), config=PeerConfig(dynamic=dynamic))

    return {"bare": bare, "ours": ours, "peer": peer}


def models_and_inputs(args):
    """``(name, model, inputs)`` of the tiny models, or of the catalog classes' zoo models with ``--classes``."""
    if not args.classes:
        for name in args.models.split(","):
            tiny = TINY_MODELS[name]
            yield name, tiny.model(), tiny.inputs()
        return
    from sweep.zoo.build import build_case

    for name in (SMOKE_DYNAMO if args.classes == "smoke-dynamo" else args.classes).split(","):
        case = build_case(name)
        inputs = case.inputs
        if args.batch_of_one:
            inputs = {k: v[:1] if isinstance(v, torch.Tensor) and v.ndim else v for k, v in inputs.items()}
        yield name, case.model, inputs


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
    parser.add_argument("--classes", default="", help="catalog classes, comma-separated, or smoke-dynamo")
    parser.add_argument("--dynamic", action="store_true", help="dynamic=True against every dim Dim.AUTO")
    parser.add_argument("--no-peer", action="store_true", help="leave transformers.exporters out")
    parser.add_argument("--batch-of-one", action="store_true", help="the first row of every input (--classes)")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    register_pytree_nodes()  # bare torch.export needs cache pytrees for decoder outputs

    rows = []
    fns = exporters(args.dynamic)
    if args.no_peer:
        del fns["peer"]
    print(f"{'model':<32} {'bare s':>8} {'ours s':>8} {'peer s':>8} {'ours/bare':>10} {'ours/peer':>10}")
    for name, model, inputs in models_and_inputs(args):
        medians = median_seconds(fns, model, inputs, args.repeats)
        t_bare, t_ours, t_peer = medians["bare"], medians["ours"], medians.get("peer", float("nan"))
        rows.append((name, t_bare, t_ours, t_peer))
        print(f"{name:<32} {t_bare:8.3f} {t_ours:8.3f} {t_peer:8.3f} {t_ours / t_bare:10.3f} {t_ours / t_peer:10.3f}")
    ratios_bare = [o / b for _, b, o, _ in rows]
    ratios_peer = [o / p for _, _, o, p in rows if p == p]
    median_peer = statistics.median(ratios_peer) if ratios_peer else float("nan")
    print(f"median ours/bare: {statistics.median(ratios_bare):.3f}   median ours/peer: {median_peer:.3f}")


if __name__ == "__main__":
    main()
