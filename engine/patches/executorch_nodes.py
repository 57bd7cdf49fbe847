"""FX node fixes of the ``"executorch"`` scope (stage 3): nodes of the traced program that ExecuTorch's edge
dialect, memory planning or XNNPACK reject or compute wrong, rewritten before lowering."""

from __future__ import annotations

import functools
import operator

import torch
from torch._dispatch.python import enable_python_dispatcher
from torch.fx.experimental.symbolic_shapes import free_symbols, free_unbacked_symbols

from engine.patches.fx_edit import insert_node, replace_node
from engine.patches.registry import register_fx_node_fix


# ── Correctness: FX node fixes ──────────────────────────────────────────────────────────────────────────────
# `_fix_<pattern>(graph_module, node) -> bool` on the traced program, before lowering.


#: uninitialised allocations, rewritten as the ``full``/``full_like`` that their zero-filled twins decompose to
_ZEROED = (torch.ops.aten.new_empty.default, torch.ops.aten.empty.memory_format, torch.ops.aten.empty_like.default)


@register_fx_node_fix("executorch", ops=_ZEROED)
def _fix_symbolic_empty_as_zeros(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Make an uninitialised allocation of a symbolic size (``new_empty``, ``empty_like``) a zero-filled one.

    Pattern: DeepSeek-V3's attention makes its keys with ``kv_nope.new_empty(...)``, filled in place;
    ExecuTorch's ``_empty_dim_order`` takes ``int[] size``, pinning batch and length to their traced values.
    Rewrite: ``full(size, 0)`` (``full_like`` for ``empty_like``), ExecuTorch's table's form of zeros, so the
    single trace needs no decomposition retrace; ``empty``'s contents are undefined, so zeros are valid. A static
    ``new_empty`` becomes the table's ``empty``; other static allocations stay. Upstream: no issue found for
    ``_empty_dim_order``'s ``int[]`` schema (TODO)."""
    val = node.meta.get("val")
    if node.op != "call_function" or node.target not in _ZEROED or not isinstance(val, torch.Tensor):
        return False
    kwargs = {"dtype": val.dtype, "layout": torch.strided, "device": val.device, "pin_memory": False}
    if not any(free_symbols(d) for d in val.shape):
        if node.target is not torch.ops.aten.new_empty.default:  # (new_empty has no memory_format)
            return False
        return replace_node(gm, node, torch.ops.aten.empty.memory_format, (node.args[1],), kwargs)
    memory_format = node.kwargs.get("memory_format")
    if memory_format not in (None, torch.contiguous_format, torch.preserve_format):
        return False
    zero = False if val.dtype == torch.bool else 0
    if node.target is torch.ops.aten.empty_like.default:
        return replace_node(gm, node, torch.ops.aten.full_like.default, (node.args[0], zero),
                            {"dtype": val.dtype, "pin_memory": False,
                             "memory_format": memory_format or torch.preserve_format})
    size = node.args[1] if node.target is torch.ops.aten.new_empty.default else node.args[0]
    return replace_node(gm, node, torch.ops.aten.full.default, (size, zero), kwargs)


@register_fx_node_fix("executorch")
def _fix_data_sized_view_of_a_copy(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Make a ``view`` of a tensor whose size only data gives a view of its contiguous copy.

    Pattern: Qwen2.5-Omni's audio tower views a tensor of ``32*u21*((u22 - 1)//2 + 1)`` elements (sizes the audio
    chunks give) as ``(-1, 32)``. The trace took the view size-obliviously; the lowering's decomposition retrace
    computes its strides again, cannot prove the input contiguous at sizes it does not know, and raises
    GuardOnDataDependentSymNode (torch 2.14's fake view retries non-obliviously to raise it). A contiguous copy is
    viewable at any sizes: the same values, at a copy. Related upstream: https://github.com/pytorch/pytorch/issues/148519
    (the view reference failing on data-dependent sizes)."""
    if node.op != "call_function" or node.target is not torch.ops.aten.view.default:
        return False
    source = node.args[0]
    val = getattr(source, "meta", {}).get("val")
    if not isinstance(val, torch.Tensor) or not any(free_unbacked_symbols(d) for d in val.shape):
        return False
    if source.op == "call_function" and source.target is torch.ops.aten.clone.default:  # a copy already
        return False
    copy = insert_node(gm, node, torch.ops.aten.clone.default, source, memory_format=torch.contiguous_format)
    node.replace_input_with(source, copy)
    return True


#: ops whose ``index`` argument (by position) ExecuTorch's edge dialect takes only as int64
_INDEXED = {op: 2 for op in (torch.ops.aten.scatter_add.default, torch.ops.aten.scatter.src, torch.ops.aten.scatter.value,
                             torch.ops.aten.scatter_reduce.two, torch.ops.aten.gather.default,
                             torch.ops.aten.scatter_add_.default, torch.ops.aten.scatter_.src,
                             torch.ops.aten.scatter_.value, torch.ops.aten.scatter_reduce_.two)}


@register_fx_node_fix("executorch")
def _fix_int32_scatter_index_as_int64(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Cast an int32 ``index`` of ``scatter``/``scatter_add``/``scatter_reduce``/``gather`` to int64.

    Pattern: GLM-5-Next's top-k attention mask counts the selected keys with ``counts.scatter_add_(-1, indices,
    ones)`` on int32 indices, which torch accepts; ExecuTorch's edge verifier allows only int64 indices for these
    ops ("These operators are taking Tensor inputs with mismatched dtypes: aten.scatter_add.default ... 'index':
    torch.int32"). The same indices as int64 select the same elements. TODO: upstream issue not found.
    """
    position = _INDEXED.get(node.target) if node.op == "call_function" else None
    if position is None or len(node.args) <= position or not isinstance(node.args[position], torch.fx.Node):
        return False
    index = node.args[position]
    if getattr(index.meta.get("val"), "dtype", None) != torch.int32:
        return False

    node.update_arg(position, insert_node(gm, node, torch.ops.aten._to_copy.default, index, dtype=torch.int64))
    return True


@register_fx_node_fix("executorch")
def _fix_cat_of_empty_tensors_as_full(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Make a ``torch.cat`` of only empty inputs, with symbolic sizes, an ``aten.full`` of its shape whose sizes are graph
    nodes (the inputs' ``sym_size``, summed along the cat dim).

    Pattern: a no-rope layer's zero-width rotary half, ``(batch, heads, length, 0)``, concatenated with the past.
    ExecuTorch's ``PruneEmptyTensorsPass`` makes it ``aten.full(tuple(shape), 0)`` with ``SymInt`` values, and the
    emitter fails: "Unsupported type encountered in int list" (left a cat, the runtime misshapes the output). TODO:
    upstream issue not found (executorch/exir/passes/prune_empty_tensors_pass.py, introduced by
    https://github.com/pytorch/executorch/pull/7954)."""
    if node.op != "call_function" or node.target is not torch.ops.aten.cat.default:
        return False
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    inputs = node.args[0]
    out = node.meta.get("val")
    if not isinstance(out, torch.Tensor) or not free_symbols(out.shape) or not all(
            isinstance(i, torch.fx.Node) and statically_known_true(i.meta["val"].numel() == 0) for i in inputs):
        return False
    dim = (node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)) % out.dim()
    inputs = [i for i in inputs if i.meta["val"].dim() == out.dim()]  # torch.cat skips legacy 1-D (0,) tensors
    if not inputs:
        return False

    def size_of(tensor: torch.fx.Node, d: int):  # an int, or a sym_size node of a symbolic size
        size = tensor.meta["val"].shape[d]
        return insert_node(gm, node, torch.ops.aten.sym_size.int, tensor, d) if free_symbols(size) else int(size)

    def add(a, b):
        return a + b if isinstance(a, int) and isinstance(b, int) else insert_node(gm, node, operator.add, a, b)

    sizes = [functools.reduce(add, (size_of(t, d) for t in inputs), 0) if d == dim else size_of(inputs[0], d)
             for d in range(out.dim())]
    return replace_node(gm, node, torch.ops.aten.full.default, (sizes, 0), {"dtype": out.dtype, "device": out.device})


_SORTS = (torch.ops.aten.sort.default, torch.ops.aten.sort.stable)


_ARGSORTS = (torch.ops.aten.argsort.default, torch.ops.aten.argsort.stable)


@register_fx_node_fix("executorch")
def _fix_sort_as_topk(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Make ``torch.sort(x, dim, descending)`` (and ``torch.argsort``) a ``torch.topk(x, x.shape[dim], dim,
    largest=descending)``.

    Pattern: JetMoE sorts its routed expert ids, SAM-HQ its point scores. ExecuTorch's portable kernels have no ``sort``
    (``kernel 'aten::sort.values' not found``: the method fails to load with 0x14) but have ``topk``, which with ``k``
    the whole dim and ``sorted=True`` returns the same values and indices (ties in either order, as an unstable ``sort``
    may). A stable sort (``stable=True``) keeps its ``sort``. Upstream: no issue found for a portable ``sort`` kernel in
    ExecuTorch (TODO)."""
    if node.op != "call_function" or node.target not in (*_SORTS, *_ARGSORTS) or node.kwargs.get("stable"):
        return False
    source = node.args[0]
    src_val = source.meta.get("val") if isinstance(source, torch.fx.Node) else None
    if not isinstance(src_val, torch.Tensor) or src_val.dim() == 0:
        return False
    # sort/argsort.default(self, dim=-1, descending=False); .stable(self, *, stable, dim=-1, descending=False)
    positional = node.args[1:] if node.target in (torch.ops.aten.sort.default, torch.ops.aten.argsort.default) else ()
    dim = positional[0] if len(positional) > 0 else node.kwargs.get("dim", -1)
    descending = positional[1] if len(positional) > 1 else node.kwargs.get("descending", False)
    length = src_val.shape[dim]
    with gm.graph.inserting_before(node):
        if free_symbols(length):
            k = gm.graph.call_function(torch.ops.aten.sym_size.int, (source, dim % src_val.dim()))
            k.meta["val"] = length
        else:
            k = int(length)
    topk_args = (source, k, dim, bool(descending), True)
    if node.target in _SORTS:  # same (values, indices) outputs
        return replace_node(gm, node, torch.ops.aten.topk.default, topk_args, {})
    # argsort: the indices of topk
    with gm.graph.inserting_before(node):
        topk = gm.graph.call_function(torch.ops.aten.topk.default, topk_args)
    topk.meta.update({**node.meta, "val": (src_val, node.meta.get("val"))})
    return replace_node(gm, node, operator.getitem, (topk, 1), {})


#: node meta key marking a modulo this module already rewrote (the fixes may run over a graph twice)
_FLOORED = "engine.floored_mod"


@register_fx_node_fix("executorch")
def _fix_symbolic_mod_as_floored(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Make ``a % b`` of symbolic sizes ``((a % b) + b) % b``.

    Pattern: padding a length to a multiple of a block, ``pad = (-length) % block`` (LongT5's local attention). Python's
    ``%`` is floored (``-24 % 128 == 104``); ExecuTorch's ``executorch_prim::mod`` computes C's truncated remainder
    (``-24``): LongT5's padded length came out 0, then a block count of 0, and dividing by it killed the process
    (SIGFPE). ``((a % b) + b) % b`` is the floored remainder under both rules, for every sign. TODO: upstream issue not
    found (``kernels/prim_ops/register_prim_ops.cpp`` computes ``a.toInt() % b.toInt()``; its floordiv is floored)."""
    if node.op != "call_function" or node.target is not operator.mod or node.meta.get(_FLOORED):
        return False
    a, b = node.args
    values = [x.meta.get("val") if isinstance(x, torch.fx.Node) else x for x in (a, b)]
    if not any(isinstance(v, torch.SymInt) for v in values) or not all(isinstance(v, (int, torch.SymInt)) for v in values):
        return False
    graph = gm.graph
    with graph.inserting_before(node):
        remainder = graph.call_function(operator.mod, (a, b))
        shifted = graph.call_function(operator.add, (remainder, b))
        floored = graph.call_function(operator.mod, (shifted, b))
    remainder.meta["val"] = values[0] % values[1]
    shifted.meta["val"] = remainder.meta["val"] + values[1]
    floored.meta.update(node.meta)
    for rewritten in (remainder, floored):
        rewritten.meta[_FLOORED] = True
    node.replace_all_uses_with(floored)
    return True


_CONSTANT_PADS = (torch.ops.aten.pad.default, torch.ops.aten.constant_pad_nd.default)


@register_fx_node_fix("executorch")
def _fix_negative_pad_as_slice(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Make a constant pad with negative amounts a slice (the crop), then a pad by the positive amounts.

    Pattern: a model shifts a sequence by one step with ``nn.ZeroPad2d((0, 0, 1, -1))`` (RWKV's time shift): a
    negative pad crops that end, as torch allows. ExecuTorch's ``constant_pad_nd`` kernel rejects it ("Padding values
    must be non-negative", 0x12 at run time). A slice from ``-left`` to ``right`` (a negative end) crops the same
    rows. TODO: upstream issue not found (``kernels/portable/cpu/util/kernel_ops_util.cpp`` checks ``pad[i] >= 0``).
    """
    if node.op != "call_function" or node.target not in _CONSTANT_PADS:
        return False
    x, pad, *rest = node.args
    if node.target is torch.ops.aten.pad.default:
        mode = rest[0] if rest else node.kwargs.get("mode", "constant")
        value = rest[1] if len(rest) > 1 else node.kwargs.get("value")
        if mode != "constant":
            return False
    else:
        value = rest[0] if rest else node.kwargs.get("value", 0)
    value = 0.0 if value is None else value
    current_val = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
    fake_mode = getattr(current_val, "fake_mode", None)
    if fake_mode is None or not all(isinstance(p, int) for p in pad) or min(pad, default=0) >= 0:
        return False
    graph, current = gm.graph, x
    carried = {k: v for k, v in node.meta.items() if k != "val"}
    steps = []
    for i in range(len(pad) // 2):  # pad pairs run from the last dim backwards
        left, right = pad[2 * i], pad[2 * i + 1]
        if left < 0 or right < 0:
            dim = current_val.dim() - 1 - i
            steps.append((torch.ops.aten.slice.Tensor, (dim, max(-left, 0), right if right < 0 else torch.iinfo(torch.int64).max)))
    if any(p > 0 for p in pad):
        steps.append((torch.ops.aten.constant_pad_nd.default, ([max(p, 0) for p in pad], value)))
    with graph.inserting_before(node):
        for op, args in steps:
            current = graph.call_function(op, (current, *args))
            with fake_mode, enable_python_dispatcher():  # the symbolic meta kernels, as export's: the C++ ones pin sizes
                current_val = op(current_val, *args)
            current.meta.update(carried)
            current.meta["val"] = current_val
    node.replace_all_uses_with(current)
    return True
