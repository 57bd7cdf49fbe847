"""Run each case in a child process so a native crash or a hang is a result, not the end of the sweep.

Children are forked from a per-process *forkserver* that imported torch and transformers once and never
computes: a case starts in milliseconds, inherits no thread pool (forking a process that already ran OpenMP
work can deadlock), and leaves nothing behind (patches, registries, memory) for the next case.

The child reports each stage it enters; when it dies (``crash``) or runs past the case timeout (``timeout``,
then it is killed) the result names the stage it was in, e.g. ``lower`` or ``run``.
"""

from __future__ import annotations

import multiprocessing
import os
import resource
import signal
import time
from collections.abc import Callable
from typing import Any

PRELOAD = ["torch", "transformers", "engine", "sweep.case", "sweep.zoo"]
_context: multiprocessing.context.BaseContext | None = None


def _get_context():
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(PRELOAD)
    return _context


def _child(target: Callable[..., dict], spec: dict[str, Any], conn) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(int(os.environ.get("SWEEP_THREADS", "1")))
    try:
        result = target(spec, lambda stage: conn.send(("stage", stage)))
        if isinstance(result, dict):  # peak resident memory of the case process (Linux reports KiB)
            result.setdefault("peak_rss_mb", round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1))
        conn.send(("result", result))
    finally:
        conn.close()


def _signal_name(exitcode: int | None) -> str:
    if exitcode is None or exitcode >= 0:
        return f"exit code {exitcode}"
    try:
        return signal.Signals(-exitcode).name
    except ValueError:
        return f"signal {-exitcode}"


def run_isolated(target: Callable[..., dict], spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    """``target(spec, progress) -> dict`` in a child; its result, or a ``crash``/``timeout`` result."""
    ctx = _get_context()
    receiver, sender = ctx.Pipe(duplex=False)
    process = ctx.Process(target=_child, args=(target, spec, sender), daemon=True)
    start = time.monotonic()
    process.start()
    sender.close()
    stage = "start"
    deadline = start + timeout
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                process.kill()
                return {"status": "timeout", "stage": stage, "error": f"case ran past --case-timeout={timeout:g}s in stage '{stage}'"}
            if receiver.poll(min(remaining, 0.5)):
                try:
                    kind, payload = receiver.recv()
                except (EOFError, ConnectionError):
                    break
                if kind == "stage":
                    stage = payload
                else:
                    return payload
            elif not process.is_alive() and not receiver.poll(0):
                break
        process.join(5)
        return {
            "status": "crash",
            "stage": stage,
            "error": f"the case process died ({_signal_name(process.exitcode)}) in stage '{stage}'",
        }
    finally:
        receiver.close()
        process.join(5)
        if process.is_alive():
            process.kill()
            process.join()
