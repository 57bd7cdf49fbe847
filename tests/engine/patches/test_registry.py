"""Patch registry: reversible even when the traced forward raises; version ranges; FX fixes."""

from __future__ import annotations

import sys
import types

import pytest
import torch
import transformers

from engine import DynamoConfig, DynamoExporter, ExportStageError, apply_patches, register_patch
from engine.patches import registry
from engine.patches import apply_fx_node_fixes, register_fx_node_fix
from tests.engine.tiny_models import TINY_MODELS


@pytest.fixture
def clean_registry():
    saved = {b: list(v) for b, v in registry._PATCHES.items()}
    saved_fx = {b: list(v) for b, v in registry._FX_NODE_FIXES.items()}
    yield
    registry._PATCHES.update(saved)
    registry._FX_NODE_FIXES.update(saved_fx)


class Boom(RuntimeError):
    pass


def test_every_patched_attribute_is_restored_after_a_failing_export(clean_registry):
    llama = transformers.models.llama.modeling_llama
    originals = {
        "mlp": llama.LlamaMLP.forward,
        "norm": llama.LlamaRMSNorm.forward,
        "silu": torch.nn.functional.silu,
    }

    @register_patch("dynamo", "transformers.models.llama.modeling_llama.LlamaRMSNorm.forward")
    def _patch_norm_identity(original):
        return lambda self, x: original(self, x)

    @register_patch("dynamo", "torch.nn.functional.silu")
    def _patch_silu(original):
        return lambda x, inplace=False: original(x)

    @register_patch("dynamo", "transformers.models.llama.modeling_llama.LlamaMLP.forward")
    def _patch_mlp_raises(original):
        def forward(self, x):
            raise Boom("raised inside the traced forward")

        return forward

    tiny = TINY_MODELS["llama"]
    with pytest.raises(ExportStageError) as info:
        DynamoExporter().export(tiny.model(), tiny.inputs(), config=DynamoConfig(dynamic=True))
    assert info.value.stage == "export" and isinstance(info.value.__cause__, Boom)
    assert llama.LlamaMLP.forward is originals["mlp"]
    assert llama.LlamaRMSNorm.forward is originals["norm"]
    assert torch.nn.functional.silu is originals["silu"]
    assert "forward" not in vars(tiny.model())  # the flattened signature is gone too


def test_a_patch_of_the_exported_models_own_forward_is_traced(clean_registry):
    """The forward the exporter binds for the trace (its flattened signature) is the patched one, not the class's
    forward before the patches: a patch of ``LlamaModel.forward`` shows in a program exported from a LlamaModel."""
    llama = transformers.models.llama.modeling_llama

    @register_patch("dynamo", "transformers.models.llama.modeling_llama.LlamaModel.forward")
    def _patch_model_doubled(original):
        def forward(self, *args, **kwargs):
            output = original(self, *args, **kwargs)
            output.last_hidden_state = output.last_hidden_state * 2
            return output

        return forward

    tiny = TINY_MODELS["llama"]
    model = tiny.model().model  # the LlamaModel itself
    assert isinstance(model, llama.LlamaModel)
    inputs = tiny.inputs()
    program = DynamoExporter().export(model, inputs, config=DynamoConfig(dynamic=True))
    with torch.no_grad():
        expected = model(**inputs).last_hidden_state * 2
    torch.testing.assert_close(program.module()(**inputs).last_hidden_state, expected)


@pytest.fixture
def fake_target(clean_registry, monkeypatch):
    """An importable module ``fake_target`` whose ``op()`` returns ``"original"``."""
    module = types.ModuleType("fake_target")
    module.op = lambda: "original"
    monkeypatch.setitem(sys.modules, "fake_target", module)
    return module


def test_patch_outside_its_version_range_is_not_applied(fake_target):
    register_patch("onnx", "fake_target.op", requires={"torch": "<1.0"})(lambda orig: lambda: "old torch")
    register_patch("onnx", "fake_target.op", requires={"torch": ">=2.0"})(lambda orig: lambda: "patched " + orig())
    with apply_patches("onnx") as applied:
        assert fake_target.op() == "patched original"
        assert len([name for name in applied if name.endswith("@fake_target.op")]) == 1
    assert fake_target.op() == "original"


def test_patches_of_one_path_compose_in_registration_order(fake_target):
    register_patch("onnx", "fake_target.op")(lambda orig: lambda: f"first({orig()})")
    register_patch("onnx", "fake_target.op")(lambda orig: lambda: f"second({orig()})")
    with apply_patches("onnx"):
        assert fake_target.op() == "second(first(original))"
    assert fake_target.op() == "original"


def test_unknown_backend_is_a_config_error():
    from engine import ConfigError

    with pytest.raises(ConfigError, match="known backends: dynamo, onnx, executorch, generation"):
        register_patch("tensorrt", "torch.add")


def test_fx_node_fix_rewrites_and_eliminates_dead_code(clean_registry):
    @register_fx_node_fix("onnx")
    def _fix_relu_to_clamp(gm, node):
        if node.op == "call_function" and node.target is torch.relu:
            with gm.graph.inserting_before(node):
                new = gm.graph.call_function(torch.clamp, (node.args[0],), {"min": 0.0})
            node.replace_all_uses_with(new)
            return True
        return False

    gm = torch.fx.symbolic_trace(lambda x: torch.relu(x) * 2)
    assert apply_fx_node_fixes("onnx", gm) == 1
    assert torch.relu not in [n.target for n in gm.graph.nodes]
    assert torch.equal(gm(torch.tensor([-1.0, 2.0])), torch.tensor([0.0, 4.0]))
