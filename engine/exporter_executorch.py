"""``ExecutorchExporter``: a model and sample inputs become an ``ExecutorchProgramManager`` (a ``.pte``).

``export()`` reads as the six stages every exporter shares (:mod:`engine`): **prepare** the backend
(:data:`BACKENDS`: ``xnnpack`` CPU/fp32 with ``XnnpackPartitioner``, ``cuda`` CUDA/bf16 with ``CudaPartitioner``),
**trace** (:meth:`DynamoExporter.trace`, with the ``"executorch"`` patches; by default straight to the ATen IR the
lowering takes, :func:`engine.executorch_lowering.trace_table`), **fix the program** (finite dim bounds
for memory planning, :mod:`engine.dim_bounds`; the FX fixes of :mod:`engine.patches.executorch`), **lower**
(:func:`engine.executorch_lowering.lower`: ``to_edge_transform_and_lower`` with one decomposition pass, the
``"executorch"`` patches active), **describe** (:mod:`engine.pte_metadata`: the ``.pte`` carries its input leaves,
dtypes, per-dim bounds, guards and output leaves, which :func:`engine.run_exported` reads) and **write**
(``to_executorch``; :meth:`ExecutorchExporter.save` writes the file).

>>> manager = ExecutorchExporter().export(model, inputs, config=ExecutorchConfig(dynamic=True))
>>> ExecutorchExporter.save(manager, "model.pte")      # or manager.write_to_file(open("model.pte", "wb"))
>>> run_exported("model.pte", inputs)                   # {"logits": ...}
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

import torch

from engine.artifact_meta import META_METHOD
from engine.configs import ExecutorchConfig
from engine.errors import ConfigError, ExportStageError, MissingDependencyError, require
from engine.exporter_dynamo import DynamoExporter, stack_traces_as_configured
from engine.dim_bounds import DimLimits, bound_dynamic_dims
from engine.executorch_lowering import lower, trace_table
from engine.patches import apply_fx_node_fixes, apply_fx_program_fixes, apply_patches
from engine.patches.model.experts import use_batched_experts
from engine.prepare import model_name, split_inputs
from engine.index_inputs import find_index_inputs
from engine.pte_metadata import drop_none_outputs, program_metadata, tensor_output_names, warn_specialised_by_lowering
from engine.random_draws import lift_random_draws
from engine.shape_guards import program_guards
from engine.single_trace import single_trace_supported

logger = logging.getLogger("engine")

# ── Stage 1: Prepare: the backends (device, dtype, partitioners) ──────────────────────────────────────────────────────────────────
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


@register_backend("xnnpack")
def _prepare_xnnpack(model: torch.nn.Module):
    """CPU, fp32, ``XnnpackPartitioner``; ops XNNPACK does not take stay on the portable CPU kernels."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    model = model.to(device="cpu", dtype=torch.float32)
    use_batched_experts(model)
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
    use_batched_experts(model)
    return model, [CudaPartitioner([CudaBackend.generate_method_name_compile_spec("forward")])]


# ── The exporter ──────────────────────────────────────────────────────────────────────────────────


