"""``ExecutorchExporter``: a model and sample inputs become an ``ExecutorchProgramManager`` (a ``.pte``).

``export()`` reads top to bottom as the pipeline:

1. **Backend preparation** (:data:`BACKENDS`): move the model to the backend's device/dtype and pick its
   partitioner (``xnnpack``: CPU/fp32, ``XnnpackPartitioner``; ``cuda``: CUDA/bf16, ``CudaPartitioner``).
2. **Torch patches** (``apply_patches("executorch")`` during ``torch.export``, via :meth:`DynamoExporter.trace`).
3. **ExecuTorch patches** (``apply_patches("executorch")`` around ``to_edge_transform_and_lower`` /
   ``to_executorch``). Stages 2 and 3 share one registry, in :mod:`engine.executorch_patches`.
4. **FX program fixes**: cap ``int_oo`` upper bounds from the model config (see :func:`_fix_unbounded_dims`).
5. **FX node fixes**: per-node rewrites before lowering.

Then lowering with the partitioner (:func:`lower`: ``to_edge_transform_and_lower`` with one decomposition pass
instead of three) and ``to_executorch``. The ``.pte`` is self-describing: a constant method
``export_sweep_meta`` returns a JSON string with the input leaf names, dtypes and per-dim ``[min, max]``
bounds, and the output leaf names, which :func:`engine.run_exported` uses to feed inputs in the program's
order, reject out-of-bounds shapes with a clear error, and name the outputs like ``get_leaf_tensors``.

>>> manager = ExecutorchExporter().export(model, inputs, config=ExecutorchConfig(dynamic=True))
>>> ExecutorchExporter.save(manager, "model.pte")      # or manager.write_to_file(open("model.pte", "wb"))
>>> run_exported("model.pte", inputs)                   # {"logits": ...}
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._sympy.numbers import IntInfinity, NegativeIntInfinity
from torch.utils._sympy.value_ranges import ValueRanges, bound_sympy

from engine.configs import ExecutorchConfig
from engine.errors import ConfigError, ExportStageError, MissingDependencyError, require
from engine.exporter_dynamo import DynamoExporter, fake_dispatch_cache_off_while_decomposing, program_shape_env
import engine.fx_fixes  # noqa: F401  (registers the node fixes shared with other backends)
from engine.patches import apply_fx_node_fixes, apply_fx_program_fixes, apply_patches, register_fx_program_fix
from engine.prepare import model_name, split_inputs
from engine.pytree import spec_leaf_names, iter_leaf_tensors
from engine.shape_guards import program_guards
from engine.shapes import SpecialisationWarning, config_values

logger = logging.getLogger("engine")

#: name of the constant method that carries the program's metadata (a JSON string) inside the ``.pte``
META_METHOD = "export_sweep_meta"
META_FORMAT = "export-sweep/executorch/1"


class UnboundedDimWarning(UserWarning):
    """Dynamic dims without an upper bound were given a finite one for ExecuTorch memory planning."""


# ── Stage 1: Backend preparation ──────────────────────────────────────────────────────────────────
# A backend is a function ``prepare(model) -> (model, partitioners)``: move the model where the backend
# runs and build the partitioner list for ``to_edge_transform_and_lower``. Inputs are then cast to the
# model's dtype/device by ``prepare_for_export`` inside the trace. Add a backend: write
# ``_prepare_<name>`` and decorate it with ``@register_backend("<name>")``.

BACKENDS: dict[str, Callable[[torch.nn.Module], tuple[torch.nn.Module, list]]] = {}


def register_backend(name: str):
    def decorator(fn):
        BACKENDS[name] = fn
        return fn

    return decorator


def backend_prepare(name: str):
    if name not in BACKENDS:
        raise ConfigError(f"unknown ExecuTorch backend {name!r}; known backends: {', '.join(BACKENDS)}")
    return BACKENDS[name]


def _use_batched_experts(model: torch.nn.Module) -> None:
    """MoE experts default to ``grouped_mm``, which has no ExecuTorch kernel: use ``batched_mm``."""
    can_set = getattr(model, "_can_set_experts_implementation", None)
    if can_set is not None and can_set():
        model.set_experts_implementation("batched_mm")


@register_backend("xnnpack")
def _prepare_xnnpack(model: torch.nn.Module):
    """CPU, fp32, ``XnnpackPartitioner``; ops XNNPACK does not take stay on the portable CPU kernels."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    model = model.to(device="cpu", dtype=torch.float32)
    _use_batched_experts(model)
    return model, [XnnpackPartitioner()]


