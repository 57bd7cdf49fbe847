"""Auto classes: pick the config class from a dict, and the exporter from a config.

Exporter modules are imported lazily, so a user with only the ONNX extra installed never imports ExecuTorch.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from engine.configs import CONFIG_CLASSES, DynamoConfig
from engine.errors import ConfigError

EXPORTERS: dict[str, tuple[str, str]] = {
    "dynamo": ("engine.exporter_dynamo", "DynamoExporter"),
    "onnx": ("engine.exporter_onnx", "OnnxExporter"),
    "executorch": ("engine.exporter_executorch", "ExecutorchExporter"),
}


def _format_of(config: Any) -> str:
    if isinstance(config, DynamoConfig):
        return config.export_format
    if isinstance(config, Mapping):
        fmt = config.get("export_format", "dynamo")
        if fmt not in CONFIG_CLASSES:
            raise ConfigError(f"unknown export_format {fmt!r}; known formats: {', '.join(CONFIG_CLASSES)}")
        return fmt
    raise ConfigError(f"an export config must be a config object or a dict, got {type(config).__name__}")


class AutoExportConfig:
    """``AutoExportConfig.from_dict({"export_format": "onnx", "dynamic": True})`` -> ``OnnxConfig``."""

    @staticmethod
    def from_dict(values: Mapping[str, Any]) -> DynamoConfig:
        return CONFIG_CLASSES[_format_of(values)].from_dict(values)


class AutoExporter:
    """``AutoExporter.from_config(OnnxConfig())`` -> ``OnnxExporter()``; a dict works too."""

    @staticmethod
    def exporter_class(export_format: str) -> type:
        if export_format not in EXPORTERS:
            raise ConfigError(f"unknown export_format {export_format!r}; known formats: {', '.join(EXPORTERS)}")
        module, name = EXPORTERS[export_format]
        return getattr(importlib.import_module(module), name)

    @classmethod
    def from_config(cls, config: DynamoConfig | Mapping[str, Any]):
        return cls.exporter_class(_format_of(config))()

    @classmethod
    def export(cls, model, inputs, config: DynamoConfig | Mapping[str, Any]):
        """Shortcut: pick the exporter from ``config`` and export."""
        if isinstance(config, Mapping):
            config = AutoExportConfig.from_dict(config)
        return cls.from_config(config).export(model, inputs, config=config)

    @classmethod
    def export_for_generation(cls, model, inputs, config: DynamoConfig | Mapping[str, Any]):
        """Shortcut: pick the exporter from ``config`` and export every generation component."""
        if isinstance(config, Mapping):
            config = AutoExportConfig.from_dict(config)
        return cls.from_config(config).export_for_generation(model, inputs, config=config)
