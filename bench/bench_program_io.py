"""CPU seconds of the .pt2 round trip: torch.export.save/load vs engine.save_program/load_program.

Run by hand:  ./dev bench bench_program_io [--repeats 3] [--models Qwen3NextModel,DetrForObjectDetection]
Models are catalog classes built by the sweep's zoo (tiny random configs), exported with ``dynamic=True``.
Both round trips take turns within each repeat (after one warm-up round), so load on the machine affects
them alike; the table shows medians and ours/torch.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from engine import AutoExporter, DynamoConfig, load_program, save_program  # noqa: E402
from sweep.zoo.build import build_case  # noqa: E402

DEFAULT_MODELS = "LlamaForCausalLM,T5ForConditionalGeneration,DetrForObjectDetection,Mamba2ForCausalLM,Qwen3NextModel"
ROUND_TRIPS = {"torch": (torch.export.save, torch.export.load), "ours": (save_program, load_program)}


def _cpu_seconds(fn, *args) -> float:
    gc.collect()  # the garbage of the previous round trip is not this one's cost
    started = time.process_time()
    fn(*args)
    return time.process_time() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=DEFAULT_MODELS)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp())
    print("| model | save torch | save ours | ratio | load torch | load ours | ratio |\n|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        case = build_case(name)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            program = AutoExporter.export(case.model, case.inputs, DynamoConfig(dynamic=True))
        times = {(who, step): [] for who in ROUND_TRIPS for step in ("save", "load")}
        for attempt in range(args.repeats + 1):
            for who, (save, load) in ROUND_TRIPS.items():
                path = workdir / f"{who}.pt2"
                save_s, load_s = _cpu_seconds(save, program, path), _cpu_seconds(load, path)
                if attempt:
                    times[who, "save"].append(save_s)
                    times[who, "load"].append(load_s)
        m = {key: statistics.median(values) for key, values in times.items()}
        print(f"| {name} | {m['torch', 'save']:.2f} | {m['ours', 'save']:.2f} | {m['ours', 'save'] / m['torch', 'save']:.2f} "
              f"| {m['torch', 'load']:.2f} | {m['ours', 'load']:.2f} | {m['ours', 'load'] / m['torch', 'load']:.2f} |",
              flush=True)


if __name__ == "__main__":
    main()