@register_backend("cuda")
def _prepare_cuda(model: torch.nn.Module):
    """CUDA, bf16, ``CudaPartitioner`` (AOTInductor). Needs a CUDA device and ExecuTorch's CUDA backend."""
    if not torch.cuda.is_available():
        raise ConfigError(
            "ExecutorchConfig(backend='cuda') needs a CUDA device, but torch.cuda.is_available() is False on this "
            "machine (torch " + torch.__version__ + "); use backend='xnnpack' for CPU"
        )
    try:
        from executorch.backends.cuda.cuda_backend import CudaBackend
        from executorch.backends.cuda.cuda_partitioner import CudaPartitioner
    except ImportError as e:
        raise MissingDependencyError(
            f"ExecuTorch's CUDA backend cannot be imported ({type(e).__name__}: {e}); it needs an executorch build "
            "with CUDA support and triton; use backend='xnnpack' for CPU"
        ) from e
    model = model.to(device="cuda", dtype=torch.bfloat16)
    _use_batched_experts(model)
    return model, [CudaPartitioner([CudaBackend.generate_method_name_compile_spec("forward")])]


# ── Exporter ──────────────────────────────────────────────────────────────────────────────────────


class ExecutorchExporter(DynamoExporter):
    """Export a ``PreTrainedModel`` (any ``nn.Module``) to ExecuTorch, lowered to the configured backend.

    Note that backend preparation moves the model in place (``model.to(...)``), like ``nn.Module.to`` does.
    """

    config_class = ExecutorchConfig
    patch_backends = ("dynamo", "executorch")

    def export(self, model: torch.nn.Module, inputs: Mapping[str, Any], config: ExecutorchConfig | Mapping | None = None):
        require("executorch", "executorch")
        import engine.executorch_patches  # noqa: F401  (registers the patches and fixes)

        config = self.config_class.coerce(config)
        prepare = backend_prepare(config.backend)
        name = model_name(model)

        # ── Stage 1: Backend preparation ─────────────────────────────────────────────────────────
        model, partitioners = prepare(model)

        # ── Stage 2: Torch patches (active during the trace through patch_backends) ────────────
        program = self.trace(model, inputs, config)
        traced_inputs, _ = split_inputs(inputs)
        guards = program_guards(program)  # what the model's code assumed of the traced sizes, checked by the runner

        # ── Stage 4: FX program fixes ────────────────────────────────────────────────────────────
        program.graph_module.meta[DIM_LIMITS_KEY] = DimLimits.from_model(model, name, config.max_seq_len,
                                                                       config.dynamic_shapes is not None)
        apply_fx_program_fixes("executorch", program)
        program.graph_module.meta.pop(DIM_LIMITS_KEY, None)

        # ── Stage 5: FX node fixes ───────────────────────────────────────────────────────────────
        apply_fx_node_fixes("executorch", program.graph_module)

        before = program_metadata(program, traced_inputs, name, config.backend)

        # ── Stage 3: ExecuTorch patches (active during lowering) ─────────────────────────────────
        from executorch.exir import EdgeCompileConfig

        # no_grad: lowering passes re-run ops, and a program updating a cache in place (StaticCache) would trip
        # autograd's "leaf Variable that requires grad is used in an in-place operation" check
        with apply_patches("executorch"), torch.no_grad():
            try:
                edge = lower(program, partitioners, EdgeCompileConfig(), constant_methods={META_METHOD: ""})
                # the metadata describes the lowered program: a dim lowering specialised shows as static
                meta = program_metadata(edge.exported_program(), traced_inputs, name, config.backend)
                _warn_specialised_by_lowering(name, before, meta)
                if guards["guards"]:
                    meta["guards"] = guards
                edge._config_methods[META_METHOD] = json.dumps(meta)
                return edge.to_executorch()
            except ExportStageError:
                raise
            except Exception as e:
                raise ExportStageError("lower", name, e) from e

    @staticmethod
    def save(program, path: str | os.PathLike) -> str:
        """Write ``program`` (the ``ExecutorchProgramManager`` from :meth:`export`) to ``path`` (a ``.pte``).

        Same bytes as ``program.write_to_file(open(path, "wb"))``, streamed without a contiguous copy; unlike
        ``ExecutorchProgramManager.save`` it raises instead of logging a failure. Returns the path.
        """
        path = os.fspath(path)
        try:
            with open(path, "wb") as f:
                program.write_to_file(f)
        except Exception as e:
            raise ExportStageError("save", meta_of(program).get("model", type(program).__name__), e) from e
        return path


