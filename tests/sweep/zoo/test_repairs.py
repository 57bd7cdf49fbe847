"""Config fixes learned from a model's own __init__ errors (sweep.zoo.init_lessons, with the values of
sweep.zoo.repairs), on configs alone."""

from __future__ import annotations

from transformers import (DeepseekOcr2Config, HieraConfig, LlamaConfig, MoonshineStreamingConfig,
                          PPOCRV5ServerDetConfig, ReformerConfig, T5GemmaConfig)

from sweep.zoo import init_lessons, profiles, repairs, shrink

TINY = profiles.PROFILES[0]


def _raise(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:  # noqa: BLE001 - a real traceback, as the model would leave
        return caught


def test_an_undeclared_attribute_takes_the_same_field_elsewhere_in_the_tree():
    config = shrink.shrink_config(MoonshineStreamingConfig)
    exc = _raise(AttributeError("no attribute", name="num_key_value_heads", obj=config))
    assert init_lessons.learn_from_init_error(exc, config, TINY) == {
        "num_key_value_heads": config.encoder_config.num_key_value_heads}


def test_an_undeclared_attribute_gets_a_value_by_its_name():
    config = shrink.shrink_config(LlamaConfig)
    for key, value in (("dropout_rate", 0.0), ("shared_expert_intermediate_size", TINY.intermediate)):
        exc = _raise(AttributeError("no attribute", name=key, obj=config))
        assert init_lessons.learn_from_init_error(exc, config, TINY) == {key: value}


def _read_unset(config):
    return config.decoder_hidden_size + 1


def _read_unset_through_a_local(config):
    kernel_list = config.kernel_list
    return kernel_list[0]


def test_a_none_field_the_failing_statement_reads_is_filled():
    config = shrink.shrink_config(HieraConfig)
    try:
        _read_unset(config)
    except TypeError as exc:
        assert init_lessons.learn_from_init_error(exc, config, TINY) == {"decoder_hidden_size": TINY.width}


def test_a_none_field_read_through_a_local_takes_its_documented_default():
    config = shrink.shrink_config(PPOCRV5ServerDetConfig)
    try:
        _read_unset_through_a_local(config)
    except TypeError as exc:
        assert init_lessons.learn_from_init_error(exc, config, TINY) == {"kernel_list": [3, 2, 2]}


def test_per_layer_type_lists_take_the_values_their_docstring_quotes():
    text = shrink.shrink_config(DeepseekOcr2Config).text_config
    assert repairs.documented_values(type(text), "mlp_layer_types") == ["dense", "sparse"]
    assert repairs.value_by_name("mlp_layer_types", text, TINY) == ["dense", "sparse"]


def test_flags_a_class_requires_are_set_from_its_message():
    config = shrink.shrink_config(ReformerConfig)
    exc = AssertionError("If you want to use `ReformerModelWithLMHead` make sure that `is_decoder=True`.")
    assert init_lessons.learn_from_init_error(exc, config, TINY) == {"is_decoder": True}
    t5 = shrink.shrink_config(T5GemmaConfig)
    exc = ValueError("T5GemmaEncoderModel only supports encoder-only model. Use `T5GemmaModel` instead.")
    assert init_lessons.learn_from_init_error(exc, t5, TINY) == {"is_encoder_decoder": False}


def test_a_flag_a_head_class_warns_for_is_set_and_the_model_is_built_with_it():
    """BertLMHeadModel only logs "add `is_decoder=True.`"; built without it, it attends both ways and its
    generation cannot be decoded a token at a time."""
    from transformers import BertConfig

    from sweep.zoo.build import build_case

    config = shrink.shrink_config(BertConfig)
    message = "If you want to use `BertLMHeadModel` as a standalone, add `is_decoder=True.`"
    assert init_lessons.required_flag(message, config) == {"is_decoder": True}
    assert init_lessons.required_flag("nothing asked for here", config) is None
    assert build_case("BertLMHeadModel").model.config.is_decoder
    assert not build_case("BertModel").model.config.is_decoder


def test_head_counts_divide_the_channels_they_split():
    config = shrink.shrink_config(LlamaConfig)
    exc = ValueError(f"qk_channels (261) must be divisible by num_heads ({config.num_attention_heads}).")
    fix = init_lessons.learn_from_init_error(exc, config, TINY)
    assert fix["num_attention_heads"] == 1 and fix.get("num_key_value_heads", 1) == 1


def test_nested_overrides_merge():
    assert repairs.merge({"a": {"b": 1}}, {"a": {"c": 2}, "d": 3}) == {"a": {"b": 1, "c": 2}, "d": 3}
