"""Auto classes pick the config class from a dict and the exporter from a config."""

from __future__ import annotations

import pytest

from engine import AutoExportConfig, AutoExporter, ConfigError, DynamoConfig, DynamoExporter, ExecutorchConfig, OnnxConfig


def test_config_from_dict_round_trip():
    for config in (DynamoConfig(dynamic=True), OnnxConfig(opset_version=18, optimize=False), ExecutorchConfig(backend="xnnpack")):
        assert AutoExportConfig.from_dict(config.to_dict()) == config


def test_default_format_is_dynamo():
    assert AutoExportConfig.from_dict({"dynamic": True}) == DynamoConfig(dynamic=True)
    assert isinstance(AutoExporter.from_config({}), DynamoExporter)


def test_unknown_format_lists_known_ones():
    with pytest.raises(ConfigError, match="unknown export_format 'tflite'; known formats: dynamo, onnx, executorch"):
        AutoExportConfig.from_dict({"export_format": "tflite"})


def test_key_of_another_format_is_rejected():
    with pytest.raises(ConfigError, match="unknown DynamoConfig key.*backend"):
        AutoExportConfig.from_dict({"export_format": "dynamo", "backend": "xnnpack"})
