"""run_exported on an ExportedProgram checks its inputs: every mismatch is an InputError naming the input and the
bound, never torch's raw ``Guard failed`` AssertionError or a RuntimeError from inside the graph."""

from __future__ import annotations

import pytest
import torch
from torch.export import Dim
from transformers import DynamicCache

from engine import DynamoConfig, DynamoExporter, InputError, SpecialisationWarning, run_exported
from engine.input_checks import DimSpec, LeafSpec, check_leaves


class _Tagger(torch.nn.Module):
    """Token features [batch, seq, 4] through a Linear (dim 2 static) and a long mask [batch, seq]."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 3)

    def forward(self, x, mask):
        return {"y": self.proj(x) * mask[..., None].to(x.dtype)}


def _inputs(batch=2, seq=5, features=4):
    torch.manual_seed(batch * 100 + seq)
    return {"x": torch.randn(batch, seq, features), "mask": torch.ones(batch, seq, dtype=torch.long)}


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return _Tagger().eval()


@pytest.fixture(scope="module")
def bounded(model):
    """Explicit bounds: batch in [1, 6] shared by both inputs, sequence in [3, 10]."""
    batch, seq = Dim("batch", min=1, max=6), Dim("seq", min=3, max=10)
    shapes = {"x": {0: batch, 1: seq}, "mask": {0: batch, 1: seq}}
    return DynamoExporter().export(model, _inputs(), config=DynamoConfig(dynamic_shapes=shapes))


@pytest.fixture(scope="module")
def auto(model):
    with pytest.warns(SpecialisationWarning, match="x dim 2"):  # the Linear's in-features: static
        return DynamoExporter().export(model, _inputs(), config=DynamoConfig(dynamic=True))


def _expected(model, inputs):
    with torch.no_grad():
        return model(**inputs)["y"]


@pytest.mark.parametrize("program", ["bounded", "auto"])
def test_valid_inputs_still_run(request, model, program):
    program = request.getfixturevalue(program)
    for inputs in (_inputs(), _inputs(6, 10), _inputs(1, 3), _inputs(3, 7)):
        torch.testing.assert_close(run_exported(program, inputs)["y"], _expected(model, inputs))


def test_dynamic_program_takes_sizes_0_and_1(model, auto):
    """torch.export's floor of 2 is no limit: ExportedProgram.module() takes 0 and 1 there, and so do the checks."""
    for inputs in (_inputs(1, 1), _inputs(2, 0)):
        torch.testing.assert_close(run_exported(auto, inputs)["y"], _expected(model, inputs))


@pytest.mark.parametrize("program", ["bounded", "auto"])
def test_unknown_input_is_named_with_the_accepted_ones(request, program):
    program = request.getfixturevalue(program)
    with pytest.raises(InputError, match=r"_Tagger: the program takes inputs x, mask; not taken: maks$"):
        run_exported(program, _inputs() | {"maks": torch.ones(2, 5)})


@pytest.mark.parametrize("program", ["bounded", "auto"])
def test_missing_input(request, program):
    program = request.getfixturevalue(program)
    with pytest.raises(InputError, match=r"takes inputs x, mask; missing: mask$"):
        run_exported(program, {"x": torch.randn(2, 5, 4)})
    with pytest.raises(InputError, match=r"takes inputs x, mask; missing: mask; not taken: maks$"):
        run_exported(program, {"x": torch.randn(2, 5, 4), "maks": torch.ones(2, 5, dtype=torch.long)})


@pytest.mark.parametrize("program", ["bounded", "auto"])
def test_wrong_dtype(request, model, program):
    program = request.getfixturevalue(program)
    with pytest.raises(InputError, match=r"input mask is torch.float32, the program takes torch.int64"):
        run_exported(program, _inputs() | {"mask": torch.ones(2, 5)})
    with pytest.raises(InputError, match=r"input x is torch.int64, the program takes torch.float32"):
        run_exported(program, _inputs() | {"x": torch.ones(2, 5, 4, dtype=torch.long)})
    # another dtype of the same kind is cast, as the ExecuTorch runner does
    inputs = _inputs()
    cast = {"x": inputs["x"].double(), "mask": inputs["mask"].int()}
    torch.testing.assert_close(run_exported(program, cast)["y"], _expected(model, inputs))


@pytest.mark.parametrize("program", ["bounded", "auto"])
def test_wrong_rank(request, program):
    program = request.getfixturevalue(program)
    with pytest.raises(InputError, match=r"input x has 2 dims, the program takes 3 \(shape \(5, 4\); the program takes \[.*, 4\]\)"):
        run_exported(program, _inputs() | {"x": torch.randn(5, 4)})


