"""Export a module to a backend with dynamic shapes and compare it with eager at other sizes: the check every
patch test ends with."""

import pytest

from engine import AutoExporter, run_exported
from engine.compare import compare_leaves
from tests.engine.tiny_models import eager_leaves


def assert_exports_and_runs(module, trace_inputs, run_inputs, backend: str, tolerance: float) -> None:
    """Export ``module`` with dynamic shapes to ``backend`` and compare it with eager at other sizes."""
    if backend == "executorch":
        pytest.importorskip("executorch", reason="the executorch extra is not installed")
    config = {"export_format": backend, "dynamic": True}
    program = AutoExporter.from_config(config).export(module, trace_inputs, config=config)
    comparison = compare_leaves(eager_leaves(module, run_inputs), run_exported(program, run_inputs),
                                atol=tolerance, rtol=tolerance)
    assert comparison.ok, str(comparison)
