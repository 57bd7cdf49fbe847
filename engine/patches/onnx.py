"""ONNX patches, FX node fixes and the decomposition table of :class:`engine.OnnxExporter`.

Registered for ``"onnx"``: every patch is active while :meth:`DynamoExporter.trace` traces (stage 2) and around
``torch.onnx.export`` and the optimizer (stage 4); the node fixes rewrite the traced program (stage 3) and, through
``_patch_prepare_for_export``, the decomposed one. Aten ops torchlib lowers wrong or not at all are translated in
:mod:`engine.patches.onnx_translations`. Each exists because a test model needs it; its docstring names the
pattern and the upstream issue.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from typing import Any

import torch

from engine.patches.registry import apply_fx_node_fixes, register_fx_node_fix, register_patch, registered_patches
from engine.single_trace import decomposed_with, loaded_op_count

#: the opset being exported to, for the patches whose need depends on it (set by OnnxExporter.export)
TARGET_OPSET: contextvars.ContextVar[int | None] = contextvars.ContextVar("target_opset", default=None)


#: first opset with the ONNX ``Attention`` op, which torch.onnx lowers SDPA to from there on
ATTENTION_OPSET = 23


# ── Correctness: torch functions the model calls ────────────────────────────────────────────────────────────
# Swapped while tracing, so the traced graph has a pattern ONNX lowers correctly.


@register_patch("onnx", "torch.nn.functional.scaled_dot_product_attention", requires={"onnxscript": "<0.8"})
def _patch_sdpa_fully_masked_rows(original: Callable) -> Callable:
    """Zero the output rows whose boolean mask attends to no key, as torch's SDPA does (opsets < 23).

    Pattern: a causal mask with left padding (batched decoder prompts) leaves query rows attending to nothing, where
    torch's SDPA returns zeros (``_safe_softmax``, https://github.com/pytorch/pytorch/issues/103749). Below opset 23
    torchlib masks ``Softmax`` with the lowest finite float (https://github.com/microsoft/onnxscript/pull/2654, dropping
    the NaN-to-0 of https://github.com/microsoft/onnxscript/pull/2479), so such rows average every value. TODO: no
    upstream issue found for that regression.

    Rewrite: SDPA, then the all-False rows zeroed. Float masks and opset >= 23 (``Attention``) are left alone."""

    def scaled_dot_product_attention(query, key, value, attn_mask=None, *args, **kwargs):
        output = original(query, key, value, attn_mask, *args, **kwargs)
        if attn_mask is None or attn_mask.dtype != torch.bool or (TARGET_OPSET.get() or 0) >= ATTENTION_OPSET:
            return output
        attends = attn_mask.sum(dim=-1, keepdim=True) > 0  # a bool ReduceMax has no onnxruntime CPU kernel
        return torch.where(attends, output, torch.zeros((), dtype=output.dtype, device=output.device))

    return scaled_dot_product_attention


def _static_one(size) -> bool:
    return isinstance(size, int) and size == 1


@register_patch("onnx", "torch.nn.functional.scaled_dot_product_attention")
def _patch_sdpa_broadcasts_for_attention_op(original: Callable) -> Callable:
    """Spell out the broadcasts of SDPA's batch, key/value heads and its mask's query rows (opset >= 23).

    Pattern: SDPA inputs that broadcast (a batch of 1, one key/value head without ``enable_gqa``, a ``(batch, 1, 1,
    kv_len)`` mask). The ONNX ``Attention`` op refuses them: "SDPA (MHA) requires q_num_heads = kv_num_heads"
    (torchlib), "inconsistent batch_size (between Q and K)", "inconsistent q_sequence_length (between attn_mask and Q)"
    (onnxruntime).

    Rewrite: ``expand`` each to the other's size, torch's own broadcast: same values. Below opset 23 SDPA is left alone.
    TODO: upstream issue not found (torch/onnx/_internal/exporter/_torchlib/ops/nn.py; onnxruntime attention_helper.h)."""

    def scaled_dot_product_attention(query, key, value, attn_mask=None, *args, **kwargs):
        if (TARGET_OPSET.get() or 0) >= ATTENTION_OPSET and query.dim() == 4:
            if _static_one(query.shape[0]) and not _static_one(key.shape[0]):  # learned queries for every row
                query = query.expand(key.shape[0], *query.shape[1:])
            elif _static_one(key.shape[0]) and not _static_one(query.shape[0]):
                key = key.expand(query.shape[0], *key.shape[1:])
                value = value.expand(query.shape[0], *value.shape[1:])
            heads = query.shape[1]  # may be symbolic; a single key/value head is a static 1 (0/1 specialisation)
            if not kwargs.get("enable_gqa", False) and isinstance(key.shape[1], int) and key.shape[1] == 1:
                key = key.expand(key.shape[0], heads, *key.shape[2:])
                value = value.expand(value.shape[0], heads, *value.shape[2:])
            # a static 1 only: a packed length read from data (MuSE's vision tower) must not be guarded on
            if isinstance(attn_mask, torch.Tensor) and attn_mask.dim() >= 2 and _static_one(attn_mask.shape[-2]):
                attn_mask = attn_mask.expand(*attn_mask.shape[:-2], query.shape[-2], attn_mask.shape[-1])
        return original(query, key, value, attn_mask, *args, **kwargs)

    return scaled_dot_product_attention


# ── Correctness: torch.onnx internals ───────────────────────────────────────────────────────────────────────


@register_patch(
    "onnx",
    "torch.onnx._internal.exporter._core._prepare_exported_program_for_export",
    requires={"torch": ">=2.13,<2.15"},  # 2.15 adds the RNN while_loop decompositions here: port before widening
)
def _patch_prepare_for_export(original: Callable) -> Callable:
    """Run the FX node fixes (stage 3) again right after ``run_decompositions``.

    Pattern: ``torch.onnx.export`` decomposes the ``ExportedProgram`` with its own table before translating it, so an op
    a fix targets can first appear in the decomposed graph (an overload the table introduces, a symbolic guard). This
    hooks the private step that does it (``torch/onnx/_internal/exporter/_core.py``); if a torch upgrade renames it,
    hook wherever ``decompose_with_registry`` is called. No test architecture needs the second pass yet;
    ``test_fx_fixes_run_again_after_decomposition`` proves the hook. Not an upstream bug: the hook is how the fixes
    reach the decomposed graph. No upstream issue applies."""

    def prepare(exported_program, *args, **kwargs):
        result = original(exported_program, *args, **kwargs)
        apply_fx_node_fixes("onnx", result.graph_module)
        return result

    return prepare


@register_patch("onnx", "onnxscript.rewriter._matcher.SimplePatternMatcher._match_constant",
                requires={"onnxscript": ">=0.7,<0.8"})
def _patch_zero_constant_matches_only_zero(original: Callable) -> Callable:
    """A rewrite pattern's constant 0 matches only 0.

    Pattern: the optimizer's no-op rules (``x + 0``, ``x - 0``) match their 0 with ``abs_tol=1e-8``, so the epsilon of
    ``x * rsqrt(mean(x**2) + 1e-8)`` is removed as an ``Add`` of 0 (MuseGlimmer's post-norms then drift from eager;
    repro: ``skiplists/repros/onnxscript_drops_add_of_1e8_epsilon.py``).

    Rewrite: where the pattern's constant is 0 (a scalar or all of a list), a non-zero value fails the match; every
    other constant is matched by the original. Upstream: no onnxscript issue found (tracker microsoft/onnxscript)."""
    import numpy as np

    def _match_constant(self, pattern_constant, value):
        expected = pattern_constant.value
        if np.all(np.asarray(expected) == 0) and value.const_value is not None:
            try:
                given = value.const_value.numpy()
            except Exception:  # no value to read: the original says why it fails
                return original(self, pattern_constant, value)
            if np.any(given != 0):
                return self.fail(f"Constant value mismatch: expected {expected}, got a non-zero {given.ravel()[:4]}.")
        return original(self, pattern_constant, value)

    return _match_constant


# ── Correctness: FX node fixes ──────────────────────────────────────────────────────────────────────────────
# `_fix_<pattern>(graph_module, node) -> bool`; True when the node was consumed.


@register_fx_node_fix("onnx")
def _fix_contiguous_as_clone(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Make ``aten.contiguous`` an explicit ``clone(memory_format=contiguous_format)``.

    Pattern: ``attn_output.transpose(1, 2).contiguous()`` then ``.reshape(...)`` (T5's attention output).
    ``torch.onnx.export`` decomposes with ``backed_size_oblivious=True``, where ``contiguous()`` cannot prove a copy is
    needed and returns the transposed view; the ``reshape`` becomes a ``view`` and fails: "Cannot view a tensor with
    shape [s0, s1, 4, 8] and strides ... as a tensor with shape (s0, s1, 32)"
    (https://github.com/pytorch/pytorch/issues/141107). A clone always materialises the layout, and ONNX has no strides,
    so it costs nothing exported. Two-pass path only (``OnnxConfig(single_trace=False)``)."""
    if node.op != "call_function" or node.target is not torch.ops.aten.contiguous.default:
        return False
    with gm.graph.inserting_before(node):
        clone = gm.graph.call_function(
            torch.ops.aten.clone.default, (node.args[0],), {"memory_format": torch.contiguous_format}
        )
    clone.meta.update(node.meta)
    node.replace_all_uses_with(clone)
    gm.graph.erase_node(node)
    return True


#: arithmetic ops whose ``Tensor`` first slot a decomposition fills with a Python number (``rsub``: ``1.0 - mask``)
_SCALAR_FIRST_ARITHMETIC = {torch.ops.aten.sub.Tensor, torch.ops.aten.add.Tensor, torch.ops.aten.mul.Tensor,
                            torch.ops.aten.div.Tensor, torch.ops.aten.rsub.Scalar}


@register_fx_node_fix("onnx")
def _fix_scalar_first_arithmetic_promoted(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Cast the tensor operand of ``number - int_tensor`` to the result's dtype before the op.

    Pattern: ``1.0 - mask`` on an integer or boolean mask (XLNet, ProphetNet, Mllama, TimesFM): ``aten.rsub.Scalar(mask,
    1.0)``, decomposed to ``aten.sub.Tensor(1.0, mask)``. torch.onnx's type-promotion pass casts ``mask`` to float and
    re-resolves the overload from (float, tensor), which no ``aten.sub`` overload takes: "Cannot find a compatible
    OpOverload for aten.sub" (https://github.com/pytorch/pytorch/issues/194381). Casting the tensor to the result's
    dtype is the promotion torch does itself: same values, nothing left to promote."""
    if node.op != "call_function" or node.target not in _SCALAR_FIRST_ARITHMETIC:
        return False
    scalar_first = node.target is torch.ops.aten.rsub.Scalar or isinstance(node.args[0], (bool, int, float))
    tensor = node.args[0] if node.target is torch.ops.aten.rsub.Scalar else node.args[1]
    result, operand = node.meta.get("val"), getattr(tensor, "meta", {}).get("val")
    if not (scalar_first and isinstance(result, torch.Tensor) and isinstance(operand, torch.Tensor)
            and operand.dtype != result.dtype):
        return False
    with gm.graph.inserting_before(node):
        cast = gm.graph.call_function(torch.ops.prims.convert_element_type.default, (tensor, result.dtype))
    cast.meta.update(node.meta)
    cast.meta["val"] = operand.to(result.dtype)
    node.replace_input_with(tensor, cast)
    return True


#: squeezes that name their dims: torch keeps one in the graph when it cannot tell the dim is 1
_SQUEEZES_OF_DIMS = {torch.ops.aten.squeeze.dim, torch.ops.aten.squeeze.dims}


@register_fx_node_fix("onnx")
def _fix_squeeze_traced_as_no_op(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Drop a squeeze whose traced output keeps every dim of its input.

    Pattern: ``features.squeeze(0)`` on a dim of data-dependent size (Mistral3's merged image patches): torch takes
    ``size == 1`` as false, so the traced output keeps the dim, but the graph keeps ``aten.squeeze.dim``, which
    torchlib translates to ONNX ``Squeeze`` (``aten_squeeze_dim``); ONNX's Squeeze raises on a dim that is not 1
    ('Dimension of input 0 must be 1 instead of 8'; torch's is then a no-op: https://github.com/onnx/onnx/issues/3764).
    The traced program does not squeeze, so the node becomes an ``alias`` of its input (its name kept: it may be an
    output of the program)."""
    if node.op != "call_function" or node.target not in _SQUEEZES_OF_DIMS:
        return False
    result, operand = node.meta.get("val"), getattr(node.args[0], "meta", {}).get("val")
    if not (isinstance(result, torch.Tensor) and isinstance(operand, torch.Tensor) and result.dim() == operand.dim()):
        return False
    node.target, node.args, node.kwargs = torch.ops.aten.alias.default, (node.args[0],), {}
    return True


# ── Speed: torch.onnx and onnxscript internals ──────────────────────────────────────────────────────────────
# The same ONNX model, without work torch.onnx.export repeats on every call or every node.


@register_patch(
    "onnx",
    "torch.onnx._internal.exporter._fx_passes.decompose_with_registry",
    requires={"torch": ">=2.13,<2.16"},
)
def _patch_decompose_once(original: Callable) -> Callable:
    """Leave a program traced straight to ONNX's ATen IR as it is, instead of decomposing it again.

    Pattern: ``torch.onnx.export`` retraces every ``ExportedProgram`` through ``run_decompositions`` with the table of
    ops its registry does not implement. A program traced with that same table (:mod:`engine.single_trace`) is already
    decomposed: the retrace would redo the symbolic-shape work for an identical graph. Checked against the registry
    ``torch.onnx.export`` passes: any other table, a program traced the usual way, or one an FX fix left with an op the
    table decomposes, is decomposed as usual. Not an upstream bug: torch.onnx cannot know which table traced the
    program. No upstream issue applies."""

    def decompose_with_registry(exported_program, registry):
        traced_with = decomposed_with(exported_program)
        if traced_with is not None:
            table = _decomposition_table(registry)
            # an FX fix run on the trace may have put an op the table decomposes (the erfinv polynomial's
            # ``rsub``): then the program is decomposed as before
            if traced_with == frozenset(table) and not any(
                    node.op == "call_function" and node.target in table for node in exported_program.graph.nodes):
                return exported_program
        return original(exported_program, registry)

    return decompose_with_registry


def decompose_once_applies() -> bool:
    """Whether ``_patch_decompose_once`` is registered and applies to the installed versions: without it a
    single trace would only add a pass, since torch.onnx.export would decompose the program again."""
    return any(p.name == "_patch_decompose_once" and p.applies() for p in registered_patches("onnx"))


def onnx_decomposition_table(opset: int | None) -> dict:
    """The table ``torch.onnx.export`` decomposes with for ``opset`` and this exporter's translations (stage 4)."""
    from torch.onnx._internal.exporter import _constants, _registration
    from engine.patches.onnx_translations import translation_table

    # torch.onnx.export builds opsets below torchlib's own from torchlib's registry, then converts the model
    registry = _registration.ONNXRegistry.from_torchlib(max(opset or 0, _constants.TORCHLIB_OPSET))
    for op, translation in translation_table().items():
        registry.register_op(op, translation, is_complex=False)
    return _decomposition_table(registry)


#: decomposition tables by (the ops a registry implements, ops the dispatcher knows, aten decompositions known)
_TABLES: dict[tuple[frozenset, int, int], dict] = {}


def _decomposition_table(registry) -> dict:
    """``torch.onnx``'s decomposition table for a registry: the default decompositions of what it does not implement.

    Built once per set of implemented ops (an export needs it twice: the trace's table and the check of
    ``_patch_decompose_once``); a newly loaded op library or decomposition builds it again. A copy is returned, so a
    caller that edits it leaves the cache unchanged."""
    from torch.onnx._internal.exporter import _decomp

    implemented = frozenset(_decomp.get_onnx_implemented_overloads(registry))
    key = (implemented, loaded_op_count(), len(torch._decomp.decomposition_table))
    if key not in _TABLES:
        _TABLES[key] = _decomp.create_onnx_friendly_decomposition_table(set(implemented))
    return dict(_TABLES[key])


#: pristine torchlib registries, by (opset, number of ops the dispatcher knows): a newly loaded op library
#: (torchvision, a model's custom ops) changes the count and so gets a fresh registry
_REGISTRIES: dict[tuple[int, int], Any] = {}


@register_patch(
    "onnx",
    "torch.onnx._internal.exporter._registration.ONNXRegistry.from_torchlib",
    requires={"torch": ">=2.13,<2.16"},
)
def _patch_registry_from_torchlib(original: Callable) -> Callable:
    """Build torchlib's registry once per opset instead of on every ``torch.onnx.export``.

    Pattern: ``torch.onnx.export`` rebuilds ``ONNXRegistry.from_torchlib(opset)`` on every call, resolving about a
    thousand torchlib op names to overloads, again for every model of a sweep. The registry is cached per opset (and per
    set of loaded op libraries) and each export gets a copy of its overload lists, so the custom translations
    ``torch.onnx.export`` registers into it (stage 4) never leak into the cache. TODO: upstream issue not found."""

    def from_torchlib(opset_version=None):
        from torch.onnx._internal.exporter import _constants, _registration

        opset = _constants.TORCHLIB_OPSET if opset_version is None else opset_version
        key = (opset, loaded_op_count())
        if key not in _REGISTRIES:
            _REGISTRIES[key] = original(opset)
        pristine = _REGISTRIES[key]
        registry = _registration.ONNXRegistry()
        registry.__dict__.update(pristine.__dict__)
        registry.functions = {target: list(decomps) for target, decomps in pristine.functions.items()}
        return registry

    return staticmethod(from_torchlib)  # replaces a classmethod, called on the class and on instances


@register_patch(
    "onnx",
    "torch.onnx._internal.fx.passes.type_promotion._TypePromotionInterpreter.run_node",
    requires={"torch": ">=2.13,<2.16"},
)
def _patch_type_promotion_reads_node_values(original: Callable) -> Callable:
    """Take each node's fake value from ``node.meta["val"]`` instead of re-running it, unless it is promoted.

    Pattern: ``torch.onnx.export``'s ``InsertTypePromotion`` pass re-runs every node of the decomposed program in fake
    mode to rebuild the values already in ``node.meta["val"]``; only a promoted node gets a new value.

    Rewrite: other call nodes read their stored value (nodes without one run): same model bytes. It also keeps
    single-trace programs exportable: under ``backed_size_oblivious``, re-running T5's ``view`` fails the stride check
    of https://github.com/pytorch/pytorch/issues/141107. TODO(upstream): no pytorch issue found; the pass could seed its
    environment from ``node.meta["val"]``."""
    from torch.onnx._internal.fx.passes.type_promotion import get_type_promotion_rule

    def run_node(self, node):
        value = node.meta.get("val")
        if node.op != "call_function" or value is None:
            return original(self, node)
        with self._set_current_node(node):
            rule = get_type_promotion_rule(node, self.type_promotion_table)
            if rule is not None:
                self._maybe_promote_node(node, rule)  # re-runs the node and stores its value if it promotes
        return node.meta["val"]

    return run_node


@register_patch("onnx", "onnxscript.rewriter._matcher.SimplePatternMatcher.match", requires={"onnxscript": ">=0.7,<0.8"})
def _patch_multi_output_match_checks_its_first_node(original: Callable) -> Callable:
    """Reject a node of the wrong op before enumerating candidates for a multi-output rewrite pattern.

    Pattern: the optimizer's rewriter tries every rule at every node; for a pattern with several output nodes,
    ``SimplePatternMatcher.match`` first groups every node of the graph by op, then tries the node as the first output
    node: a whole-graph walk per node, quadratic in graph size.

    Rewrite: the node's op type and domain are checked first, the original's own first step; a mismatch fails without
    the walk (same models: ``test_optimize_with_first_node_check_writes_the_same_model``). TODO(upstream): no onnxscript
    issue found; ``match`` could check the first output node before grouping."""
    from onnxscript.rewriter import _basics

    def match(self, model, graph_or_function, node, *args, **kwargs):
        outputs = self.pattern.output_nodes
        first = outputs[0] if len(outputs) > 1 else None  # single-output patterns match without the walk already
        if first is not None and not (first.op.matches(node.op_type) and first.domain.matches(node.domain)):
            return _basics.MatchResult().fail(f"OpType mismatch: expected {first.op}, got {node.op_type}.", node)
        return original(self, model, graph_or_function, node, *args, **kwargs)

    return match