def meta_of(program) -> dict[str, Any]:
    """The metadata dict stored in an ``ExecutorchProgramManager`` by :meth:`ExecutorchExporter.export`."""
    getter = getattr(program, "_config_methods", None) or {}
    text = getter.get(META_METHOD)
    return json.loads(text) if isinstance(text, str) else {}


# ── Lowering: one decomposition pass ──────────────────────────────────────────────────────────────
# ``to_edge_transform_and_lower`` retraces the whole program three times before the edge dialect: once to
# functionalize (``run_decompositions({})``), once to decompose with the partitioner's ops kept, and, for a
# partitioner that checks op support per node (XNNPACK does), once more after marking the supported nodes of
# those ops so that only they survive. Each retrace re-runs every op on fake tensors with symbolic shapes, and
# they are the largest cost of lowering a small model. Marking the supported nodes on the exported program itself
# and decomposing once does the same work in one retrace: the .pte files are byte-identical (checked for the
# twelve test architectures), and lowering takes about a quarter less CPU time (``bench/bench_executorch.py``).

_ONE_PASS_HELPERS = (
    "_default_decomposition_table",
    "_replace_aten_ops_with_transformed_ops",
    "_restore_transformed_ops_to_aten_ops",
    "_generate_edge_program",
    "_can_skip_using_EDGE_DO_NOT_DECOMP",
    "_remove_invalid_ops_for_not_decompose",
    "_sanity_check_graph_for_non_decomp_ops",
    "EdgeProgramManager",
)


class _ToBackendDeprecationFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "deprecated 'to_edge() + to_backend()' workflow" not in record.getMessage()


@contextlib.contextmanager
def _without_to_backend_deprecation():
    """XNNPACK's partitioner warns of the deprecated ``to_edge() + to_backend()`` workflow whenever no stack frame
    is named ``to_edge_transform_and_lower``; :func:`lower` runs that function's own steps, so the warning is wrong."""
    partitioner_logger = logging.getLogger("executorch.backends.xnnpack.partition.xnnpack_partitioner")
    quiet = _ToBackendDeprecationFilter()
    partitioner_logger.addFilter(quiet)
    try:
        yield
    finally:
        partitioner_logger.removeFilter(quiet)


