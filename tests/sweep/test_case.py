"""``run_case`` with a stand-in exporter (``bench/peer_sweep.py``): an artifact that runs its own runtime."""

import torch

from sweep.case import run_case


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, x):
        return {"logits": self.linear(x)}


def _tiny(seed):
    torch.manual_seed(seed)
    return Tiny().eval(), {"x": torch.randn(2, 5, 4)}


class Noisy(Tiny):
    """Samples at inference, as SpeechT5's prenet dropout and VibeVoice's latent noise do."""

    def forward(self, x):
        return {"logits": self.linear(x) + torch.randn_like(x[..., :3])}


def _noisy(seed):
    torch.manual_seed(seed)
    return Noisy().eval(), {"x": torch.randn(2, 5, 4)}


SWEEP_MODELS = {"Tiny": _tiny, "Noisy": _noisy}


def runs_the_model(model, inputs, config):
    """A stand-in whose 'runtime' is the model itself: every leaf matches."""
    return lambda run_inputs: model(**run_inputs)


def runs_it_wrong(model, inputs, config):
    return lambda run_inputs: {"logits": model(**run_inputs)["logits"] + 1}


def _spec(exporter):
    return {"model": "Tiny", "model_module": __name__, "backend": "onnx", "shapes": "dynamic", "atol": 1e-4,
            "rtol": 1e-4, "seed": 0, "exporter": f"{__name__}:{exporter}"}


def test_a_stand_in_that_runs_its_own_runtime_is_compared_leaf_by_leaf():
    row = run_case(_spec("runs_the_model"))
    assert row["status"] == "pass", row.get("error")
    assert row["shapes_run"] == ["traced", "second"]
    assert set(row["diffs"]) == {"traced:logits", "second:logits"}


def test_a_stand_in_with_wrong_numbers_is_a_discrepancy():
    row = run_case(_spec("runs_it_wrong"))
    assert row["status"] == "discrepancy"
    assert row["diffs"]["traced:logits"]["max_abs"] > 0.9


def test_a_model_that_samples_draws_the_same_numbers_in_eager_and_in_its_pt2():
    row = run_case({"model": "Noisy", "model_module": __name__, "backend": "dynamo", "shapes": "dynamic",
                    "atol": 1e-4, "rtol": 1e-4, "seed": 0})
    assert row["status"] == "pass", row.get("error")
    assert row["shapes_run"] == ["traced", "second"]


def test_second_shape_takes_m_rope_positions_per_row_and_generation_leaves_them_to_generate():
    from sweep.case import second_shape
    from sweep.zoo.generation_prompt import generation_prompt

    ids = torch.arange(12).reshape(2, 6)
    positions = torch.stack([ids, ids + 100, ids + 200])  # (sections, batch, seq)
    other = second_shape({"input_ids": ids, "pixel_values": torch.zeros(2, 3), "position_ids": positions})
    assert torch.equal(other["input_ids"], ids[[0, 1, 0]])
    assert torch.equal(other["position_ids"], positions[:, [0, 1, 0]])
    assert "position_ids" not in generation_prompt(torch.nn.Module(), {"input_ids": ids, "position_ids": positions})


def test_generation_exports_with_the_export_cases_onnx_settings():
    from sweep.case import generation_config

    onnx = generation_config({"backend": "onnx", "shapes": "generate", "onnx_disable_optimize": True})
    assert onnx == {"export_format": "onnx", "dynamic": True, "stack_traces": False, "optimize": False}
    # the cache outgrows the export cases' sequence bound (a multimodal prompt alone can be longer)
    assert generation_config({"backend": "executorch", "shapes": "generate"}) == {
        "export_format": "executorch", "dynamic": True, "stack_traces": False}
    # ... so it is bounded at the length the generation reaches, as an ExecuTorch LLM export states its context
    assert generation_config({"backend": "executorch", "shapes": "generate"}, length=139) == {
        "export_format": "executorch", "dynamic": True, "stack_traces": False, "max_seq_len": 139}
    assert "max_seq_len" not in generation_config({"backend": "dynamo", "shapes": "generate"}, length=139)


def test_a_decoder_whose_generate_reads_the_start_token_gets_the_pad():
    """MusicGen's decoder-only generate() builds its delay pattern from the decoder start token (``~mask * None``
    without one); it gets the pad token as its checkpoints do, and eager generate then runs; a plain decoder-only
    model is left alone."""
    from sweep.case import GENERATE_TOKENS, _set_decoder_start_token
    from sweep.zoo.build import build_case

    case = build_case("MusicgenForCausalLM", seed=0)
    result: dict = {}
    _set_decoder_start_token(case.model, result)
    assert case.model.generation_config.decoder_start_token_id == case.model.config.pad_token_id
    assert "pad token" in result["note"]
    with torch.no_grad():
        out = case.model.generate(**case.inputs, do_sample=False, num_beams=1, num_return_sequences=1,
                                  max_new_tokens=GENERATE_TOKENS)
    assert out.shape[0] * case.model.config.num_codebooks == case.inputs["input_ids"].shape[0]  # a row per codebook in
    plain = build_case("GPT2LMHeadModel", seed=0)
    _set_decoder_start_token(plain.model, {})
    assert plain.model.generation_config.decoder_start_token_id is None


def test_an_executorch_generation_bound_counts_the_positions_a_prefill_caches_before_the_prompt():
    """GIT prepends its image tokens to the text in the cache, so prompt plus new tokens undercounts the context its
    ExecuTorch cache bound must hold; a text-only decoder and an encoder-decoder add nothing."""
    from sweep.case import _cached_positions_before_the_prompt
    from sweep.zoo.build import build_case
    from sweep.zoo.generation_prompt import generation_prompt

    git = build_case("GitForCausalLM", seed=0)
    image_tokens = _cached_positions_before_the_prompt(git.model, generation_prompt(git.model, git.inputs))
    vision = git.model.config.vision_config
    assert image_tokens == (vision.image_size // vision.patch_size) ** 2 + 1  # patches and the class token
    for name in ("GPT2LMHeadModel", "T5ForConditionalGeneration"):
        case = build_case(name, seed=0)
        assert _cached_positions_before_the_prompt(case.model, generation_prompt(case.model, case.inputs)) == 0
