"""``DynamoExporter``: a model and sample inputs become a ``torch.export.ExportedProgram``.

``export()`` reads top to bottom as the pipeline. The ONNX and ExecuTorch exporters reuse :meth:`trace`
(stages 1-5, with their own patch registries active) and add their stages after it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

import torch

from engine.configs import DynamoConfig
from engine.errors import ExportStageError
import engine.model_patches  # noqa: F401  (registers the model patches every exporter traces with)
from engine.patches import apply_patches
from engine.prepare import model_name, prepare_for_export
from engine.pytree import register_pytree_nodes
from engine.shapes import auto_dynamic_shapes, specialised_dims, warn_specialised
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
        return self.trace(model, inputs, config)

    def export_for_generation(self, model: torch.nn.Module, inputs: Mapping[str, Any], config: DynamoConfig | Mapping | None = None):
        """Export every component of :func:`engine.decompose.decompose_for_generation`.

        Returns ``{component: artifact}`` with the generation plan attached, ready for :func:`engine.generate`.
        With an ``output_path`` in the config, each component is written beside it as ``<stem>.<component><suffix>``.
        """
        from engine.decompose import GenerationPlan, decompose_for_generation
        from engine.generate import GenerationComponents

        import engine.generation_patches  # noqa: F401  (registers the "generation" patches)

        config = self.config_class.coerce(config)
        plan = GenerationPlan()
        components = GenerationComponents(plan=plan)
        with apply_patches("generation"):  # the capture too: templates must match what the steps compute
            parts = decompose_for_generation(model, inputs, plan)
            for name, (module, kwargs) in parts.items():
                components[name] = self.export(module, kwargs, config=_component_config(config, name))
        return components

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
            if dynamic_shapes is None and config.dynamic:
                dynamic_shapes = auto_dynamic_shapes(inputs, getattr(model, "config", None))

            # ── Stage 5: Model state clean-up ─────────────────────────────────────────────────────
            # Attributes and buffers the trace leaves as FakeTensors are restored on exit.
            stack.enter_context(restore_module_state(model))

            try:
                program = torch.export.export(
                    model,
                    (),
                    kwargs=inputs,
                    dynamic_shapes=dynamic_shapes,
                    strict=config.strict,
                    prefer_deferred_runtime_asserts_over_guards=config.prefer_deferred_runtime_asserts_over_guards,
                )
            except Exception as e:
                raise ExportStageError("export", name, e) from e

        # ── Specialisation report ─────────────────────────────────────────────────────────────────
        if dynamic_shapes is not None:
            warn_specialised(name, specialised_dims(program, inputs, dynamic_shapes))
        return program
