"""``DynamoExporter``: a model and sample inputs become a ``torch.export.ExportedProgram``.

``export()`` reads top to bottom as the pipeline: :meth:`trace` (stages 1-5), then the FX node fixes of the
saved program (stage 6). The ONNX and ExecuTorch exporters reuse :meth:`trace` (with their own patch registries
active) and add their own stages after it.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import time
from collections.abc import Mapping
from typing import Any

import torch

from engine.compare import compare_leaves
from engine.configs import DynamoConfig
from engine.decompose import GenerationPlan, cache_kwargs, prefill_through_decode
from engine.errors import ExportStageError
import engine.model_patches  # noqa: F401  (registers the model patches every exporter traces with)
import engine.fx_fixes  # noqa: F401  (registers the node fixes, stage 6)
from engine.patches import apply_fx_node_fixes, apply_patches
from engine.prepare import model_name, prepare_for_export
from engine.pytree import get_leaf_tensors, register_pytree_nodes
from engine.runtime import run_exported
from engine.shapes import auto_dynamic_shapes, relax_floor_derived_lower_bounds, specialised_dims, warn_specialised
from engine.signature import flat_forward, restore_module_state
from engine.versions import warn_on_version_drift

logger = logging.getLogger("engine")


def _component_config(config: DynamoConfig, component: str) -> DynamoConfig:
    path = getattr(config, "output_path", None)
    if path is None:
        return config
    from pathlib import Path

    path = Path(path)
    return dataclasses.replace(config, output_path=str(path.with_name(f"{path.stem}.{component}{path.suffix}")))


class DynamoExporter:
    """Export any ``nn.Module`` (a transformers ``PreTrainedModel`` included) with ``torch.export``.

    >>> exported = DynamoExporter().export(model, inputs, config=DynamoConfig(dynamic=True))
    >>> outputs = exported.module()(**inputs)
    """

    config_class: type[DynamoConfig] = DynamoConfig
    #: patch registries active while tracing; subclasses add their backend's
    patch_backends: tuple[str, ...] = ("dynamo",)

    def export(self, model: torch.nn.Module, inputs: Mapping[str, Any], config: DynamoConfig | Mapping | None = None):
        config = self.config_class.coerce(config)
        program = self.trace(model, inputs, config)
        # ── Stage 6: FX node fixes: what torch.export.save cannot write (math.ceil of a size) ─────
        apply_fx_node_fixes("dynamo", program.graph_module)
        return program

    def export_for_generation(self, model: torch.nn.Module, inputs: Mapping[str, Any], config: DynamoConfig | Mapping | None = None):
        """Export every component of :func:`engine.decompose.decompose_for_generation`.

        Returns ``{component: artifact}`` with the generation plan attached, ready for :func:`engine.generate`.
        With an ``output_path`` in the config, each component is written beside it as ``<stem>.<component><suffix>``.
        When the decode program also computes the prefill (checked, see :meth:`_decode_serves_prefill`), the
        ``prefill`` entry is that same artifact and file.
        """
        from engine.decompose import decompose_for_generation
        from engine.generation import GenerationComponents

        import engine.generation_patches  # noqa: F401  (registers the "generation" patches)

        config = self.config_class.coerce(config)
        plan = GenerationPlan()
        exported: dict[str, Any] = {}
        seconds: dict[str, float] = {}
        with apply_patches("generation"):  # the capture too: templates must match what the steps compute
            parts = decompose_for_generation(model, inputs, plan)
            for name in sorted(parts, key=lambda n: n == "prefill"):  # the others first: they may serve the prefill
                if name == "prefill" and self._multimodal_components_serve_prefill(exported, parts, plan):
                    continue
                if name == "prefill" and self._decode_serves_prefill(exported.get("decode"), parts, plan):
                    exported[name] = exported["decode"]
                else:
                    module, kwargs = parts[name]
                    started = time.perf_counter()
                    if name == plan.decode:
                        exported[name] = self._export_decode(module, kwargs, plan, _component_config(config, name))
                    else:
                        exported[name] = self.export(module, kwargs, config=_component_config(config, name))
                    seconds[name] = round(time.perf_counter() - started, 4)
        plan.one_token_decode = None
        return GenerationComponents({name: exported[name] for name in parts if name in exported}, plan=plan, seconds=seconds)

    def _export_decode(self, module: torch.nn.Module, merged: Mapping[str, Any], plan: GenerationPlan, config: Any) -> Any:
        """The decode program: the merged two-token step (its query length symbolic, so it also serves the prefill
        and runs one token at a time), checked on the last captured one-token call; when that step cannot be
        exported or its program does not reproduce the one-token call (a Python loop over the query tokens unrolled
        and pinned to two: MiniMax's lightning attention, RWKV; a model that asserts one token per cached step:
        ProphetNet), the one-token call itself, with the query length fixed at 1 (and the prefill its own program)."""
        single = plan.one_token_decode
        try:
            program = self.export(module, merged, config=config)
        except ExportStageError as error:
            if single is None:
                raise
            logger.info("%s: the two-token decode step does not export (%s); exporting the one-token step",
                        model_name(module), str(error).splitlines()[0])
        else:
            if single is None or _reproduces_prefill("the two-token decode program", module, single,
                                                     lambda: run_exported(program, copy.deepcopy(single))):
                return program
            logger.info("%s: the two-token decode program does not run a one-token step; exporting the one-token step",
                        model_name(module))
        plan.templates[plan.decode] = single
        plan.empty_cache = None  # a one-token program cannot compute the prompt
        return self.export(module, single, config=config)

    @staticmethod
    def _multimodal_components_serve_prefill(exported: Mapping[str, Any], parts: Mapping[str, Any], plan: GenerationPlan) -> bool:
        """Whether ``embed_tokens``, the merge, ``language_model`` and ``lm_head`` compute the multimodal prefill, so it
        needs no program of its own (:class:`engine.decompose.MultimodalPrefill`).

        Checked like :meth:`_decode_serves_prefill`: the exported programs run on the captured prefill and must
        match the eager prefill's last logits and cache; otherwise ``plan.multimodal_prefill`` is dropped."""
        if plan.multimodal_prefill is None:
            return False
        from engine.generation import run_multimodal_prefill

        module, prefill = parts["prefill"]
        caches = tuple(f"{name}." for name in cache_kwargs(prefill))

        def last_logits_and_cache(leaves):
            return {k: (v[:, -1] if k == "logits" else v) for k, v in leaves.items() if k == "logits" or k.startswith(caches)}

        if _reproduces_prefill("the multimodal components", module, prefill,
                               lambda: run_multimodal_prefill(exported, plan, copy.deepcopy(prefill)), last_logits_and_cache):
            return True
        plan.multimodal_prefill = None
        return False

    @staticmethod
    def _decode_serves_prefill(decode: Any, parts: Mapping[str, Any], plan: GenerationPlan) -> bool:
        """Whether the (already exported) ``decode`` artifact computes the prefill, so it is not exported twice.

        A decode step with a symbolic query length over an empty cache (a dynamic one, or a static one zeroed)
        *is* a prefill (the peer's ``multi_token_decode`` says as much). That is checked, not assumed: the decode
        artifact runs on the captured prompt over :attr:`GenerationPlan.empty_cache` and must match the eager
        prefill leaf by leaf (logits and the cache it fills). Otherwise ``plan.empty_cache`` is dropped and the
        prefill gets its own program.
        """
        module, prefill = parts["prefill"]
        kwargs = prefill_through_decode(plan, prefill) if decode is not None and module is parts["decode"][0] else None
        if kwargs is not None and _reproduces_prefill("the decode program", module, prefill, lambda: run_exported(decode, kwargs)):
            return True
        plan.empty_cache = None
        return False

    def trace(self, model: torch.nn.Module, inputs: Mapping[str, Any], config: DynamoConfig) -> torch.export.ExportedProgram:
        """Stages 1-5 around ``torch.export.export``; returns the ``ExportedProgram``."""
        warn_on_version_drift()
        model, inputs, flags = prepare_for_export(model, inputs)
        name = model_name(model)

        with contextlib.ExitStack() as stack:
            # ── Stage 1: Forward-signature flattening ────────────────────────────────────────────
            # kwargs become an explicit signature; output flags are bound as constants.
            stack.enter_context(flat_forward(model, list(inputs), flags))

            # ── Stage 2: Model patches ────────────────────────────────────────────────────────────
            for backend in self.patch_backends:
                applied = stack.enter_context(apply_patches(backend))
                if applied:
                    logger.debug("%s: %s patches applied: %s", name, backend, ", ".join(applied))

            # ── Stage 3: Pytree registration ──────────────────────────────────────────────────────
            # Every loaded Cache/cache-layer class, and any ModelOutput type among the inputs.
            register_pytree_nodes(inputs)

            # ── Stage 4: Dynamic shapes ───────────────────────────────────────────────────────────
            dynamic_shapes = config.dynamic_shapes
            auto_shapes = dynamic_shapes is None and config.dynamic
            if auto_shapes:
                dynamic_shapes = auto_dynamic_shapes(inputs, getattr(model, "config", None))

            # ── Stage 5: Model state clean-up ─────────────────────────────────────────────────────
            # Attributes and buffers the trace leaves as FakeTensors are restored on exit.
            stack.enter_context(restore_module_state(model))

            try:
                with fake_dispatch_cache_off_while_tracing():
                    program = self.export_program(model, inputs, dynamic_shapes, config)
                restore_fake_dispatch_cache(program)
            except Exception as e:
                raise ExportStageError("export", name, e) from e

        # ── Lower bounds: what the 0/1-specialisation floor made checked (dynamic=True specs only) ─────
        if auto_shapes:
            relaxed = relax_floor_derived_lower_bounds(program)
            if relaxed:
                logger.debug("%s: lower bounds derived from the floor of 2 relaxed: %s", name, relaxed)

        # ── Specialisation report, and the guards the model's code left on the dynamic dims ──────────
        if dynamic_shapes is not None:
            warn_specialised(name, specialised_dims(program, inputs, dynamic_shapes))
            from engine.shape_guards import warn_for_program

            warn_for_program(name, program)
        return program

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


