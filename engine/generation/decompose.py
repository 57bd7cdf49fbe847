"""Split a generative model into independently exportable ``(module, forward kwargs)`` components.

- :func:`decompose_prefill_decode` runs ``model.generate`` once and records the *real* forward kwargs of the
  prefill call and of two decode calls (cache objects included). The two decode calls are merged into one
  two-token step, so the exported decode keeps its query length symbolic: the same program then runs one
  token at a time or several at once, over caches of any length.
- :func:`decompose_multimodal` finds the modality encoders (``get_encoder(modality=...)``), the projector
  (canonical names), the language model (``get_decoder()``) and ``lm_head`` and records each one's kwargs in
  a single forward.
- :func:`decompose_for_generation` combines both; for a multimodal model it captures the language model as the
  prefill calls it (cache, positions) and learns, where it is exact, how the prefill runs through those
  components (:class:`MultimodalPrefill`: embeddings, the feature merge, language model, ``lm_head``). A
  ``generate()`` that hands over to a sub-model's ``generate()`` (BLIP-2: ``language_model.generate(inputs_embeds=
  ...)``) is captured as the sub-model's generation from what it was handed, after a :class:`GenerateHandover`
  component that computes those inputs with the model's own code.

What the merge learned (which kwargs carry the new tokens, which grow by one per token) is kept in a
:class:`GenerationPlan` so :func:`engine.generate` can drive the exported components without the model.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
from collections.abc import Mapping
from typing import Any

import torch

from engine.errors import InputError, ModelError
from engine.prepare import OUTPUT_FLAGS, accepted_input_names, check_model, model_name
from engine.generation.capture import FeatureMethod, feature_methods, recording, recording_method, run_generate, snapshot
from engine.generation.decode_merge import merge_decode_calls
from engine.generation.multimodal_prefill import learn_multimodal_prefill
from engine.generation.plan import CAPTURE_TOKENS, GenerationPlan, MODALITIES, PROJECTOR_NAMES
from engine.generation.prefill import cache_kwargs, empty_cache_leaves


# ─── Public decompositions ───────────────────────────────────────────────────────────────────────

class NoForwardSteps(ModelError):
    """``generate()`` did not run the model's own forward once per token: no prefill/decode steps to capture."""


def _require_generate(model: Any) -> None:
    check_model(model)
    if not callable(getattr(model, "generate", None)) or not hasattr(model, "generation_config"):
        raise ModelError(f"{model_name(model)} has no generate(): only generative models can be decomposed for generation")


def _clean(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in kwargs.items() if v is not None}


