"""export_for_generation + engine.generate give exactly eager greedy generate()'s tokens, on every backend.

Components are exported from one set of inputs and generation runs on *another* (seed 1: other tokens,
other pixels), so nothing captured at export time can leak into the result. Eight new tokens run the decode
step over caches longer than the one it was captured with.
"""

from __future__ import annotations

import copy
import functools

import pytest
import torch
from transformers import StaticCache

from engine import (
    AutoExporter,
    ExportStageError,
    InputError,
    ModelError,
    decompose_prefill_decode,
    generate,
)
import transformers as tf

from tests.engine.tiny_models import GENERATIVE_EXTRAS, TINY_MODELS, VOCAB, ci_cover

MODELS = {**{n: TINY_MODELS[n] for n in ("llama", "qwen3", "gemma3_text", "gpt2", "mamba2", "t5", "whisper")}, **GENERATIVE_EXTRAS}


DECODER_ONLY = ("llama", "qwen3", "gemma3_text", "gpt2")


NEW_TOKENS = 8


MAX_CACHE_LEN = 32


def with_cache(inputs: dict, cache: str, model) -> dict:
    """``inputs`` with a fresh ``StaticCache`` of MAX_CACHE_LEN for ``cache="static"`` (generate() makes a dynamic one)."""
    if cache == "static":
        inputs["past_key_values"] = StaticCache(config=model.config, max_cache_len=MAX_CACHE_LEN)
    return inputs


def generation_inputs(name: str, seed: int, cache: str, model) -> dict:
    inputs = MODELS[name].inputs("trace", seed=seed)
    inputs.pop("decoder_input_ids", None)  # generate() starts encoder-decoders from the decoder start token
    return with_cache(inputs, cache, model)


CASES = [(n, "dynamic") for n in MODELS] + [(n, "static") for n in DECODER_ONLY]

#: the cache a decoder-only model is generated with on each backend in CI: every (model, cache), (model, backend) and
#: (cache, backend) pair once (a pairwise cover of the 24 combinations); the other 12 are marked slow
PAIRWISE = {"llama": ("static", "dynamic", "static"), "gpt2": ("dynamic", "static", "dynamic"),
            "qwen3": ("static", "dynamic", "dynamic"), "gemma3_text": ("dynamic", "static", "static")}
#: the longest cases, whose paths other CI cases cover (Mamba2's export on ONNX in the exporter tests and on
#: ExecuTorch in the smoke sweep, an encoder-decoder's generation on ONNX and ExecuTorch by Whisper, a multimodal
#: one's on ONNX by Llava), and the decoder-only combinations outside the pairwise cover: marked slow, which
#: ./dev test leaves out (``./dev unit -m slow``)
SLOW = {("mamba2", "dynamic", "onnx"), ("mamba2", "dynamic", "executorch"), ("t5", "dynamic", "onnx"),
        ("t5", "dynamic", "executorch"), ("llava", "dynamic", "executorch")} | {
    (name, cache, backend) for name, kept in PAIRWISE.items() for cache in ("static", "dynamic")
    for backend, kept_cache in zip(("dynamo", "onnx", "executorch"), kept) if cache != kept_cache}


#: known failures, strict: a fix shows up as an unexpected pass
KNOWN_FAILURES: dict[tuple[str, str, str], str] = {}


def _params():
    for backend in ("dynamo", "onnx", "executorch"):
        for name, cache in CASES:
            marks = [pytest.mark.slow] if (name, cache, backend) in SLOW else []
            if (name, cache, backend) in KNOWN_FAILURES:
                marks.append(pytest.mark.xfail(strict=True, reason=KNOWN_FAILURES[name, cache, backend]))
            yield pytest.param(name, cache, backend, id=f"{name}-{cache}-{backend}", marks=marks)


