"""Finite dim bounds for ExecuTorch memory planning (:mod:`engine.dim_bounds`): caps from the config, the user's
bounds kept, and the planned-tensor budget, down to real-size configs in bounded memory."""

from __future__ import annotations

import functools
import json
import operator
import sys
import warnings

import pytest
import torch
from transformers import PretrainedConfig

from engine import (
    ExecutorchConfig,
    InputError,
    PlannedMemoryError,
    get_leaf_tensors,
    run_exported,
)
from engine.compare import compare_leaves
from tests.engine.tiny_models import REAL_LIMIT_MODELS, TINY_MODELS, ci_cover, eager_leaves

pytest.importorskip("executorch", reason="the executorch extra is not installed")

from engine.dim_bounds import UnboundedDimWarning  # noqa: E402
from engine.exporter_executorch import ExecutorchExporter  # noqa: E402
from tests.engine.executorch_cases import TwoLinear, dynamic_export, pte_meta  # noqa: E402

import sympy  # noqa: E402
from hypothesis import given, settings, strategies as st  # noqa: E402

from engine.dim_bounds import PLANNED_TENSOR_BUDGET, _fit_to_budget  # noqa: E402

ATOL = RTOL = 1e-4


def test_caps_come_from_the_config():
    torch.manual_seed(0)
    model = TwoLinear().eval()
    model.config = PretrainedConfig(max_position_embeddings=16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        manager = ExecutorchExporter().export(model, {"x": torch.randn(3, 5, 4)}, config=ExecutorchConfig(dynamic=True))
    caps = [str(w.message) for w in caught if issubclass(w.category, UnboundedDimWarning)]
    assert len(caps) == 1, caps
    assert "x dim 0 <= 12 (batch: 4 x traced 3); x dim 1 <= 16 (config max_position_embeddings=16)" in caps[0]
    assert pte_meta(manager)["inputs"][0]["bounds"] == [[0, 12], [0, 16], [4, 4]]
    with pytest.raises(InputError, match="x dim 1 is 17, outside the exported bounds: it must be between 0 and 16"):
        run_exported(manager, {"x": torch.randn(3, 17, 4)})


def test_explicit_dim_bounds_are_respected():
    torch.manual_seed(0)
    model = TwoLinear().eval()
    x = torch.randn(3, 5, 4)
    batch = torch.export.Dim("batch", min=1, max=6)
    config = ExecutorchConfig(dynamic_shapes={"x": {0: batch, 1: torch.export.Dim.AUTO}})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        manager = ExecutorchExporter().export(model, {"x": x}, config=config)
    caps = [str(w.message) for w in caught if issubclass(w.category, UnboundedDimWarning)]
    # the explicit batch bound is kept; only the AUTO length is capped (no config: 4 x traced, floor 256)
    assert len(caps) == 1 and "x dim 1 <= 256" in caps[0] and "dim 0" not in caps[0], caps
    # the max is the explicit one; the min is 0 as ExportedProgram.module() has it: torch.export states 2 (its
    # 0/1-specialisation assumption, for min=1 too) and its own input check accepts 0 and 1 there
    assert pte_meta(manager)["inputs"] == [{"name": "x", "dtype": "float32", "bounds": [[0, 6], [0, 256], [4, 4]]}]
    x6 = torch.randn(6, 9, 4)
    with torch.no_grad():
        expected = get_leaf_tensors(model(x6))
    comparison = compare_leaves(expected, run_exported(manager, {"x": x6}), atol=ATOL, rtol=RTOL)
    assert comparison.ok, str(comparison)
    with pytest.raises(InputError, match="x dim 0 is 7, outside the exported bounds: it must be between 0 and 6"):
        run_exported(manager, {"x": torch.randn(7, 5, 4)})


def test_max_seq_len_lowers_a_bound_the_guards_derived():
    tiny = TINY_MODELS["bert"]
    model = tiny.model()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        manager = ExecutorchExporter().export(model, tiny.inputs("trace"), config=ExecutorchConfig(dynamic=True, max_seq_len=16))
    caps = [str(w.message) for w in caught if issubclass(w.category, UnboundedDimWarning)]
    # bert's position table bounds the length by 128 (a guard); max_seq_len lowers it, the batch cap is unchanged
    assert len(caps) == 1 and "input_ids dim 1 <= 16 (max_seq_len=16, was 128)" in caps[0], caps
    assert {s["name"]: s["bounds"] for s in pte_meta(manager)["inputs"]}["input_ids"] == [[0, 8], [0, 16]]
    default_plan = sum(dynamic_export("bert")[1].executorch_program.execution_plan[0].non_const_buffer_sizes)
    assert sum(manager.executorch_program.execution_plan[0].non_const_buffer_sizes) < default_plan / 4
    inputs = tiny.make_inputs(3, 16, 1)
    comparison = compare_leaves(eager_leaves(model, inputs), run_exported(manager, inputs), atol=ATOL, rtol=RTOL)
    assert comparison.ok, str(comparison)
    with pytest.raises(InputError, match="input_ids dim 1 is 17, outside the exported bounds: it must be between 0 and 16"):
        run_exported(manager, tiny.make_inputs(2, 17, 0))


class _AttendToCache(torch.nn.Module):
    """A decode step's shape: queries ``[B, q, 4]`` against a cache layer's keys/values ``[B, heads, length, 4]``."""

    def forward(self, x, cache):
        keys, values = cache[0]["keys"], cache[0]["values"]
        scores = torch.softmax(x.unsqueeze(1) @ keys.transpose(-1, -2), dim=-1)
        return {"y": (scores @ values).sum(1)}


def test_a_cache_layers_length_is_bounded_by_max_seq_len_not_as_an_image_dim():
    # [B, heads, length, head_dim] floats read as an image's [B, C, H, W]: max_seq_len did not bound the length,
    # and the memory budget lowered Aria's decode cache below the generation's last step (138 < 139)
    model = _AttendToCache().eval()
    model.config = PretrainedConfig(max_position_embeddings=4096, image_size=8)
    layer = {"keys": torch.randn(2, 2, 5, 4), "values": torch.randn(2, 2, 5, 4)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnboundedDimWarning)
        manager = ExecutorchExporter().export(model, {"x": torch.randn(2, 3, 4), "cache": [layer]},
                                              config=ExecutorchConfig(dynamic=True, max_seq_len=40))
    bounds = {s["name"]: s["bounds"] for s in pte_meta(manager)["inputs"]}
    assert bounds["cache.0.keys"][2] == bounds["cache.0.values"][2] == [0, 40]  # was the image_size, 8
    longer = {"x": torch.randn(2, 3, 4), "cache": [{"keys": torch.randn(2, 2, 40, 4), "values": torch.randn(2, 2, 40, 4)}]}
    comparison = compare_leaves(eager_leaves(model, longer), run_exported(manager, longer), atol=ATOL, rtol=RTOL)
    assert comparison.ok, str(comparison)


class _Choices(torch.nn.Module):
    """A multiple-choice head: ``[batch, choices, seq]`` ids folded into ``batch * choices`` rows."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)

    def forward(self, input_ids):
        h = self.embed(input_ids.flatten(0, 1))
        return {"y": (torch.softmax(h @ h.transpose(1, 2), dim=-1) @ h).view(*input_ids.shape, 4)}


def test_the_choices_of_ids_are_bounded_as_batch_rows_not_as_a_length():
    # as a length, max_seq_len (never lowered) bounded the choices: LongformerForMultipleChoice planned 15 GB
    model = _Choices().eval()
    ids = torch.randint(0, 10, (2, 3, 7))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnboundedDimWarning)
        manager = ExecutorchExporter().export(model, {"input_ids": ids},
                                              config=ExecutorchConfig(dynamic=True, max_seq_len=64))
    bounds = {s["name"]: s["bounds"] for s in pte_meta(manager)["inputs"]}["input_ids"]
    assert bounds[2][1] == 64 and bounds[1][1] < 64  # the sequence at max_seq_len; the choices as a batch
    more = {"input_ids": torch.randint(0, 10, (2, 5, 9))}
    comparison = compare_leaves(eager_leaves(model, more), run_exported(manager, more), atol=ATOL, rtol=RTOL)
    assert comparison.ok, str(comparison)


class _Scores(torch.nn.Module):
    """``h @ h^T``: a ``[batch, seq, seq]`` intermediate, quadratic in the length, like attention scores."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, x):
        h = self.proj(x)
        return {"y": torch.softmax(h @ h.transpose(1, 2), dim=-1) @ h}


def _export_scores(config: ExecutorchConfig, positions: int = 32768):
    torch.manual_seed(0)
    model = _Scores().eval()
    model.config = PretrainedConfig(max_position_embeddings=positions)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        manager = ExecutorchExporter().export(model, {"x": torch.randn(2, 7, 4)}, config=config)
    caps = [str(w.message) for w in caught if issubclass(w.category, UnboundedDimWarning)]
    return model, manager, caps


def test_a_config_limit_that_plans_gigabytes_is_lowered_to_the_budget():
    model, manager, caps = _export_scores(ExecutorchConfig(dynamic=True))
    # 8 x 32768 x 32768 float scores would be 32 GiB; the length is halved (powers of two) until 8 x S x S fits
    assert len(caps) == 1 and "x dim 1 <= 1024 (config max_position_embeddings=32768 = 32768, lowered to fit the 64 MiB" in caps[0], caps
    assert pte_meta(manager)["inputs"][0]["bounds"] == [[0, 8], [0, 1024], [4, 4]]
    plan = manager.executorch_program.execution_plan[0]
    assert max(plan.non_const_buffer_sizes) < 4 * PLANNED_TENSOR_BUDGET
    x = torch.randn(3, 1024, 4)
    comparison = compare_leaves(get_leaf_tensors(model(x)), run_exported(manager, {"x": x}), atol=ATOL, rtol=RTOL)
    assert comparison.ok, str(comparison)
    with pytest.raises(InputError, match="x dim 1 is 1025, outside the exported bounds: it must be between 0 and 1024"):
        run_exported(manager, {"x": torch.randn(2, 1025, 4)})


def test_a_stated_bound_is_never_lowered_and_the_overrun_is_named():
    _, manager, caps = _export_scores(ExecutorchConfig(dynamic=True, max_seq_len=4096))
    # max_seq_len is the user's: the batch goes down to its floor (2 x traced), the length stays, the warning says so
    assert len(caps) == 1 and "x dim 0 <= 4 (batch: 4 x traced 2 = 8, lowered" in caps[0] and "x dim 1 <= 4096 (max_seq_len=4096" in caps[0], caps
    assert "The largest planned tensor is still 256 MiB, over the 64 MiB budget" in caps[0], caps
    assert pte_meta(manager)["inputs"][0]["bounds"] == [[0, 4], [0, 4096], [4, 4]]


_SYMS = sympy.symbols("a b c")


@settings(max_examples=60, deadline=None)
@given(caps=st.lists(st.integers(1, 1 << 16), min_size=3, max_size=3),
       floor_frac=st.lists(st.floats(0.0, 1.0), min_size=3, max_size=3),
       movable=st.lists(st.booleans(), min_size=3, max_size=3),
       powers=st.lists(st.lists(st.integers(0, 2), min_size=3, max_size=3), min_size=1, max_size=4),
       budget=st.integers(1, 1 << 30))
def test_fitting_to_the_budget_lowers_only_what_may_move_and_stops_at_the_first_fit(caps, floor_frac, movable, powers,
                                                                                    budget):
    start = dict(zip(_SYMS, caps))
    floors = {s: max(1, int(c * f)) for s, c, f, m in zip(_SYMS, caps, floor_frac, movable) if m}
    sizes = [functools.reduce(operator.mul, (s ** p for s, p in zip(_SYMS, ps)), sympy.Integer(4)) for ps in powers]
    sizes = [e for e in sizes if e.free_symbols] + [_SYMS[2]]  # a one-byte tensor's size is a bare symbol
    out, largest = _fit_to_budget(sizes, start, floors, lambda sym, chosen: 1, budget)
    assert largest == max(int(e.xreplace(out)) for e in sizes)
    for sym in _SYMS:
        assert out[sym] <= start[sym]
        assert out[sym] == start[sym] or (sym in floors and out[sym] >= floors[sym])
    if largest > budget:  # it stopped over the budget only because the largest tensor's dims are all at their floor
        worst = max(sizes, key=lambda e: int(e.xreplace(out)))
        assert all(sym not in floors or out[sym] <= floors[sym] for sym in worst.free_symbols)
    else:  # and it stopped at the first fit: raising any lowered cap back to twice its value breaks the budget or
        # is above where it started (halving moves to the power of two below, so one step back is at most x2)
        assert all(out[s] == start[s] or out[s] >= floors[s] for s in _SYMS)


# ── Real-size configs with the documented call: bounded memory, no native crash ───────────────────────

def test_a_plan_the_runtime_cannot_run_is_refused_at_export_naming_the_tensor_and_its_bounds():
    """A small Mamba whose stated max_seq_len of 4096 (never lowered by the budget) makes its closed-form scan plan
    a [batch, 128, seq, seq, 8] intermediate of 1.6 TiB at batch <= 26: without the limit it exported, then
    XNNPACK ran out of memory at run (0x1; at the unstated bounds of 256 tokens and batch 52, 13 GiB) or the
    process died. Refused before lowering, with the bounds it follows. The limit is the user's: at 16 tokens and
    batch 52 the plan is 52 MiB (within the 64 MiB budget, no bound lowered), refused under a 16 MiB limit."""
    tiny = REAL_LIMIT_MODELS["mamba"]
    model = tiny.model()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(PlannedMemoryError, match=r"MambaForCausalLM: at its dim bounds the ExecuTorch program plans "
                                                     r"'\w+' \[.*\] float32 of 1664\.0 GiB, over the 4096 MiB limit "
                                                     r".*follows input_ids dim 0 <= 26, input_ids dim 1 <= 4096"):
            ExecutorchExporter().export(model, tiny.inputs("trace"), config=ExecutorchConfig(dynamic=True, max_seq_len=4096))
        with pytest.raises(PlannedMemoryError, match=r"of 52 MiB, over the 16 MiB limit .*input_ids dim 0 <= 52, input_ids dim 1 <= 16\."):
            ExecutorchExporter().export(model, tiny.inputs("trace"),
                                        config=ExecutorchConfig(dynamic=True, max_seq_len=16, max_planned_tensor_mb=16))


_REAL_LIMITS = r'''
import json, resource, sys, warnings
from engine import ExecutorchConfig, ExecutorchExporter, run_exported
from engine.compare import compare_leaves
from tests.engine.tiny_models import REAL_LIMIT_MODELS, eager_leaves
tiny = REAL_LIMIT_MODELS[sys.argv[1]]
model = tiny.model()
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    manager = ExecutorchExporter().export(model, tiny.inputs("trace"), config=ExecutorchConfig(backend="xnnpack", dynamic=True))
    ExecutorchExporter.save(manager, sys.argv[2])
    del manager
    failed = []
    for which in ("trace", "run"):  # 13 x 7, then 3 x 12
        inputs = tiny.inputs(which, seed=1)
        comparison = compare_leaves(eager_leaves(model, inputs), run_exported(sys.argv[2], inputs), atol=1e-4, rtol=1e-4)
        failed += [] if comparison.ok else [f"{which}: {comparison}"]
print(json.dumps({"failed": failed, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
'''


#: export + save + load + run of one small-width model at its real limits, imports included (the peer: 17.4 GB)
REAL_LIMITS_RSS_MB = 2048


@pytest.mark.parametrize("name", ci_cover(REAL_LIMIT_MODELS, ["jamba"]))  # attention and mamba layers
def test_real_limit_config_exports_and_runs_in_bounded_memory(name, tmp_path):
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", _REAL_LIMITS, name, str(tmp_path / "m.pte")], capture_output=True,
                          text=True, timeout=600, cwd=root)
    assert done.returncode == 0, f"exit {done.returncode} (a native crash is negative):\n{done.stderr[-3000:]}"
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert not result["failed"], result["failed"]
    assert result["rss_mb"] < REAL_LIMITS_RSS_MB, f"peak RSS {result['rss_mb']:.0f} MB"