def decompose_prefill_decode(model: torch.nn.Module, inputs: Mapping[str, Any], plan: GenerationPlan | None = None
                             ) -> dict[str, tuple[torch.nn.Module, dict[str, Any]]]:
    """``{"prefill": (model, kwargs), "decode": (model, kwargs)}`` from one real ``model.generate`` run.

    An encoder-decoder also gets ``"encoder": (encoder, kwargs)``; ``plan`` (if given) records how to chain them.
    """
    _require_generate(model)
    if not isinstance(inputs, Mapping):
        raise InputError(f"inputs must be a mapping of generate() keyword arguments, got {type(inputs).__name__}")
    plan = plan if plan is not None else GenerationPlan()
    calls: list[dict[str, Any]] = []
    encoder_calls: list[dict[str, Any]] = []
    feature_calls: dict[str, list[dict[str, Any]]] = {m: [] for m in feature_methods(model)}
    encoder = model.get_encoder() if getattr(model.config, "is_encoder_decoder", False) else None
    base = getattr(model, "base_model", model)
    with contextlib.ExitStack() as stack:
        stack.enter_context(recording(model, calls))
        if encoder is not None and encoder is not model:
            stack.enter_context(recording(encoder, encoder_calls))
        for modality, method in feature_methods(model).items():
            stack.enter_context(recording_method(base, method, feature_calls[modality]))
        sequences = run_generate(model, inputs, CAPTURE_TOKENS)
    if len(calls) < CAPTURE_TOKENS:
        raise NoForwardSteps(
            f"{model_name(model)}.generate() called its top-level forward {len(calls)} time(s) for {CAPTURE_TOKENS} "
            f"new tokens, so prefill and decode steps cannot be captured from it (add the class to "
            f"skiplists/generate_skip.yaml with the reason)"
        )
    # generate() may hand the forward keywords only its own prepare_inputs_for_generation reads (OpenAI-GPT, XLM
    # pass every generate() kwarg on: next_sequence_length, ...); a forward whose **kwargs is typed reads none of them
    prefill = _declared(model, _clean(calls[0]))
    first, last = _declared(model, _clean(calls[-2])), _declared(model, _clean(calls[-1]))
    decode = merge_decode_calls(first, last, plan, prefill)
    plan.one_token_decode = last
    caches = [next((call[k] for k in cache_kwargs(call)), None) for call in (calls[0], calls[-2], calls[-1])]
    if caches[1] is not None and caches[2] is not None:
        plan.empty_cache = empty_cache_leaves(*caches)
    for flags in (prefill, decode, last):
        flags.update({k: v for k, v in calls[0].items() if k in OUTPUT_FLAGS})
    plan.token_input = "decoder_input_ids" if "decoder_input_ids" in decode else "input_ids"
    # what generate() returns around the new tokens: some models return the whole prompt, others part or none
    prompt = prefill.get(plan.token_input)
    if prompt is None:  # a prefill on inputs_embeds only: the prompt is the ids generate() was given with them
        prompt = inputs.get(plan.token_input)
    if not isinstance(prompt, torch.Tensor):
        raise ModelError(f"{model_name(model)}.generate()'s prefill takes no {plan.token_input} and none was given, "
                         f"so the prompt the new tokens follow is unknown")
    returned = max(min(sequences.shape[-1] - CAPTURE_TOKENS, prompt.shape[-1]), 0)
    plan.prompt_columns_returned = -1 if returned == prompt.shape[-1] else returned
    given = inputs.get(plan.token_input)
    if isinstance(given, torch.Tensor) and prompt.shape[-1] == given.shape[-1] + 1:
        plan.start_tokens = prompt[:1, :1].clone()  # generate() put the decoder start token in front
    generation_config = model.generation_config
    eos = generation_config.eos_token_id
    plan.eos_token_ids = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
    pad = generation_config.pad_token_id
    plan.pad_token_id = pad if pad is not None else (plan.eos_token_ids[0] if plan.eos_token_ids else None)  # as generate()
    plan.generation_config = copy.deepcopy(generation_config)
    plan.is_encoder_decoder = bool(getattr(model.config, "is_encoder_decoder", False))
    plan.main_input_name = getattr(model, "main_input_name", "input_ids")
    components: dict[str, tuple[torch.nn.Module, dict[str, Any]]] = {}
    if encoder_calls:
        components["encoder"] = (encoder, _clean(encoder_calls[0]))
        plan.encoders["encoder"] = "encoder_outputs"
    for modality, method in feature_methods(model).items():
        if feature_calls[modality] and isinstance(prefill.get("mm_encoder_outputs"), Mapping):
            components[f"{modality}_features"] = (FeatureMethod(base, method), _clean(feature_calls[modality][0]))
            plan.encoders[f"{modality}_features"] = f"mm_encoder_outputs.{modality}"
    components["prefill"] = (model, prefill)
    components["decode"] = (model, decode)
    plan.templates.update({name: kwargs for name, (_, kwargs) in components.items()})
    return components


