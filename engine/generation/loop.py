"""Greedy generation over exported components, on whatever runtime each artifact needs.

``generate(components, inputs, max_new_tokens=N)`` returns the token ids that
``model.generate(**inputs, do_sample=False, max_new_tokens=N)`` returns: the prompt followed by the new tokens
for decoder-only models, the decoder sequence (starting with the decoder start token) for encoder-decoders.
Rows that produced an end-of-sequence token are padded, and generation stops once every row has, as
``generate`` does.

The step kwargs are rebuilt from the :class:`~engine.generation.decompose.GenerationPlan` that ``export_for_generation``
attached to the components: captured templates give each kwarg's structure (a cache object is refilled with
the previous step's cache outputs by leaf name), the merge told which kwargs carry tokens and which grow.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

import torch

from engine.generation.multimodal_prefill import merge_features

from engine.generation.plan import GenerationPlan

from engine.generation.prefill import cache_kwargs, prefill_through_decode
from engine.errors import ExportStageError, InputError, ModelError
from engine.pytree import fill_leaves, get_leaf_tensors, is_cache_object
from engine.runtime import run_exported


class GenerationComponents(dict):
    """``{component name: artifact}`` plus the :class:`GenerationPlan` that chains them, and the export seconds
    of each component (``seconds``; a component served by another one's program took none)."""

    def __init__(self, *args, plan: GenerationPlan, seconds: dict[str, float] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.plan = plan
        self.seconds = dict(seconds or {})


def _leaves_under(outputs: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """The output leaves named ``prefix.<leaf>``, keyed by ``<leaf>``."""
    return {name[len(prefix) + 1 :]: t for name, t in outputs.items() if name.startswith(prefix + ".")}


def _cache_outputs(outputs: dict[str, torch.Tensor], template_cache: Any) -> dict[str, torch.Tensor]:
    """The output leaves that refill ``template_cache``: the output prefix whose leaf names cover it. A cache with
    no leaves (a text-only pass of a model whose every layer is cross-attention) stays empty."""
    wanted = set(get_leaf_tensors(template_cache))
    if not wanted:
        return {}
    prefixes = {name.split(".", 1)[0] for name in outputs if "." in name}
    for prefix in sorted(prefixes):
        leaves = _leaves_under(outputs, prefix)
        if wanted <= set(leaves):
            return leaves
    raise InputError(f"the step's outputs hold no cache with leaves {sorted(wanted)[:4]}...; outputs: {sorted(outputs)[:8]}")


def _returned_state(outputs: dict[str, torch.Tensor], name: str, captured: Any) -> Any:
    """The step's output of the same name as a decode kwarg, shaped like the captured kwarg, or None: a recurrent
    state a model returns and takes back (RWKV's ``state``, XLNet's ``mems``), which generate() feeds to the next
    step under that name (``_update_model_kwargs_for_generation``)."""
    if isinstance(captured, torch.Tensor):
        return outputs.get(name)
    wanted = set(get_leaf_tensors(captured)) if isinstance(captured, (list, tuple, dict)) else set()
    leaves = _leaves_under(outputs, name)
    return fill_leaves(captured, leaves) if wanted and wanted <= set(leaves) else None


def _fill(template: dict[str, Any], values: dict[str, Any], cache: dict[str, torch.Tensor] | None) -> dict[str, Any]:
    """Kwargs shaped like ``template``: the cache from the template (empty, or refilled with ``cache``), then
    given ``values``, the rest as captured. A caller's own cache object only told generate() which kind to use;
    the exported step expects exactly the captured structure."""
    out = {}
    for name, captured in template.items():
        if is_cache_object(captured):
            out[name] = copy.deepcopy(captured) if cache is None else fill_leaves(captured, cache)
        elif name in values:
            out[name] = values[name]
        else:
            out[name] = captured
    return out


def _positions(previous: torch.Tensor, dim: int, count: int) -> torch.Tensor:
    """The next ``count`` positions after ``previous`` along ``dim`` (cache_position, position_ids)."""
    last = previous.narrow(dim, previous.shape[dim] - 1, 1)
    steps = torch.arange(1, count + 1, dtype=previous.dtype).reshape([-1 if d == dim else 1 for d in range(previous.ndim)])
    return last + steps


class _ProcessorOwner:
    """What ``GenerationMixin._get_logits_processor`` reads from the model it is a method of: whether the model is an
    encoder-decoder, and the list-merging helper. The processors themselves hold no model."""

    def __init__(self, is_encoder_decoder: bool):
        self.config = SimpleNamespace(is_encoder_decoder=is_encoder_decoder)

    def _merge_criteria_processor_list(self, default_list, custom_list):
        from transformers.generation.utils import GenerationMixin

        return GenerationMixin._merge_criteria_processor_list(self, default_list, custom_list)


def logits_processors(plan: GenerationPlan, values: Mapping[str, Any], prompt_length: int, max_new_tokens: int):
    """The logits processors ``model.generate(**inputs, do_sample=False, num_beams=1, max_new_tokens=N)`` applies to
    each step's scores, built from the generation config recorded at export time the way generate() builds them:
    a forced end token at the last position (BART's ``forced_eos_token_id``), suppressed tokens, n-gram and
    repetition penalties, minimum lengths. ``None`` when the config asks for none."""
    if plan.generation_config is None:
        return None
    from transformers.generation.utils import GenerationMixin

    config = copy.deepcopy(plan.generation_config)
    config.update(do_sample=False, num_beams=1, max_new_tokens=max_new_tokens)
    if config.guidance_scale is not None and config.guidance_scale != 1:
        raise ModelError("the generation config asks for classifier-free guidance (guidance_scale="
                         f"{config.guidance_scale}), which runs the eager model at every step: engine.generate cannot")
    # generate()'s _prepare_generated_length: lengths count the tokens fed to the decoder
    config.max_length = max_new_tokens + prompt_length
    if config.min_new_tokens is not None:
        config.min_length = config.min_new_tokens + prompt_length
    encoder_inputs = values.get(plan.main_input_name)
    mask_name = "decoder_attention_mask" if plan.is_encoder_decoder else "attention_mask"
    mask = values.get(mask_name)
    processors = GenerationMixin._get_logits_processor(
        _ProcessorOwner(plan.is_encoder_decoder), generation_config=config, input_ids_seq_length=prompt_length,
        encoder_input_ids=encoder_inputs if isinstance(encoder_inputs, torch.Tensor) else None, device="cpu",
        model_kwargs={} if mask is None else {mask_name: mask},
    )
    return processors or None


def _run(components: Mapping[str, Any], name: str, kwargs: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """Run one component; a failure names it and the shapes given to it. (Each program accepts the shapes its trace
    allowed: tiny Mamba2's prefill, for one, rejects prompts whose chunk count differs from the traced one.)"""
    try:
        return run_exported(components[name], kwargs)
    except Exception as e:
        shapes = ", ".join(f"{leaf} {tuple(t.shape)}" for leaf, t in list(get_leaf_tensors(kwargs).items())[:3])
        raise ExportStageError("run", f"the {name!r} generation component (given {shapes}, ...)", e) from e


def run_multimodal_prefill(components: Mapping[str, Any], plan: GenerationPlan, kwargs: Mapping[str, Any]
                           ) -> dict[str, torch.Tensor]:
    """The prefill through the reference's multimodal components (:class:`~engine.generation.decompose.MultimodalPrefill`):
    the prompt embedded by ``embed_tokens``, the modality features merged in, ``language_model`` on the result with
    the prefill's other kwargs, ``lm_head`` on its hidden states. Returns the prefill's outputs: ``logits`` and the
    language model's other outputs (its cache)."""
    route = plan.multimodal_prefill
    ids = kwargs[plan.token_input]
    embedded = next(iter(_run(components, "embed_tokens", {next(iter(plan.templates["embed_tokens"])): ids}).values()))
    merged = merge_features(embedded, ids, kwargs, route.placeholders)
    if merged is None:
        raise InputError(f"the prompt's placeholder tokens {sorted(t for t, _ in route.placeholders.values())} do not match "
                         "the number of feature rows its inputs give")
    template = plan.templates["language_model"]
    values = {k: v for k, v in kwargs.items() if k in template and isinstance(v, torch.Tensor)}
    outputs = _run(components, "language_model", _fill(template, {**values, "inputs_embeds": merged}, None))
    head_input = next(iter(plan.templates["lm_head"]))
    logits = next(iter(_run(components, "lm_head", {head_input: outputs.pop(route.hidden)}).values()))
    return {"logits": logits, **outputs}


def generate(components: Mapping[str, Any], inputs: Mapping[str, Any], *, config: Any = None, max_new_tokens: int = 8
             ) -> torch.Tensor:
    """Greedy decoding over ``components`` from ``export_for_generation``: the tokens of
    ``model.generate(**inputs, do_sample=False, num_beams=1, max_new_tokens=N)``, with the logits processors the
    model's generation config asks for (:func:`logits_processors`). ``config`` is accepted for symmetry with the
    exporters (the runtime is chosen by each artifact's type)."""
    plan: GenerationPlan | None = getattr(components, "plan", None)
    if plan is None:
        raise InputError("generate() takes the components returned by export_for_generation (they carry the generation plan)")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise InputError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
    values: dict[str, Any] = {k: v for k, v in inputs.items() if v is not None}
    if plan.handover is not None:  # the model's code before it hands over to a sub-model's generate()
        values = _run(components, plan.handover, _fill(plan.templates[plan.handover], values, None))
    _run_encoders(components, plan, values)
    outputs, prefill_kwargs, prompt_length = _run_prefill(components, plan, values)

    decode_template = plan.templates[plan.decode]
    cache_name = next(iter(cache_kwargs(decode_template)), None)
    sequence = values[plan.token_input]
    state = {name: prefill_kwargs[name] for name in (*plan.growing, *plan.token_dims) if name in prefill_kwargs}
    finished = torch.zeros(sequence.shape[0], dtype=torch.bool)

    processors = logits_processors(plan, values, prompt_length, max_new_tokens)
    for step in range(max_new_tokens):
        scores = outputs["logits"][:, -1, :].to(dtype=torch.float32, copy=True)  # as generate()'s greedy step
        if processors:
            scores = processors(sequence, scores)
        token = scores.argmax(-1)
        if plan.pad_token_id is not None:
            token = torch.where(finished, torch.full_like(token, plan.pad_token_id), token)
        sequence = torch.cat([sequence, token[:, None].to(sequence.dtype)], dim=-1)
        if plan.eos_token_ids:
            finished |= torch.isin(token, torch.tensor(plan.eos_token_ids))
            if bool(finished.all()):
                break
        if step == max_new_tokens - 1:
            break
        # ── Decode: one new token, the cache of the previous step ──
        step_values = _decode_values(plan, values, state, prefill_kwargs, outputs, token, sequence.dtype)
        cache = _cache_outputs(outputs, decode_template[cache_name]) if cache_name else None
        outputs = _run(components, plan.decode, _fill(decode_template, step_values, cache))
    kept = plan.prompt_columns_returned if plan.prompt_columns_returned >= 0 else prompt_length
    return sequence[:, prompt_length - min(kept, prompt_length) :]


def _run_encoders(components: Mapping[str, Any], plan: GenerationPlan, values: dict[str, Any]) -> None:
    """Run the encoders (an encoder-decoder's encoder, a multimodal model's feature extractors) into ``values``."""
    for name, feeds in plan.encoders.items():
        key, _, sub = feeds.partition(".")
        template = plan.templates[plan.prefill].get(key)
        if template is None or (sub and sub not in template):
            # generate() ran this encoder but the captured prefill takes none of its outputs (Dots3Note encodes
            # audio its image prompt does not hold): nothing to feed
            continue
        outputs = _run(components, name, _fill(plan.templates[name], values, None))
        if sub:
            values.setdefault(key, {})[sub] = fill_leaves(template[sub], outputs)
        else:
            values[key] = fill_leaves(template, outputs)


def _run_prefill(components: Mapping[str, Any], plan: GenerationPlan, values: dict[str, Any]) -> tuple[dict, dict, int]:
    """Complete ``values`` as ``generate()`` would (start tokens, positions) and run the prefill; returns its outputs,
    its inputs and the prompt's length."""
    prefill_template = plan.templates[plan.prefill]
    token_input = plan.token_input
    batch = next(v.shape[0] for v in values.values() if isinstance(v, torch.Tensor))
    if token_input not in values:  # an encoder-decoder starts from the decoder start token(s)
        start = prefill_template[token_input][:1]  # (1, 1), or (1, 1, channels) for Dia's audio codes
        values[token_input] = start.expand(batch, *start.shape[1:]).clone()
    elif plan.start_tokens is not None:  # as generate() does with given decoder ids
        values[token_input] = torch.cat([plan.start_tokens.expand(batch, 1), values[token_input]], dim=-1)
    prompt_length = values[token_input].shape[-1]
    mask = values.get("attention_mask")
    captured_positions = prefill_template.get("position_ids")
    if isinstance(captured_positions, torch.Tensor) and "position_ids" not in values:
        if captured_positions.ndim > 2:  # not generate()'s running count: the model's own (M-RoPE rows)
            raise InputError(
                f"the prefill takes the model's own position_ids (captured as {list(captured_positions.shape)}: "
                f"[rows, batch, length], multimodal rotary positions that only the model computes from the prompt); "
                f"pass them in the inputs: position_ids=engine.generation_position_ids(model, inputs)")
        if isinstance(mask, torch.Tensor) and mask.ndim == 2:
            # generate()'s convention: positions count the attended tokens of each row
            values["position_ids"] = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)
        elif captured_positions.ndim == 2 and torch.equal(captured_positions, torch.arange(
                captured_positions.shape[-1], dtype=captured_positions.dtype).expand_as(captured_positions)):
            # no mask: every token attended, positions 0..n-1 (the capture says so)
            values["position_ids"] = torch.arange(prompt_length, dtype=captured_positions.dtype).expand(batch, -1)
    prefill_kwargs = _fill(prefill_template, values, None)
    if plan.multimodal_prefill is not None:  # the reference's multimodal components compute it
        return run_multimodal_prefill(components, plan, prefill_kwargs), prefill_kwargs, prompt_length
    if plan.empty_cache is not None:  # the decode program computes the prefill over the empty cache
        prefill_kwargs = prefill_through_decode(plan, prefill_kwargs)
    return _run(components, plan.prefill, prefill_kwargs), prefill_kwargs, prompt_length


def _decode_values(plan: GenerationPlan, values: Mapping[str, Any], state: dict[str, Any], prefill_kwargs: Mapping[str, Any],
                   outputs: Mapping[str, Any], token: torch.Tensor, token_dtype: torch.dtype) -> dict[str, Any]:
    """The next decode step's inputs but the cache: the growing mask (or sequence), the new token and positions
    (``state`` is updated with them), per-token inputs, and state the previous step returned."""
    decode_template = plan.templates[plan.decode]
    token_input = plan.token_input
    step_values = {k: v for k, v in values.items() if k in decode_template}  # constant ones (an encoder mask)
    for name, dim in plan.growing.items():
        grown = state[name]
        if name == token_input:  # no cache (use_cache=False): every step feeds the whole sequence so far
            new = token.reshape([-1 if d == 0 else 1 for d in range(grown.ndim)]).to(grown.dtype)
        elif name in plan.growing_positions:  # ... and all the positions so far: the next one
            new = _positions(grown, dim, 1)
        else:  # an attention mask: the new token is attended
            new = torch.ones([1 if d == dim else s for d, s in enumerate(grown.shape)], dtype=grown.dtype)
        state[name] = step_values[name] = torch.cat([grown, new], dim=dim)
    for name, dim in plan.per_token.items():  # generate() repeats the prompt's last position
        given = values.get(name, prefill_kwargs.get(name))
        if isinstance(given, torch.Tensor):
            step_values[name] = given.narrow(dim, given.shape[dim] - 1, 1)
    for name, dim in plan.token_dims.items():
        if name == token_input:
            step_values[name] = token[:, None].to(token_dtype)
        elif name in state:
            state[name] = step_values[name] = _positions(state[name], dim, 1)
    for name, captured in decode_template.items():
        if name not in (*plan.growing, *plan.token_dims, *plan.per_token) and not is_cache_object(captured):
            state_value = _returned_state(outputs, name, captured)
            if state_value is not None:
                step_values[name] = state_value
    return step_values