def test_a_quotient_that_can_be_zero_raises_its_dividends_floor():
    """``a // (s // 4)`` divides by zero for ``s < 4``: those inputs cannot run, so ``s >= 4`` (which gives the
    size a finite interval bound); a floor already at or above 4, or a plain ``a // s``, is left alone."""
    from torch.utils._sympy.functions import FloorDiv
    from torch.utils._sympy.value_ranges import ValueRanges

    s, t, u = sympy.symbols("s t u", integer=True, positive=True)
    from engine.dim_bounds import _raise_divisor_floors

    sizes = [32 * u * FloorDiv(s, FloorDiv(s, 4)), FloorDiv(8 * t, t)]
    table = {s: ValueRanges(2, 128), t: ValueRanges(2, 64), u: ValueRanges(0, 256)}
    assert _raise_divisor_floors(sizes, table) == {s: 4}
    assert _raise_divisor_floors(sizes, {**table, s: ValueRanges(4, 128)}) == {}


def test_the_maxsize_bound_of_a_checked_count_is_no_bound():
    """torch gives a count read by ``.item()`` and checked ``>= 0`` the range ``[0, sys.maxsize - 1]``, and two
    dims whose sum is such a size ``sys.maxsize - 3`` each (Qwen3-Omni's image and audio feature counts): planning
    memory at either asks for exabytes, so both are capped like ``int_oo``."""
    from torch.utils._sympy.numbers import int_oo

    from engine.dim_bounds import _unbounded

    assert _unbounded(int_oo) and _unbounded(sympy.Integer(sys.maxsize - 1)) and _unbounded(sympy.Integer(sys.maxsize - 3))
    assert not _unbounded(sympy.Integer(4096)) and not _unbounded(sympy.Integer(2**40))