def lower(program: torch.export.ExportedProgram, partitioners: list, config, constant_methods: dict):
    """``to_edge_transform_and_lower(program, partitioners, config, constant_methods)`` with one decomposition pass.

    Falls back to ``to_edge_transform_and_lower`` itself when the installed ExecuTorch lacks one of the
    (private) steps it is made of, so a newer ExecuTorch is slower, never wrong.
    """
    from executorch.exir.program import _program as steps

    if not all(hasattr(steps, helper) for helper in _ONE_PASS_HELPERS):
        logger.debug("ExecuTorch %s lacks a one-pass lowering step; using to_edge_transform_and_lower", steps.__name__)
        return steps.to_edge_transform_and_lower(
            program, partitioner=partitioners, compile_config=config, constant_methods=constant_methods
        )
    from executorch.exir.verification.verifier import EXIREdgeDialectVerifier

    method = "forward"
    table = steps._default_decomposition_table()
    preserved: set = set()
    for partitioner in partitioners:
        ops, check_op_support = partitioner.ops_to_not_decompose(program)
        if check_op_support is None:  # keep every node of these ops
            preserved.update(op for op in ops if table.pop(op, None) is not None)
        else:  # keep only the nodes the partitioner takes: they become ops the decomposition does not know
            preserved.update(steps._replace_aten_ops_with_transformed_ops(method, program, {method: [partitioner]}) or ())
    # functionalizes and decomposes in one retrace, faster without the fake dispatch cache (tiny Mamba2's
    # ExecuTorch export 70-82 -> 57-66 CPU s; Llama, T5, DETR within noise), which the edge passes then use
    with fake_dispatch_cache_off_while_decomposing(program):
        program = program.run_decompositions(table)
    steps._restore_transformed_ops_to_aten_ops(program)

    preserved_ops = list(preserved)
    edge_program = steps._generate_edge_program(config, program, preserve_ops=preserved_ops)
    config._core_aten_ops_exception_list = list(set(config._core_aten_ops_exception_list) | preserved)
    edge = steps.EdgeProgramManager({method: edge_program}, constant_methods, config, preserved_ops)
    with _without_to_backend_deprecation():
        for partitioner in partitioners:
            edge = edge.to_backend({method: partitioner})

    # the checks to_edge_transform_and_lower ends with: no kept op left outside a delegate unless allowed
    lowered = edge.exported_program(method)
    kept: set = set()
    for partitioner in partitioners:
        ops, check_op_support = partitioner.ops_to_not_decompose(lowered)
        if not steps._can_skip_using_EDGE_DO_NOT_DECOMP(partitioner, lowered):
            ops = steps._remove_invalid_ops_for_not_decompose(ops)
        kept.update(ops)
        steps._sanity_check_graph_for_non_decomp_ops(
            method, lowered, kept, check_op_support, partitioner_name=type(partitioner).__name__, generate_error=True
        )
    if config._check_ir_validity:
        EXIREdgeDialectVerifier(edge_compile_config=config, class_only=True, preserve_ops=config.preserve_ops + list(kept))()(
            lowered.graph_module
        )
    return edge


# ── Stage 4: FX program fixes ─────────────────────────────────────────────────────────────────────
# ``Dim.AUTO`` leaves most upper bounds at ``int_oo``. ExecuTorch plans memory for the upper bound of
# every dynamic dim (and ``eval_upper_bound`` fails on ``int_oo``), so each unbounded dim needs a finite
# cap: the larger the cap, the larger the plan. Caps come from the model config where it states a limit
# (positions for sequence dims, image size for spatial dims) and from the traced size otherwise (batch).

DIM_LIMITS_KEY = "export_sweep.dim_limits"

#: config keys that bound a sequence length (looked up in the config and every sub-config)
POSITION_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_target_positions",
    "max_source_positions",
    "n_ctx",
    "max_seq_len",
    "max_sequence_length",
)
IMAGE_KEYS = ("image_size",)
#: a batch dim traced at ``b`` accepts up to ``max(BATCH_FACTOR * b, MIN_BATCH_CAP)``
BATCH_FACTOR, MIN_BATCH_CAP = 4, 8
#: a sequence/spatial dim the config states no limit for accepts up to ``max(LENGTH_FACTOR * traced, MIN_LENGTH_CAP)``
LENGTH_FACTOR, MIN_LENGTH_CAP = 4, 256
#: the largest tensor (an op's output, or the score matrix attention materialises once decomposed) the chosen caps
#: may plan for: caps the user did not state are halved, the largest relative to its traced size first, down to
#: ``BUDGET_FLOOR_FACTOR x traced``, until every planned tensor fits. A config's 32k positions (or a video's
#: frames x height x width) otherwise plan attention scores of many GB, which the runtime cannot allocate.
PLANNED_TENSOR_BUDGET = 64 * 2**20
BUDGET_FLOOR_FACTOR = 2


def _config_limits(config: Any, keys: tuple[str, ...]) -> list[tuple[str, int]]:
    """``(dotted key, largest positive int)`` for every ``key`` in the config and its sub-configs."""
    found = []
    for key, value in config_values(config, keys):
        ints = [x for x in (value if isinstance(value, (list, tuple)) else [value])
                if isinstance(x, int) and not isinstance(x, bool) and x > 0]
        if ints:
            found.append((key, max(ints)))
    return found


