"""``auto_dynamic_shapes``: every dim dynamic except the model's constants."""

import torch
import transformers as tf
from torch.export import Dim

from engine.pytree import pytree_attributes
from engine.shapes import auto_dynamic_shapes, configured_image_sizes


def test_image_at_the_configured_size_keeps_channels_height_width_static():
    config = tf.CLIPConfig(vision_config=dict(image_size=32))
    assert (32, 32) in configured_image_sizes(config)  # found in the vision sub-config
    spec = auto_dynamic_shapes({"pixel_values": torch.zeros(2, 3, 32, 32), "input_ids": torch.zeros(2, 5, dtype=torch.long)}, config)
    assert spec["pixel_values"] == {0: Dim.AUTO}
    assert spec["input_ids"] == {0: Dim.AUTO, 1: Dim.AUTO}


def test_image_at_another_size_stays_fully_dynamic():
    config = tf.ConvNextConfig()  # image_size 224
    spec = auto_dynamic_shapes({"pixel_values": torch.zeros(2, 3, 64, 48)}, config)
    assert spec["pixel_values"] == {d: Dim.AUTO for d in range(4)}


def test_rectangular_image_size_and_video_frames():
    config = tf.PretrainedConfig(image_size=[16, 24])
    spec = auto_dynamic_shapes({"pixel_values_videos": torch.zeros(1, 4, 3, 16, 24)}, config)
    assert spec["pixel_values_videos"] == {0: Dim.AUTO, 1: Dim.AUTO}  # batch and frames


def test_without_a_config_every_dim_is_dynamic():
    assert auto_dynamic_shapes({"pixel_values": torch.zeros(1, 3, 32, 32)}) == {"pixel_values": {d: Dim.AUTO for d in range(4)}}


def test_cache_keys_values_grow_and_recurrent_states_vary_by_batch_only():
    from transformers import cache_utils

    attention = cache_utils.DynamicLayer()
    attention.keys, attention.values = torch.zeros(2, 4, 3, 8), torch.zeros(2, 4, 3, 8)
    recurrent = cache_utils.LinearAttentionLayer()
    recurrent.conv_states, recurrent.recurrent_states = {0: torch.zeros(2, 80, 4)}, {0: torch.zeros(2, 8, 8, 8)}
    cache = cache_utils.DynamicCache.__new__(cache_utils.DynamicCache)
    cache_utils.Cache.__init__(cache, layers=[attention, recurrent])

    (layers,) = auto_dynamic_shapes({"past_key_values": cache})["past_key_values"]
    keys_spec = layers[0][[name for name, _ in pytree_attributes(attention)].index("keys")]
    assert keys_spec == {0: Dim.AUTO, 2: Dim.AUTO(min=0)}  # heads and head_dim are the model's; the cache may be empty
    for name, value in zip([name for name, _ in pytree_attributes(recurrent)], layers[1]):
        if name in ("conv_states", "recurrent_states"):
            assert value == {0: {0: Dim.AUTO}}  # [batch, <model constants>]


def test_a_cache_state_with_one_entry_per_cached_token_grows_with_the_keys():
    """DeepSeek-V3.2's indexer keys [batch, seq, dim] beside keys [batch, heads, seq, head_dim]: the sequence dim is
    dynamic (a decode step over a longer cache failed a guard when it was not); a Mamba-like state stays batch-only."""
    from engine.shapes import _cache_layer_spec

    sequence = 9
    assert _cache_layer_spec("indexer_keys", torch.zeros(2, sequence, 16), sequence) == {0: Dim.AUTO, 1: Dim.AUTO(min=0)}
    assert _cache_layer_spec("conv_states", torch.zeros(2, 32, 4), sequence) == {0: Dim.AUTO}
    assert _cache_layer_spec("conv_states", torch.zeros(2, 32, 4), None) == {0: Dim.AUTO}
