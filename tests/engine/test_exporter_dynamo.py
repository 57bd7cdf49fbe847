"""DynamoExporter on twelve tiny architectures: dynamic export runs at a new shape, static at the traced one."""

from __future__ import annotations

import copy
import math
import warnings

import pytest
import torch

from engine import DynamoConfig, DynamoExporter, SpecialisationWarning, get_leaf_tensors, run_exported
from engine.compare import compare_leaves
from tests.engine.tiny_models import TINY_MODELS, eager_leaves

ATOL = RTOL = 1e-4




@pytest.mark.parametrize("name", list(TINY_MODELS))
def test_dynamic_export_runs_at_another_shape(name):
    tiny = TINY_MODELS[name]
    model = tiny.model()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        program = DynamoExporter().export(model, tiny.inputs("trace"), config=DynamoConfig(dynamic=True))

    # the only dims torch.export may pin are the ones the architecture fixes, and the report names them
    reported = [str(w.message) for w in caught if issubclass(w.category, SpecialisationWarning)]
    for fixed in tiny.fixed_dims:
        assert reported and fixed in reported[0], f"{fixed} specialised but not reported: {reported}"
    if not tiny.fixed_dims:
        assert not reported, reported

    run_inputs = tiny.inputs("run", seed=1)
    expected = eager_leaves(model, run_inputs)  # after export: the model must still run eagerly
    got = run_exported(program, run_inputs)
    comparison = compare_leaves(expected, got, atol=ATOL, rtol=RTOL)
    assert comparison.ok, str(comparison)


@pytest.mark.parametrize("name", list(TINY_MODELS))
def test_static_export_at_traced_shape(name):
    tiny = TINY_MODELS[name]
    model = tiny.model()
    inputs = tiny.inputs("trace")
    program = DynamoExporter().export(model, inputs, config={"dynamic": False})
    comparison = compare_leaves(eager_leaves(model, inputs), run_exported(program, inputs), atol=ATOL, rtol=RTOL)
    assert comparison.ok, str(comparison)
    # a static program rejects another shape instead of computing garbage
    with pytest.raises(Exception):
        run_exported(program, tiny.inputs("run", seed=1))


def test_cache_leaves_are_outputs_and_inputs():
    """A decoder's cache leaves are named outputs, and a cache can be fed back as a graph input."""
    tiny = TINY_MODELS["llama"]
    model = tiny.model()
    prefill = tiny.inputs("trace")
    with torch.no_grad():
        cache = model(**copy.deepcopy(prefill)).cache
    names = list(get_leaf_tensors(cache))
    assert names == [f"{i}.{kv}" for i in range(2) for kv in ("keys", "values")]

    batch, past = prefill["input_ids"].shape
    step = {
        "input_ids": torch.randint(0, 96, (batch, 3)),
        "attention_mask": torch.ones(batch, past + 3, dtype=torch.long),
        "cache": cache,
    }
    program = DynamoExporter().export(model, step, config=DynamoConfig(dynamic=True))
    got = run_exported(program, step)
    expected = eager_leaves(model, step)
    assert "cache.1.values" in got
    assert got["cache.0.keys"].shape[2] == past + 3
    comparison = compare_leaves(expected, got, atol=ATOL, rtol=RTOL)
    assert comparison.ok, str(comparison)


def test_explicit_dynamic_shapes_win_over_dynamic_flag():
    tiny = TINY_MODELS["gpt2"]
    model = tiny.model()
    inputs = tiny.inputs("trace")
    batch = torch.export.Dim("batch", min=1, max=8)
    config = DynamoConfig(dynamic=True, dynamic_shapes={"input_ids": {0: batch}, "attention_mask": {0: batch}})
    program = DynamoExporter().export(model, inputs, config=config)
    placeholder = next(n for n in program.graph.nodes if n.name == "input_ids")
    seq = placeholder.meta["val"].shape[1]
    assert isinstance(seq, int), "sequence dim was not asked to be dynamic, so it must be static"
    assert not isinstance(placeholder.meta["val"].shape[0], int)


