"""Forward-signature flattening and model-state clean-up around a trace.

``torch.export`` binds sample inputs to ``inspect.signature(model.forward)``. A transformers forward takes
most of its arguments through ``**kwargs``, which torch.export would see as one opaque dict. During the
trace the instance gets an explicit forward whose parameters are exactly the traced input names, in order,
and which binds the output flags (``use_cache=...``) as constants. Nothing of it survives the context.

Tracing may also leave FakeTensors in module attributes a forward caches on ``self`` (rotary tables, cached
keys, ...). :func:`restore_module_state` snapshots every module's plain attributes and buffers and puts back
whatever the trace replaced, so an eager forward after export still works.

:func:`call_program` is the other side of the signature: a traced program called by it, without unlifting.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensor
from torch.export.graph_signature import OutputKind

from engine.swap import swap_attributes
from engine.pytree import in_field_order, is_cache_object, iter_leaf_tensors

_SKIP_ATTRS = frozenset({"_parameters", "_buffers", "_modules", "training"})


@contextlib.contextmanager
def flat_forward(model: torch.nn.Module, input_names: list[str], flags: dict[str, Any]) -> Iterator[None]:
    """Give ``model`` an explicit ``forward(<input_names>)`` that calls the original with ``**flags`` bound, and
    returns its ModelOutputs with their keys in declaration order (:func:`engine.pytree.in_field_order`)."""
    original = model.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        bound = dict(zip(input_names, args))
        bound.update(kwargs)
        return in_field_order(original(**bound, **flags))

    forward.__signature__ = inspect.Signature(
        [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in input_names]
    )
    forward.__name__ = "forward"
    with swap_attributes([(model, "forward", forward)]):
        yield


def _has_fake(value: Any) -> bool:
    if isinstance(value, FakeTensor):
        return True
    if isinstance(value, (dict, list, tuple)) or is_cache_object(value):
        return any(isinstance(t, FakeTensor) for _, t in iter_leaf_tensors(value))
    return False


@contextlib.contextmanager
def restore_module_state(model: torch.nn.Module) -> Iterator[None]:
    """Undo attribute and buffer changes that tracing left behind as FakeTensors."""
    snapshot = []
    for module in model.modules():
        attrs = {k: v for k, v in vars(module).items() if k not in _SKIP_ATTRS}
        snapshot.append((module, attrs, dict(module._buffers)))
    try:
        yield
    finally:
        for module, attrs, buffers in snapshot:
            for name in [k for k in vars(module) if k not in _SKIP_ATTRS]:
                value = vars(module)[name]
                if _has_fake(value):
                    if name in attrs:
                        vars(module)[name] = attrs[name]
                    else:
                        del vars(module)[name]
            for name, value in list(module._buffers.items()):
                if isinstance(value, FakeTensor) and name in buffers:
                    module._buffers[name] = buffers[name]


def call_program(program: torch.export.ExportedProgram, inputs: dict[str, Any]) -> Any:
    """``program.module()(**inputs)`` without the module: the graph called on its lifted state and the flat inputs
    (torch's calling convention, ``ExportedProgram._graph_module_flat_inputs``, which checks the input tree and
    the range constraints). ``module()`` unlifts: it copies the graph and recompiles it, which at a sample's size
    costs 5-30x the call (0.12 s against 0.016 for a tiny Whisper). A program with guard code (``_guards_code``,
    relations of input sizes that only the module's ``_guards_fn`` checks) is called through the module. Mutated
    buffers are not written back: for one call, the outputs are the module's."""
    if getattr(program, "_guards_code", None):
        return program.module()(**inputs)
    flat = program._graph_module_flat_inputs((), dict(inputs))
    outputs = program.graph_module(*flat)
    user = [out for out, spec in zip(outputs, program.graph_signature.output_specs) if spec.kind == OutputKind.USER_OUTPUT]
    return pytree.tree_unflatten(user, program.call_spec.out_spec)
