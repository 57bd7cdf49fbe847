"""Export-to-``.pte`` seconds, ``.pte`` size and peak RSS: ExecutorchExporter vs transformers.exporters (the peer).

Run by hand:  ./dev bench bench_executorch [--repeats 3] [--models llama,gpt2]   (pin it: taskset -c 0 ...)
              ./dev bench bench_executorch --real-limits --repeats 1   (small widths at the checkpoints' real
              position limits, batch 13 x 7 tokens: the default memory planning, ours and the peer's)

Every (model, exporter) pair runs in a fresh subprocess: ``--repeats`` exports with ``dynamic=True``, each timed up to
the ``.pte`` on disk (wall and CPU seconds; the table shows medians), then one run of the ``.pte`` on the ExecuTorch
runtime at the traced shape. The peak RSS is the subprocess's ``ru_maxrss`` at the end (imports, exports and the
run). CPU seconds are the fairer figure on a shared machine. The engine never imports the peer; only this file does.

``--check-identical PATCH`` instead exports each model with our exporter with and without one of its ExecuTorch
patches (the factory's name, e.g. ``_patch_xnnpack_idle_retraces``), for a patch that must not change the
result: it prints both CPU times and whether the ``.pte`` bytes are identical, and exits 1 if any differ. With
``--timed FUNCTION`` (dotted) it also prints the CPU seconds spent inside that function, the step the patch speeds up.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REAL = "real:"  # a model name from tests.engine.tiny_models.REAL_LIMIT_MODELS


def _ours(model, inputs, path):
    from engine import ExecutorchConfig, run_exported
    from engine.exporter_executorch import ExecutorchExporter

    manager = ExecutorchExporter().export(model, inputs, config=ExecutorchConfig(dynamic=True))
    ExecutorchExporter.save(manager, path)
    return lambda: run_exported(path, inputs)


def _peer(model, inputs, path):
    from transformers.exporters import ExecutorchConfig, ExecutorchExporter

    exported = ExecutorchExporter().export(model, dict(inputs), config=ExecutorchConfig(dynamic=True))
    ExecutorchExporter.save_program(exported.program, path)
    return lambda: exported(**inputs)


def worker(side: str, name: str, repeats: int, function: str | None = None) -> dict:
    """One (model, exporter) measurement, in this (fresh) process. ``side``: ours, peer, or ours-without:PATCH;
    ``function`` (a dotted name): also the median CPU seconds spent inside it per export."""
    sys.path.insert(0, str(ROOT))
    warnings.simplefilter("ignore")
    import torch

    from bench.timing import timed
    from tests.engine.tiny_models import REAL_LIMIT_MODELS, TINY_MODELS

    import engine.patches.executorch_nodes  # noqa: F401
    import engine.patches.executorch  # noqa: F401  (registers the patches one side may leave out)
    import engine.patches.executorch_speed  # noqa: F401
    from engine.patches import patch_disabled

    torch.set_num_threads(1)
    tiny = REAL_LIMIT_MODELS[name.removeprefix(REAL)] if name.startswith(REAL) else TINY_MODELS[name]
    export = _peer if side == "peer" else _ours
    left_out = side.partition("ours-without:")[2]
    wall, cpu, inside, size = [], [], [], 0
    with tempfile.TemporaryDirectory() as tmp, patch_disabled("executorch", left_out) if left_out else contextlib.nullcontext():
        path = os.path.join(tmp, f"{name}.pte")
        for _ in range(repeats):
            model, inputs = tiny.model(), tiny.inputs("trace")
            with timed(function) if function else contextlib.nullcontext([]) as spent:
                w, c = time.perf_counter(), time.process_time()
                run = export(model, inputs, path)
                wall.append(time.perf_counter() - w)
                cpu.append(time.process_time() - c)
            inside.append(sum(spent))
            size = os.path.getsize(path)
        with open(path, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        run()
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"wall_s": statistics.median(wall), "cpu_s": statistics.median(cpu), "pte_kb": size / 1024, "rss_mb": rss_mb,
            "sha256": digest, "timed_cpu_s": statistics.median(inside)}


def check_identical(patch: str, names: list[str], repeats: int, timeout: int, function: str | None = None) -> int:
    """Exports with and without ``patch``: CPU seconds (of the export, and of ``function`` if given) and whether the
    ``.pte`` bytes match; 1 if any differ."""
    inside = f" {'in ' + function.rpartition('.')[2] + ' with/without':>30}" if function else ""
    print(f"{'model':<12} {'with s':>7} {'without s':>9} {'ratio':>6}{inside}  identical .pte", flush=True)
    differ = 0
    for name in names:
        with_ = measure("ours", name, repeats, timeout, function)
        without = measure(f"ours-without:{patch}", name, repeats, timeout, function)
        if "error" in with_ or "error" in without:
            print(f"{name:<12} with: {with_.get('error', 'ok')} | without: {without.get('error', 'ok')}", flush=True)
            differ += ("error" in with_) != ("error" in without)
            continue
        verdict = "yes"
        if with_["sha256"] != without["sha256"]:  # is the export deterministic at all? export once more without
            again = measure(f"ours-without:{patch}", name, repeats, timeout).get("sha256")
            if again == with_["sha256"]:
                verdict = "yes (the export without the patch is not deterministic: 2 runs, 2 files; one matches)"
            elif again != without["sha256"]:
                verdict = "unknown (the export without the patch is not deterministic: 2 runs, 2 files)"
            else:
                verdict = "NO"
                differ += 1
        inside = f" {with_['timed_cpu_s']:22.2f} / {without['timed_cpu_s']:5.2f}" if function else ""
        print(f"{name:<12} {with_['cpu_s']:7.1f} {without['cpu_s']:9.1f} {with_['cpu_s'] / without['cpu_s']:6.2f}{inside}  "
              f"{verdict}", flush=True)
    return 1 if differ else 0


#: address-space limit of each measurement's process: the peer's plans reach tens of GB on real limits, and an
#: allocation refused is a result (an error row) where an OOM kill would take the machine's other work with it
MEMORY_LIMIT = 16 * 2**30


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def measure(side: str, name: str, repeats: int, timeout: int, function: str | None = None) -> dict:
    cmd = [sys.executable, __file__, "--worker", side, name, "--repeats", str(repeats), *(["--timed", function] if function else [])]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, preexec_fn=_limit_memory)
    except subprocess.TimeoutExpired:
        return {"error": f"timeout after {timeout}s"}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode or not lines:
        tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return {"error": tail[:160]}
    return json.loads(lines[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", default=None, help="comma-separated names from tests/engine/tiny_models.py")
    parser.add_argument("--real-limits", action="store_true",
                        help="the models of REAL_LIMIT_MODELS (small widths, the checkpoints' real position limits)")
    parser.add_argument("--timeout", type=int, default=1800)
    parser.add_argument("--check-identical", metavar="PATCH", help="with and without this patch: same .pte bytes?")
    parser.add_argument("--timed", metavar="FUNCTION", help="with --check-identical: also the CPU seconds inside this "
                        "function (dotted, e.g. executorch.exir.program._program.EdgeProgramManager.to_executorch)")
    parser.add_argument("--worker", nargs=2, metavar=("SIDE", "MODEL"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(*args.worker, args.repeats, args.timed)))
        return

    sys.path.insert(0, str(ROOT))
    from tests.engine.tiny_models import REAL_LIMIT_MODELS, TINY_MODELS

    registry, prefix = (REAL_LIMIT_MODELS, REAL) if args.real_limits else (TINY_MODELS, "")
    names = [prefix + n for n in (args.models.split(",") if args.models else registry)]
    if args.check_identical:
        raise SystemExit(check_identical(args.check_identical, names, args.repeats, args.timeout, args.timed))
    header = f"{'model':<12} {'ours s':>7} {'peer s':>7} {'ours cpu':>8} {'peer cpu':>8} {'cpu o/p':>7} {'ours KB':>8} {'peer KB':>8} {'ours MB':>8} {'peer MB':>8}"
    print(header, flush=True)
    ratios = []
    for name in names:
        ours, peer = measure("ours", name, args.repeats, args.timeout), measure("peer", name, args.repeats, args.timeout)
        if "error" in ours or "error" in peer:
            print(f"{name:<12} ours: {ours.get('error', 'ok')} | peer: {peer.get('error', 'ok')}", flush=True)
            if "error" in peer and "error" not in ours:
                print(f"{'':<12} ours {ours['wall_s']:.1f}s wall, {ours['cpu_s']:.1f}s cpu, {ours['pte_kb']:.0f} KB, {ours['rss_mb']:.0f} MB")
            continue
        ratio = ours["cpu_s"] / peer["cpu_s"]
        ratios.append(ratio)
        print(
            f"{name:<12} {ours['wall_s']:7.1f} {peer['wall_s']:7.1f} {ours['cpu_s']:8.1f} {peer['cpu_s']:8.1f} {ratio:7.2f} "
            f"{ours['pte_kb']:8.0f} {peer['pte_kb']:8.0f} {ours['rss_mb']:8.0f} {peer['rss_mb']:8.0f}",
            flush=True,
        )
    if ratios:
        print(f"median ours/peer (cpu seconds): {statistics.median(ratios):.2f} over {len(ratios)} models")


if __name__ == "__main__":
    main()
