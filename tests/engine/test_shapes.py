"""``auto_dynamic_shapes``: every dim dynamic except the model's constants."""

import torch
import transformers as tf
from torch.export import Dim

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