@dataclass
class DimLimits:
    """The limits a model's config states for its dynamic dims, and where each came from."""

    model: str
    length: tuple[str, int] | None = None  # (config key, limit) for sequence-like dims
    image: tuple[str, int] | None = None  # (config key, limit) for spatial dims of images
    max_seq_len: int | None = None  # ExecutorchConfig.max_seq_len: wins over ``length`` and derived bounds
    stated_shapes: bool = False  # the user passed dynamic_shapes: finite bounds are theirs, never lowered

    @classmethod
    def from_model(cls, model: torch.nn.Module, name: str, max_seq_len: int | None = None,
                   stated_shapes: bool = False) -> DimLimits:
        config = getattr(model, "config", None)
        lengths = _config_limits(config, POSITION_KEYS)
        images = _config_limits(config, IMAGE_KEYS)
        # the largest stated limit: a cap above one sub-model's limit costs memory, one below rejects valid inputs
        return cls(name, max(lengths, key=lambda kv: kv[1], default=None), max(images, key=lambda kv: kv[1], default=None),
                   max_seq_len, stated_shapes)

    def cap(self, role: str, traced: int) -> tuple[int, str]:
        """``(cap, why)`` for a dim of ``role`` (``"batch"``, ``"length"``, ``"image"``) traced at ``traced``."""
        if role == "batch":
            return max(BATCH_FACTOR * traced, MIN_BATCH_CAP), f"batch: {BATCH_FACTOR} x traced {traced}"
        if role == "length" and self.max_seq_len is not None:
            return max(self.max_seq_len, traced), f"max_seq_len={self.max_seq_len}"
        stated = self.image if role == "image" else self.length
        if stated is not None:
            key, limit = stated
            return max(limit, traced), f"config {key}={limit}"
        return max(LENGTH_FACTOR * traced, MIN_LENGTH_CAP), f"no config limit: {LENGTH_FACTOR} x traced {traced}"

    def user_stated(self, role: str) -> bool:
        """Whether the user chose this role's bound (``max_seq_len``): the memory budget never lowers it."""
        return role == "length" and self.max_seq_len is not None


def _dim_role(val: torch.Tensor, dim: int) -> str:
    """Dim 0 is the batch; the last two dims of a floating input of 4 or more dims are image dims (the height and
    width of images, ``[B, C, H, W]``, and of video frames, ``[B, T, C, H, W]`` or ``[B, C, T, H, W]``); the rest
    are lengths. (A video's spatial dims read as lengths had no config limit, and three dims capped at 256 each
    planned GBs.)"""
    if dim == 0:
        return "batch"
    if val.ndim >= 4 and val.is_floating_point() and dim >= val.ndim - 2:
        return "image"
    return "length"


def _user_input_specs(program: torch.export.ExportedProgram) -> list:
    from torch.export.graph_signature import InputKind

    return [s for s in program.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]


def _user_input_placeholders(program: torch.export.ExportedProgram) -> list[torch.fx.Node]:
    from torch.export.graph_signature import TensorArgument

    nodes = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    return [nodes[s.arg.name] for s in _user_input_specs(program) if isinstance(s.arg, TensorArgument)]


_ATTENTION_OPS = ("scaled_dot_product", "_scaled_dot_product")


def _planned_sizes(program: torch.export.ExportedProgram) -> list[Any]:
    """The byte size, as an expression in the program's size symbols, of every distinct tensor the program
    computes, plus each attention's score matrix (``query rows x key rows`` per head), which the lowering's
    decomposition materialises though no node of the exported program holds it."""
    import sympy

    sizes: set[Any] = set()

    def add(shape, dtype) -> None:
        numel = sympy.Integer(1)
        for size in shape:
            numel *= size.node.expr if isinstance(size, torch.SymInt) else sympy.Integer(int(size))
        if numel.free_symbols:
            sizes.add(numel * dtype.itemsize)

    for node in program.graph.nodes:
        val = node.meta.get("val")
        for tensor in val if isinstance(val, (list, tuple)) else (val,):
            if isinstance(tensor, torch.Tensor):
                add(tensor.shape, tensor.dtype)
        if node.op == "call_function" and any(k in str(node.target) for k in _ATTENTION_OPS) and len(node.args) >= 2:
            q, k = (getattr(a, "meta", {}).get("val") for a in node.args[:2])
            if isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and q.ndim >= 2 and k.ndim >= 2:
                add((*q.shape[:-1], k.shape[-2]), q.dtype)
    return sorted(sizes, key=str)