class ExecutorchExporter(DynamoExporter):
    """Export a ``PreTrainedModel`` (any ``nn.Module``) to ExecuTorch, lowered to the configured backend.

    Note that backend preparation moves the model in place (``model.to(...)``), like ``nn.Module.to`` does.
    """

    config_class = ExecutorchConfig
    patch_backends = ("dynamo", "executorch")
    # TODO: the lowering's retraces (run_decompositions, the edge passes) specialise a size-oblivious program's
    # derived sizes at 1 again (a Mamba2 traced below its chunk: et_view/expand refuse two chunks, error 0x12);
    # until they run size-oblivious too, such programs keep their guards, checked by the runner
    size_oblivious_retrace = False

    def export(self, model: torch.nn.Module, inputs: Mapping[str, Any], config: ExecutorchConfig | Mapping | None = None):
        """The pipeline, stage by stage (the stages every exporter shares: :mod:`engine`)."""
        require("executorch", "executorch")
        import engine.patches.torch_export  # noqa: F401  (registers the "executorch" patches and fixes: they import
        import engine.patches.unlowerable_ops  # noqa: F401  numpy and, lazily, executorch)
        import engine.patches.executorch  # noqa: F401
        import engine.patches.executorch_nodes  # noqa: F401
        import engine.patches.executorch_speed  # noqa: F401

        # ── Stage 1: Prepare: the backend's device, dtype and partitioners ───────────────────────────
        config = self.config_class.coerce(config)
        prepare = backend_prepare(config.backend)
        name = model_name(model)
        model, partitioners = prepare(model)
        traced_inputs, _ = split_inputs(inputs)

        # ── Stage 2: Trace: the "executorch" patches active with the "dynamo" ones ──────────────────
        # straight to the ATen IR the lowering takes where it can (config.single_trace: one trace, not two)
        self._trace_table = trace_table(partitioners) if config.single_trace and single_trace_supported() else None
        program = self.trace(model, inputs, config)
        draws = lift_random_draws(program)  # inputs the runner draws on torch's generator, as eager does
        if draws is not None:
            traced_inputs = {**traced_inputs, **{d["input"]: torch.empty(0) for d in draws["draws"]}}
        guards = program_guards(program)  # what the model's code assumed of the traced sizes, checked by the runner

        # ── Stage 3: Fix the program: finite dim bounds for memory planning, then the FX fixes ──────
        tensor_limit = config.max_planned_tensor_mb << 20 if config.max_planned_tensor_mb is not None else None
        bound_dynamic_dims(program, DimLimits.from_model(model, name, config.max_seq_len, config.dynamic_shapes is not None,
                                                         tensor_limit))
        apply_fx_program_fixes("executorch", program)
        apply_fx_node_fixes("executorch", program.graph_module)
        before = program_metadata(program, traced_inputs, name, config.backend)
        index_inputs = find_index_inputs(program)  # checked by the runner before the runtime sees their values
        dropped_none_outputs = drop_none_outputs(program)  # named from `before`: the lowering may reorder around them

        # no_grad: lowering passes re-run ops, and a program updating a cache in place (StaticCache) would trip
        # autograd's "leaf Variable that requires grad is used in an in-place operation" check
        with apply_patches("executorch"), torch.no_grad(), stack_traces_as_configured(config):
            try:
                # ── Stage 4: Lower: to the edge dialect and the partitioner's delegates ──────────────
                from executorch.exir import EdgeCompileConfig

                edge = lower(program, partitioners, EdgeCompileConfig(), constant_methods={META_METHOD: ""})

                # ── Stage 5: Describe: the metadata method the runtime reads (of the lowered program) ─
                meta = program_metadata(edge.exported_program(), traced_inputs, name, config.backend)
                if dropped_none_outputs:
                    meta["outputs"] = tensor_output_names(before)
                warn_specialised_by_lowering(name, before, meta)  # a dim lowering specialised shows as static
                if guards["guards"]:
                    meta["guards"] = guards
                meta["index_inputs"] = index_inputs
                if draws is not None:
                    meta["random_draws"] = draws
                edge._config_methods[META_METHOD] = json.dumps(meta)

                # ── Stage 6: Write: the ExecuTorch program (ExecutorchExporter.save writes the .pte) ─
                return edge.to_executorch()
            except ExportStageError:
                raise
            except Exception as e:
                raise ExportStageError("lower", name, e) from e

    def export_program(self, model: torch.nn.Module, inputs: Mapping[str, Any], dynamic_shapes: Any,
                       config: ExecutorchConfig) -> torch.export.ExportedProgram:
        """Trace straight to the ATen IR the lowering takes (``config.single_trace``, the table of
        :func:`engine.executorch_lowering.trace_table`), or ``torch.export.export`` for the two passes."""
        table = getattr(self, "_trace_table", None)
        if table is None:
            return super().export_program(model, inputs, dynamic_shapes, config)
        # the table's decompositions run as run_decompositions runs them (not size-oblivious, as torch.onnx's)
        return self.export_program_decomposed(model, inputs, dynamic_shapes, config, table, size_oblivious=False)

    @staticmethod
    def save(program, path: str | os.PathLike) -> str:
        """Write ``program`` (the ``ExecutorchProgramManager`` from :meth:`export`) to ``path`` (a ``.pte``); returns
        the path. The same as :func:`engine.artifacts.save_artifact` for this kind."""
        from engine.artifacts import save_pte

        return save_pte(program, path)