class _RoutedSplit(torch.nn.Module):
    """JetMoe's expert dispatch: tokens (batch x sequence, flattened) sorted by expert and split by how many each
    expert got, counted from data (``.tolist()``)."""

    def __init__(self, experts: int = 3):
        super().__init__()
        self.router, self.experts = torch.nn.Linear(4, experts), torch.nn.Parameter(torch.randn(experts, 4, 4))

    def forward(self, x):
        tokens = x.flatten(0, 1)
        choice = self.router(tokens).argmax(-1)
        order = choice.argsort()
        routed = torch.zeros(tokens.shape[0], self.experts.shape[0]).scatter(1, choice[:, None], 1)
        counts = routed.long().sum(0).tolist()
        pieces = tokens[order].split(counts, dim=0)
        out = torch.cat([piece @ self.experts[e] for e, piece in enumerate(pieces)])
        return {"y": torch.empty_like(out).index_copy(0, order, out).view_as(x)}


def test_a_data_dependent_split_is_planned_up_to_the_dim_it_cuts():
    """The split's pieces are unbacked sizes; planned at the fallback (the sequence cap) a piece holding every token
    of two sequences near that cap overflows its plan at run time. Bounded by the split dim, it runs."""
    from engine.dim_bounds import _split_piece_bounds

    torch.manual_seed(0)
    model = _RoutedSplit().eval()
    with torch.no_grad():
        model.router.weight.zero_()
        model.router.bias.copy_(torch.tensor([1.0, 0.0, 0.0]))  # every token to expert 0: one piece of them all
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnboundedDimWarning)
        manager = ExecutorchExporter().export(model, {"x": torch.randn(2, 5, 4)},
                                              config=ExecutorchConfig(dynamic=True, max_seq_len=32))
    longest = {"x": torch.randn(2, 30, 4)}  # 60 rows in expert 0's piece, above the sequence cap (32)
    comparison = compare_leaves(eager_leaves(model, longest), run_exported(manager, longest), atol=ATOL, rtol=RTOL)
    assert comparison.ok, str(comparison)

    batch, length = torch.export.Dim("batch", max=8), torch.export.Dim("length", max=32)
    program = torch.export.export(model, (torch.randn(2, 5, 4),), dynamic_shapes=({0: batch, 1: length},))
    bounds = _split_piece_bounds(program, program.range_constraints)
    assert len(bounds) == 3 and set(bounds.values()) == {8 * 32}  # each piece: up to every token of the batch