def _fit_to_budget(sizes: list[Any], caps: dict[Any, int], floors: dict[Any, int], fixed: Callable[[Any, dict], int],
                   budget: int = PLANNED_TENSOR_BUDGET) -> tuple[dict[Any, int], int]:
    """Halve the caps in ``floors`` (the ones that may move), the largest relative to its floor first, until the
    largest of ``sizes`` fits ``budget`` or none can move; ``fixed(sym, caps)`` values every other symbol given
    the current caps. Returns the caps and the largest planned tensor's bytes."""
    import sympy

    caps = dict(caps)

    def value(expr) -> int:
        subs = {sym: sympy.Integer(caps[sym] if sym in caps else fixed(sym, caps)) for sym in expr.free_symbols}
        return int(expr.xreplace(subs))  # every symbol has a value: a number (a bare symbol: the Integer itself)

    while True:
        largest, expr = max(((value(e), e) for e in sizes), default=(0, None), key=lambda t: t[0])
        movable = [sym for sym in (expr.free_symbols if expr is not None else ()) if caps.get(sym, 0) > floors.get(sym, 1 << 62)]
        if largest <= budget or not movable:
            return caps, largest
        sym = max(movable, key=lambda s: (caps[s] / floors[s], str(s)))
        caps[sym] = max(floors[sym], 1 << ((caps[sym] - 1).bit_length() - 1))  # the power of two below