@pytest.mark.parametrize("name, cache, backend", list(_params()))
def test_generation_matches_eager_greedy(name, cache, backend):
    model = MODELS[name].model()
    config = {"export_format": backend, "dynamic": True}
    components = AutoExporter.export_for_generation(model, generation_inputs(name, 0, cache, model), config)

    inputs = generation_inputs(name, 1, cache, model)
    with torch.no_grad():
        expected = model.generate(**copy.deepcopy(inputs), do_sample=False, max_new_tokens=NEW_TOKENS)
    got = generate(components, inputs, max_new_tokens=NEW_TOKENS)
    assert got.shape == expected.shape and torch.equal(got, expected), f"\neager:    {expected}\nexported: {got}"

    if name in DECODER_ONLY:  # a one-token prompt: the decode program's prefill over the empty cache at its smallest
        short = with_cache(MODELS[name].make_inputs(2, 1, 2), cache, model)
        with torch.no_grad():
            expected = model.generate(**copy.deepcopy(short), do_sample=False, max_new_tokens=NEW_TOKENS)
        got = generate(components, short, max_new_tokens=NEW_TOKENS)
        assert torch.equal(got, expected), f"one-token prompt\neager:    {expected}\nexported: {got}"


@pytest.mark.parametrize("name", ["llama", "t5"])
def test_a_prompt_longer_than_the_captured_one_comes_back_whole(name):
    """generate() returns the whole prompt before the new tokens, however long; the plan once kept as many prompt
    columns as the captured prompt had, and cut the front of a longer one (Llama; Mamba2 too). T5: a longer
    encoder input, and the decoder sequence comes back from its start token."""
    tiny = MODELS[name]
    model = tiny.model()
    components = AutoExporter.export_for_generation(model, generation_inputs(name, 0, "dynamic", model), {"dynamic": True})
    batch, length = tiny.trace_shape
    inputs = tiny.make_inputs(batch, length + 2, 1)
    inputs.pop("decoder_input_ids", None)  # as generation_inputs(): generate() starts from the decoder start token
    with torch.no_grad():
        expected = model.generate(**copy.deepcopy(inputs), do_sample=False, max_new_tokens=NEW_TOKENS)
    got = generate(components, inputs, max_new_tokens=NEW_TOKENS)
    assert got.shape == expected.shape and torch.equal(got, expected), f"\neager:    {expected}\nexported: {got}"


def test_a_prompt_outside_what_the_programs_take_is_an_error_naming_the_component():
    """Llama's prefill runs through its decode program over a static cache of MAX_CACHE_LEN: a longer prompt is
    outside the shapes it accepts, named with the component, its shapes and the bound rather than a bare guard assertion."""
    tiny = MODELS["llama"]
    model = tiny.model()
    components = AutoExporter.export_for_generation(model, generation_inputs("llama", 0, "static", model), {"dynamic": True})
    inputs = with_cache(tiny.make_inputs(2, MAX_CACHE_LEN + 4, 1), "static", model)
    with pytest.raises(ExportStageError, match=rf"stage 'run' failed for the 'prefill' generation component \(given input_ids \(2, {MAX_CACHE_LEN + 4}\).*"
                       rf"InputError: .* dim 1 is {MAX_CACHE_LEN + 4}, outside the exported bounds"):
        generate(components, inputs, max_new_tokens=2)


@pytest.mark.parametrize("name", ["llama", "t5"])
def test_generation_applies_the_generation_configs_logits_processors(name):
    """A forced end token (BART's config), a suppressed token, no repeated bigram and a repetition penalty: the
    exported loop picks the tokens that eager generate() picks after its logits processors. (Without them, the
    forced end token alone makes the last token differ.)"""
    model = MODELS[name].model()
    model.generation_config.update(forced_eos_token_id=3, suppress_tokens=[5], no_repeat_ngram_size=2,
                                   repetition_penalty=1.5, eos_token_id=None)
    components = AutoExporter.export_for_generation(model, generation_inputs(name, 0, "dynamic", model), {"dynamic": True})
    inputs = generation_inputs(name, 1, "dynamic", model)
    with torch.no_grad():
        expected = model.generate(**copy.deepcopy(inputs), do_sample=False, max_new_tokens=NEW_TOKENS)
    got = generate(components, inputs, max_new_tokens=NEW_TOKENS)
    assert torch.equal(got, expected), f"\neager:    {expected}\nexported: {got}"
    assert (got[:, -1] == 3).all() and not (got[:, -NEW_TOKENS:] == 5).any()