class _MaskedRows(torch.nn.Module):
    """The rows a mask keeps, as indexing and as nonzero (FunASR-Nano keeps the audio frames its feature mask marks)."""

    def forward(self, x, mask):
        return {"picked": x[mask] * 2, "where": mask.nonzero() + 1}


def test_rows_a_mask_selects_are_planned_up_to_the_masks_size():
    """The selected count is an unbacked size; planned at the fallback (the sequence cap) a mask keeping every
    frame of two sequences near that cap overflows its plan at run time ('Attempted to resize a bounded tensor').
    Bounded by the mask's number of elements, it runs."""
    from engine.dim_bounds import _mask_count_bounds

    model = _MaskedRows().eval()
    sample = {"x": torch.randn(2, 5, 4), "mask": torch.rand(2, 5) > 0.5}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnboundedDimWarning)
        manager = ExecutorchExporter().export(model, sample, config=ExecutorchConfig(dynamic=True, max_seq_len=32))
    longest = {"x": torch.randn(2, 30, 4), "mask": torch.ones(2, 30, dtype=torch.bool)}  # 60 rows, above the cap
    comparison = compare_leaves(eager_leaves(model, longest), run_exported(manager, longest), atol=ATOL, rtol=RTOL)
    assert comparison.ok, str(comparison)

    batch, length = torch.export.Dim("batch", max=8), torch.export.Dim("length", max=32)
    program = torch.export.export(model, (), {"x": sample["x"], "mask": sample["mask"]},
                                  dynamic_shapes={"x": {0: batch, 1: length}, "mask": {0: batch, 1: length}})
    bounds = _mask_count_bounds(program, program.range_constraints)
    assert bounds and set(bounds.values()) == {8 * 32}  # the count (shared by both): up to every mask element


