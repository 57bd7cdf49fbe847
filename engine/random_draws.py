"""Random draws of a forward as program inputs, drawn by the runner on torch's generator.

Some forwards sample at inference: VibeVoice's latent noise (``randn_like``), SpeechT5's always-on prenet dropout
(``bernoulli``), Informer's key sampling (``randint``). A ``.pt2`` runs them on torch's generator, as eager does. An
ONNX model or a ``.pte`` cannot: onnxruntime registers no kernel for ``RandomNormalLike``/``RandomUniformLike`` at
opset 22 (https://github.com/microsoft/onnxruntime/pull/32201), ExecuTorch's edge dialect refuses them as outside
Core ATen (https://github.com/pytorch/pytorch/issues/158113), and where they ran they would draw other numbers than
eager. So the ONNX and ExecuTorch exporters make each draw a program input (:func:`lift_random_draws`, named
``random_draw_<i>``) and record the op, its arguments and its shape as expressions over the input dims; the runners
make the same calls on torch's generator (:func:`draw_inputs`) in the program's order, so a seeded run computes what
seeded eager computes, and a caller of onnxruntime may pass noise of its own. A program with a draw whose size
depends on data (VITS's durations) keeps all its draws: they consume one sequence.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from engine import shape_guards

#: leaf name of the i-th lifted draw
DRAW_INPUT = "random_draw_{}"

_aten = torch.ops.aten
#: ops whose result depends only on their sizes and scalar arguments (not on tensor values)
LIFTABLE = frozenset({
    _aten.rand.default, _aten.randn.default, _aten.rand_like.default, _aten.randn_like.default,
    _aten.randint.default, _aten.randint.low, _aten.randint_like.default, _aten.randint_like.low_dtype,
    _aten.bernoulli.p, _aten.normal.float_float, _aten.randperm.default,
})
#: arguments that place the draw (the runner draws on CPU, contiguous) rather than define it
_PLACEMENT = frozenset({"device", "layout", "pin_memory", "memory_format"})


class _NotLiftable(Exception):
    pass


def _size(value: Any, dims: Mapping[str, list]) -> int | dict:
    """A size: an int, or ``{"size": expression}`` over input-dim symbols."""
    from torch.utils._sympy.printers import PythonPrinter

    if isinstance(value, torch.fx.Node):
        value = value.meta.get("val")
    if isinstance(value, int):
        return value
    if not isinstance(value, torch.SymInt):
        raise _NotLiftable(f"not a size: {value!r}")
    expr = value.node.expr
    if expr.is_number:
        return int(expr)
    if not {str(s) for s in expr.free_symbols} <= dims.keys():  # data-dependent (an unbacked symbol)
        raise _NotLiftable(f"size {expr} is not a function of the input dims")
    return {"size": PythonPrinter().doprint(expr)}


def _encode(value: Any, dims: Mapping[str, list]) -> Any:
    """An argument as JSON: a tensor by its shape, strides and dtype (its values do not matter to the op), sizes as
    :func:`_size`, a dtype by name; numbers, bools and None as they are."""
    if isinstance(value, torch.fx.Node):
        val = value.meta.get("val")
        if isinstance(val, torch.Tensor):
            return {"like": [_size(s, dims) for s in val.shape], "stride": [_size(s, dims) for s in val.stride()],
                    "dtype": str(val.dtype).removeprefix("torch.")}
        return _size(value, dims)
    if isinstance(value, (list, tuple)):
        return [_encode(v, dims) for v in value]
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    if isinstance(value, torch.SymInt):
        return _size(value, dims)
    if value is None or isinstance(value, (bool, int, float)):
        return value
    raise _NotLiftable(f"argument {value!r}")


def _decode(value: Any, sizes: Mapping[str, int]) -> Any:
    if isinstance(value, list):
        return [_decode(v, sizes) for v in value]
    if not isinstance(value, dict):
        return value
    if "size" in value:
        return shape_guards.size_of(value["size"], sizes)
    dtype = getattr(torch, value["dtype"])
    if "like" in value:  # with its strides: a ``*_like`` draw fills memory in their order (a transposed latent)
        return torch.empty_strided(_decode(value["like"], sizes), _decode(value["stride"], sizes), dtype=dtype)
    return dtype


def _draw_record(node: torch.fx.Node, dims: Mapping[str, list]) -> dict:
    if node.kwargs.get("generator") is not None:
        raise _NotLiftable("a draw from a generator of its own")
    return {"op": f"aten.{node.target._schema.name.removeprefix('aten::')}.{node.target._overloadname}",
            "args": _encode(list(node.args), dims),
            "kwargs": {k: _encode(v, dims) for k, v in node.kwargs.items() if k not in _PLACEMENT}}


def _as_laid_out(gm: torch.fx.GraphModule, node: torch.fx.Node, placeholder: torch.fx.Node) -> torch.fx.Node:
    """``placeholder`` (contiguous: what a runtime is fed) given the layout of the draw ``node`` made: a ``*_like``
    draw of a transposed tensor is transposed, and the ops after it (ExecuTorch's kernels check dim orders) expect
    that layout. Made as permute, contiguous copy, permute back."""
    from engine.patches.fx_edit import insert_node

    val = node.meta["val"]
    with val.fake_mode:
        placeholder.meta["val"] = val.contiguous()
    order = list(val.dim_order())
    if order == sorted(order):
        return placeholder
    inverse = sorted(range(len(order)), key=order.__getitem__)
    permuted = insert_node(gm, node, _aten.permute.default, placeholder, order)
    copied = insert_node(gm, node, _aten.clone.default, permuted, memory_format=torch.contiguous_format)
    return insert_node(gm, node, _aten.permute.default, copied, inverse)


def _example(val: torch.Tensor) -> torch.Tensor:
    """Zeros shaped as ``val`` at its traced sizes."""
    from torch.fx.experimental.symbolic_shapes import optimization_hint

    return torch.zeros([optimization_hint(s) for s in val.shape], dtype=val.dtype)


def _draws_unliftably(node: torch.fx.Node) -> bool:
    """A draw :data:`LIFTABLE` does not cover (``multinomial`` of computed weights); dropout outside training and
    attention without dropout (seeded ops by their tags) draw nothing."""
    target = node.target
    if node.op != "call_function" or target in LIFTABLE or torch.Tag.nondeterministic_seeded not in getattr(target, "tags", ()):
        return False
    names = [a.name for a in target._schema.arguments]
    bound = {**dict(zip(names, node.args)), **node.kwargs}
    if "dropout_p" in names:
        return bound.get("dropout_p", 0.0) != 0
    return not ("train" in names and bound.get("train") is False)


def lift_random_draws(program: torch.export.ExportedProgram) -> dict | None:
    """Make every random draw of ``program`` a user input (in place); the record :func:`draw_inputs` takes, or None
    when the program draws nothing or a draw cannot be lifted (its size depends on data, it has a generator of its
    own, or the inputs cannot be named)."""
    from torch.export.graph_signature import TensorArgument

    graph = program.graph_module.graph
    nodes = [n for n in graph.nodes if n.op == "call_function" and n.target in LIFTABLE]
    dims = shape_guards.input_dims(program) if nodes else None
    if not nodes or dims is None or not program.module_call_graph or any(map(_draws_unliftably, graph.nodes)):
        return None
    try:
        draws = [_draw_record(node, dims) for node in nodes]
    except _NotLiftable:
        return None
    last = [n for n in graph.nodes if n.op == "placeholder"][-1]
    for i, (node, draw) in enumerate(zip(nodes, draws)):
        draw["input"] = DRAW_INPUT.format(i)
        with graph.inserting_after(last):
            last = graph.placeholder(draw["input"])
        node.replace_all_uses_with(_as_laid_out(program.graph_module, node, last))
        for spec in program.graph_signature.output_specs:  # a draw returned as it is
            if isinstance(spec.arg, TensorArgument) and spec.arg.name == node.name:
                spec.arg = TensorArgument(last.name)
        graph.erase_node(node)
        _add_keyword_input(program, draw["input"], last)
    program.graph_module.recompile()
    return {"draws": draws, "dims": dims}


def _add_keyword_input(program: torch.export.ExportedProgram, name: str, placeholder: torch.fx.Node) -> None:
    """Make ``placeholder`` the program's last user input, taken as the keyword argument ``name``: in the graph
    signature, the call signature (its tree spec, and the argument names of the unlifted module's forward) and
    the example inputs that ``program.module()`` binds."""
    import torch.utils._pytree as pytree
    from torch.export.graph_signature import InputKind, InputSpec, TensorArgument

    program.graph_signature.input_specs.append(InputSpec(InputKind.USER_INPUT, TensorArgument(placeholder.name), None))
    signature = program.module_call_graph[0].signature
    signature.inputs.append(TensorArgument(placeholder.name))
    args, kwargs = pytree.tree_unflatten(list(range(signature.in_spec.num_leaves)), signature.in_spec)
    signature.in_spec = pytree.tree_structure((args, {**kwargs, name: -1}))
    if signature.forward_arg_names is not None:
        signature.forward_arg_names.append(name)
    if program.example_inputs is not None:
        example_args, example_kwargs = program.example_inputs
        program._example_inputs = (example_args, {**example_kwargs, name: _example(placeholder.meta["val"])})


def draw_inputs(record: Mapping[str, Any] | None, given: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``{input name: tensor}``: each recorded draw made on torch's generator at the sizes of the given leaves, in the
    program's order; a draw the caller gave (its input name among ``given``) is taken as given."""
    if not record:
        return {}
    sizes = shape_guards.dim_sizes(record["dims"], given)
    out = {}
    for draw in record["draws"]:
        if draw["input"] in given:
            continue
        namespace, name, overload = draw["op"].split(".")
        op = getattr(getattr(getattr(torch.ops, namespace), name), overload)
        out[draw["input"]] = op(*_decode(draw["args"], sizes), **{k: _decode(v, sizes) for k, v in draw["kwargs"].items()})
    return out
