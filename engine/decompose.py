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
import functools
import inspect
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from engine.errors import InputError, ModelError
from engine.prepare import OUTPUT_FLAGS, accepted_input_names, check_model, model_name
from engine.pytree import fill_leaves, get_leaf_tensors, is_cache_object

# prefill + three decode calls; the last two are merged, so every cache length in the decode example is >= 2
# (an encoder-decoder's self-attention cache holds one token before the first decode call, and torch.export
# pins a dim traced at size 1)
CAPTURE_TOKENS = 4
TOKEN_INPUTS = ("input_ids", "decoder_input_ids")
PROJECTOR_NAMES = ("multi_modal_projector", "connector", "embed_vision", "embed_audio")
MODALITIES = ("image", "audio", "video")


@dataclass
class GenerationPlan:
    """How to build each step's kwargs from the previous step's outputs (plain data, no model)."""

    #: kwargs of each component as captured (templates: cache objects give the structure to refill)
    templates: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: kwargs that carry the new tokens (concatenated along ``token_dims[name]`` when merging decode calls)
    token_dims: dict[str, int] = field(default_factory=dict)
    #: kwargs that grow by one position per generated token (attention masks)
    growing: dict[str, int] = field(default_factory=dict)
    #: per-position kwargs generate() extends by repeating the last position and slices to the tokens being
    #: processed (GPT-2's ``token_type_ids``, Idefics' ``image_attention_mask``): each decode step takes the
    #: prompt's last position along ``per_token[name]``
    per_token: dict[str, int] = field(default_factory=dict)
    #: the kwarg holding the token ids fed back each step (``input_ids`` or ``decoder_input_ids``)
    token_input: str = "input_ids"
    #: the component run once on the prompt, and the one run per new token
    prefill: str = "prefill"
    decode: str = "decode"
    #: components run before the prefill, with the (dotted) kwarg their outputs feed: an encoder-decoder's
    #: ``encoder`` -> ``encoder_outputs``; ``image_features`` -> ``mm_encoder_outputs.image``
    encoders: dict[str, str] = field(default_factory=dict)
    #: how many trailing prompt columns generate() returns before the new tokens; -1: the whole prompt, however
    #: long (what decoder-only models return)
    prompt_columns_returned: int = -1
    #: a decoder start token generate() prepends to given decoder ids (1x1), if it does
    start_tokens: torch.Tensor | None = None
    #: generate()'s stopping and padding, as the model's generation config says
    eos_token_ids: list[int] = field(default_factory=list)
    pad_token_id: int | None = None
    #: the model's generation config, for the logits processors generate() applies to each step's scores
    #: (forced BOS/EOS tokens, suppressed tokens, n-gram and repetition penalties, minimum lengths)
    generation_config: Any = None
    is_encoder_decoder: bool = False
    #: the generate() input the encoder-side processors read (``main_input_name``: input_ids, input_features, ...)
    main_input_name: str = "input_ids"
    #: the decode cache's leaves before the first token (``{leaf: tensor}``), when the prefill can run as a
    #: decode step over it; kept by ``export_for_generation`` only once the decode program reproduced the
    #: eager prefill on it (see :func:`empty_cache_leaves`)
    empty_cache: dict[str, torch.Tensor] | None = None
    #: how a multimodal prefill runs through the reference's components (``embed_tokens``, the merge,
    #: ``language_model``, ``lm_head``) instead of a program of its own; kept by ``export_for_generation`` only once
    #: those programs reproduced the eager prefill (see :func:`learn_multimodal_prefill`)
    multimodal_prefill: MultimodalPrefill | None = None
    #: the component run first on the caller's inputs where generate() hands over to a sub-model's generate()
    #: (BLIP-2 encodes the image, then calls ``language_model.generate(inputs_embeds=...)``): its outputs are the
    #: sub-model's generate() inputs, which the other components were captured from
    handover: str | None = None
    #: capture only (the exporter clears it): the last one-token decode call, the decode program's fallback when
    #: the merged two-token step cannot be exported or comes out pinned to two tokens (a Python loop over the
    #: query, an assert on one token)
    one_token_decode: dict[str, Any] | None = None