def test_generate_needs_exported_components():
    with pytest.raises(InputError, match="components returned by export_for_generation"):
        generate({"prefill": None}, {"input_ids": torch.zeros(1, 2, dtype=torch.long)})


def test_generate_that_never_calls_forward_is_named():
    model = MODELS["gpt2"].model()

    class NoForwardGenerate(type(model)):
        def generate(self, input_ids=None, **kwargs):
            return input_ids

    model.__class__ = NoForwardGenerate
    with pytest.raises(ModelError, match="called its top-level forward 0 time"):
        decompose_prefill_decode(model, MODELS["gpt2"].inputs())


def test_decode_program_serves_prefill_only_where_it_reproduces_it():
    """Decoder-only models export one program for both steps, with a dynamic and with a static cache (checked
    against the eager prefill); an encoder-decoder, whose decode step reads a cross-attention cache the prefill
    computes, keeps a prefill of its own."""
    for name, cache, shared in (("gpt2", "dynamic", True), ("gpt2", "static", True), ("t5", "dynamic", False)):
        model = MODELS[name].model()
        components = AutoExporter.export_for_generation(model, generation_inputs(name, 0, cache, model), {"export_format": "dynamo", "dynamic": True})
        assert (components["prefill"] is components["decode"]) is shared, (name, cache)
        empty = components.plan.empty_cache
        assert (empty is not None) is shared, (name, cache)
        # the check ran the decode program, which updates a static cache in place: on copies, not on the plan's
        assert empty is None or not any(leaf.any() for leaf in empty.values()), (name, cache)


def test_generation_without_a_cache_feeds_the_whole_sequence_each_step():
    """A generation config with ``use_cache=False`` (Evolla's): every forward gets the whole sequence so far, and
    the exported loop must grow the token input with the generated tokens."""
    model = MODELS["llama"].model()
    model.generation_config.use_cache = False
    components = AutoExporter.export_for_generation(model, generation_inputs("llama", 0, "dynamic", model), {"dynamic": True})
    assert "input_ids" in components.plan.growing
    inputs = generation_inputs("llama", 1, "dynamic", model)
    with torch.no_grad():
        expected = model.generate(**copy.deepcopy(inputs), do_sample=False, max_new_tokens=NEW_TOKENS)
    assert torch.equal(generate(components, inputs, max_new_tokens=NEW_TOKENS), expected)


def test_generation_without_a_cache_grows_the_positions_with_the_sequence():
    """Without a cache and without an attention mask generate() passes every position so far (Blt's generation):
    each step appends the next position, where a mask would append a 1."""
    model = MODELS["llama"].model()
    model.generation_config.use_cache = False

    def unmasked(seed):
        inputs = generation_inputs("llama", seed, "dynamic", model)
        inputs.pop("attention_mask", None)
        return inputs

    components = AutoExporter.export_for_generation(model, unmasked(0), {"dynamic": True})
    assert components.plan.growing_positions == ["position_ids"]
    with torch.no_grad():
        expected = model.generate(**unmasked(1), do_sample=False, max_new_tokens=NEW_TOKENS)
    assert torch.equal(generate(components, unmasked(1), max_new_tokens=NEW_TOKENS), expected)