class _CountedRowScores(torch.nn.Module):
    """Scores between the first rows a count read from data keeps (Qwen-Omni attends over its audio frames, counted
    by a mask over chunks whose number is read from data)."""

    def forward(self, x, mask):
        n = mask.sum().item()
        torch._check(n >= 0)
        torch._check(n <= x.shape[0] * x.shape[1])
        rows = x.flatten().narrow(0, 0, n)
        return rows[:, None] * rows[None, :]


def test_a_data_dependent_size_that_plans_past_the_limit_is_bounded_to_the_budget():
    """The count has no bound torch.export derived: it gets the largest input cap (65536 positions), at which its
    scores would plan 16 GiB, a ``.pte`` that cannot load. It is halved until they fit the budget, the warning names
    it, and the program runs."""
    model = _CountedRowScores().eval()
    sample = {"x": torch.randn(2, 5), "mask": torch.rand(2, 5) > 0.5}
    with pytest.warns(UnboundedDimWarning, match=r"1 data-dependent size\(s\) bounded to fit the 64 MiB tensor budget "
                                                 r"\(u\d+ <= 4096\)"):
        manager = ExecutorchExporter().export(model, sample, config=ExecutorchConfig(dynamic=True, max_seq_len=65536))
    other = {"x": torch.randn(3, 40), "mask": torch.rand(3, 40) > 0.3}
    comparison = compare_leaves(eager_leaves(model, other), run_exported(manager, other), atol=ATOL, rtol=RTOL)
    assert comparison.ok, str(comparison)