@dataclass
class MultimodalPrefill:
    """The merge the reference leaves to the caller, learned from one prefill: each modality's feature rows
    replace the embeddings of its placeholder token (``masked_scatter`` order), then ``language_model`` runs on
    the merged embeddings with the prefill's other kwargs and ``lm_head`` reads its ``hidden`` output."""

    #: encoder feed (``mm_encoder_outputs.image``) -> (placeholder token id, the feature field whose rows replace it)
    placeholders: dict[str, tuple[int, str]]
    #: the ``language_model`` output leaf ``lm_head`` reads
    hidden: str


# ─── Capture ─────────────────────────────────────────────────────────────────────────────────────

def _snapshot(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Copy call kwargs as they are *at call time* (the forward mutates caches in place)."""
    return {k: (v.detach().clone() if isinstance(v, torch.Tensor) else copy.deepcopy(v)) for k, v in kwargs.items()}


@contextlib.contextmanager
def _recording(module: torch.nn.Module, calls: list[dict[str, Any]]) -> Iterator[None]:
    """Record the kwargs of every call of ``module`` (positional arguments are bound to their names)."""
    import inspect

    signature = inspect.signature(module.forward)

    def hook(mod, args, kwargs):
        bound = signature.bind_partial(*args, **kwargs).arguments
        extra = bound.pop("kwargs", {}) if "kwargs" in signature.parameters else {}
        calls.append(_snapshot({**bound, **extra}))

    handle = module.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


class FeatureMethod(torch.nn.Module):
    """A module whose forward is ``owner.<method>(**kwargs)``: generate() encodes images/videos through the
    base model's ``get_<modality>_features`` method, so that method is what a generation loop must export."""

    def __init__(self, owner: torch.nn.Module, method: str):
        super().__init__()
        self.owner = owner
        self.method = method
        self.train(owner.training)  # a new module starts in training mode; the owner says what is traced

    def forward(self, **kwargs: Any) -> Any:
        return getattr(self.owner, self.method)(**kwargs)


@contextlib.contextmanager
def _recording_method(owner: Any, method: str, calls: list[dict[str, Any]]) -> Iterator[None]:
    original = getattr(owner, method)

    @functools.wraps(original)  # generate() picks the method's kwargs from its signature
    def recorded(*args: Any, **kwargs: Any) -> Any:
        import inspect

        bound = inspect.signature(original).bind_partial(*args, **kwargs).arguments
        extra = bound.pop("kwargs", {})
        calls.append(_snapshot({**bound, **extra}))
        return original(*args, **kwargs)

    from engine.patches.registry import swap_attributes

    with swap_attributes([(owner, method, recorded)]):
        yield


def _feature_methods(model: torch.nn.Module) -> dict[str, str]:
    """``{modality: method}`` for the ``get_<modality>_features`` methods generate() may call."""
    base = getattr(model, "base_model", model)
    return {m: f"get_{m}_features" for m in MODALITIES if callable(getattr(base, f"get_{m}_features", None))}


def _fresh_cache(cache: Any, model: torch.nn.Module) -> Any:
    """A caller's ``StaticCache`` re-created now, so patches active during the capture shape its layers
    (a cache built earlier keeps the layers it was built with); other caches are copied."""
    from transformers import StaticCache

    if isinstance(cache, StaticCache) and cache.layers:
        max_cache_len = max(layer.max_cache_len for layer in cache.layers if hasattr(layer, "max_cache_len"))
        return StaticCache(config=model.config, max_cache_len=max_cache_len)
    return copy.deepcopy(cache)


def _run_generate(model: torch.nn.Module, inputs: Mapping[str, Any], tokens: int) -> torch.Tensor:
    kwargs = {k: (_fresh_cache(v, model) if is_cache_object(v) else copy.deepcopy(v)) for k, v in inputs.items()}
    with torch.no_grad():
        out = model.generate(**kwargs, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False, num_beams=1,
                             num_return_sequences=1)
    return out if isinstance(out, torch.Tensor) else out.sequences


# ─── Decode-call merge ───────────────────────────────────────────────────────────────────────────

def _token_dim(a: torch.Tensor, b: torch.Tensor) -> int | None:
    """The dim that carries the new token: the last dim of size 1 shared by both calls."""
    if a.shape != b.shape:
        return None
    dims = [d for d in range(a.ndim) if a.shape[d] == 1]
    return dims[-1] if dims else None


def _growing_dim(a: torch.Tensor, b: torch.Tensor) -> int | None:
    if a.ndim != b.ndim:
        return None
    grown = [d for d in range(a.ndim) if b.shape[d] == a.shape[d] + 1]
    same = [d for d in range(a.ndim) if b.shape[d] == a.shape[d]]
    return grown[0] if len(grown) == 1 and len(same) == a.ndim - 1 else None


def _per_token_dim(name: str, a: torch.Tensor, b: torch.Tensor, prefill: Mapping[str, Any] | None,
                   prompt_length: int | None) -> int | None:
    """The dim along which a kwarg holds one entry per processed token although it repeats (the same in both decode
    calls): size 1 there in the decode calls, the prompt's length there in the prefill."""
    before = (prefill or {}).get(name)
    if name in TOKEN_INPUTS or not isinstance(before, torch.Tensor) or before.ndim != a.ndim or not prompt_length:
        return None
    dims = [d for d in range(a.ndim) if a.shape[d] == 1 and before.shape[d] == prompt_length
            and all(before.shape[o] == a.shape[o] for o in range(a.ndim) if o != d)]
    return dims[-1] if dims and prompt_length > 1 and torch.equal(a, b) else None


def merge_decode_calls(first: dict[str, Any], second: dict[str, Any], plan: GenerationPlan,
                       prefill: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """One two-token decode step from two one-token calls: token kwargs concatenated, growing kwargs taken
    from the second call, everything else (the cache before the first call included) from the first.

    A kwarg that is the same in both calls but held the prompt's length in the ``prefill`` along the dim the
    decode calls have at 1 is per-token (generate() repeats its last position): concatenated too, and recorded in
    ``plan.per_token``."""
    ids = (prefill or {}).get("decoder_input_ids", (prefill or {}).get("input_ids"))
    prompt_length = ids.shape[-1] if isinstance(ids, torch.Tensor) and ids.ndim >= 1 else None
    merged = {}
    for name, a in first.items():
        b = second.get(name)
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
            growing, token_dim = _growing_dim(a, b), _token_dim(a, b)
            carries_tokens = token_dim is not None and (name in TOKEN_INPUTS or not torch.equal(a, b))
            per_token = None if growing is not None or carries_tokens else _per_token_dim(name, a, b, prefill, prompt_length)
            if per_token is not None:  # token_type_ids, a per-token image mask: one entry per query token
                plan.per_token[name] = per_token
                merged[name] = torch.cat([a, b], dim=per_token)
            elif growing is not None:  # e.g. an attention mask: one position more per token
                plan.growing[name] = growing
                merged[name] = b
            elif carries_tokens:  # ids, positions: concatenated into a two-token query
                plan.token_dims[name] = token_dim
                merged[name] = torch.cat([a, b], dim=token_dim)
            else:  # the same every step (an encoder's mask, ...)
                merged[name] = a
        else:
            merged[name] = a
    return merged


# ─── Prefill as a decode step over an empty cache ─────────────────────────────────────────────────

def cache_kwargs(kwargs: Mapping[str, Any]) -> list[str]:
    """The names of the cache objects among a step's kwargs."""
    return [k for k, v in kwargs.items() if is_cache_object(v)]


def empty_cache_leaves(prefill_cache: Any, first: Any, second: Any) -> dict[str, torch.Tensor] | None:
    """The decode cache's leaves as they are before any token, or None when they cannot be told.

    A decode step whose query length is symbolic computes the prefill too when it is given the cache as it
    is before the prompt: every leaf that grows by one position per token (the keys and values of a dynamic
    cache) at length 0, every leaf the prefill received as the prefill received it (a counter), and zeros for
    a leaf that neither grows nor was there at the prefill (a static cache's buffers, which it allocates zeroed
    at its first update). ``first`` and ``second`` are the caches of two consecutive one-token decode calls.
    This is a candidate: the exporter keeps it only once the decode program reproduced the eager prefill on it
    (a decode step that cannot prefill, like a sliding window shorter than the prompt or a state-space
    model's one-token recurrence, fails that check and the prefill gets its own program).
    """
    before = get_leaf_tensors(prefill_cache) if prefill_cache is not None else {}
    a, b = get_leaf_tensors(first), get_leaf_tensors(second)
    if not a or set(a) != set(b):
        return None
    empty = {}
    for name, leaf in a.items():
        grown = _growing_dim(leaf, b[name])
        if grown is not None:
            empty[name] = leaf.new_zeros([0 if d == grown else s for d, s in enumerate(leaf.shape)])
        elif name in before:
            if before[name].shape != leaf.shape:
                return None
            empty[name] = before[name].clone()
        else:
            empty[name] = torch.zeros_like(leaf)
    return empty


def prefill_through_decode(plan: GenerationPlan, prefill_kwargs: Mapping[str, Any]) -> dict[str, Any] | None:
    """Decode-step kwargs that compute the prefill: the prefill's values, the decode cache refilled with
    :attr:`GenerationPlan.empty_cache`. None when the two steps do not take the same kwargs."""
    decode = plan.templates[plan.decode]
    cache_names = cache_kwargs(decode)
    if plan.empty_cache is None or len(cache_names) != 1:
        return None
    tensors = lambda kwargs: {k for k, v in kwargs.items() if isinstance(v, torch.Tensor)}  # noqa: E731
    if tensors(decode) != tensors(prefill_kwargs):
        return None
    out = {k: prefill_kwargs.get(k, v) for k, v in decode.items()}
    # copies: a program that updates its cache in place (a static cache's) must not fill the plan's empty one
    out[cache_names[0]] = fill_leaves(decode[cache_names[0]], {k: v.clone() for k, v in plan.empty_cache.items()})
    return out


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
    feature_calls: dict[str, list[dict[str, Any]]] = {m: [] for m in _feature_methods(model)}
    encoder = model.get_encoder() if getattr(model.config, "is_encoder_decoder", False) else None
    base = getattr(model, "base_model", model)
    with contextlib.ExitStack() as stack:
        stack.enter_context(_recording(model, calls))
        if encoder is not None and encoder is not model:
            stack.enter_context(_recording(encoder, encoder_calls))
        for modality, method in _feature_methods(model).items():
            stack.enter_context(_recording_method(base, method, feature_calls[modality]))
        sequences = _run_generate(model, inputs, CAPTURE_TOKENS)
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
    for modality, method in _feature_methods(model).items():
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
            stack.enter_context(_recording(module, calls[name]))
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
    kwargs it was called with; None where it calls none."""
    calls: list[tuple[str, dict[str, Any]]] = []
    subs = [(n, m) for n, m in model.named_modules() if n and callable(getattr(m, "generate", None))
            and hasattr(m, "generation_config")]
    for name, sub in subs:
        original = sub.generate

        def record(*args, _original=original, _name=name, **kwargs):
            calls.append((_name, _snapshot({k: v for k, v in kwargs.items() if isinstance(v, torch.Tensor)})))
            return _original(*args, **kwargs)

        sub.generate = record
    try:
        _run_generate(model, inputs, CAPTURE_TOKENS)
    finally:
        for _, sub in subs:
            vars(sub).pop("generate", None)
    return calls[0] if calls else None


class GenerateHandover(torch.nn.Module):
    """The part of a model's ``generate()`` before it hands over to a sub-model's ``generate()``, as a module: its
    forward returns the tensors the sub-model's generate() is called with (``inputs_embeds``, ``attention_mask``,
    ``input_ids``), computed by the model's own code (BLIP-2: vision tower, Q-Former, projection, merge)."""

    def __init__(self, model: torch.nn.Module, delegate: str):
        super().__init__()
        self.model = model
        self.delegate = delegate
        self.config = getattr(model, "config", None)

    def forward(self, **inputs):
        sub = self.model.get_submodule(self.delegate)

        def hand_over(*args, **kwargs):
            raise _HandedOver({k: v for k, v in kwargs.items() if isinstance(v, torch.Tensor)})

        sub.generate = hand_over
        try:
            self.model.generate(**inputs, max_new_tokens=1, do_sample=False, num_beams=1, num_return_sequences=1)
        except _HandedOver as handed:
            return handed.kwargs
        finally:
            vars(sub).pop("generate", None)
        raise ModelError(f"{model_name(self.model)}.generate() did not call {self.delegate}.generate() on these inputs")


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
        given = {k: v for k, v in inputs.items() if v is not None}
        components["handover"] = (_handover(list(given))(model, name), given)
        plan.handover = "handover"
        plan.templates["handover"] = given
        return components
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


# ─── Multimodal prefill through the reference components ─────────────────────────────────────────


def feature_rows(features: Any, field: str, width: int) -> torch.Tensor | None:
    """The rows of one field of a modality's features (``pooler_output``: a tuple of per-image tensors, or a
    single tensor; ``""``: the features are a bare tensor), concatenated as the model concatenates them."""
    leaves = [t for name, t in get_leaf_tensors(features).items() if name.split(".", 1)[0] == field or not field]
    if not leaves or any(t.shape[-1] != width for t in leaves):
        return None
    return torch.cat([t.reshape(-1, width) for t in leaves])


def merge_features(embeds: torch.Tensor, ids: torch.Tensor, kwargs: Mapping[str, Any],
                   placeholders: Mapping[str, tuple[int, str]]) -> torch.Tensor | None:
    """``embeds`` with each placeholder token's rows replaced by its modality's feature rows (None if the counts differ)."""
    merged = embeds.clone()
    for feed, (token, feature_field) in placeholders.items():
        key, _, sub = feed.partition(".")
        rows = feature_rows(kwargs[key][sub] if sub else kwargs[key], feature_field, embeds.shape[-1])
        mask = ids == token
        if rows is None or int(mask.sum()) != rows.shape[0]:
            return None
        merged[mask] = rows.to(merged.dtype)
    return merged


def learn_multimodal_prefill(model: torch.nn.Module, components: Mapping[str, tuple[torch.nn.Module, dict[str, Any]]],
                             plan: GenerationPlan) -> MultimodalPrefill | None:
    """How the prefill runs through ``embed_tokens`` + merge + ``language_model`` + ``lm_head``, or None.

    Learned eagerly from the captured calls, and only where it is exact: the language model's inputs other than
    its embeddings are the prefill's own (the same names, equal values: positions a model computes on its own,
    like Qwen2-VL's multimodal rotary ones, rule it out), the prompt's embeddings with each modality's feature
    rows put in place of one token's rows give exactly the embeddings the language model received, and
    ``lm_head`` read one of the language model's outputs. The exported programs are checked against the eager
    prefill once they exist (``export_for_generation``)."""
    needed = ("language_model", "lm_head", "prefill")
    try:
        embed = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    except (NotImplementedError, AttributeError):  # PreTrainedModel's default raises for models without one
        embed = None
    if not all(name in components for name in needed) or not isinstance(embed, torch.nn.Module) or not plan.encoders:
        return None
    language_model, lm_kwargs = components["language_model"]
    prefill = components["prefill"][1]
    ids, received = prefill.get(plan.token_input), lm_kwargs.get("inputs_embeds")
    if not isinstance(ids, torch.Tensor) or not isinstance(received, torch.Tensor) or len(components["lm_head"][1]) != 1:
        return None
    for name, value in lm_kwargs.items():
        if name == "inputs_embeds":
            continue
        if is_cache_object(value) != is_cache_object(prefill.get(name)):
            return None
        if isinstance(value, torch.Tensor) and not (isinstance(prefill.get(name), torch.Tensor) and torch.equal(value, prefill[name])):
            return None
    with torch.no_grad():
        text = embed(ids)
        if text.shape != received.shape:
            return None
        # placeholder candidates: the tokens whose rows the merge replaced
        replaced = [int(t) for t in ids[(text != received).any(-1)].unique()]
        placeholders = {}
        for feed in plan.encoders.values():
            key, _, sub = feed.partition(".")
            features = prefill.get(key, {}).get(sub) if sub else prefill.get(key)
            if features is None:  # generate() encoded this modality, the prompt's prefill holds none of it
                return None
            fields = sorted({name.split(".", 1)[0] for name in get_leaf_tensors(features)}) if features is not None else []
            placeholders[feed] = next(((token, field) for token in replaced for field in fields or [""]
                                       if merge_features(text, ids, prefill, {feed: (token, field)}) is not None), None)
        if None in placeholders.values():
            return None
        merged = merge_features(text, ids, prefill, placeholders)
        if merged is None or not torch.equal(merged, received):
            return None
        outputs = get_leaf_tensors(language_model(**copy.deepcopy(lm_kwargs)))
    head_input = next(iter(components["lm_head"][1].values()))
    hidden = next((name for name, t in outputs.items() if t.shape == head_input.shape and torch.equal(t, head_input)), None)
    return None if hidden is None else MultimodalPrefill(placeholders, hidden)
