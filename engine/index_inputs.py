"""Inputs a program uses as indices, and the check that their values lie where eager takes them.

Eager refuses an index outside ``[0, rows)`` of an ``embedding``, ``index_select``, ``gather`` or ``one_hot``;
exported, ONNX's ``Gather`` wraps ``-1`` to the last row and ExecuTorch fails with error 0x12. So the user inputs
reaching such an op (through views and casts) are found in the graph (:func:`find_index_inputs`), recorded in the
ONNX and ExecuTorch metadata, and every runner checks their values (:func:`check_index_values`).
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import Any

import torch

from engine.errors import InputError

aten = torch.ops.aten

#: op -> (position of its index argument, a function of the node giving the size of the table it indexes)
_INDEX_OPS = {
    aten.embedding.default: (1, lambda node: _size(node.args[0], 0)),
    aten.index_select.default: (2, lambda node: _size(node.args[0], node.args[1])),
    aten.gather.default: (2, lambda node: _size(node.args[0], node.args[1])),
    aten.one_hot.default: (0, lambda node: node.args[1] if len(node.args) > 1 and node.args[1] >= 0 else None),
}
#: ops that pass their first argument's values on unchanged (reshaped, repeated, cast between integer types)
_TRANSPARENT = {
    aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.unsqueeze.default, aten.squeeze.dim,
    aten.squeeze.dims, aten.squeeze.default, aten.expand.default, aten.flatten.using_ints, aten.clone.default,
    aten.contiguous.default, aten._to_copy.default, aten.to.dtype, aten.alias.default, aten.permute.default,
    aten.transpose.int, aten.t.default, aten.lift_fresh_copy.default, aten.view_copy.default,
    aten.expand_copy.default, aten.unsqueeze_copy.default, aten.squeeze_copy.dims, aten.permute_copy.default,
}

_FOUND: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _size(node: Any, dim: Any) -> int | None:
    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    if not isinstance(value, torch.Tensor) or not isinstance(dim, int):
        return None
    size = value.shape[dim]
    return size if isinstance(size, int) else None


def _op(node: torch.fx.Node) -> Any:
    """The op a node had before decomposition (a trace straight to core ATen records it), else its target."""
    return node.meta.get("original_aten") or node.target


def _source_input(node: Any, placeholders: Mapping[str, str]) -> str | None:
    """The leaf name of the user input whose values ``node`` carries unchanged, or None."""
    while isinstance(node, torch.fx.Node):
        if node.op == "placeholder":
            return placeholders.get(node.name)
        if node.op != "call_function" or node.target not in _TRANSPARENT or not node.args:
            return None
        node = node.args[0]
    return None


def find_index_inputs(program: torch.export.ExportedProgram) -> dict[str, list]:
    """``{leaf name: [low, high, op]}``: the user inputs ``program`` indexes with, each value to lie in
    ``[low, high)`` (the smallest table when several ops use it), ``op`` the first such op's name."""
    if program in _FOUND:
        return _FOUND[program]
    from engine.input_checks import placeholder_leaf_names

    placeholders = placeholder_leaf_names(program)
    found: dict[str, list] = {}
    for node in program.graph.nodes:
        if node.op != "call_function":
            continue
        rule = _INDEX_OPS.get(_op(node))
        if rule is None or len(node.args) <= rule[0]:
            continue
        leaf = _source_input(node.args[rule[0]], placeholders)
        size = rule[1](node) if leaf is not None else None
        if size is None:
            continue
        if leaf in found:
            found[leaf][1] = min(found[leaf][1], size)
        else:
            found[leaf] = [0, size, str(_op(node).name()).removeprefix("aten::")]
    _FOUND[program] = found
    return found


def check_index_values(label: str, index_inputs: Mapping[str, list], leaves: Mapping[str, torch.Tensor]) -> None:
    """:class:`InputError` for the first input of ``index_inputs`` holding a value outside its range."""
    for leaf, (low, high, op) in index_inputs.items():
        tensor = leaves.get(leaf)
        if not isinstance(tensor, torch.Tensor) or tensor.numel() == 0 or tensor.is_floating_point():
            continue
        smallest, largest = torch.aminmax(tensor)
        bad = int(smallest) if int(smallest) < low else int(largest) if int(largest) >= high else None
        if bad is not None:
            raise InputError(f"{label}: input {leaf} holds {bad}, outside [{low}, {high}): the program uses it as an "
                             f"index into {high} rows ({op}), as eager does, which refuses it", input=leaf,
                             problem="index")
