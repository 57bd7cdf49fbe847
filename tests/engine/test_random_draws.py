"""Random draws as program inputs (:mod:`engine.random_draws`): the lifted program, fed the runner's draws, computes
what eager computes under the same seed; ONNX and ExecuTorch programs of a sampling forward run and match it."""

from __future__ import annotations

import functools
import warnings

import pytest
import torch
from hypothesis import given, settings, strategies as st

from engine import DynamoConfig, DynamoExporter, get_leaf_tensors, run_exported
from engine.random_draws import draw_inputs, lift_random_draws


class Sampling(torch.nn.Module):
    """Every kind of draw the lift covers: noise like a transposed tensor, an always-on dropout mask, a key sample
    and a draw sized by an expression of the input dims."""

    def forward(self, x):
        t = x.transpose(1, 2) * 2  # a *_like draw of it fills memory in the transposed order
        noisy = t + torch.randn_like(t)
        kept = torch.bernoulli(x, 0.5) * x
        keys = torch.randint(0, x.shape[1], (x.shape[0], 3))
        half = torch.rand(x.shape[0], x.shape[2] // 2)
        return noisy, kept, torch.gather(x[:, :, 0], 1, keys), half


class DataSizedDraw(torch.nn.Module):
    """A draw whose size depends on data (VITS's durations): it cannot be an input the runner sizes."""

    def forward(self, x):
        kept = x[x > 0]  # a size only the data gives
        return (kept + torch.randn_like(kept)).sum()


def seeded(seed: int, run):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return run()


@functools.cache
def lifted():
    program = DynamoExporter().export(Sampling(), {"x": torch.randn(2, 5, 6)}, config=DynamoConfig(dynamic=True))
    record = lift_random_draws(program)
    return program, record


@settings(max_examples=25, deadline=None)
@given(batch=st.integers(2, 4), length=st.integers(2, 7), width=st.integers(2, 9), seed=st.integers(0, 2**31 - 1))
def test_lifted_program_with_the_runner_draws_equals_seeded_eager(batch, length, width, seed):
    program, record = lifted()
    x = torch.randn(batch, length, width)
    expected = seeded(seed, lambda: Sampling()(x))

    def run():
        draws = draw_inputs(record, {"x": x})
        return program.module()(x=x, **draws)

    for want, got in zip(expected, seeded(seed, run)):
        assert torch.equal(want, got)


def test_record_names_each_draw_and_the_input_dims_it_is_sized_by():
    program, record = lifted()
    assert [d["op"] for d in record["draws"]] == ["aten.randn_like.default", "aten.bernoulli.p", "aten.randint.low",
                                                  "aten.rand.default"]
    assert [d["input"] for d in record["draws"]] == [f"random_draw_{i}" for i in range(4)]
    assert {leaf for leaf, _ in record["dims"].values()} == {"x"}
    assert not any(torch.Tag.nondeterministic_seeded in getattr(n.target, "tags", ()) for n in program.graph.nodes)


def test_a_data_sized_draw_leaves_the_program_as_it_is():
    program = DynamoExporter().export(DataSizedDraw(), {"x": torch.randn(4, 3)}, config=DynamoConfig(dynamic=True))
    before = str(program.graph)
    assert lift_random_draws(program) is None
    assert str(program.graph) == before


def test_a_caller_may_give_a_draw():
    _, record = lifted()
    mine = torch.zeros(3, 5, 2)
    draws = draw_inputs(record, {"x": torch.randn(3, 2, 5), "random_draw_0": mine})
    assert "random_draw_0" not in draws and draws["random_draw_3"].shape == (3, 2)


@pytest.mark.parametrize("backend", ["onnx", "executorch"])
def test_sampling_forward_runs_and_matches_seeded_eager(backend):
    """Without the lift onnxruntime has no kernel for RandomNormalLike(22) and ExecuTorch refuses aten.randn_like
    (not Core ATen)."""
    pytest.importorskip("onnxruntime" if backend == "onnx" else "executorch")
    from engine import AutoExportConfig, AutoExporter

    inputs = {"x": torch.randn(2, 5, 6)}
    config = AutoExportConfig.from_dict({"export_format": backend, "dynamic": True})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        artifact = AutoExporter.from_config(config).export(Sampling(), inputs, config=config)
    for x in (inputs["x"], torch.randn(3, 4, 8)):
        expected = get_leaf_tensors(seeded(7, lambda: Sampling()(x)))
        got = seeded(7, lambda: run_exported(artifact, {"x": x}))
        assert got.keys() == expected.keys()
        for name in expected:
            assert torch.equal(expected[name], got[name]), name
