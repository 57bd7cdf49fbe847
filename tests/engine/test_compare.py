"""engine.compare: a leaf matches eager within atol + rtol * |eager|, equal values (infinities included) exactly."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.compare import compare_leaves

values = st.lists(st.one_of(st.floats(-1e3, 1e3, width=32), st.sampled_from([math.inf, -math.inf, math.nan])),
                  min_size=1, max_size=16)


@given(values)
@settings(max_examples=100, deadline=None)
def test_a_leaf_matches_itself_whatever_it_holds(xs):
    """Masked logits hold -inf where eager does: the same tensor matches (inf - inf is NaN, not a difference)."""
    x = torch.tensor(xs)
    comparison = compare_leaves({"logits": x}, {"logits": x.clone()})
    assert comparison.ok, str(comparison)


@given(values, st.integers(0, 15), st.sampled_from([math.inf, -math.inf, 1.0]))
@settings(max_examples=100, deadline=None)
def test_a_changed_entry_is_caught(xs, position, replacement):
    """An infinity where eager has another value (or a finite value where eager has an infinity) fails."""
    x = torch.tensor(xs)
    position %= x.numel()
    y = x.clone()
    y[position] = replacement
    original = x[position].item()
    same = original == replacement or (math.isnan(original) and math.isnan(replacement))
    if same or (math.isfinite(original) and abs(original - replacement) <= 1e-4 + 1e-4 * abs(original)):
        return
    assert not compare_leaves({"logits": x}, {"logits": y}).ok


def test_tolerance_is_atol_plus_rtol_times_eager():
    eager = torch.tensor([0.0, 100.0, -math.inf])
    assert compare_leaves({"y": eager}, {"y": eager + torch.tensor([0.9e-4, 1.0e-2, 0.0])}).ok
    assert not compare_leaves({"y": eager}, {"y": eager + torch.tensor([1.1e-4, 0.0, 0.0])}).ok
    assert not compare_leaves({"y": eager}, {"y": torch.tensor([0.0, 100.0, math.inf])}).ok
