"""``export_for_generation``: every component of a generation decomposition exported, ready for :func:`engine.generate`.

The components come from :func:`engine.generation.decompose.decompose_for_generation` (prefill and decode steps, encoders,
a multimodal model's parts); each is exported by the exporter given (any of the three), with the ``"generation"``
patches active. Where a program already computes another component (the decode program over an empty cache is a
prefill; a multimodal model's parts are its prefill), that is checked on the captured call and the program serves
both, so it is not exported twice.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

import engine.patches.generation  # noqa: F401  (registers the "generation" patches)
from engine.compare import compare_leaves
from engine.generation.decompose import decompose_for_generation
from engine.generation.plan import GenerationPlan
from engine.generation.prefill import cache_kwargs, prefill_through_decode
from engine.errors import ExportStageError
from engine.generation.loop import GenerationComponents, run_multimodal_prefill
from engine.patches import apply_patches
from engine.prepare import model_name
from engine.pytree import get_leaf_tensors
from engine.runtime import run_exported

logger = logging.getLogger("engine")


def _component_config(config: Any, component: str) -> Any:
    """``config`` with its ``output_path`` (if any) renamed ``<stem>.<component><suffix>``."""
    path = getattr(config, "output_path", None)
    if path is None:
        return config
    path = Path(path)
    return dataclasses.replace(config, output_path=str(path.with_name(f"{path.stem}.{component}{path.suffix}")))


def export_for_generation(exporter: Any, model: torch.nn.Module, inputs: Mapping[str, Any], config: Any = None):
    """Export every component of :func:`engine.generation.decompose.decompose_for_generation`.

    Returns ``{component: artifact}`` with the generation plan attached, ready for :func:`engine.generate`.
    With an ``output_path`` in the config, each component is written beside it as ``<stem>.<component><suffix>``.
    When the decode program also computes the prefill (checked, see :func:`_decode_serves_prefill`), the
    ``prefill`` entry is that same artifact and file.
    """
    config = exporter.config_class.coerce(config)
    plan = GenerationPlan()
    exported: dict[str, Any] = {}
    seconds: dict[str, float] = {}
    with apply_patches("generation"):  # the capture too: templates must match what the steps compute
        parts = decompose_for_generation(model, inputs, plan)
        for name in sorted(parts, key=lambda n: n == "prefill"):  # the others first: they may serve the prefill
            if name == "prefill" and _multimodal_components_serve_prefill(exported, parts, plan):
                continue
            if name == "prefill" and _decode_serves_prefill(exported.get("decode"), parts, plan):
                exported[name] = exported["decode"]
            else:
                module, kwargs = parts[name]
                started = time.perf_counter()
                if name == plan.decode:
                    exported[name] = _export_decode(exporter, module, kwargs, plan, _component_config(config, name))
                else:
                    exported[name] = exporter.export(module, kwargs, config=_component_config(config, name))
                seconds[name] = round(time.perf_counter() - started, 4)
    plan.one_token_decode = None
    return GenerationComponents({name: exported[name] for name in parts if name in exported}, plan=plan, seconds=seconds)


def _export_decode(exporter: Any, module: torch.nn.Module, merged: Mapping[str, Any], plan: GenerationPlan, config: Any) -> Any:
    """The decode program: the merged two-token step (its query length symbolic, so it also serves the prefill
    and runs one token at a time), checked on the last captured one-token call; when that step cannot be
    exported or its program does not reproduce the one-token call (a Python loop over the query tokens unrolled
    and pinned to two: MiniMax's lightning attention, RWKV; a model that asserts one token per cached step:
    ProphetNet), the one-token call itself, with the query length fixed at 1 (and the prefill its own program)."""
    single = plan.one_token_decode
    try:
        program = exporter.export(module, merged, config=config)
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
    return exporter.export(module, single, config=config)


def _multimodal_components_serve_prefill(exported: Mapping[str, Any], parts: Mapping[str, Any], plan: GenerationPlan) -> bool:
    """Whether ``embed_tokens``, the merge, ``language_model`` and ``lm_head`` compute the multimodal prefill, so it
    needs no program of its own (:class:`engine.generation.decompose.MultimodalPrefill`).

    Checked like :func:`_decode_serves_prefill`: the exported programs run on the captured prefill and must
    match the eager prefill's last logits and cache; otherwise ``plan.multimodal_prefill`` is dropped."""
    if plan.multimodal_prefill is None:
        return False
    module, prefill = parts["prefill"]
    caches = tuple(f"{name}." for name in cache_kwargs(prefill))

    def last_logits_and_cache(leaves):
        return {k: (v[:, -1] if k == "logits" else v) for k, v in leaves.items() if k == "logits" or k.startswith(caches)}

    if _reproduces_prefill("the multimodal components", module, prefill,
                           lambda: run_multimodal_prefill(exported, plan, copy.deepcopy(prefill)), last_logits_and_cache):
        return True
    plan.multimodal_prefill = None
    return False


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