def test_multimodal_prefill_falls_back_to_its_own_program_when_the_components_differ(monkeypatch):
    """The learned route is checked on the exported programs: where they do not reproduce the eager prefill, the
    prefill is exported and generation still gives eager's tokens."""
    import engine.generation.export
    import engine.generation.loop

    def off(components, plan, kwargs):
        outputs = run(components, plan, kwargs)
        return {**outputs, "logits": outputs["logits"] + 1e-2}

    run = engine.generation.export.run_multimodal_prefill  # the check export_for_generation makes
    monkeypatch.setattr(engine.generation.export, "run_multimodal_prefill", off)
    model = MODELS["llava"].model()
    components = AutoExporter.export_for_generation(model, generation_inputs("llava", 0, "dynamic", model), {"dynamic": True})
    assert "prefill" in components and components.plan.multimodal_prefill is None
    monkeypatch.setattr(engine.generation.loop, "run_multimodal_prefill", run)
    inputs = generation_inputs("llava", 1, "dynamic", model)
    with torch.no_grad():
        expected = model.generate(**copy.deepcopy(inputs), do_sample=False, max_new_tokens=NEW_TOKENS)
    assert torch.equal(generate(components, inputs, max_new_tokens=NEW_TOKENS), expected)


# ── Capture: per-token kwargs, undeclared generate() kwargs, the one-token decode fallback ──────────

def _token_type_inputs(seed: int) -> dict:
    inputs = generation_inputs("gpt2", seed, "dynamic", None)
    types = torch.zeros_like(inputs["input_ids"])
    types[:, -3:] = 1  # the prompt's last position says 1: generate() repeats it for every new token
    return {**inputs, "token_type_ids": types}


# the loop feeds token_type_ids alike on every backend: ExecuTorch's program runs in the slow set
@pytest.mark.parametrize("backend", ci_cover(["dynamo", "onnx", "executorch"], ["dynamo", "onnx"]))
def test_token_type_ids_follow_the_new_tokens_as_generate_repeats_them(backend):
    """GPT-2 with ``token_type_ids``: generate() extends them by repeating the last position and feeds each decode
    step the current tokens' slice. The decode program takes them per token (``plan.per_token``), and every step
    gets the prompt's last one, not the caller's full-length tensor."""
    model = MODELS["gpt2"].model()
    components = AutoExporter.export_for_generation(model, _token_type_inputs(0), {"export_format": backend, "dynamic": True})
    assert components.plan.per_token == {"token_type_ids": 1}
    inputs = _token_type_inputs(1)
    with torch.no_grad():
        expected = model.generate(**copy.deepcopy(inputs), do_sample=False, max_new_tokens=NEW_TOKENS)
    got = generate(components, inputs, max_new_tokens=NEW_TOKENS)
    assert torch.equal(got, expected), f"\neager:    {expected}\nexported: {got}"


def test_keywords_generate_passes_that_the_forward_does_not_declare_are_not_captured():
    """OpenAI-GPT's prepare_inputs_for_generation hands its forward every generate() kwarg (``next_sequence_length``
    among them); the typed ``**kwargs`` reads none of them, so the captured steps keep only the declared ones."""
    config = tf.OpenAIGPTConfig(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64)
    torch.manual_seed(0)
    model = tf.OpenAIGPTLMHeadModel(config).eval()
    inputs = {"input_ids": torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(0))}
    parts = decompose_prefill_decode(model, inputs)
    assert "next_sequence_length" not in parts["prefill"][1] and "next_sequence_length" not in parts["decode"][1]
    components = AutoExporter.export_for_generation(model, inputs, {"dynamic": True})
    other = {"input_ids": torch.randint(0, VOCAB, (3, 5), generator=torch.Generator().manual_seed(1))}
    with torch.no_grad():
        expected = model.generate(**copy.deepcopy(other), do_sample=False, max_new_tokens=NEW_TOKENS)
    assert torch.equal(generate(components, other, max_new_tokens=NEW_TOKENS), expected)


