"""One trace to a decomposed ATen program, instead of ``torch.export.export`` then ``run_decompositions``.

``torch.export.export`` records the pre-dispatch (training) IR. A backend that needs ATen IR then calls
``ExportedProgram.run_decompositions(table)``, which traces the whole program a second time through AOTAutograd,
redoing all of the first trace's symbolic-shape work (``torch.onnx.export`` does this with its own table).
:func:`export_decomposed` asks torch.export for the ATen IR straight away (its ``pre_dispatch=False`` path)
with the backend's table, so the model is traced once. Tiny Mamba2, ONNX: 20.7 -> 16.9 CPU s for the prefill
program, 24.1 -> 16.1 for the decode program.

The table is applied as ``run_decompositions`` applies it: its composite-implicit entries through
``_override_composite_implicit_decomp`` (composite ops it leaves out are kept whole), the others as
AOTAutograd decompositions. ``torch.onnx.export`` retraces under ``backed_size_oblivious`` (a decomposition
does not specialise a size to 0 or 1), so those AOTAutograd decompositions run under it here too. The model's
own code, and the composite ops, are traced as torch.export traces them: not size-oblivious.

ExecuTorch (:class:`engine.ExecutorchExporter`, ``ExecutorchConfig.single_trace``) traces with its lowering's
table the same way, less the ops its partitioner may keep whole and those its FX fixes rewrite
(:func:`engine.executorch_lowering.trace_table`), and runs the decompositions as ``run_decompositions`` does (not
size-oblivious); the lowering then decomposes again only where a kept node is one the partitioner does not take.

This reaches into private torch.export functions (``torch/export/_trace.py``, ``exported_program.py``);
:func:`single_trace_supported` says whether the installed torch has them, and callers fall back to the two
passes where it does not.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch

from engine.swap import swap_attributes

#: ``graph_module.meta`` key of a program traced by :func:`export_decomposed`: the ops of its table
DECOMPOSED_WITH = "engine.decomposed_with"


@functools.cache
def single_trace_supported() -> bool:
    """Whether the installed torch has the private hooks :func:`export_decomposed` needs."""
    try:
        from torch.export import _trace
        from torch.export.exported_program import (  # noqa: F401
            _override_composite_implicit_decomp,
            _split_decomp_table_to_cia_and_python_decomp,
        )
    except ImportError:
        return False
    export_parameters = inspect.signature(_trace._export).parameters
    return "pre_dispatch" in export_parameters and "decomp_table" in inspect.signature(_trace._export_to_aten_ir).parameters


def export_decomposed(
    model: torch.nn.Module,
    kwargs: Mapping[str, Any],
    decomp_table: Mapping[Any, Callable],
    *,
    dynamic_shapes: Any = None,
    strict: bool = False,
    prefer_deferred_runtime_asserts_over_guards: bool = False,
    size_oblivious: bool = True,
) -> torch.export.ExportedProgram:
    """``torch.export.export(model, (), kwargs, ...)`` then ``.run_decompositions(decomp_table)``, in one trace.
    ``size_oblivious``: run the table's decompositions under ``backed_size_oblivious``, as ``torch.onnx.export``
    retraces (``False``: as ``run_decompositions`` itself runs them)."""
    from torch.export import _trace
    from torch.export.exported_program import _override_composite_implicit_decomp

    composite_decompositions, post_autograd_decompositions = _split_table(decomp_table, size_oblivious)
    to_aten = _trace._export_to_aten_ir

    def export_to_aten_ir(*args, decomp_table=None, **kw):
        return to_aten(*args, decomp_table=post_autograd_decompositions if decomp_table is None else decomp_table, **kw)

    # _export reads _export_to_aten_ir by name when it builds its tracing function
    with swap_attributes([(_trace, "_export_to_aten_ir", export_to_aten_ir)]), \
            _override_composite_implicit_decomp(composite_decompositions):
        program = _trace._export(
            model,
            (),
            dict(kwargs),
            dynamic_shapes,
            strict=strict,
            pre_dispatch=False,
            prefer_deferred_runtime_asserts_over_guards=prefer_deferred_runtime_asserts_over_guards,
        )
    program.graph_module.meta[DECOMPOSED_WITH] = frozenset(decomp_table)
    return program


def loaded_op_count() -> int:
    """How many operators the dispatcher knows: a newly loaded op library (torchvision, a model's custom ops)
    changes it, so caches of tables built from the dispatcher's ops key on it."""
    return len(torch._C._dispatch_get_all_op_names())


#: split tables by (the table's entries, ops the dispatcher knows): a sweep exports with the same table again and again
_SPLITS: dict[tuple[frozenset, int, bool], tuple[dict, dict]] = {}


def _split_table(decomp_table: Mapping[Any, Callable], size_oblivious: bool = True) -> tuple[dict, dict]:
    """The table's composite-implicit entries and its AOTAutograd decompositions (those run size-oblivious), as
    ``run_decompositions`` splits them; the split walks every composite op the dispatcher knows (0.065 CPU s), so
    it is done once per table."""
    from torch.export.exported_program import _split_decomp_table_to_cia_and_python_decomp

    key = (frozenset(decomp_table.items()), loaded_op_count(), size_oblivious)
    if key not in _SPLITS:
        composite, post_autograd = _split_decomp_table_to_cia_and_python_decomp(dict(decomp_table))
        if size_oblivious:
            post_autograd = {op: _size_oblivious(fn) for op, fn in post_autograd.items()}
        _SPLITS[key] = composite, post_autograd
    composite, post_autograd = _SPLITS[key]
    return dict(composite), dict(post_autograd)


def decomposed_with(program: torch.export.ExportedProgram) -> frozenset | None:
    """The ops of the table :func:`export_decomposed` traced the program with; None for any other program."""
    return program.graph_module.meta.get(DECOMPOSED_WITH)


def _size_oblivious(decomposition: Callable) -> Callable:
    """The decomposition run under ``backed_size_oblivious``, as ``torch.onnx.export`` runs its decompositions."""

    @functools.wraps(decomposition)
    def run(*args, **kwargs):
        with torch.fx.experimental._config.patch(backed_size_oblivious=True):
            return decomposition(*args, **kwargs)

    return run