def _reproduces_prefill(label: str, module: torch.nn.Module, prefill: Mapping[str, Any], run: Any,
                        compared: Any = lambda leaves: leaves) -> bool:
    """Whether ``run()`` (exported programs standing in for the prefill) gives the eager prefill's leaves, as far as
    ``compared`` keeps them; programs that reject the captured prefill do not (the prefill is exported on its own)."""
    with torch.no_grad():
        expected = compared(get_leaf_tensors(module(**copy.deepcopy(prefill))))
    try:
        comparison = compare_leaves(expected, compared(run()))
    except Exception as e:
        logger.debug("%s: %s do not run the prefill: %s", model_name(module), label, e)
        return False
    if not comparison.ok:
        logger.debug("%s: %s differ from the prefill: %s", model_name(module), label, comparison)
    return comparison.ok


# ── Fake-tensor dispatch cache ──────────────────────────────────────────────────────────────────────
# FakeTensorMode caches each op's output metadata by its arguments, and on every miss it also synthesises the
# output back from the new entry to validate it (``_get_output_info_for_cache_entry``). A trace runs each op
# on new symbolic shapes, so nearly every op misses and pays for the entry and the synthesis: with the cache
# off, torch.export of the tiny Mamba2 takes 3.1 s instead of 5.5, T5 1.6 instead of 3.5, Llama 0.72 instead
# of 0.96 (CPU s). Lowering retraces the same graph again and again and gains from the cache (ExecuTorch's
# passes), so it is turned back on, on the program's fake mode, once the trace is done.