def _one_token_per_cached_step(forward):
    """A causal LM's forward that refuses more than one token over a non-empty cache, as ProphetNet asserts."""

    @functools.wraps(forward)
    def checked(self, input_ids=None, cache=None, **kwargs):
        if cache is not None and cache.get_seq_length() > 0 and input_ids.shape[1] != 1:
            raise ValueError("use_cache is only supported for one token at a time")
        return forward(self, input_ids=input_ids, cache=cache, **kwargs)

    return checked


def _python_loop_over_the_query(forward):
    """A causal LM's forward with a Python loop over the query tokens (MiniMax's lightning attention, RWKV): the
    trace unrolls it and pins the query length to the traced one."""

    @functools.wraps(forward)
    def looped(self, input_ids=None, **kwargs):
        out = forward(self, input_ids=input_ids, **kwargs)
        zero = out.logits.new_zeros(())
        for i in range(input_ids.shape[1]):  # unrolled: the program accepts only the traced query length
            zero = zero + (input_ids[:, i] * 0).sum()
        out.logits = out.logits + zero
        return out

    return looped


@pytest.mark.parametrize("backend, wrap", [("dynamo", _one_token_per_cached_step), ("onnx", _one_token_per_cached_step),
                                           ("dynamo", _python_loop_over_the_query)])
def test_a_decode_step_that_takes_one_token_only_is_exported_from_the_one_token_call(backend, wrap, monkeypatch):
    """The merged two-token decode step cannot be traced when the model asserts one token per cached step, and its
    program does not run one token when a Python loop over the query pinned it to two: the decode program is then
    the last captured one-token call (query length 1) and the prefill its own program."""
    model = MODELS["llama"].model()
    monkeypatch.setattr(type(model), "forward", wrap(type(model).forward))
    components = AutoExporter.export_for_generation(model, generation_inputs("llama", 0, "dynamic", model),
                                                    {"export_format": backend, "dynamic": True})
    assert components["decode"] is not components["prefill"] and components.plan.empty_cache is None
    assert components.plan.templates["decode"]["input_ids"].shape[1] == 1
    inputs = generation_inputs("llama", 1, "dynamic", model)
    with torch.no_grad():
        expected = model.generate(**copy.deepcopy(inputs), do_sample=False, max_new_tokens=NEW_TOKENS)
    assert torch.equal(generate(components, inputs, max_new_tokens=NEW_TOKENS), expected)


def test_a_cache_with_no_leaves_stays_empty():
    """A text-only pass of a model whose layers are all cross-attention fills no cache: nothing to refill."""
    from transformers import DynamicCache

    from engine.generation.loop import _cache_outputs

    assert _cache_outputs({"logits": torch.zeros(1, 1, 4)}, DynamicCache()) == {}


class _HandsOver(torch.nn.Module):
    """A generate() that encodes its own input and hands over to the language model's generate() with embeddings
    (BLIP-2's shape: vision tower and Q-Former, then ``language_model.generate(inputs_embeds=...)``)."""

    def __init__(self, language_model):
        super().__init__()
        self.language_model = language_model
        self.proj = torch.nn.Linear(3, language_model.config.n_embd)
        self.config, self.generation_config = language_model.config, language_model.generation_config

    def generate(self, features, input_ids, attention_mask=None, **kwargs):
        embeds = self.language_model.get_input_embeddings()(input_ids) + self.proj(features)[:, None, :]
        return self.language_model.generate(inputs_embeds=embeds, input_ids=input_ids, attention_mask=attention_mask,
                                            **kwargs)


@pytest.mark.parametrize("backend", ["dynamo", "onnx"])
def test_a_generate_that_hands_over_to_a_sub_models_generate_is_replayed(backend):
    """The model's code before the hand-over is a component of its own; the language model's steps are captured
    from what it was handed; the tokens equal eager generate() for other features and prompts."""
    torch.manual_seed(0)
    model = _HandsOver(MODELS["gpt2"].model()).eval()

    def sample(seed, length):
        g = torch.Generator().manual_seed(seed)
        return {"features": torch.randn(2, 3, generator=g), "input_ids": torch.randint(0, VOCAB, (2, length), generator=g),
                "attention_mask": torch.ones(2, length, dtype=torch.long)}

    with pytest.raises(ModelError, match="called its top-level forward 0 time"):
        decompose_prefill_decode(model, sample(0, 6))
    _assert_the_handover_replays(model, sample, backend)