def test_output_flags_are_bound_not_traced():
    tiny = TINY_MODELS["llama"]
    model = tiny.model()
    inputs = tiny.inputs("trace") | {"use_cache": False, "labels": torch.zeros(2, 7, dtype=torch.long)}
    program = DynamoExporter().export(model, inputs, config=DynamoConfig(dynamic=True))
    user_inputs = [s.arg.name for s in program.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    assert user_inputs == ["input_ids", "attention_mask"]
    assert list(run_exported(program, inputs)) == ["logits"]  # no cache: use_cache=False was applied


def test_the_trace_runs_without_the_fake_dispatch_cache_and_the_program_gets_it_back(monkeypatch):
    from torch._subclasses.fake_tensor import FakeTensorMode

    created = []
    real_init = FakeTensorMode.__init__

    def init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        created.append(self.cache_enabled)

    monkeypatch.setattr(FakeTensorMode, "__init__", init)
    tiny = TINY_MODELS["llama"]
    model = tiny.model()
    program = DynamoExporter().export(model, tiny.inputs("trace"), config=DynamoConfig(dynamic=True))
    assert created and not any(created)  # every fake mode of the trace started without the cache
    fake_mode = torch._guards.detect_fake_mode([n.meta.get("val") for n in program.graph.nodes if n.op == "placeholder"])
    assert fake_mode.cache_enabled == torch._dynamo.config.fake_tensor_cache_enabled  # on again for what follows
    inputs = tiny.inputs("run", seed=1)
    assert compare_leaves(eager_leaves(model, inputs), run_exported(program, inputs)).ok


class _Windows(torch.nn.Module):
    """Rounds a length up to whole windows (``math.ceil(length / window)``), as GraniteSpeech's audio encoder does."""

    def forward(self, x):
        windows = math.ceil(x.shape[1] / 3)
        padded = torch.nn.functional.pad(x, (0, 0, 0, windows * 3 - x.shape[1]))
        return padded.reshape(x.shape[0], windows, 3, x.shape[2]).sum(2)


class _UnusedNoGradBlock(torch.nn.Module):
    """Computes something under ``torch.no_grad()`` and never uses it, as tiny Mllama's rotary embedding does."""

    def forward(self, x):
        with torch.no_grad():
            unused = x.cos()  # noqa: F841
        return x * 2


def test_a_no_grad_block_without_outputs_saves_and_loads(tmp_path):
    """torch.export keeps the block as a set-grad region returning ``()``, which torch.export.load rejected."""
    from engine import load_program, save_program

    with torch.enable_grad():
        program = DynamoExporter().export(_UnusedNoGradBlock(), {"x": torch.randn(2, 3)}, config=DynamoConfig(dynamic=True))
    assert not any("set_grad" in str(n.target) for n in program.graph.nodes)
    x = torch.randn(4, 5)
    assert torch.equal(load_program(save_program(program, tmp_path / "block.pt2")).module()(x=x), x * 2)


def test_a_rounded_up_size_saves_and_loads(tmp_path):
    from engine import load_program, save_program

    program = DynamoExporter().export(_Windows().eval(), {"x": torch.randn(2, 7, 4)}, config=DynamoConfig(dynamic=True))
    assert not any(n.target is math.ceil for n in program.graph.nodes)  # rewritten into ops the serializer writes
    loaded = load_program(save_program(program, tmp_path / "windows.pt2"))
    for length in (5, 6, 7, 9, 12):  # whole windows and partial ones
        x = torch.randn(3, length, 4)
        assert torch.equal(loaded.module()(x=x), _Windows()(x)), length


@pytest.mark.skipif(not hasattr(torch.fx.config, "do_not_emit_stack_traces"), reason="torch < 2.14 has no switch")
def test_stack_traces_off_records_none_and_computes_the_same():
    """``stack_traces=False`` (what the sweep asks for): no node carries the model's source stack (torch's own
    runtime-assert pass still stamps its two nodes), the switch is restored after the trace, and the program
    computes what the recorded one does."""
    tiny = TINY_MODELS["llama"]
    model = tiny.model()
    inputs = tiny.inputs("trace")
    with_stacks = DynamoExporter().export(model, inputs, config=DynamoConfig(dynamic=True))
    without = DynamoExporter().export(model, inputs, config=DynamoConfig(dynamic=True, stack_traces=False))
    def model_stacks(program):
        return [n for n in program.graph.nodes if "modeling_llama.py" in (n.meta.get("stack_trace") or "")]

    assert model_stacks(with_stacks)
    assert not model_stacks(without)
    assert torch.fx.config.do_not_emit_stack_traces is False
    run_inputs = tiny.inputs("run", seed=1)
    comparison = compare_leaves(run_exported(with_stacks, run_inputs), run_exported(without, run_inputs),
                                atol=0, rtol=0)
    assert comparison.ok, str(comparison)