def test_dim_above_max(bounded):
    with pytest.raises(InputError, match=r"input x dim 0 is 7, outside the exported bounds: it must be between 1 and 6"):
        run_exported(bounded, _inputs(7, 5))
    with pytest.raises(InputError, match=r"input x dim 1 is 11, outside the exported bounds: it must be between 3 and 10"):
        run_exported(bounded, _inputs(2, 11))


def test_dim_below_min(bounded):
    with pytest.raises(InputError, match=r"input x dim 1 is 2, outside the exported bounds: it must be between 3 and 10"):
        run_exported(bounded, _inputs(2, 2))
    with pytest.raises(InputError, match=r"input x dim 0 is 0, outside the exported bounds: it must be between 1 and 6"):
        run_exported(bounded, _inputs(0, 5))


@pytest.mark.parametrize("program", ["bounded", "auto"])
def test_static_dim_wrong(request, program):
    program = request.getfixturevalue(program)
    with pytest.raises(InputError, match=r"input x dim 2 is 5, outside the exported bounds: it must be exactly 4 .*static"):
        run_exported(program, _inputs(features=5))


@pytest.mark.parametrize("program", ["bounded", "auto"])
def test_dims_sharing_a_symbol_must_agree(request, program):
    program = request.getfixturevalue(program)
    inputs = _inputs() | {"mask": torch.ones(3, 5, dtype=torch.long)}
    with pytest.raises(InputError, match=r"input mask dim 0 is 3, but the program has it equal to x dim 0, which is 2"):
        run_exported(program, inputs)


def test_no_raw_torch_error_escapes(bounded):
    """Each bad input that torch's module() rejects with an AssertionError ('Guard failed') or RuntimeError is an
    InputError, and one that torch lets through (an unknown key) is too."""
    bad = [
        _inputs(7, 5),
        _inputs(2, 2),
        _inputs(features=5),
        _inputs() | {"mask": torch.ones(3, 5, dtype=torch.long)},
        _inputs() | {"mask": torch.ones(2, 5)},
        _inputs() | {"x": torch.randn(5, 4)},
        _inputs() | {"extra": torch.ones(1)},
    ]
    for inputs in bad:
        with pytest.raises(InputError):
            run_exported(bounded, inputs)


class _Concat(torch.nn.Module):
    """``c`` must be as long as ``a`` and ``b`` together: torch.export gives its dim the expression s_a + s_b."""

    def forward(self, a, b, c):
        return torch.cat([a, b], 1) + c


def test_a_dim_the_program_computes_from_others():
    program = DynamoExporter().export(_Concat().eval(), {"a": torch.randn(2, 3), "b": torch.randn(2, 4), "c": torch.randn(2, 7)},
                                      config=DynamoConfig(dynamic=True))
    ok = {"a": torch.randn(2, 5), "b": torch.randn(2, 2), "c": torch.randn(2, 7)}
    torch.testing.assert_close(run_exported(program, ok)[""], torch.cat([ok["a"], ok["b"]], 1) + ok["c"])
    with pytest.raises(InputError, match=r"input c dim 1 is 8, but the program has it equal to .*\(a dim 1\).*= 7: it must be 7"):
        run_exported(program, ok | {"c": torch.randn(2, 8)})


class _CacheReader(torch.nn.Module):
    def forward(self, x, past_key_values):
        keys = past_key_values.layers[0].keys
        return {"y": x.sum(-1, keepdim=True) + keys.sum((1, 2, 3))[:, None, None]}


def _cache(layers=1, batch=2, heads=2, length=3):
    cache = DynamicCache()
    for i in range(layers):
        cache.update(torch.randn(batch, heads, length, 4), torch.randn(batch, heads, length, 4), i)
    return cache


def test_cache_leaves_are_checked_by_their_flattened_names():
    program = DynamoExporter().export(_CacheReader().eval(), {"x": torch.randn(2, 5, 4), "past_key_values": _cache()},
                                      config=DynamoConfig(dynamic=True))
    assert run_exported(program, {"x": torch.randn(3, 6, 4), "past_key_values": _cache(batch=3, length=9)})["y"].shape == (3, 6, 1)
    with pytest.raises(InputError, match=r"input past_key_values.0.keys dim 1 is 3, outside the exported bounds: it must be exactly 2"):
        run_exported(program, {"x": torch.randn(2, 5, 4), "past_key_values": _cache(heads=3)})
    with pytest.raises(InputError, match=r"input past_key_values.0.keys dim 0 is 3, but the program has it equal to x dim 0, which is 2"):
        cache = _cache()
        cache.layers[0].keys = torch.randn(3, 2, 3, 4)  # the keys' batch is the batch of x (the values' is not used)
        run_exported(program, {"x": torch.randn(2, 5, 4), "past_key_values": cache})
    with pytest.raises(InputError, match=r"takes inputs x, past_key_values.0.keys, past_key_values.0.values; "
                                         r"not taken: past_key_values.1.keys, past_key_values.1.values$"):
        run_exported(program, {"x": torch.randn(2, 5, 4), "past_key_values": _cache(layers=2)})
    with pytest.raises(InputError, match=r"missing: past_key_values.0.keys, past_key_values.0.values$"):
        run_exported(program, {"x": torch.randn(2, 5, 4)})