def fake_dispatch_cache_off_while_tracing():
    """A context in which new fake modes (the one torch.export creates) start with their dispatch cache off."""
    import torch._dynamo.config as dynamo_config

    return dynamo_config.patch(fake_tensor_cache_enabled=False)


def program_fake_mode(program: torch.export.ExportedProgram):
    """The fake mode the program's recorded values (``node.meta["val"]``) belong to; None when none has one."""
    for node in program.graph.nodes:
        fake_mode = getattr(node.meta.get("val"), "fake_mode", None)
        if fake_mode is not None:
            return fake_mode
    return None


def program_shape_env(program: torch.export.ExportedProgram):
    """The shape env of the program's fake mode (its symbols' ranges and guards); None when it has none."""
    return getattr(program_fake_mode(program), "shape_env", None)


@contextlib.contextmanager
def fake_dispatch_cache_off_while_decomposing(program: torch.export.ExportedProgram):
    """A context in which the program's fake mode runs without its dispatch cache, for a decomposition retrace
    (new symbolic shapes miss the cache, as in the trace), and then with the cache the process is configured with."""
    fake_mode = program_fake_mode(program)
    if fake_mode is not None and not fake_mode.propagate_real_tensors:
        fake_mode.cache_enabled = False
    try:
        yield
    finally:
        restore_fake_dispatch_cache(program)


def restore_fake_dispatch_cache(program: torch.export.ExportedProgram) -> None:
    """Give the program's fake mode the dispatch cache the process is configured with, for what comes after the
    trace (decomposition, lowering passes)."""
    import torch._dynamo.config as dynamo_config

    fake_mode = program_fake_mode(program)
    if fake_mode is not None and not fake_mode.propagate_real_tensors:
        fake_mode.cache_enabled = dynamo_config.fake_tensor_cache_enabled
