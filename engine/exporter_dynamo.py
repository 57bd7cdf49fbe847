"""``DynamoExporter``: a model and sample inputs become a ``torch.export.ExportedProgram``.

``export()`` reads as the stages every exporter shares (:mod:`engine`): prepare, **trace** (:meth:`trace`, whose
steps 2a-2h are labelled below), **fix the program** (what ``torch.export.save`` cannot write,
:mod:`engine.patches.program_io`). The ONNX and ExecuTorch exporters reuse :meth:`trace` (with their own patch
registries active) and add their lowering after it.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import time
from collections.abc import Mapping
from typing import Any

import torch

import engine.patches.model  # noqa: F401  (registers the model patches and trace contexts every exporter traces with)
import engine.patches.program_io  # noqa: F401  (registers the fixes for what torch.export.save cannot write)
import engine.patches.torch_export  # noqa: F401  (registers the torch.export internals every exporter traces with)
from engine.configs import DynamoConfig
from engine.errors import ExportStageError
from engine.fake_mode import fake_dispatch_cache_off_while_tracing, restore_fake_dispatch_cache
from engine.patches import apply_fx_node_fixes, apply_fx_program_fixes, apply_patches, apply_trace_contexts
from engine.prepare import model_name, prepare_for_export
from engine.pytree import register_pytree_nodes
from engine.shape_guards import warn_for_program
from engine.shapes import (
    auto_dynamic_shapes,
    relax_floor_derived_lower_bounds,
    specialised_dims,
    warn_specialised,
    widen_unit_dims,
)
from engine.signature import call_program, flat_forward, restore_module_state
from engine.single_trace import SymbolicWorkExceeded, export_decomposed
from engine.versions import warn_on_version_drift

logger = logging.getLogger("engine")

#: a program traced with size-1 dims at 2 is kept only if it computes the eager outputs at the sample within this
SAMPLE_TOLERANCE = 1e-4


@contextlib.contextmanager
def stack_traces_as_configured(config: DynamoConfig):
    """With ``config.stack_traces=False``, no trace inside records a node's Python stack: torch.fx captures and
    symbolizes one per traced node otherwise, and a retrace (ExecuTorch's lowering passes) captures one for every
    node that has none. A torch without the switch traces as before."""
    fx_config = torch.fx.config
    if config.stack_traces or not hasattr(fx_config, "do_not_emit_stack_traces"):
        yield
        return
    before = fx_config.do_not_emit_stack_traces
    fx_config.do_not_emit_stack_traces = True
    try:
        yield
    finally:
        fx_config.do_not_emit_stack_traces = before


class DynamoExporter:
    """Export any ``nn.Module`` (a transformers ``PreTrainedModel`` included) with ``torch.export``.

    >>> exported = DynamoExporter().export(model, inputs, config=DynamoConfig(dynamic=True))
    >>> outputs = exported.module()(**inputs)
    """

    config_class: type[DynamoConfig] = DynamoConfig
    #: patch registries active while tracing; subclasses add their backend's
    patch_backends: tuple[str, ...] = ("dynamo",)
    #: whether a program whose guards restrict a dim is retraced size-oblivious (:meth:`_retrace_where_guards_restrict`)
    size_oblivious_retrace: bool = True

    def export(self, model: torch.nn.Module, inputs: Mapping[str, Any], config: DynamoConfig | Mapping | None = None):
        """The pipeline, stage by stage (the stages every exporter shares: :mod:`engine`); stages 4-6 (lower,
        describe, write) have nothing to do: the ``ExportedProgram`` is the artifact (:func:`engine.save_artifact`)."""
        # ── Stage 1: Prepare: the config (the model and inputs are prepared inside the trace) ────────
        config = self.config_class.coerce(config)

        # ── Stage 2: Trace ───────────────────────────────────────────────────────────────────────────
        program = self.trace(model, inputs, config)

        # ── Stage 3: Fix the program: what torch.export.save cannot write (math.ceil of a size) ──────
        apply_fx_program_fixes("dynamo", program)
        apply_fx_node_fixes("dynamo", program.graph_module)
        return program

    def export_for_generation(self, model: torch.nn.Module, inputs: Mapping[str, Any], config: DynamoConfig | Mapping | None = None):
        """Export every component of :func:`engine.generation.decompose.decompose_for_generation` with this exporter.

        Returns ``{component: artifact}`` with the generation plan attached, ready for :func:`engine.generate`.
        With an ``output_path`` in the config, each component is written beside it as ``<stem>.<component><suffix>``.
        When the decode program also computes the prefill, the ``prefill`` entry is that same artifact and file
        (:mod:`engine.generation.export`).
        """
        from engine.generation.export import export_for_generation

        return export_for_generation(self, model, inputs, config)

    def trace(self, model: torch.nn.Module, inputs: Mapping[str, Any], config: DynamoConfig) -> torch.export.ExportedProgram:
        """Stage 2 of every exporter, steps 2a-2h around ``torch.export.export``; returns the ``ExportedProgram``."""
        warn_on_version_drift()
        model, inputs, flags = prepare_for_export(model, inputs)
        name = model_name(model)

        # ── 2a: Dynamic shapes: computed first, with the size-1 widening (the sample depends on them) ───────
        dynamic_shapes = config.dynamic_shapes
        auto_shapes = dynamic_shapes is None and config.dynamic
        if auto_shapes:
            dynamic_shapes = auto_dynamic_shapes(inputs, getattr(model, "config", None))

        # torch.export specialises a dim traced at size 1 (a one-token decoder prompt, a batch of one): such dims
        # are traced at 2 instead, and that program is kept where it reproduces the eager outputs at the sample
        program = None
        widened = widen_unit_dims(inputs, dynamic_shapes) if auto_shapes else None
        if widened is not None and self._eager_outputs(model, widened, flags) is None:
            logger.debug("%s: the model refuses its size-1 dims at 2 in eager; traced as sampled", name)
            widened = None
        if widened is not None:
            try:
                program = self._trace_at(model, widened, flags, dynamic_shapes, config)
            except Exception as e:  # the model requires the size 1 (a channel count, a placeholder count): as sampled
                logger.debug("%s: tracing size-1 dims at 2 failed (%s: %s); traced as sampled", name, type(e).__name__, e)
            if program is not None and not self._reproduces_sample(program, model, inputs, flags):
                logger.debug("%s: the program traced with size-1 dims at 2 differs at the sample; traced as sampled", name)
                program = None
        if program is None:
            try:
                program = self._trace_at(model, inputs, flags, dynamic_shapes, config)
            except Exception as e:
                raise ExportStageError("export", name, e) from e
        # guards that reject larger sizes within a dim's bounds (Mamba2 traced below its chunk keeps one chunk): a
        # retrace that takes fewer is kept where it holds at the sample and at a size the first one rejected
        if dynamic_shapes is not None:
            program = self._retrace_where_guards_restrict(program, model, inputs, flags, dynamic_shapes, config)

        # ── 2g: Lower bounds: what the 0/1-specialisation floor made checked (dynamic=True specs only) ─────
        if auto_shapes:
            relaxed = relax_floor_derived_lower_bounds(program)
            if relaxed:
                logger.debug("%s: lower bounds derived from the floor of 2 relaxed: %s", name, relaxed)

        # ── 2h: Specialisation and shape-guard report: what the model's code left on the dynamic dims ──────────
        if dynamic_shapes is not None:
            warn_specialised(name, specialised_dims(program, inputs, dynamic_shapes))
            warn_for_program(name, program)
        return program

    def _trace_at(self, model: torch.nn.Module, inputs: Mapping[str, Any], flags: Mapping[str, Any], dynamic_shapes: Any,
                  config: DynamoConfig, *, two_passes: bool = False) -> torch.export.ExportedProgram:
        """Steps 2b-2f around :meth:`export_program`, for one sample (``two_passes``: the plain ``torch.export``
        of this class, whose decompositions the backend then runs, instead of a subclass's single trace)."""
        name = model_name(model)
        with contextlib.ExitStack() as stack:
            # ── 2b: Patches: of the exporter's backends, model patches first ──
            # Before 2c, which binds model.forward: a patch of the model's own class forward must be the one bound.
            for backend in self.patch_backends:
                applied = stack.enter_context(apply_patches(backend))
                if applied:
                    logger.debug("%s: %s patches applied: %s", name, backend, ", ".join(applied))

            # ── 2c: Forward-signature flattening ────────────────────────────────────────────────────────────
            # kwargs become an explicit signature; output flags are bound as constants.
            stack.enter_context(flat_forward(model, list(inputs), flags))
            # ── 2d: Trace contexts: patches whose targets are found on the model (packed attention, grids, experts) ──
            for backend in self.patch_backends:
                applied = stack.enter_context(apply_trace_contexts(backend, model))
                if applied:
                    logger.debug("%s: %s trace contexts applied: %s", name, backend, ", ".join(applied))

            # ── 2e: Pytree registration ─────────────────────────────────────────────────────────────────────
            # Every loaded Cache/cache-layer class and standalone cache, and any ModelOutput type among the inputs.
            register_pytree_nodes(inputs)

            # ── 2f: Model state clean-up: around torch.export ───────────────────────────────────────────────
            # Attributes and buffers the trace leaves as FakeTensors are restored on exit.
            stack.enter_context(restore_module_state(model))
            stack.enter_context(stack_traces_as_configured(config))

            with fake_dispatch_cache_off_while_tracing():
                export_program = DynamoExporter.export_program if two_passes else type(self).export_program
                program = export_program(self, model, inputs, dynamic_shapes, config)
            restore_fake_dispatch_cache(program)
            return program

    def _retrace_where_guards_restrict(self, program: torch.export.ExportedProgram, model: torch.nn.Module,
                                       inputs: Mapping[str, Any], flags: Mapping[str, Any], dynamic_shapes: Any,
                                       config: DynamoConfig) -> torch.export.ExportedProgram:
        """``program``, or a retrace whose guards reject fewer of the probed sizes (:func:`~engine.shape_guards.restrictions`).

        Pattern: a derived size the sample makes 0 or 1 (a Mamba2 traced below ``chunk_size``: one chunk) is
        specialised like a size-1 dim, so longer inputs are refused (a broken guard compares with 0 or 1:
        :func:`~engine.shape_guards.pins_a_unit_size`; eager takes that size). Tried in turn: the sample under
        ``backed_size_oblivious`` (two passes: a single trace's decompositions guard again), then the sample grown
        to the first rejected size. A retrace is kept only if it accepts the sample and reproduces eager there and
        at a size the first one rejected; else ``program`` stays."""
        import torch.fx.experimental._config as fx_config

        from engine.shape_guards import accepts, grow_dim, pins_a_unit_size, program_guards, rejected_probes, restrictions

        traced, probes, before = restrictions(program)
        guards = program_guards(program)
        leaf, [(size, _), *_] = next(iter(before.items()), (None, [(None, None)]))
        if leaf is None or not pins_a_unit_size(guards, traced, leaf, size):
            return program  # no guard restricts, or only sizes the model needs (no 0/1 specialisation to avoid)
        name = model_name(model)
        grown = grow_dim(inputs, program, leaf, size)
        if grown is not None and self._eager_outputs(model, grown, flags) is None:
            logger.debug("%s: eager refuses %s dim %s = %s too; no retrace", name, leaf[0], leaf[1], size)
            return program  # a size the model needs after all: no trace can accept it
        # at the size itself only where nothing but 0/1 guards break there (Florence-2's window branches do too)
        only_unit = pins_a_unit_size(guards, traced, leaf, size, only=True)
        attempts = [("size-oblivious at the sample", inputs if self.size_oblivious_retrace else None, True),
                    (f"at {leaf[0]} dim {leaf[1]} = {size}", grown if only_unit else None, False)]
        for how, sample, oblivious in attempts:
            if sample is None:
                continue
            started = time.perf_counter()

            def took() -> float:
                return time.perf_counter() - started

            try:
                with fx_config.patch(backed_size_oblivious=oblivious):
                    candidate = self._trace_at(model, sample, flags, dynamic_shapes, config, two_passes=oblivious)
            except Exception as e:
                logger.debug("%s: retrace %s (%.1f s) failed (%s: %s)", name, how, took(), type(e).__name__, e)
                continue
            record = program_guards(candidate)
            if not accepts(record, traced):
                logger.debug("%s: retrace %s (%.1f s) rejects the sample; kept the first trace", name, how, took())
                continue
            after = rejected_probes(record, traced, probes)
            newly = [(where, s) for where, rejected in before.items() for s, _ in rejected
                     if s not in {t for t, _ in after.get(where, ())}]
            if sum(map(len, after.values())) >= sum(map(len, before.values())) or not newly:
                logger.debug("%s: retrace %s (%.1f s) rejects as many sizes; kept the first trace", name, how, took())
                continue
            at_newly = grow_dim(inputs, program, *newly[0])
            if at_newly is None or not all(self._reproduces_sample(candidate, model, s, flags) for s in (inputs, at_newly)):
                logger.debug("%s: retrace %s (%.1f s) differs from eager at the sample or at %s", name, how, took(), newly[0])
                continue
            logger.debug("%s: retrace %s (%.1f s) kept: its guards reject fewer sizes", name, how, took())
            return candidate
        return program

    @staticmethod
    def _eager_outputs(model: torch.nn.Module, inputs: Mapping[str, Any], flags: Mapping[str, Any]) -> list | None:
        """The eager output leaves at ``inputs``, None where eager refuses them. 2a traces a sample it made
        (size-1 dims at 2, a dim grown to a size a guard rejects) only where eager takes it: one it refuses (a
        channel count of 1, a reshape the size does not divide) fails to trace or gives a program
        :meth:`_reproduces_sample` rejects, at the cost of a whole trace."""
        from engine.pytree import get_leaf_tensors

        with torch.no_grad():
            try:
                return get_leaf_tensors(model(**copy.deepcopy(dict(inputs)), **flags))
            except Exception:
                return None

    @staticmethod
    def _reproduces_sample(program: torch.export.ExportedProgram, model: torch.nn.Module, inputs: Mapping[str, Any],
                           flags: Mapping[str, Any]) -> bool:
        """Whether ``program`` (traced at a widened sample) accepts the sample itself (its shape guards hold there:
        the runners of ONNX and ExecuTorch check them) and computes the eager outputs there at the tolerance the
        sweep checks (1e-4): the branch a size-1 dim would take in the model's code is the one the program has, or
        the sample falls back to being traced as it is."""
        from engine.compare import compare_leaves
        from engine.errors import InputError
        from engine.pytree import get_leaf_tensors
        from engine.shape_guards import check, program_guards

        try:  # a guard the widened trace took that the sample breaks (Mllama: images x batch != tiles' batch)
            check(model_name(model), program_guards(program), get_leaf_tensors(dict(inputs)))
        except InputError:
            return False
        expected = DynamoExporter._eager_outputs(model, inputs, flags)
        if expected is None:
            return False
        with torch.no_grad():
            try:
                got = get_leaf_tensors(call_program(program, copy.deepcopy(dict(inputs))))
            except Exception:  # the program rejects the sample (a guard the widened trace took)
                return False
        return compare_leaves(expected, got, atol=SAMPLE_TOLERANCE, rtol=SAMPLE_TOLERANCE).ok

    def export_program_decomposed(self, model: torch.nn.Module, inputs: Mapping[str, Any], dynamic_shapes: Any,
                                  config: DynamoConfig, table: Mapping, *, size_oblivious: bool = True,
                                  ) -> torch.export.ExportedProgram:
        """One trace straight to the ATen IR ``table`` decomposes to (:func:`engine.single_trace.export_decomposed`),
        for an exporter whose backend would decompose the program again; the two passes' ``torch.export.export``
        where that trace guards on a data-dependent size or spends its symbolic-work budget."""
        from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

        try:
            return export_decomposed(
                model,
                inputs,
                table,
                dynamic_shapes=dynamic_shapes,
                strict=config.strict,
                prefer_deferred_runtime_asserts_over_guards=config.prefer_deferred_runtime_asserts_over_guards,
                size_oblivious=size_oblivious,
            )
        except (GuardOnDataDependentSymNode, SymbolicWorkExceeded):
            # Decomposing composite-implicit ops while tracing can guard on an unbacked size that the two passes
            # (torch.export, then run_decompositions) leave symbolic: SAM 3's text and vision towers fail the single
            # trace with Eq(u0*u1, 16) in _special_op_to_decompose_cia and export in two passes. Those are the
            # fallback; a model that is data-dependent for torch.export itself fails there as before.
            return DynamoExporter.export_program(self, model, inputs, dynamic_shapes, config)

    def export_program(self, model: torch.nn.Module, inputs: Mapping[str, Any], dynamic_shapes: Any,
                       config: DynamoConfig) -> torch.export.ExportedProgram:
        """The ``torch.export`` call of :meth:`trace` (an exporter that wants another IR traces to it here)."""
        return torch.export.export(
            model,
            (),
            kwargs=inputs,
            dynamic_shapes=dynamic_shapes,
            strict=config.strict,
            prefer_deferred_runtime_asserts_over_guards=config.prefer_deferred_runtime_asserts_over_guards,
        )


