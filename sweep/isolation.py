"""Run each case in a child process so a native crash or a hang is a result, not the end of the sweep.

Children are forked from a per-process *forkserver* that imported torch and transformers once: a case starts in
milliseconds and leaves nothing behind (patches, registries, memory) for the next case. With :func:`warm_backends`
the forkserver also exports one tiny module per backend (:mod:`sweep.warmup`), so that no child pays a backend's
first-use costs; that warm-up runs single-threaded and never starts a runtime, so children inherit no thread pool
(forking a process that already ran OpenMP or onnxruntime work can deadlock).

The child reports each stage it enters; when it dies (``crash``) or runs past the case timeout (``timeout``,
then it is killed) the result names the stage it was in, e.g. ``lower`` or ``run``.

A sweep that is killed leaves no case running: a case process exits when the process waiting for its result is
gone (the forkserver, its parent, outlives it), and an xdist worker whose controller died stops at its next poll
instead of running its case to the end.
"""

from __future__ import annotations

import multiprocessing
import os
import resource
import signal
import time
from collections.abc import Callable
from typing import Any

from sweep.warm_env import WARM_CATALOG_ENV, WARM_ENV, WARMABLE

# engine's package init is lazy: name the modules a case runs, so that the forkserver imports them once
PRELOAD = ["torch", "transformers", "engine.exporter_dynamo", "engine.generation.loop", "engine.program_io", "sweep.case",
           "sweep.zoo.build"]
_context: multiprocessing.context.BaseContext | None = None


def warm_backends(backends, catalog: bool = True) -> None:
    """Start the forkserver warmed for these backends, and with the class catalog unless no case needs it
    (before the first case; later calls change nothing)."""
    if _context is None:
        os.environ[WARM_ENV] = ",".join(b for b in backends if b in WARMABLE)
        os.environ[WARM_CATALOG_ENV] = "1" if catalog else "0"
        _get_context()


def _get_context():
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        warm = ["sweep.warmup"] if WARM_ENV in os.environ else []
        _context.set_forkserver_preload(PRELOAD + warm)
        # start the forkserver now, so that its imports and warm-up count against no case's time or timeout
        probe = _context.Process(target=_noop, daemon=True)
        probe.start()
        probe.join()
    return _context


def _noop() -> None:
    pass


def _exit_when_the_reader_closes(conn) -> None:
    """Exit this case process when the process waiting for its result is gone: a thread blocks on the result
    pipe's write end, where Linux reports an error (``POLLERR``) once the read end has no process left."""
    import select
    import threading

    if not hasattr(select, "poll"):
        return

    def watch() -> None:
        poller = select.poll()
        poller.register(conn.fileno(), 0)  # errors and hang-ups are always reported
        poller.poll()
        os._exit(1)

    threading.Thread(target=watch, name="exit-when-orphaned", daemon=True).start()


#: the xdist controller's pid, seen from a worker (its parent): a worker orphaned by a killed sweep stops
_CONTROLLER = os.getppid() if os.environ.get("PYTEST_XDIST_WORKER") else None


def _orphaned() -> bool:
    return _CONTROLLER is not None and os.getppid() != _CONTROLLER


def _child(target: Callable[..., dict], spec: dict[str, Any], conn) -> None:
    _exit_when_the_reader_closes(conn)
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
            if _orphaned():  # the sweep that asked for this case was killed: nobody reads its result
                process.kill()
                os._exit(1)
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
