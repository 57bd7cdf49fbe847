"""Model and input preparation shared by every exporter and runner.

- validate the model and the inputs, with errors that say what was wrong and what is allowed;
- strip label inputs (loss computation is not exported);
- take output flags (``use_cache``, ``return_dict``, ...) and Python scalars out of the traced inputs: they
  become constants bound into the traced forward (see :mod:`engine.signature`), not graph inputs;
- materialise view and strided inputs (torch.export guards on a view's ``_base`` and on odd strides, which
  the fresh contiguous tensors of a later run lack);
- cast floating inputs to the model's dtype and every tensor to its device;
- switch flash/flex attention, which no backend can export, to ``sdpa``.
"""

from __future__ import annotations

import inspect
import logging
import sys
import typing
import warnings
from collections.abc import Mapping
from typing import Any

import torch

from engine.errors import InputError, ModelError
from engine.pytree import map_structure

logger = logging.getLogger("engine")

OUTPUT_FLAGS = (
    "use_cache",
    "return_dict",
    "output_attentions",
    "output_hidden_states",
    "output_router_logits",
    "return_loss",
)
LABEL_INPUTS = frozenset(
    {"labels", "label", "future_values", "start_positions", "end_positions", "next_sentence_label", "mc_labels"}
)
EXPORTABLE_ATTENTION = ("sdpa", "eager")


def is_label_input(name: str) -> bool:
    return name in LABEL_INPUTS or name.endswith("_labels")


def model_name(model: torch.nn.Module) -> str:
    return type(model).__name__


def check_model(model: Any) -> None:
    if not isinstance(model, torch.nn.Module):
        raise ModelError(
            f"model must be a torch.nn.Module (a transformers PreTrainedModel or any nn.Module), got {type(model).__name__}"
        )


def is_pretrained_model(model: Any) -> bool:
    """``isinstance(model, transformers.PreTrainedModel)`` without importing transformers' modeling utilities (a slow
    import): a ``PreTrainedModel`` exists only once they are imported, so a process exporting plain modules never pays
    for them."""
    modeling_utils = sys.modules.get("transformers.modeling_utils")
    return modeling_utils is not None and isinstance(model, modeling_utils.PreTrainedModel)


def accepted_input_names(model: torch.nn.Module) -> tuple[set[str], bool]:
    """Names ``model.forward`` takes, and whether it also takes arbitrary extra keywords.

    A ``**kwargs: Unpack[SomeTypedDict]`` parameter (the transformers idiom) accepts exactly the keys of
    that TypedDict; so does an unannotated ``**kwargs`` of a ``PreTrainedModel``, whose extra keywords are
    ``TransformersKwargs`` by convention. A bare ``**kwargs`` of any other module accepts anything.
    """
    sig = inspect.signature(model.forward)
    pretrained = is_pretrained_model(model)
    names: set[str] = set()
    open_ended = False
    for param in sig.parameters.values():
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            typed = _unpacked_typeddict(model.forward, param.name)
            if typed is None and pretrained:
                from transformers.utils.generic import TransformersKwargs

                typed = set(TransformersKwargs.__required_keys__) | set(TransformersKwargs.__optional_keys__)
            if typed is not None and pretrained:
                typed |= set(OUTPUT_FLAGS)  # consumed by transformers' output decorators, not the signature
            if typed is None:
                open_ended = True
            else:
                names.update(typed)
        elif param.kind is not inspect.Parameter.VAR_POSITIONAL:
            names.add(param.name)
    names |= {old for old, new in deprecated_input_names(model.forward).items() if new in names}
    return names, open_ended


def deprecated_input_names(fn: Any) -> dict[str, str]:
    """``{old: new}`` for the keywords ``fn`` still takes under a deprecated name and renames as it is called.

    Pattern: transformers renames a forward argument with ``@deprecate_kwarg(old, version, new_name=new)`` (5.24:
    ``past_key_values`` to ``cache``): the signature names only ``new``, and the wrapper renames a call's ``old`` until
    ``version``. Code written for the previous release passes ``old``; the exported program keeps the name it is given,
    and the wrapper renames it during the trace. Read from the closure of each wrapper in the ``__wrapped__`` chain (its
    ``old_name``/``new_name``)."""
    aliases: dict[str, str] = {}
    seen = 0
    while fn is not None and seen < 16:
        fn = getattr(fn, "__func__", fn)
        code, closure = getattr(fn, "__code__", None), getattr(fn, "__closure__", None)
        if code is not None and closure and {"old_name", "new_name"} <= set(code.co_freevars):
            cells = dict(zip(code.co_freevars, closure))
            try:
                old, new = cells["old_name"].cell_contents, cells["new_name"].cell_contents
            except ValueError:  # an empty cell
                old = new = None
            if isinstance(old, str) and isinstance(new, str):
                aliases.setdefault(old, new)
        fn, seen = getattr(fn, "__wrapped__", None), seen + 1
    return aliases


