"""One save and one load call for every artifact kind (:mod:`engine.artifacts`): what an exporter returns, saved
and loaded back, runs to the numbers the in-memory artifact gives; anything else is a named error."""

from __future__ import annotations

import pytest
import torch

from engine import ConfigError, DynamoExporter, load_artifact, run_exported, save_artifact
from engine.artifacts import SUFFIX, artifact_kind
from engine.compare import compare_leaves


class _Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(4, 8), torch.nn.Linear(8, 3)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def _exporter(backend: str):
    if backend == "dynamo":
        return DynamoExporter()
    pytest.importorskip(backend if backend == "executorch" else "onnxruntime")
    from engine import AutoExporter

    return AutoExporter.exporter_class(backend)()


@pytest.mark.parametrize("backend", ["dynamo", "onnx", "executorch"])
def test_a_saved_artifact_loads_and_runs_as_the_one_in_memory(backend, tmp_path):
    torch.manual_seed(0)
    model, inputs = _Mlp().eval(), {"x": torch.randn(3, 4)}
    artifact = _exporter(backend).export(model, inputs, config={"dynamic": True})
    assert artifact_kind(artifact) == backend
    path = save_artifact(artifact, tmp_path / f"model{SUFFIX[backend]}")
    loaded = load_artifact(path)
    other = {"x": torch.randn(5, 4)}
    comparison = compare_leaves(run_exported(artifact, other), run_exported(loaded, other), atol=0, rtol=0)
    assert comparison.ok, str(comparison)
    assert isinstance(loaded, torch.export.ExportedProgram) == (backend == "dynamo")


def test_saving_something_that_is_not_an_artifact_names_what_is():
    with pytest.raises(ConfigError, match="ExportedProgram, an ONNXProgram or an ExecutorchProgramManager"):
        save_artifact(torch.nn.Linear(2, 2), "model.pt2")