def _modality_encoders(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    found = {}
    get_encoder = getattr(model, "get_encoder", None)
    if get_encoder is None:
        return found
    for modality in MODALITIES:
        try:
            encoder = get_encoder(modality=modality)
        except (TypeError, ValueError, AttributeError, NotImplementedError):
            continue
        if isinstance(encoder, torch.nn.Module) and encoder is not model and encoder not in found.values():
            found[f"{modality}_encoder"] = encoder
    return found


def multimodal_submodules(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """Encoders per modality, projector, language model and ``lm_head``; empty unless at least one
    modality encoder and a language model exist."""
    encoders = _modality_encoders(model)
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    if not encoders or not isinstance(decoder, torch.nn.Module) or decoder is model:
        return {}
    found = dict(encoders)
    for name in PROJECTOR_NAMES:
        module = getattr(model, name, None) or getattr(getattr(model, "model", None), name, None)
        if isinstance(module, torch.nn.Module):
            found["multi_modal_projector"] = module
            break
    found["language_model"] = decoder
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if isinstance(head, torch.nn.Module):
        found["lm_head"] = head
    return found


def is_multimodal(model: torch.nn.Module) -> bool:
    return bool(multimodal_submodules(model))


def decompose_multimodal(model: torch.nn.Module, inputs: Mapping[str, Any]) -> dict[str, tuple[torch.nn.Module, dict[str, Any]]]:
    """Each multimodal submodule with the kwargs it received during one ``model(**inputs)``."""
    check_model(model)
    modules = multimodal_submodules(model)
    if not modules:
        raise ValueError(
            f"{model_name(model)} has no modality encoder (get_encoder(modality=...)) together with a language "
            f"model (get_decoder()): it is not a multimodal model this decomposition can split"
        )
    calls: dict[str, list[dict[str, Any]]] = {name: [] for name in modules}
    with contextlib.ExitStack() as stack:
        for name, module in modules.items():
            stack.enter_context(recording(module, calls[name]))
        with torch.no_grad():
            model(**copy.deepcopy(dict(inputs)))
    return {name: (modules[name], _declared(modules[name], _clean(calls[name][0]))) for name in modules if calls[name]}


def _declared(module: torch.nn.Module, kwargs: dict[str, Any]) -> dict[str, Any]:
    """A submodule's captured call without the keywords its ``forward`` signature does not declare.

    A parent may hand its language model keywords meant for itself (GOT-OCR2 passes ``logits_to_keep`` on to a
    ``Qwen2Model``); the child's ``**kwargs`` is typed (``Unpack[TransformersKwargs]``) and does not list them, so
    nothing in it reads them, and the exporter rejects undeclared inputs. A forward with an untyped ``**kwargs``
    keeps everything."""
    accepted, open_ended = accepted_input_names(module)
    return kwargs if open_ended else {k: v for k, v in kwargs.items() if k in accepted}


class _HandedOver(Exception):
    def __init__(self, kwargs: dict[str, Any]):
        super().__init__("generate() handed over to a sub-model")
        self.kwargs = kwargs


def _submodel_generate_calls(model: torch.nn.Module, inputs: Mapping[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """``(name, kwargs)`` of the first sub-model whose ``generate()`` the model's ``generate()`` calls, with the tensor
    kwargs of that call; None where it calls none."""
    calls: list[tuple[str, dict[str, Any]]] = []
    subs = [(n, m) for n, m in model.named_modules() if n and callable(getattr(m, "generate", None))
            and hasattr(m, "generation_config")]
    for name, sub in subs:
        original = sub.generate

        def record(*args, _original=original, _name=name, **kwargs):
            calls.append((_name, snapshot({k: v for k, v in kwargs.items() if isinstance(v, torch.Tensor)})))
            return _original(*args, **kwargs)

        sub.generate = record
    try:
        run_generate(model, inputs, CAPTURE_TOKENS)
    finally:
        for _, sub in subs:
            vars(sub).pop("generate", None)
    return calls[0] if calls else None


#: the delegate of a hand-over to the shared ``GenerationMixin.generate`` of the model itself (Pop2Piano)
SHARED_GENERATE = ""


class GenerateHandover(torch.nn.Module):
    """The part of a model's ``generate()`` before it hands over to a sub-model's ``generate()``, as a module: its
    forward returns the tensors the sub-model's generate() is called with (``inputs_embeds``, ``attention_mask``,
    ``input_ids``), computed by the model's own code (BLIP-2: vision tower, Q-Former, projection, merge). With
    ``delegate`` :data:`SHARED_GENERATE` it is the model's own ``generate()`` before its ``super().generate()``."""

    def __init__(self, model: torch.nn.Module, delegate: str):
        super().__init__()
        self.model = model
        self.delegate = delegate
        self.config = getattr(model, "config", None)

    def forward(self, **inputs):
        with _handing_over(self.model, self.delegate):
            try:
                self.model.generate(**inputs, max_new_tokens=1, do_sample=False, num_beams=1, num_return_sequences=1)
            except _HandedOver as handed:
                return handed.kwargs
        target = f"{self.delegate}.generate()" if self.delegate else "the shared GenerationMixin.generate()"
        raise ModelError(f"{model_name(self.model)}.generate() did not call {target} on these inputs")


@contextlib.contextmanager
def _handing_over(model: torch.nn.Module, delegate: str):
    """While inside, the delegate's ``generate()`` raises :class:`_HandedOver` with the tensors it was called with;
    the model's generation config is restored after (a ``generate()`` may update it with the call's kwargs)."""
    from transformers import GenerationMixin

    def hand_over(*args, **kwargs):
        raise _HandedOver({k: v for k, v in kwargs.items() if isinstance(v, torch.Tensor)})

    saved = copy.deepcopy(getattr(model, "generation_config", None))
    if delegate == SHARED_GENERATE:
        shared = GenerationMixin.generate

        def generate(self, *args, **kwargs):
            return hand_over(**kwargs) if self is model else shared(self, *args, **kwargs)

        GenerationMixin.generate = generate
    else:
        model.get_submodule(delegate).generate = hand_over
    try:
        yield
    finally:
        if delegate == SHARED_GENERATE:
            GenerationMixin.generate = shared
        else:
            vars(model.get_submodule(delegate)).pop("generate", None)
        if saved is not None:
            model.generation_config = saved


def _shared_generate_preamble(model: torch.nn.Module, inputs: Mapping[str, Any]) -> dict[str, Any] | None:
    """The tensors a class's own ``generate()`` hands to the shared ``GenerationMixin.generate`` when it computes
    the embeddings itself first (Pop2Piano: the composer's embedding put before ``input_features``, as
    ``inputs_embeds``); None where the class has no generate() of its own or hands over no ``inputs_embeds`` it
    was not given. The captured forward calls take those embeddings, so the steps are captured from what was
    handed over, after a :class:`GenerateHandover` that computes it with the model's code."""
    from transformers import GenerationMixin

    own = getattr(type(model), "generate", None)
    if own is None or own is GenerationMixin.generate or getattr(getattr(model, "generate", None), "__func__", None
                                                                 ) is GenerationMixin.generate:
        return None
    try:
        with torch.no_grad():
            handed = GenerateHandover(model, SHARED_GENERATE)(**copy.deepcopy(dict(inputs)))
    except Exception:  # noqa: BLE001 - no hand-over found: the usual capture says what fails
        return None
    if "inputs_embeds" not in handed or "inputs_embeds" in inputs:
        return None
    return snapshot(handed)


@contextlib.contextmanager
def _shared_generate(model: torch.nn.Module):
    """``model.generate`` is the shared ``GenerationMixin.generate`` while inside (the captures call it)."""
    import types

    from transformers import GenerationMixin

    model.generate = types.MethodType(GenerationMixin.generate, model)
    try:
        yield
    finally:
        vars(model).pop("generate", None)


def _handover(names: list[str]) -> type[GenerateHandover]:
    """A :class:`GenerateHandover` class whose forward declares ``names`` (the exporters bind inputs by the
    signature)."""
    handover_class = type("GenerateHandover", (GenerateHandover,), {})

    def forward(self, **inputs):
        return GenerateHandover.forward(self, **inputs)

    parameters = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    parameters += [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=None) for n in names]
    forward.__signature__ = inspect.Signature(parameters)
    handover_class.forward = forward
    return handover_class


def decompose_for_generation(model: torch.nn.Module, inputs: Mapping[str, Any], plan: GenerationPlan | None = None
                             ) -> dict[str, tuple[torch.nn.Module, dict[str, Any]]]:
    """Prefill/decode (and encoder) components; a multimodal prefill is also split into its submodules.

    Keys: ``prefill``, ``decode`` (and ``encoder`` for encoder-decoders); for multimodal models also
    ``<modality>_encoder``, ``multi_modal_projector``, ``language_model`` and ``lm_head``, the
    ``<modality>_features`` generate() encodes with, and ``embed_tokens`` where the prefill can run through those
    (``plan.multimodal_prefill``).
    """
    plan = plan if plan is not None else GenerationPlan()
    handed = _shared_generate_preamble(model, inputs) if plan.handover is None else None
    if handed is not None:  # generate() computes the embeddings, then calls the shared generate() with them
        with _shared_generate(model):
            components = decompose_for_generation(model, handed, plan)
        return _with_handover(components, plan, model, SHARED_GENERATE, inputs)
    try:
        components = decompose_prefill_decode(model, inputs, plan)
    except NoForwardSteps:
        if plan.handover is not None:
            raise
        handed = _submodel_generate_calls(model, inputs)
        if handed is None:
            raise
        # generate() hands over: the sub-model's generation from the inputs it was handed, and the model's code
        # before the hand-over as the first component
        name, sub_inputs = handed
        components = decompose_for_generation(model.get_submodule(name), sub_inputs, plan)
        return _with_handover(components, plan, model, name, inputs)
    if is_multimodal(model):
        multimodal = decompose_multimodal(model, _prefill_with_modality_inputs(model, inputs, components, plan))
        components = {**multimodal, **components}
        plan.multimodal_prefill = learn_multimodal_prefill(model, components, plan)
        if plan.multimodal_prefill is not None:
            ids = components["prefill"][1][plan.token_input]
            embed = model.get_input_embeddings()  # nn.Embedding takes `input`; a model's own module may not (MuSE)
            components["embed_tokens"] = (embed, {next(iter(inspect.signature(embed.forward).parameters)): ids})
            plan.templates.update({name: components[name][1] for name in ("embed_tokens", "language_model", "lm_head")})
    return components


def _with_handover(components: dict[str, tuple[torch.nn.Module, dict[str, Any]]], plan: GenerationPlan,
                   model: torch.nn.Module, delegate: str, inputs: Mapping[str, Any]
                   ) -> dict[str, tuple[torch.nn.Module, dict[str, Any]]]:
    given = {k: v for k, v in inputs.items() if v is not None}
    components["handover"] = (_handover(list(given))(model, delegate), given)
    plan.handover = "handover"
    plan.templates["handover"] = given
    return components


def _prefill_with_modality_inputs(model: torch.nn.Module, inputs: Mapping[str, Any],
                                  components: Mapping[str, tuple[torch.nn.Module, dict[str, Any]]],
                                  plan: GenerationPlan) -> dict[str, Any]:
    """The prefill's kwargs with the raw modality inputs in place of the features generate() encoded from them
    (``pixel_values`` for ``mm_encoder_outputs``), so one forward runs the encoders and calls the language model
    as the prefill calls it: its cache, positions and mask (generate() leaves out a mask of ones). Without
    encoded features in the prefill, the caller's modality inputs are added as given."""
    accepted, open_ended = accepted_input_names(model)
    feeds = {feed.partition(".")[0] for feed in plan.encoders.values()}
    prefill = components["prefill"][1]
    forward_inputs = {k: v for k, v in prefill.items() if k not in feeds and k != "logits_to_keep"}
    raw = [components[name][1] for name in plan.encoders if name.endswith("_features")] or [inputs]
    for kwargs in raw:
        forward_inputs.update({k: v for k, v in kwargs.items() if k not in forward_inputs and k not in OUTPUT_FLAGS
                               and k != "return_dict" and (open_ended or k in accepted)})
    return forward_inputs
