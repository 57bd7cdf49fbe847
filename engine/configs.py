"""Export configs: one dataclass per exporter, built from keyword arguments or a plain dict.

Every config knows its ``export_format`` (``"dynamo"``, ``"onnx"``, ``"executorch"``) so that
:class:`engine.AutoExportConfig` can rebuild the right class from ``config.to_dict()``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from engine.errors import ConfigError


@dataclass
class DynamoConfig:
    """Options of ``torch.export``.

    - ``dynamic``: mark every tensor dim (and every cache leaf dim) ``Dim.AUTO`` when ``dynamic_shapes`` is not given.
    - ``strict``: run ``torch.export`` in strict (TorchDynamo) mode.
    - ``dynamic_shapes``: explicit per-input spec, passed to ``torch.export``; wins over ``dynamic``.
    - ``prefer_deferred_runtime_asserts_over_guards``: data-dependent guards become runtime asserts instead of failing
      the trace (most LLMs need it with ``Dim(min=, max=)`` bounds).
    - ``stack_traces``: record ``node.meta["stack_trace"]``; ``False`` skips it (up to a third of an ONNX trace). Needs
      torch >= 2.14 (``torch.fx.config.do_not_emit_stack_traces``); ignored before."""

    export_format: ClassVar[str] = "dynamo"

    dynamic: bool = False
    strict: bool = False
    dynamic_shapes: Any = None
    prefer_deferred_runtime_asserts_over_guards: bool = False
    stack_traces: bool = True

    def __post_init__(self):
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.type in ("bool", bool) and not isinstance(value, bool):
                raise ConfigError(f"{type(self).__name__}.{f.name} must be a bool, got {value!r}")
        if self.dynamic_shapes is not None and not isinstance(self.dynamic_shapes, (Mapping, tuple, list)):
            raise ConfigError(
                f"{type(self).__name__}.dynamic_shapes must be a dict keyed by input name (or a tuple/list), "
                f"got {type(self.dynamic_shapes).__name__}"
            )

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]):
        if not isinstance(values, Mapping):
            raise ConfigError(f"{cls.__name__}.from_dict takes a dict, got {type(values).__name__}")
        values = dict(values)
        fmt = values.pop("export_format", cls.export_format)
        if fmt != cls.export_format:
            raise ConfigError(f"{cls.__name__} is for export_format={cls.export_format!r}, got {fmt!r}")
        unknown = sorted(set(values) - set(cls.field_names()))
        if unknown:
            raise ConfigError(
                f"unknown {cls.__name__} key(s): {', '.join(unknown)}; valid keys: {', '.join(cls.field_names())}"
            )
        return cls(**values)

    @classmethod
    def coerce(cls, config: Any):
        """Accept ``None``, a dict, or an instance of this class (or a subclass)."""
        if config is None:
            return cls()
        if isinstance(config, cls):
            return config
        if isinstance(config, Mapping):
            return cls.from_dict(config)
        raise ConfigError(f"config must be a {cls.__name__} or a dict, got {type(config).__name__}")

    def to_dict(self) -> dict[str, Any]:
        return {"export_format": self.export_format, **{n: getattr(self, n) for n in self.field_names()}}


@dataclass
class OnnxConfig(DynamoConfig):
    """Options of the ONNX exporter, on top of :class:`DynamoConfig`.

    - ``output_path``: write the model there (plus a ``.onnx_data`` sidecar with ``external_data``); ``None``: in
      memory.
    - ``opset_version``: target opset; ``None``: the newest the installed onnxscript supports.
    - ``optimize``: run the onnxscript optimiser passes.
    - ``export_params`` / ``keep_initializers_as_inputs``: as in ``torch.onnx.export``.
    - ``single_trace``: trace once, straight to the ATen IR ``torch.onnx.export`` translates
      (:mod:`engine.single_trace`), instead of ``torch.export.export`` plus the decomposition retrace. ``False`` takes
      the two passes (also the fallback where torch lacks the hooks)."""

    export_format: ClassVar[str] = "onnx"

    output_path: str | os.PathLike | None = None
    opset_version: int | None = None
    external_data: bool = True
    optimize: bool = True
    export_params: bool = True
    keep_initializers_as_inputs: bool = False
    single_trace: bool = True

    def __post_init__(self):
        super().__post_init__()
        if self.opset_version is not None and (isinstance(self.opset_version, bool) or not isinstance(self.opset_version, int)):
            raise ConfigError(f"OnnxConfig.opset_version must be an int, got {self.opset_version!r}")


@dataclass
class ExecutorchConfig(DynamoConfig):
    """Options of the ExecuTorch exporter, on top of :class:`DynamoConfig`.

    - ``backend``: ``"xnnpack"`` (CPU, fp32; default) or ``"cuda"`` (CUDA, bf16).
    - ``max_seq_len``: upper bound of every dynamic sequence-like input dim (a dim traced longer keeps its traced size);
      ``None``: the default bounds, which can plan gigabytes.
    - ``max_planned_tensor_mb``: largest tensor (MiB) the program may plan; over it, export raises
      :class:`~engine.errors.PlannedMemoryError`. ``None``: no limit.
    - ``single_trace``: trace once, straight to the lowering's ATen IR (:func:`engine.executorch_lowering.trace_table`);
      ``False``: ``torch.export.export`` plus the decomposition retrace (also the fallback)."""

    export_format: ClassVar[str] = "executorch"

    backend: str = "xnnpack"
    max_seq_len: int | None = None
    max_planned_tensor_mb: int | None = 4096
    single_trace: bool = True

    def __post_init__(self):
        super().__post_init__()
        if not isinstance(self.backend, str):
            raise ConfigError(f"ExecutorchConfig.backend must be a string, got {self.backend!r}")
        if self.max_seq_len is not None and (
            isinstance(self.max_seq_len, bool) or not isinstance(self.max_seq_len, int) or self.max_seq_len < 2
        ):
            raise ConfigError(f"ExecutorchConfig.max_seq_len must be None or an int >= 2, got {self.max_seq_len!r}")
        limit = self.max_planned_tensor_mb
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            raise ConfigError(f"ExecutorchConfig.max_planned_tensor_mb must be None or an int >= 1, got {limit!r}")


CONFIG_CLASSES: dict[str, type[DynamoConfig]] = {c.export_format: c for c in (DynamoConfig, OnnxConfig, ExecutorchConfig)}
