"""Multimodal rotary positions (M-RoPE) computed before the graph and passed as ``position_ids``.

Pattern: Qwen2-VL-style models (Qwen2/2.5/3-VL, GLM-4V, PaddleOCR-VL, Qwen3.5, ...) derive their 3-D rotary
positions in ``get_rope_index``, which walks each row's token types with
``itertools.groupby(enumerate(types.tolist()))`` over a boolean-mask selection of the row: a Python loop over a
data-dependent number of runs, which torch.export cannot trace (``GuardOnDataDependentSymNode`` in
``_refs.unbind``, https://github.com/pytorch/pytorch/issues/126685). The positions depend only on the token ids,
the image/video grids and the attention mask, so serving runtimes compute them on the host and give the model
``position_ids``, which makes its forward skip ``get_rope_index``. :func:`with_rope_position_ids` does the same
with the model's own ``compute_3d_position_ids``: the exported program then takes the positions as an input
(computed for new inputs by the same call), and eager with them computes what eager without them does
(:func:`with_rope_position_ids` is only used where that holds; the zoo checks it on every case).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from engine.swap import swap_attributes

#: the method transformers' M-RoPE models expose for their 3-D positions (on the inner ``*Model``)
METHOD = "compute_3d_position_ids"


def rope_positions_owner(model: torch.nn.Module) -> torch.nn.Module | None:
    """The (sub)module that computes ``model``'s multimodal rotary positions, or None for other models."""
    return next((m for m in model.modules() if callable(getattr(m, METHOD, None))), None)


def rope_position_ids(model: torch.nn.Module, inputs: dict[str, Any]) -> torch.Tensor | None:
    """The ``position_ids`` ``model`` would compute for ``inputs`` (no cache), or None where it has no M-RoPE or derives
    none from these inputs. The model's state (its remembered ``rope_deltas``) is left unchanged."""
    owner = rope_positions_owner(model)
    if owner is None:
        return None
    method = getattr(owner, METHOD)
    parameters = inspect.signature(method).parameters
    kwargs = {name: inputs.get(name) for name in parameters
              if name in inputs or parameters[name].default is inspect.Parameter.empty}
    # a fresh prompt: positions from the inputs, not from a previous call's deltas (restored after)
    fresh = [(owner, "rope_deltas", None)] if "rope_deltas" in vars(owner) else []
    with swap_attributes(fresh), torch.no_grad():
        return method(**kwargs)


def with_rope_position_ids(model: torch.nn.Module, inputs: dict[str, Any]) -> dict[str, Any]:
    """``inputs`` plus the model's M-RoPE ``position_ids`` where it computes them itself; otherwise ``inputs``."""
    if "position_ids" in inputs or "position_ids" not in inspect.signature(model.forward).parameters:
        return inputs
    positions = rope_position_ids(model, inputs)
    return inputs if positions is None else {**inputs, "position_ids": positions}


def generation_position_ids(model: torch.nn.Module, inputs: dict[str, Any]) -> torch.Tensor | None:
    """The ``position_ids`` ``model.generate(**inputs)`` gives its prefill, where the model computes its own: an
    override of ``_prepare_position_ids_for_generation`` (Qwen2-VL-like models: the text positions stacked on the
    three M-RoPE rows, ``[4, batch, length]``, from the same data-dependent ``get_rope_index``). None where
    generate()'s own positions (the mask's running count) hold, which :func:`engine.generate` computes itself.

    The exported prefill takes these positions as an input; computing them for a new prompt is host work, as in
    serving runtimes: pass the result to :func:`engine.generate` as ``position_ids``. The model's remembered
    ``rope_deltas`` are left as they were.
    """
    from transformers.generation.utils import GenerationMixin

    own = getattr(type(model), "_prepare_position_ids_for_generation", None)
    if own is None or own is GenerationMixin._prepare_position_ids_for_generation or "input_ids" not in inputs:
        return None
    owners = [m for m in model.modules() if "rope_deltas" in vars(m)]
    with swap_attributes([(m, "rope_deltas", m.rope_deltas) for m in owners]), torch.no_grad():
        return model._prepare_position_ids_for_generation(inputs["input_ids"], dict(inputs))