@register_fx_program_fix("executorch")
def _fix_unbounded_dims(program: torch.export.ExportedProgram) -> None:
    """Pattern: dynamic dims whose upper bound is ``int_oo`` (every ``Dim.AUTO`` dim no guard bounded).

    ExecuTorch's memory planning needs a finite upper bound for every dynamic dim and plans buffers at
    that bound; ``int_oo`` fails ``eval_upper_bound``, and a large generic cap makes tiny models plan GBs.
    Each unbounded input dim is capped from the model config (``max_position_embeddings`` and the like for
    sequence dims, ``image_size`` for spatial dims) or, for the batch and for dims the config states no limit
    for, from the traced size; then the caps the user did not state are lowered until the largest tensor the
    program plans (attention scores included) fits :data:`PLANNED_TENSOR_BUDGET` (:func:`_fit_to_budget`).
    Finite bounds (explicit ``Dim(min=, max=)``, or ones guards derived) are kept,
    except that ``ExecutorchConfig.max_seq_len`` lowers a sequence dim's bound above it (Gemma3's guards bound
    the length by 4094, and its attention scores then plan 2 GiB each). One :class:`UnboundedDimWarning` lists
    the caps. Both ``range_constraints`` (verifiers) and the shape env's ``var_to_range`` (read by ExecuTorch's
    ``ConstraintBasedSymShapeEvalPass``) are updated.
    Upstream: TODO: upstream issue not found (int_oo bounds are torch.export's documented Dim.AUTO behaviour).
    """
    limits: DimLimits = program.graph_module.meta.get(DIM_LIMITS_KEY) or DimLimits("model")
    shape_env = program_shape_env(program)
    ranges = program._range_constraints
    env_ranges = shape_env.var_to_range if shape_env is not None else {}

    def upper(sym):
        vr = ranges.get(sym, env_ranges.get(sym))
        return None if vr is None else vr.upper

    caps: dict[Any, tuple[int, str, str]] = {}  # symbol -> (cap, why, where)
    floors: dict[Any, int] = {}  # symbol -> the least cap the memory budget may lower it to (ours to choose only)
    derived: set[Any] = set()  # finite bounds torch.export derived: listed only when the budget lowers them
    for node in _user_input_placeholders(program):
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            continue
        for d, size in enumerate(val.shape):
            if not isinstance(size, torch.SymInt) or not size.node.expr.is_symbol:
                continue
            expr, role = size.node.expr, _dim_role(val, d)
            bound = upper(expr)
            finite = getattr(bound, "is_Integer", False)
            narrowed = role == "length" and limits.max_seq_len is not None and finite
            traced = int(size.node.hint) if size.node.hint is not None else 2
            if isinstance(bound, IntInfinity) or narrowed:
                cap, why = limits.cap(role, traced)
                if narrowed:
                    if cap >= int(bound):
                        continue
                    why += f", was {int(bound)}"
            elif finite and not limits.stated_shapes:  # a bound the trace derived (a model check): the budget may lower it
                cap, why = int(bound), "derived by torch.export"
                derived.add(expr)
            else:
                continue
            if expr not in caps or cap > caps[expr][0]:
                caps[expr] = (cap, why, f"{node.name} dim {d}")
            # a bound the user stated is never lowered (nor a dim shared with one): its floor is the cap itself
            floor = cap if limits.user_stated(role) else min(cap, BUDGET_FLOOR_FACTOR * traced)
            floors[expr] = max(floors.get(expr, 0), floor)

    def unbounded(sym, chosen) -> int:  # a symbol no input dim is: at the largest cap, as the fallback below
        vr = ranges.get(sym, env_ranges.get(sym))
        if vr is not None and not isinstance(vr.upper, IntInfinity):
            return int(vr.upper)
        return max((c for s, c in chosen.items() if s not in derived or c < caps[s][0]), default=MIN_LENGTH_CAP)

    largest = 0
    if caps:
        chosen, largest = _fit_to_budget(_planned_sizes(program), {s: c for s, (c, _, _) in caps.items()},
                                         {s: f for s, f in floors.items() if f < caps[s][0]}, unbounded)
        for sym, cap in chosen.items():
            if cap < caps[sym][0]:
                was, why, where = caps[sym]
                caps[sym] = (cap, f"{why} = {was}, lowered to fit the {PLANNED_TENSOR_BUDGET >> 20} MiB tensor budget", where)
                derived.discard(sym)
    for sym in derived:  # kept as torch.export derived it: nothing to report
        del caps[sym]
    # symbols no input dim is exactly (derived or data-dependent sizes) get the largest input cap
    fallback = max((c for c, _, _ in caps.values()), default=MIN_LENGTH_CAP)
    internal = set()
    for table in (ranges, env_ranges):
        for sym, vr in list(table.items()):
            if isinstance(vr.upper, IntInfinity) or sym in caps:
                cap = caps[sym][0] if sym in caps else fallback
                lower = vr.lower if not isinstance(vr.lower, NegativeIntInfinity) else 0
                table[sym] = ValueRanges(lower, max(cap, int(lower)))
                if sym not in caps:
                    internal.add(sym)
    if caps:
        listing = "; ".join(f"{where} <= {cap} ({why})" for cap, why, where in caps.values())
        if internal:
            listing += f"; and {len(internal)} internal size(s) at the largest cap, {fallback}"
        over = (f" The largest planned tensor is still {largest / 2**20:.0f} MiB, over the "
                f"{PLANNED_TENSOR_BUDGET >> 20} MiB budget, at bounds the user stated or at the floor of "
                f"{BUDGET_FLOOR_FACTOR} x traced.") if largest > PLANNED_TENSOR_BUDGET else ""
        warnings.warn(
            f"{limits.model}: {len(caps)} dynamic input dim(s) had no upper bound, one above max_seq_len, or one over "
            f"the memory budget, and were capped for ExecuTorch memory planning: {listing}.{over} Pass dynamic_shapes with "
            "torch.export.Dim(min=, max=) (or ExecutorchConfig.max_seq_len) to choose the bounds.",
            UnboundedDimWarning,
            stacklevel=2,
        )


# ── Program metadata (stored in the .pte) ─────────────────────────────────────────────────────────


