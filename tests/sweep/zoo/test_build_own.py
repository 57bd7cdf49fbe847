"""Bring your own model: a local config or model folder, or a class no auto mapping lists."""

from __future__ import annotations

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
