"""The catalog lists every class of every auto mapping once, with the model type its config class names."""

from __future__ import annotations

import importlib

import pytest

from sweep.zoo import catalog


@pytest.fixture(scope="module")
def records():
    return catalog.catalog()


def test_every_mapped_class_is_catalogued_once(records):
    module = importlib.import_module(catalog.MAPPING_MODULE)
    expected = set()
    for name in dir(module):
        if name.startswith("MODEL_") and name.endswith("_MAPPING_NAMES"):
            for value in getattr(module, name).values():
                expected.update(value if isinstance(value, (list, tuple)) else [value])
    assert set(records) == expected
    assert catalog.all_classes() == sorted(expected)
    assert len(records) > 1000


def test_records_are_complete(records):
    for rec in records.values():
        assert rec.model_type in rec.all_model_types
        assert rec.config_class, rec.name
        assert rec.mappings, rec.name
        assert set(rec.mappings) <= set(catalog.mapping_labels())


@pytest.mark.parametrize("name, model_type", [
    ("LlamaForCausalLM", "llama"),  # also listed under internlm3 and iquestcoder
    ("GPT2LMHeadModel", "gpt2"),  # also listed under gpt-sw3, same config class
    ("Gemma3ForConditionalGeneration", "gemma3"),  # also listed under shieldgemma2
])
def test_shared_classes_take_their_own_config_type(records, name, model_type):
    assert records[name].model_type == model_type
    assert len(records[name].all_model_types) > 1


def test_mapping_labels():
    assert catalog.mapping_label("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES") == "causal_lm"
    assert catalog.mapping_label("MODEL_MAPPING_NAMES") == "base"
    grouped = catalog.classes_by_mapping()
    assert "LlamaForCausalLM" in grouped["causal_lm"]
    assert "LlamaModel" in grouped["base"]


def test_mappings_of_names_every_mapping_that_lists_a_class(records):
    module = importlib.import_module(catalog.MAPPING_MODULE)
    expected: dict[str, set[str]] = {}
    for dict_name in dir(module):
        if dict_name.startswith("MODEL_") and dict_name.endswith("_MAPPING_NAMES"):
            for value in getattr(module, dict_name).values():
                for name in value if isinstance(value, (list, tuple)) else [value]:
                    expected.setdefault(name, set()).add(catalog.mapping_label(dict_name))
    assert {name: catalog.mappings_of(name) for name in records} == {n: tuple(sorted(m)) for n, m in expected.items()}
    assert all(rec.mappings == catalog.mappings_of(name) for name, rec in records.items())
    assert catalog.mappings_of("CLIPVisionModelWithProjection") == ()  # unlisted


def test_unlisted_classes_are_outside_the_catalog(records):
    unlisted = catalog.unlisted_classes()
    assert unlisted["concrete"] and unlisted["abstract"]
    assert not set(unlisted["concrete"]) & set(records)
    assert "CLIPVisionModelWithProjection" in unlisted["concrete"]
    assert "LlamaPreTrainedModel" in unlisted["abstract"]


def test_unlisted_class_can_be_named(records):
    rec = catalog.record("CLIPVisionModelWithProjection")
    assert rec.model_type == "clip_vision_model"
    assert rec.mappings == ()


def test_the_mapping_dicts_read_from_source_equal_the_imported_ones():
    """Selection reads the auto mappings from modeling_auto.py's literals (no transformers import); they must be
    the dicts the module defines."""
    import importlib

    module = importlib.import_module(catalog.MAPPING_MODULE)
    names = [n for n in dir(module) if n.startswith("MODEL_") and n.endswith("_MAPPING_NAMES")]
    imported = {catalog.mapping_label(n): dict(getattr(module, n)) for n in names}
    assert catalog._literal_mapping_dicts() == imported