def _bounds(size: Any, ranges: Mapping) -> list[int]:
    """``[min, max]`` of one input dim. A symbolic dim's lower bound of 2 is torch.export's 0/1-specialisation
    assumption, not a limit of the program: ``ExportedProgram.module()`` accepts sizes 0 and 1 there too (a
    decode step traced with two tokens runs one at a time; over an empty cache it computes the prefill), so the
    recorded minimum is 0, as the exported program's own input checks have it."""
    if isinstance(size, int):
        return [size, size]
    vr = bound_sympy(size.node.expr, dict(ranges))
    lo = int(vr.lower) if vr.lower.is_finite else 0
    lo = 0 if lo == 2 else lo
    hi = int(vr.upper) if vr.upper.is_finite else -1  # -1: unbounded (cannot happen after the fix)
    return [lo, hi]


def program_metadata(program: torch.export.ExportedProgram, traced_inputs: Mapping[str, Any], name: str, backend: str) -> dict:
    """Input leaves (name, dtype, per-dim ``[min, max]``) and output leaf names, in the program's flat order."""
    from torch.export.graph_signature import ConstantArgument, OutputKind, TensorArgument

    leaves = [(n, t) for key, value in traced_inputs.items() for n, t in iter_leaf_tensors(value, key)]
    placeholders = _user_input_placeholders(program)
    if len(placeholders) != len(leaves):
        raise ExportStageError(
            "export", name, RuntimeError(f"{len(placeholders)} tensor inputs in the program for {len(leaves)} input leaves")
        )
    shape_env = program_shape_env(program)
    ranges = {**(shape_env.var_to_range if shape_env is not None else {}), **program.range_constraints}
    inputs = [
        {"name": leaf, "dtype": str(node.meta["val"].dtype).removeprefix("torch."), "bounds": [_bounds(s, ranges) for s in node.meta["val"].shape]}
        for (leaf, _), node in zip(leaves, placeholders)
    ]
    # non-tensor leaves of the inputs (a ModelOutput's None fields) stay inputs of the ExecuTorch method
    constants = [[i, s.arg.value] for i, s in enumerate(_user_input_specs(program)) if isinstance(s.arg, ConstantArgument)]
    user_outputs = [s for s in program.graph_signature.output_specs if s.kind == OutputKind.USER_OUTPUT]
    # inputs updated in place (a StaticCache) come back first among the method's outputs
    mutated = [s for s in program.graph_signature.output_specs if s.kind == OutputKind.USER_INPUT_MUTATION]
    return {
        "format": META_FORMAT,
        "model": name,
        "backend": backend,
        "inputs": inputs,
        "constant_inputs": constants,
        "mutated_inputs": len(mutated),
        "outputs": [
            name if i < len(user_outputs) and isinstance(user_outputs[i].arg, TensorArgument) else None
            for i, name in enumerate(spec_leaf_names(program.call_spec.out_spec))
        ],
    }


def _warn_specialised_by_lowering(name: str, before: dict, after: dict) -> None:
    """Name every input dim whose bounds the lowering narrowed: to one size (the ``.pte`` accepts only it) or to
    a smaller range (DeepSeek-V3's batch once came out as ``0..2``, the traced batch, from ``0..8``)."""
    pinned, narrowed = [], []
    for b, a in zip(before["inputs"], after["inputs"]):
        for d, ((lo, hi), (a_lo, a_hi)) in enumerate(zip(b["bounds"], a["bounds"])):
            if lo != hi and a_lo == a_hi:
                pinned.append(f"{b['name']} dim {d} (bounds {lo}..{hi}, lowered to {a_lo})")
            elif (a_lo, a_hi) != (lo, hi) and lo <= a_lo <= a_hi <= hi:
                narrowed.append(f"{b['name']} dim {d} (bounds {lo}..{hi}, lowered to {a_lo}..{a_hi})")
    if pinned or narrowed:
        parts = []
        if pinned:
            parts.append(f"specialised {len(pinned)} dynamic input dim(s), so the .pte accepts only one size there: "
                         f"{'; '.join(pinned)}")
        if narrowed:
            parts.append(f"narrowed the bounds of {len(narrowed)} input dim(s): {'; '.join(narrowed)}")
        warnings.warn(
            f"{name}: ExecuTorch lowering {'; and '.join(parts)}",
            SpecialisationWarning,
            stacklevel=3,
        )


