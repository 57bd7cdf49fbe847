"""The fake mode of an ``ExportedProgram``: its shape env, and the fake-tensor dispatch cache around traces.

Shared by every stage that reads a program's symbolic sizes or retraces it (the exporters, shape guards,
the ``.pt2`` round trip), one layer below them all so none imports another for it.
"""

from __future__ import annotations

import contextlib

import torch

# ── Fake-tensor dispatch cache ──────────────────────────────────────────────────────────────────────
# FakeTensorMode caches each op's output metadata by its arguments, and on every miss it also synthesises the
# output back from the new entry to validate it (``_get_output_info_for_cache_entry``). A trace runs each op
# on new symbolic shapes, so nearly every op misses and pays for the entry and the synthesis: with the cache
# off, torch.export of the tiny Mamba2 takes 3.1 s instead of 5.5, T5 1.6 instead of 3.5, Llama 0.72 instead
# of 0.96 (CPU s). Lowering retraces the same graph again and again and gains from the cache (ExecuTorch's
# passes), so it is turned back on, on the program's fake mode, once the trace is done.


def fake_dispatch_cache_off_while_tracing():
    """A context in which new fake modes (the one torch.export creates) start with their dispatch cache off."""
    import torch._dynamo.config as dynamo_config

    return dynamo_config.patch(fake_tensor_cache_enabled=False)


def program_fake_mode(program: torch.export.ExportedProgram):
    """The fake mode the program's recorded values (``node.meta["val"]``) belong to; None when none has one."""
    for node in program.graph.nodes:
        fake_mode = getattr(node.meta.get("val"), "fake_mode", None)
        if fake_mode is not None:
            return fake_mode
    return None


def program_shape_env(program: torch.export.ExportedProgram):
    """The shape env of the program's fake mode (its symbols' ranges and guards); None when it has none."""
    return getattr(program_fake_mode(program), "shape_env", None)


@contextlib.contextmanager
def fake_dispatch_cache_off_while_decomposing(program: torch.export.ExportedProgram):
    """A context in which the program's fake mode runs without its dispatch cache, for a decomposition retrace
    (new symbolic shapes miss the cache, as in the trace), and then with the cache the process is configured with."""
    fake_mode = program_fake_mode(program)
    if fake_mode is not None and not fake_mode.propagate_real_tensors:
        fake_mode.cache_enabled = False
    try:
        yield
    finally:
        restore_fake_dispatch_cache(program)


def restore_fake_dispatch_cache(program: torch.export.ExportedProgram) -> None:
    """Give the program's fake mode the dispatch cache the process is configured with, for what comes after the
    trace (decomposition, lowering passes)."""
    import torch._dynamo.config as dynamo_config

    fake_mode = program_fake_mode(program)
    if fake_mode is not None and not fake_mode.propagate_real_tensors:
        fake_mode.cache_enabled = dynamo_config.fake_tensor_cache_enabled
