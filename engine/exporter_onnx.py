"""``OnnxExporter``: a model and sample inputs become a ``torch.onnx.ONNXProgram`` that runs in onnxruntime.

``export()`` reads as the six stages every exporter shares (:mod:`engine`): **prepare** (the ONNX stack, the
opset, the output path), **trace** (:meth:`DynamoExporter.trace` with the ``"onnx"`` patches active as well as the
``"dynamo"`` ones; by default straight to the decomposed ATen IR, :mod:`engine.single_trace`), **fix the program**
(the FX fixes of :mod:`engine.patches.onnx`, run again after ``torch.onnx.export``'s own decomposition), **lower**
(``torch.onnx.export`` through onnxscript's torchlib, with the translations of
:mod:`engine.patches.onnx_translations` and the ``"onnx"`` patches active, then the optimizer), **describe**
(graph inputs and outputs named after the model's leaves, :mod:`engine.onnx_io`; the trace's shape guards in
``metadata_props``) and **write** (the ``.onnx`` file, with ``output_path``).

:func:`engine.run_exported` maps an onnxruntime result straight back to eager leaves by those names.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

import engine.patches.unlowerable_ops  # noqa: F401  (registers the fixes shared with ExecuTorch)
from engine.artifact_meta import DRAWS_KEY, GUARDS_KEY, INDEX_INPUTS_KEY, INPUTS_KEY, MODEL_KEY
from engine.index_inputs import find_index_inputs
from engine.input_checks import exported_program_specs, specs_to_json
from engine.configs import OnnxConfig
from engine.errors import ConfigError, ExportStageError, require
from engine.exporter_dynamo import DynamoExporter, stack_traces_as_configured
from engine.fake_mode import fake_dispatch_cache_off_while_tracing
from engine.onnx_io import io_leaf_names, name_graph_io, save_onnx
from engine.patches import apply_fx_node_fixes, apply_fx_program_fixes, apply_patches
from engine.patches.onnx import TARGET_OPSET, decompose_once_applies, onnx_decomposition_table
from engine.prepare import model_name
from engine.pte_metadata import drop_none_outputs
from engine.random_draws import lift_random_draws
from engine.shape_guards import program_guards
from engine.single_trace import single_trace_supported

logger = logging.getLogger("engine")


#: the extra that provides onnx, onnxscript and onnxruntime
EXTRA = "onnx"


class OnnxExporter(DynamoExporter):
    """Export a ``PreTrainedModel`` (or any ``nn.Module``) to ONNX through ``torch.export``.

    >>> program = OnnxExporter().export(model, inputs, config=OnnxConfig(dynamic=True))
    >>> run_exported(program, inputs)  # {"logits": ..., "past_key_values.0.keys": ...}, on onnxruntime
    >>> OnnxExporter().export(model, inputs, config=OnnxConfig(output_path="out/model.onnx"))

    After each export ``self.timings`` holds the seconds spent per step: ``trace`` (torch.export),
    ``onnx-export`` (decomposition + translation), ``optimize`` (onnxscript passes), ``save``.
    """

    config_class = OnnxConfig
    patch_backends = ("dynamo", "onnx")

    def __init__(self):
        self.timings: dict[str, float] = {}

    def export(self, model: torch.nn.Module, inputs: Mapping[str, Any], config: OnnxConfig | Mapping | None = None):
        # torch.onnx.export decomposes the program in one more retrace of new shapes: like the trace, it runs
        # faster without the fake dispatch cache (engine.exporter_dynamo), so the cache stays off for both
        # (tiny Mamba2 20.0 -> 12.7 CPU s, ResNet 4.6 -> 3.2, T5 8.6 -> 7.8, Llama 3.6 -> 3.6)
        with fake_dispatch_cache_off_while_tracing():
            return self._export(model, inputs, self.config_class.coerce(config))

    def export_program(self, model: torch.nn.Module, inputs: Mapping[str, Any], dynamic_shapes: Any,
                       config: OnnxConfig) -> torch.export.ExportedProgram:
        """Trace straight to the decomposed ATen IR ``torch.onnx.export`` translates (``config.single_trace``);
        ``_patch_decompose_once`` then keeps ``torch.onnx.export`` from decomposing it again."""
        if not (config.single_trace and single_trace_supported() and decompose_once_applies()):
            return super().export_program(model, inputs, dynamic_shapes, config)
        return self.export_program_decomposed(model, inputs, dynamic_shapes, config,
                                              onnx_decomposition_table(TARGET_OPSET.get()))

    def _export(self, model: torch.nn.Module, inputs: Mapping[str, Any], config: OnnxConfig):
        """The pipeline, stage by stage (the stages every exporter shares: :mod:`engine`)."""
        from engine.patches.onnx_translations import translation_table

        # ── Stage 1: Prepare: the ONNX stack, the opset and the output path ─────────────────────────
        require_onnx_stack()
        opset = resolve_opset(config.opset_version)
        output_path = check_output_path(config.output_path)
        name = model_name(model) if isinstance(model, torch.nn.Module) else type(model).__name__
        self.timings = timings = {}
        clock = time.perf_counter()

        # ── Stage 2: Trace: the "onnx" patches active with the "dynamo" ones ──────────────────────
        target = TARGET_OPSET.set(opset)
        try:
            program = self.trace(model, inputs, config)
        finally:
            TARGET_OPSET.reset(target)
        draws = lift_random_draws(program)  # inputs the runner draws on torch's generator, as eager does
        input_names, output_names = io_leaf_names(program)
        guards = program_guards(program)  # what the model's code assumed of the traced sizes, checked by the runner
        timings["trace"], clock = _lap(clock)

        # ── Stage 3: Fix the program: FX fixes (again after torch.onnx.export decomposes it) ─────────
        if _returns_constants(program):  # already unnamed: torch.onnx drops None outputs but fails on an int
            drop_none_outputs(program)
        apply_fx_program_fixes("onnx", program)
        apply_fx_node_fixes("onnx", program.graph_module)

        with apply_patches("onnx"), stack_traces_as_configured(config):
            # ── Stage 4: Lower: torch.onnx.export with our translations, then the optimizer ─────────
            try:
                onnx_program = torch.onnx.export(
                    program,
                    (),
                    dynamo=True,
                    opset_version=opset,
                    custom_translation_table=translation_table(),
                    optimize=False,  # run below, timed on its own
                    verbose=False,
                )
            except Exception as e:
                raise ExportStageError("onnx-export", name, e) from e
            timings["onnx-export"], clock = _lap(clock)
            if config.optimize:
                try:
                    onnx_program.optimize()
                except Exception as e:
                    raise ExportStageError("optimize", name, e) from e
            timings["optimize"], clock = _lap(clock)

        # ── Stage 5: Describe: graph I/O named after the leaves; leaf names, input specs, index inputs and guards
        #    as metadata (the runner checks inputs as every runner does) ─────────────────────────────────────
        try:
            name_graph_io(onnx_program.model, input_names, output_names)
            props = onnx_program.model.metadata_props
            props[MODEL_KEY] = name
            specs = exported_program_specs(program)
            if specs is not None:
                props[INPUTS_KEY] = json.dumps(specs_to_json(specs))
                props[INDEX_INPUTS_KEY] = json.dumps(find_index_inputs(program))
            if guards["guards"]:
                props[GUARDS_KEY] = json.dumps(guards)
            if draws is not None:
                props[DRAWS_KEY] = json.dumps(draws)
        except ValueError as e:
            raise ExportStageError("onnx-export", name, e) from e

        # ── Stage 6: Write: the .onnx file (and its weights' sidecar), when an output path is given ──
        if output_path is not None:
            try:
                save_onnx(
                    onnx_program,
                    output_path,
                    external_data=config.external_data,
                    export_params=config.export_params,
                    keep_initializers_as_inputs=config.keep_initializers_as_inputs,
                )
            except Exception as e:
                raise ExportStageError("save", name, e) from e
        timings["save"], _ = _lap(clock)
        return onnx_program


def _returns_constants(program: torch.export.ExportedProgram) -> bool:
    """Whether the program returns a constant other than ``None`` (MaskFormer-Swin's Python int spatial sizes):
    torch.onnx cannot translate such an output ('int' object has no attribute 'name'); like a ``None``, it has no
    graph output name (:func:`engine.onnx_io.io_leaf_names`)."""
    from torch.export.graph_signature import ConstantArgument, OutputKind

    return any(s.kind == OutputKind.USER_OUTPUT and isinstance(s.arg, ConstantArgument) and s.arg.value is not None
               for s in program.graph_signature.output_specs)


def _lap(start: float) -> tuple[float, float]:
    now = time.perf_counter()
    return now - start, now


# ── Stage 1: Prepare: the checks done before any tracing ─────────────────────────────────────────────────────────────────


def require_onnx_stack() -> None:
    """The exporter needs onnx and onnxscript (onnxruntime only to run the result)."""
    require("onnx", EXTRA)
    require("onnxscript", EXTRA)


def supported_opsets() -> range:
    """Opsets ``torch.onnx.export`` can target with the installed onnxscript.

    torchlib writes opset 18 and onnxscript's version converter takes the model from there; its supported
    range is the range of opsets an export can produce.
    """
    try:
        from onnxscript.version_converter import _version_converter as converter

        return range(converter.SUPPORTED_MIN_ONNX_OPSET, converter.SUPPORTED_MAX_ONNX_OPSET + 1)
    except (ImportError, AttributeError):  # private constants moved: fall back to the opsets onnxscript can write
        import re

        import onnxscript.onnx_opset as opsets

        found = [int(m.group(1)) for n in dir(opsets) if (m := re.fullmatch(r"opset(\d+)", n))]
        return range(18, max(found) + 1)


def resolve_opset(requested: int | None) -> int:
    """``None`` -> the newest opset the installed onnxscript supports; anything outside its range is a ConfigError."""
    opsets = supported_opsets()
    if requested is None:
        return opsets[-1]
    if requested not in opsets:
        import onnxscript

        raise ConfigError(
            f"OnnxConfig.opset_version={requested} cannot be targeted by the installed onnxscript "
            f"{onnxscript.__version__}; supported opsets: {opsets[0]} to {opsets[-1]}"
        )
    return requested


def check_output_path(path: str | os.PathLike | None) -> Path | None:
    if path is None:
        return None
    if not isinstance(path, (str, os.PathLike)):
        raise ConfigError(f"OnnxConfig.output_path must be a str or os.PathLike, got {type(path).__name__}")
    path = Path(path)
    if path.suffix != ".onnx":
        raise ConfigError(f"OnnxConfig.output_path must end with '.onnx' (run_exported recognises that), got '{path}'")
    if not path.parent.is_dir():
        raise ConfigError(f"OnnxConfig.output_path: folder '{path.parent}' does not exist; create it first")
    return path
