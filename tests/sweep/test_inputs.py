"""Input hints learned from a model's own errors (sweep.inputs)."""

from __future__ import annotations

from transformers import cache_utils

from sweep import inputs


def test_an_error_building_the_cache_turns_the_cache_off():
    hints = inputs.Hints()
    try:
        cache_utils.get_layer_types_and_kwargs(object())  # a config the cache cannot read
    except Exception as exc:  # noqa: BLE001
        assert inputs.refine_hints(hints, exc)
        assert hints.no_cache and not inputs.refine_hints(hints, exc)  # learned once
    assert not inputs.refine_hints(inputs.Hints(), ValueError("elsewhere"))
