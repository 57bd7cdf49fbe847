"""The package's lazy public names: each resolves to what its module defines, and importing costs nothing."""

from __future__ import annotations

import importlib
import subprocess
import sys

import engine


def test_every_public_name_resolves_to_its_definition():
    for name in engine.__all__:
        value = getattr(engine, name)
        assert getattr(value, "__name__", name) == name, name
    assert set(dir(engine)) >= set(engine.__all__)


def test_a_submodule_import_never_shadows_a_public_function():
    importlib.import_module(engine._MODULE_OF["generate"])
    assert callable(engine.generate) and not isinstance(engine.generate, type(engine))


def test_collecting_and_scheduling_cases_imports_no_exporter():
    # what a sweep's controller and --collect-only runs import (selecting catalog classes included); the forkserver
    # imports the exporters for the cases
    script = ("import sys, engine, engine.versions, sweep.plugin, sweep.case, sweep.isolation, sweep.selection\n"
              "engine.installed_versions(); engine.pinned_versions()\n"
              "sweep.selection.resolve_models('LlamaForCausalLM,Bert*,smoke')\n"
              "print(sorted(m for m in ('transformers.modeling_utils', 'engine.exporter_dynamo') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_exporting_a_plain_module_never_loads_transformers_modeling_utils():
    # a sweep of --model-module models warms its forkserver without them (3 s); a PreTrainedModel is still told
    script = ("import sys, torch\n"
              "from engine import DynamoExporter\n"
              "from engine.prepare import is_pretrained_model\n"
              "DynamoExporter().export(torch.nn.Linear(4, 3), {'input': torch.randn(2, 4)})\n"
              "loaded = 'transformers.modeling_utils' in sys.modules\n"
              "from transformers import GPT2Config, GPT2Model\n"
              "print(loaded, is_pretrained_model(torch.nn.Linear(4, 3)),\n"
              "      is_pretrained_model(GPT2Model(GPT2Config(n_layer=1, n_embd=8, n_head=2))))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False", "True"], out