class _Masked(torch.nn.Module):
    """A mask at most as long as the cache plus the new tokens: a guard relating three input dims."""

    def forward(self, tokens, mask, past_key_values):
        torch._check(mask.shape[1] <= past_key_values.layers[0].keys.shape[2] + tokens.shape[1])
        return {"y": tokens.sum(1) + mask.sum(1) + past_key_values.layers[0].keys.sum((1, 2, 3))}


def _masked_inputs(mask_length=6):
    return {"tokens": torch.randn(2, 3), "mask": torch.ones(2, mask_length), "past_key_values": _cache()}


def _parts(error: Exception) -> set[str]:
    """The pieces of the message that the tests look for, when present."""
    text = str(error)
    pieces = ["tokens dim 1", "past_key_values.0.keys dim 2", "given shapes: tokens (2, 3), mask (2, 7)", "(tokens dim 1)",
              "(past_key_values.0.keys dim 2)", ": 7 <= 3 + 3 is false"]
    return {p for p in pieces if p in text}


def test_a_guard_relating_dims_is_an_input_error_in_leaf_names():
    """torch checks it (its guards function); the AssertionError('Guard failed: ...') comes back as an InputError."""
    program = DynamoExporter().export(_Masked().eval(), _masked_inputs(), config=DynamoConfig(dynamic=True))
    run_exported(program, _masked_inputs())
    with pytest.raises(InputError, match=r"_Masked: the exported program rejects the inputs: Guard failed: mask dim 1 <= ") as caught:
        run_exported(program, _masked_inputs(7))
    # the sum's order is torch's
    assert {"tokens dim 1", "past_key_values.0.keys dim 2", "given shapes: tokens (2, 3), mask (2, 7)"} <= _parts(caught.value)


def test_a_runtime_assert_on_input_dims_is_checked_before_the_graph_runs():
    """With prefer_deferred_runtime_asserts_over_guards the guard is an assert node in the graph: it is read and
    checked with the other input checks, instead of a RuntimeError from inside the graph."""
    config = DynamoConfig(dynamic=True, prefer_deferred_runtime_asserts_over_guards=True)
    program = DynamoExporter().export(_Masked().eval(), _masked_inputs(), config=config)
    run_exported(program, _masked_inputs())
    with pytest.raises(InputError, match=r"_Masked: the inputs break the program's constraint \(mask dim 1\) <= ") as caught:
        run_exported(program, _masked_inputs(7))
    assert {"(tokens dim 1)", "(past_key_values.0.keys dim 2)", ": 7 <= 3 + 3 is false"} <= _parts(caught.value)


def test_check_leaves_is_shared_with_the_executorch_messages():
    spec = LeafSpec("input_ids", torch.int64, (DimSpec(0, 8), DimSpec(0, 128)))
    with pytest.raises(InputError, match=r"^Bert: input input_ids dim 1 is 129, outside the exported bounds: it must be between 0 and 128 "):
        check_leaves("Bert", [spec], {"input_ids": torch.zeros(2, 129, dtype=torch.long)})
    with pytest.raises(InputError, match=r"^Bert: the program takes inputs input_ids; missing: input_ids$"):
        check_leaves("Bert", [spec], {})
    unbounded = LeafSpec("x", torch.float32, (DimSpec(3, None),))
    with pytest.raises(InputError, match=r"x dim 0 is 2, outside the exported bounds: it must be at least 3"):
        check_leaves("M", [unbounded], {"x": torch.zeros(2)})
    assert check_leaves("M", [unbounded], {"x": torch.zeros(300)})["x"].shape == (300,)


def test_running_a_program_never_renders_it(model, bounded, monkeypatch):
    """Choosing the runtime looks at an artifact's type, and at a string only for paths: ``str()`` of a program
    prints its whole graph (seconds for a large model), twice per run before."""
    def rendered(self):
        raise AssertionError("the program was rendered as a string")

    monkeypatch.setattr(torch.export.ExportedProgram, "__str__", rendered)
    torch.testing.assert_close(run_exported(bounded, _inputs())["y"], _expected(model, _inputs()))
