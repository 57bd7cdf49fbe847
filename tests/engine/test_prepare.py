"""Bad input is rejected with named errors that say what is allowed; inputs are normalised."""

from __future__ import annotations

import warnings

import pytest
import torch

from engine import ConfigError, DynamoConfig, DynamoExporter, InputError, ModelError, run_exported
from engine.prepare import prepare_for_export
from tests.engine.tiny_models import TINY_MODELS


@pytest.fixture(scope="module")
def gpt2():
    return TINY_MODELS["gpt2"].model()


def test_model_must_be_a_module():
    with pytest.raises(ModelError, match="must be a torch.nn.Module.*got str"):
        DynamoExporter().export("gpt2", {"input_ids": torch.zeros(1, 2, dtype=torch.long)})


def test_inputs_must_be_a_mapping(gpt2):
    with pytest.raises(InputError, match="must be a mapping.*got tuple"):
        DynamoExporter().export(gpt2, (torch.zeros(1, 2, dtype=torch.long),))


def test_unknown_input_name_lists_what_forward_takes(gpt2):
    with pytest.raises(InputError, match=r"does not take 'input_idz'; it takes: .*attention_mask.*input_ids"):
        DynamoExporter().export(gpt2, {"input_idz": torch.zeros(1, 2, dtype=torch.long)})


def test_an_input_under_its_deprecated_name_is_taken_as_the_model_takes_it():
    """transformers 5.24 renamed the forward's ``past_key_values`` to ``cache`` (``@deprecate_kwarg``, which renames
    a call's old name until 5.40): code written for 5.23 still exports, under the name it gave."""
    import copy

    from engine.prepare import deprecated_input_names

    tiny = TINY_MODELS["llama"]
    model = tiny.model()
    assert deprecated_input_names(type(model).forward) == {"past_key_values": "cache"}
    assert deprecated_input_names(torch.nn.Linear(2, 2).forward) == {}
    prefill = tiny.inputs("trace")
    with torch.no_grad():
        cache = model(**copy.deepcopy(prefill)).cache
    batch, past = prefill["input_ids"].shape
    step = {"input_ids": torch.randint(0, 96, (batch, 2)), "attention_mask": torch.ones(batch, past + 2, dtype=torch.long),
            "past_key_values": cache}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # transformers' own notice of the rename
        program = DynamoExporter().export(model, step, config={"dynamic": True})
        with torch.no_grad():
            expected = model(**copy.deepcopy(step)).logits
    # the program takes the cache under the name it was given
    assert torch.allclose(run_exported(program, step)["logits"], expected, atol=1e-5, rtol=1e-5)


def test_unknown_config_key_lists_valid_keys(gpt2):
    with pytest.raises(ConfigError, match=r"unknown DynamoConfig key\(s\): dynamc; valid keys: dynamic, strict"):
        DynamoExporter().export(gpt2, TINY_MODELS["gpt2"].inputs(), config={"dynamc": True})


def test_config_type_errors():
    with pytest.raises(ConfigError, match="dynamic must be a bool"):
        DynamoConfig(dynamic="yes")
    with pytest.raises(ConfigError, match="config must be a DynamoConfig or a dict"):
        DynamoExporter().export(torch.nn.Linear(2, 2), {"input": torch.zeros(1, 2)}, config=3)


def test_plain_module_with_positional_forward():
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU()).eval()
    inputs = {"input": torch.randn(2, 4)}
    program = DynamoExporter().export(model, inputs, config={"dynamic": True})
    x = {"input": torch.randn(5, 4)}
    assert torch.allclose(run_exported(program, x)[""], model(x["input"]))


def test_preparation_strips_labels_casts_and_materialises_views(gpt2):
    base = torch.randint(0, 96, (2, 10))
    inputs = {
        "input_ids": base[:, :6],
        "attention_mask": torch.ones(2, 6, dtype=torch.long),
        "labels": base[:, :6],
        "use_cache": False,
        "token_type_ids": None,
    }
    model = gpt2.to(torch.float64)
    try:
        _, traced, flags = prepare_for_export(model, inputs)
    finally:
        gpt2.to(torch.float32)
    assert list(traced) == ["input_ids", "attention_mask"] and flags == {"use_cache": False}
    assert traced["input_ids"]._base is None and inputs["input_ids"]._base is base  # caller's dict untouched


def test_floating_inputs_follow_model_dtype():
    model = torch.nn.Linear(3, 3).to(torch.float64)
    _, traced, _ = prepare_for_export(model, {"input": torch.randn(2, 3)})
    assert traced["input"].dtype == torch.float64


def test_flash_attention_is_switched_to_sdpa_with_a_warning():
    model = TINY_MODELS["llama"].model()
    model.config._attn_implementation = "flex_attention"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        prepare_for_export(model, TINY_MODELS["llama"].inputs())
    assert model.config._attn_implementation == "sdpa"
    assert any("cannot be exported; switching to 'sdpa'" in str(w.message) for w in caught)