def _unpacked_typeddict(fn: Any, param_name: str) -> set[str] | None:
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception:  # unresolvable forward references: fall back to "accepts anything"
        return None
    hint = hints.get(param_name)
    if typing.get_origin(hint) is typing.Unpack:
        (typed,) = typing.get_args(hint)
        if typing.is_typeddict(typed):
            return set(typed.__required_keys__) | set(typed.__optional_keys__)
    return None


def check_inputs(model: torch.nn.Module, inputs: Any) -> None:
    if not isinstance(inputs, Mapping):
        raise InputError(
            f"inputs must be a mapping of forward argument names to values (e.g. a dict or a tokenizer's "
            f"BatchEncoding), got {type(inputs).__name__}"
        )
    bad_keys = [k for k in inputs if not isinstance(k, str)]
    if bad_keys:
        raise InputError(f"input names must be strings, got {bad_keys!r}")
    accepted, open_ended = accepted_input_names(model)
    if open_ended:
        return
    unknown = [k for k in inputs if k not in accepted]
    if unknown:
        raise InputError(
            f"{model_name(model)}.forward does not take {', '.join(map(repr, unknown))}; "
            f"it takes: {', '.join(sorted(accepted))}"
        )


def split_inputs(inputs: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(traced_inputs, constants)``: labels and ``None`` values dropped; output flags and Python scalars
    (``logits_to_keep=1``) set apart, to be bound into the trace as constants. torch.export specialises
    scalar inputs anyway; binding them keeps them out of every backend's input list."""
    traced, flags = {}, {}
    for name, value in inputs.items():
        if name in OUTPUT_FLAGS or isinstance(value, (bool, int, float, str)):
            flags[name] = value
        elif value is None or is_label_input(name):
            continue
        else:
            traced[name] = value
    return traced, flags


def model_dtype_and_device(model: torch.nn.Module) -> tuple[torch.dtype | None, torch.device | None]:
    dtype = device = None
    for tensor in (*model.parameters(), *model.buffers()):
        if device is None:
            device = tensor.device
        if dtype is None and tensor.is_floating_point():
            dtype = tensor.dtype
        if dtype is not None and device is not None:
            break
    return dtype, device


def cast_inputs(inputs: dict[str, Any], dtype: torch.dtype | None, device: torch.device | None) -> dict[str, Any]:
    """Floating tensors to ``dtype``, every tensor to ``device``; views and strided tensors become fresh
    contiguous ones."""

    def cast(t: torch.Tensor) -> torch.Tensor:
        if t.is_floating_point() and dtype is not None and t.dtype != dtype:
            t = t.to(dtype)
        if device is not None and t.device != device:
            t = t.to(device)
        if not t.is_contiguous():  # export would guard on the odd strides, runtimes feed contiguous tensors
            t = t.contiguous()
        elif t._base is not None:
            t = t.clone()
        return t

    return {name: map_structure(value, cast) for name, value in inputs.items()}


def ensure_exportable_attention(model: torch.nn.Module) -> None:
    """Flash and flex attention cannot be exported by any backend: switch them to ``sdpa``, with a warning."""
    config = getattr(model, "config", None)
    impl = getattr(config, "_attn_implementation", None)
    if impl is None or impl in EXPORTABLE_ATTENTION:
        return
    message = f"{model_name(model)} uses attn_implementation={impl!r}, which cannot be exported; switching to 'sdpa'"
    warnings.warn(message, UserWarning, stacklevel=3)
    model.set_attn_implementation("sdpa")


def prepare_for_export(model: Any, inputs: Any) -> tuple[torch.nn.Module, dict[str, Any], dict[str, Any]]:
    """Validate and normalise; returns ``(model, traced_inputs, output_flags)``. The caller's dict is not mutated."""
    check_model(model)
    check_inputs(model, inputs)
    ensure_exportable_attention(model)
    if model.training:
        warnings.warn(
            f"{model_name(model)} is in training mode: dropout and batch-norm statistics are traced as they are "
            "now; call model.eval() first to export inference behaviour",
            UserWarning,
            stacklevel=3,
        )
    traced, flags = split_inputs(inputs)
    dtype, device = model_dtype_and_device(model)
    return model, cast_inputs(traced, dtype, device), flags
