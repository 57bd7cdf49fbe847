"""A tiny model whose top-k selections tie is rebuilt wider, so the backends compare the export, not tie-breaking."""

from __future__ import annotations

import hypothesis.strategies as st
import torch
from hypothesis import given, settings
from transformers import PretrainedConfig

from sweep.zoo import build, ties


class Router(torch.nn.Module):
    def __init__(self, gate: torch.Tensor):
        super().__init__()
        self.gate = torch.nn.Parameter(gate)

    def forward(self, x, k: int = 2):
        return (x @ self.gate.T).topk(k, dim=-1).indices


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(-100, 100, allow_nan=False, width=32), min_size=4, max_size=12, unique=True),
       st.integers(1, 3), st.booleans())
def test_ties_are_found_exactly_where_the_top_k_plus_one_are_within_rounding_of_each_other(values, k, tie_the_top):
    scores = torch.tensor(values)
    ordered = scores.sort(descending=True).values
    if tie_the_top:  # the (k+1)-th value made equal to the k-th: the k-th pick is the kernel's choice
        scores[scores == ordered[k]] = ordered[k - 1]
    top = sorted(scores.tolist(), reverse=True)[:k + 1]
    scale = max(abs(v) for v in top)
    expected = any(abs(a - b) <= ties.NEAR * scale for a, b in zip(top, top[1:]))
    with ties.RecordTiedSelections() as recorder:
        torch.topk(scores, k)
        scores.topk(k, largest=True)
    assert recorder.tied == (2 if expected else 0)
    assert expected or not tie_the_top


def test_integer_scores_and_ties_below_the_selection_do_not_count():
    with ties.RecordTiedSelections() as recorder:
        torch.topk(torch.tensor([3, 3, 1]), 1)
        torch.topk(torch.tensor([5.0, 4.0, 1.0, 1.0]), 2)
    assert recorder.tied == 0


def test_a_zero_initialised_router_ties_and_its_redrawn_matrix_does_not():
    router, x = Router(torch.zeros(4, 8)), torch.randn(3, 8)
    assert ties.tied_selections(router, {"x": x}) == 1
    assert ties.redraw_constant_matrices(router, std=0.2, seed=0) == 1
    assert ties.tied_selections(router, {"x": x}) == 0
    assert ties.redraw_constant_matrices(router, std=0.2, seed=0) == 0  # random now: left as it is


def test_widening_reaches_every_sub_config():
    config = PretrainedConfig(initializer_range=0.01)
    config.backbone_config = PretrainedConfig(initializer_range=0.02)
    config.text_config = PretrainedConfig()
    assert ties.widened(config, 4.0)
    assert config.initializer_range == 0.01 * 4.0
    assert config.backbone_config.initializer_range == 0.02 * 4.0
    assert not ties.widened(PretrainedConfig(), 4.0)


def test_rt_detr_scores_distinct_queries_and_a_model_without_ties_is_built_as_before():
    """RT-DETR at initializer_range 0.01 scores all 84 anchors exactly -ln 2 (its encoder output vanishes)."""
    rt_detr = build.build_case("RTDetrModel")
    assert ties.tied_selections(rt_detr.model, rt_detr.inputs) == 0
    assert rt_detr.model.config.initializer_range in {0.01 * factor for factor in ties.WIDENINGS}
    profile = next(p for p in build.PROFILES if p.name == rt_detr.profile)
    rules = build.overrides.for_class("RTDetrModel", "rt_detr")
    plain = build._built_model(build.model_class("RTDetrModel"), profile, rules, 0, "RTDetrModel")
    assert ties.tied_selections(plain, rt_detr.inputs) > 0  # the default build ties: the rebuild is what removed it
    assert build.build_case("BertModel").model.config.initializer_range == 0.02