def _assert_the_handover_replays(model, sample, backend: str) -> None:
    """Exported from ``sample(0, 6)``; eager's tokens for other inputs and a longer prompt."""
    components = AutoExporter.export_for_generation(model, sample(0, 6), {"export_format": backend, "dynamic": True})
    assert "handover" in components
    for seed, length in ((1, 6), (2, 9)):
        inputs = sample(seed, length)
        with torch.no_grad():
            expected = model.generate(**copy.deepcopy(inputs), do_sample=False, num_beams=1, max_new_tokens=NEW_TOKENS)
        assert torch.equal(generate(components, inputs, max_new_tokens=NEW_TOKENS), expected)


def test_a_generate_that_embeds_its_inputs_before_the_shared_generate_is_replayed():
    """Pop2Piano's shape: the class's own generate() computes ``inputs_embeds`` (here the ids' embeddings plus
    projected features) and calls ``super().generate()`` with them. That preamble is a component of its own, and
    the steps are captured from what it handed over; the tokens equal eager generate() for other features."""
    torch.manual_seed(0)
    reference = MODELS["gpt2"].model()

    class OwnGenerate(type(reference)):
        def __init__(self, config):
            super().__init__(config)
            self.proj = torch.nn.Linear(3, config.n_embd)

        def generate(self, features, input_ids, attention_mask=None, **kwargs):
            embeds = self.get_input_embeddings()(input_ids) + self.proj(features)[:, None, :]
            return super().generate(inputs_embeds=embeds, input_ids=input_ids, attention_mask=attention_mask, **kwargs)

    model = OwnGenerate(reference.config).eval()
    model.load_state_dict(reference.state_dict(), strict=False)
    model.generation_config = reference.generation_config

    def sample(seed, length):
        g = torch.Generator().manual_seed(seed)
        return {"features": torch.randn(2, 3, generator=g), "input_ids": torch.randint(0, VOCAB, (2, length), generator=g)}

    _assert_the_handover_replays(model, sample, "dynamo")


def test_an_encoder_whose_outputs_the_prefill_does_not_take_is_not_run(monkeypatch):
    """Dots3Note's generate() encodes audio its image prompt's prefill does not hold: the plan has an ``audio``
    encoder feeding ``mm_encoder_outputs.audio``, the captured prefill has no such entry. The runner skips it (it
    raised KeyError: 'audio') and still feeds the image encoder's outputs."""
    import engine.generation.loop as generation
    from engine.generation.plan import GenerationPlan

    ran = []
    outputs = {"image_features": {"": torch.ones(1, 2)}, "audio_features": {"": torch.ones(1, 5)}}
    monkeypatch.setattr(generation, "_run", lambda components, name, kwargs: ran.append(name) or outputs[name])
    plan = GenerationPlan(
        templates={"image_features": {"pixel_values": torch.zeros(1, 3)},
                   "audio_features": {"input_features": torch.zeros(1, 4)},
                   "prefill": {"input_ids": torch.zeros(1, 2, dtype=torch.long),
                               "mm_encoder_outputs": {"image": torch.zeros(1, 2)}}},
        encoders={"image_features": "mm_encoder_outputs.image", "audio_features": "mm_encoder_outputs.audio"})
    values = {"pixel_values": torch.ones(1, 3), "input_features": torch.ones(1, 4)}
    generation._run_encoders({}, plan, values)
    assert ran == ["image_features"]
    assert torch.equal(values["mm_encoder_outputs"]["image"], torch.ones(1, 2))
