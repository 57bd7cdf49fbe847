"""Bring your own model: a local config or model folder, or a class no auto mapping lists."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from sweep.zoo import build
from sweep.zoo.shrink import shrink_config


@pytest.fixture(scope="module")
def tiny_llama_config():
    return shrink_config(LlamaConfig)


def test_own_config_object(tiny_llama_config):
    case = build.build_case("LlamaForCausalLM", config=tiny_llama_config)
    assert case.source == "config"
    assert case.model.config.hidden_size == tiny_llama_config.hidden_size


def test_own_config_json(tmp_path, tiny_llama_config):
    tiny_llama_config.num_hidden_layers = 3
    tiny_llama_config.save_pretrained(tmp_path)
    case = build.build_case("LlamaForCausalLM", config=tmp_path / "config.json")
    assert case.source == "config"
    assert case.model.config.num_hidden_layers == 3


def test_own_model_folder_keeps_its_weights(tmp_path, tiny_llama_config):
    torch.manual_seed(1)
    model = LlamaForCausalLM(tiny_llama_config)
    model.save_pretrained(tmp_path)
    case = build.build_case("LlamaForCausalLM", config=tmp_path)
    assert case.source == "pretrained"
    torch.testing.assert_close(case.model.lm_head.weight, model.lm_head.weight)


def test_unlisted_class_by_name():
    case = build.build_case("CLIPVisionModelWithProjection")
    assert case.mappings == ()
    assert "pixel_values" in case.inputs


def test_unknown_class_is_an_error():
    with pytest.raises(AttributeError):
        build.build_case("NoSuchModelForAnything")


def _own_llama_folder(tmp_path, **fields):
    """A contributor's tiny Llama ``config.json``, written as a hub checkpoint ships it (no ``pad_token_id``)."""
    config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 32,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 64,
              "vocab_size": 128, "bos_token_id": 1, "eos_token_id": 2, **fields}
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_own_config_without_pad_token_is_completed_for_batched_classification(tmp_path):
    folder = _own_llama_folder(tmp_path)
    written = (folder / "config.json").read_bytes()
    case = build.build_case("LlamaForSequenceClassification", config=folder)
    assert case.config_completed == {"pad_token_id": 0}
    assert case.model.config.pad_token_id == 0
    assert case.model.config.hidden_size == 32 and case.model.config.num_hidden_layers == 2  # sizes as given
    assert case.inputs["input_ids"].shape[0] > 1
    with torch.no_grad():
        assert case.model(**case.inputs).logits.shape[0] == case.inputs["input_ids"].shape[0]
    assert (folder / "config.json").read_bytes() == written


def test_own_config_that_sets_its_pad_token_is_not_completed(tmp_path):
    case = build.build_case("LlamaForSequenceClassification", config=_own_llama_folder(tmp_path, pad_token_id=5))
    assert case.config_completed == {}
    assert case.model.config.pad_token_id == 5


def test_own_config_that_runs_as_it_is_is_not_completed(tmp_path):
    case = build.build_case("LlamaForCausalLM", config=_own_llama_folder(tmp_path))
    assert case.config_completed == {}
    assert case.model.config.pad_token_id is None


def test_the_completion_is_recorded_in_the_row(tmp_path):
    from sweep.case import run_case

    spec = {"model": "own", "class": "LlamaForSequenceClassification", "config": str(_own_llama_folder(tmp_path)),
            "backend": "eager", "shapes": "static", "atol": 1e-4, "rtol": 1e-4, "seed": 0}
    row = run_case(spec)
    assert row["status"] == "pass", row.get("error")
    assert row["config_completed"] == {"pad_token_id": 0}


def test_own_config_missing_a_field_the_init_reads_is_completed_by_the_init_lesson():
    name = "MoonshineStreamingModel"
    config = shrink_config(build.model_class(name).config_class)  # the default declares no num_key_value_heads
    case = build.build_case(name, config=config)
    assert set(case.config_completed) == {"num_key_value_heads"}
    assert not hasattr(config, "num_key_value_heads")  # the given object is not changed
