"""Export-to-``.pte`` seconds, ``.pte`` size and peak RSS: ExecutorchExporter vs transformers.exporters (the peer).

Run by hand:  ./dev bench bench_executorch [--repeats 3] [--models llama,gpt2]   (pin it: taskset -c 0 ...)

Every (model, exporter) pair runs in a fresh subprocess: ``--repeats`` exports with ``dynamic=True``, each timed up to
the ``.pte`` on disk (wall and CPU seconds; the table shows medians), then one run of the ``.pte`` on the ExecuTorch
runtime at the traced shape. The peak RSS is the subprocess's ``ru_maxrss`` at the end (imports, exports and the
run). CPU seconds are the fairer figure on a shared machine. The engine never imports the peer; only this file does.
"""

from __future__ import annotations

import argparse
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


def worker(side: str, name: str, repeats: int) -> dict:
    """One (model, exporter) measurement, in this (fresh) process."""
    sys.path.insert(0, str(ROOT))
    warnings.simplefilter("ignore")
    import torch

    from tests.engine.tiny_models import TINY_MODELS

    torch.set_num_threads(1)
    tiny = TINY_MODELS[name]
    export = _ours if side == "ours" else _peer
    wall, cpu, size = [], [], 0
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, f"{name}.pte")
        for _ in range(repeats):
            model, inputs = tiny.model(), tiny.inputs("trace")
            w, c = time.perf_counter(), time.process_time()
            run = export(model, inputs, path)
            wall.append(time.perf_counter() - w)
            cpu.append(time.process_time() - c)
            size = os.path.getsize(path)
        run()
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"wall_s": statistics.median(wall), "cpu_s": statistics.median(cpu), "pte_kb": size / 1024, "rss_mb": rss_mb}


def measure(side: str, name: str, repeats: int, timeout: int) -> dict:
    cmd = [sys.executable, __file__, "--worker", side, name, "--repeats", str(repeats)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
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
    parser.add_argument("--timeout", type=int, default=1800)
    parser.add_argument("--worker", nargs=2, metavar=("SIDE", "MODEL"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(*args.worker, args.repeats)))
        return

    sys.path.insert(0, str(ROOT))
    from tests.engine.tiny_models import TINY_MODELS

    names = args.models.split(",") if args.models else list(TINY_MODELS)
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
