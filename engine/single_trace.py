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

Its symbolic work is budgeted (:func:`symbolic_work_budget`): where the decomposed ops' size probes meet deeply
nested size expressions, the single trace can cost far more than the two passes, and it is abandoned for them.

This reaches into private torch.export functions (``torch/export/_trace.py``, ``exported_program.py``);
:func:`single_trace_supported` says whether the installed torch has them, and callers fall back to the two
passes where it does not.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
from collections.abc import Callable, Iterator, Mapping
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
            _override_composite_implicit_decomp(composite_decompositions), symbolic_work_budget() as budget:
        try:
            program = _trace._export(
                model,
                (),
                dict(kwargs),
                dynamic_shapes,
                strict=strict,
                pre_dispatch=False,
                prefer_deferred_runtime_asserts_over_guards=prefer_deferred_runtime_asserts_over_guards,
            )
        except Exception as e:
            if budget.exceeded:  # however torch wrapped it on the way out
                raise SymbolicWorkExceeded(budget.spent) from e
            raise
    program.graph_module.meta[DECOMPOSED_WITH] = frozenset(decomp_table)
    return program


#: interval-analysis steps (sympy handler runs of ``bound_sympy``) above which one size expression counts as deep
DEEP_EXPRESSION_STEPS = 1_000
#: the steps a single trace may spend on deep size expressions before it is abandoned for the two passes
SYMBOLIC_WORK_BUDGET = 250_000


class SymbolicWorkExceeded(Exception):
    """The decomposing single trace spent :data:`SYMBOLIC_WORK_BUDGET` on deep size expressions."""

    def __init__(self, spent: int):
        super().__init__(f"the single trace spent {spent:,} interval-analysis steps on size expressions of over "
                         f"{DEEP_EXPRESSION_STEPS:,} steps each (budget {SYMBOLIC_WORK_BUDGET:,})")


@dataclasses.dataclass
class _Budget:
    spent: int = 0  # steps taken by deep size expressions

    @property
    def exceeded(self) -> bool:
        return self.spent > SYMBOLIC_WORK_BUDGET


@contextlib.contextmanager
def symbolic_work_budget() -> Iterator[_Budget]:
    """Count the value-range steps ``bound_sympy`` takes per size expression; past the budget, every later call
    raises :class:`SymbolicWorkExceeded`. Counted in steps, not seconds, so that every machine decides alike.

    Why: a decomposed op's layout probes (``empty_like``, contiguity checks) bound its sizes, and where those are
    nested floor divisions (strided convs in sequence) each probe can take seconds: EfficientLoFTR's keypoint
    matcher ran past 600 s in the single trace and exports in 31 s in the two passes. The budget is far above what
    the slowest passing single traces spend (Florence-2's ONNX trace: 8 deep expressions, under 40,000 steps; its
    ExecuTorch trace does not reach the budget either)."""
    from torch.fx.experimental import symbolic_shapes
    from torch.utils._sympy import interp, value_ranges

    budget, steps = _Budget(), [0]
    run_handler, bound_sympy = interp._run_sympy_handler, value_ranges.bound_sympy

    def counted_handler(*args, **kwargs):
        steps[0] += 1
        return run_handler(*args, **kwargs)

    def budgeted_bound_sympy(expr, ranges=None):
        if budget.exceeded:
            raise SymbolicWorkExceeded(budget.spent)
        start = steps[0]
        result = bound_sympy(expr, ranges)
        taken = steps[0] - start
        if taken > DEEP_EXPRESSION_STEPS:
            budget.spent += taken
            if budget.exceeded:
                raise SymbolicWorkExceeded(budget.spent)
        return result

    with swap_attributes([(interp, "_run_sympy_handler", counted_handler),
                          (value_ranges, "bound_sympy", budgeted_bound_sympy),
                          (symbolic_shapes, "bound_sympy", budgeted_bound_sympy)]):
        yield budget


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
