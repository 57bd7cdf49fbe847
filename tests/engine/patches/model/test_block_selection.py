"""A sparse-attention indexer's block selection without per-query ``nonzero()`` picks the model's blocks, and exports."""

from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.patches.model import block_selection
from engine.patches.model.block_selection import best_blocks, select_blocks, visible_in_order

qwen4_exp = pytest.importorskip("transformers.models.qwen4_exp.modeling_qwen4_exp")

masks = st.lists(st.lists(st.booleans(), min_size=1, max_size=12), min_size=1, max_size=4).map(
    lambda rows: torch.tensor([(r * 12)[:12] for r in rows]))


@settings(max_examples=60, deadline=None)
@given(visible=masks)
def test_visible_keys_in_order_are_what_nonzero_lists(visible):
    """Each row's order starts with its nonzero() positions, then the others in order; rank counts the visible."""
    order, count, rank = visible_in_order(visible)
    for row, o, c, r in zip(visible, order, count, rank):
        shown = row.nonzero().flatten().tolist()
        assert c.item() == len(shown)
        assert o.tolist() == shown + (~row).nonzero().flatten().tolist()
        assert [r[p].item() for p in shown] == list(range(len(shown)))


@settings(max_examples=60, deadline=None)
@given(data=st.data(), blocks=st.integers(1, 8), k=st.integers(0, 5))
def test_best_blocks_are_the_k_highest_valid_ones_ties_to_the_earlier(data, blocks, k):
    scores = data.draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0]), min_size=blocks, max_size=blocks))
    valid = data.draw(st.lists(st.booleans(), min_size=blocks, max_size=blocks))
    got = best_blocks(torch.tensor([scores]), torch.tensor([valid]), k)[0].tolist()
    ranked = sorted((j for j in range(blocks) if valid[j]), key=lambda j: (-scores[j], j))[:k]
    assert got == [j in ranked for j in range(blocks)]


def _indexer(budget=4, ratio=2, heads=2):
    config = SimpleNamespace(indexer_n_heads=heads, indexer_kv_heads=1, indexer_head_dim=8, indexer_budget=budget,
                             indexer_compress_ratio=ratio, hidden_size=16, rms_norm_eps=1e-6)
    torch.manual_seed(0)
    return qwen4_exp.Qwen4ExpTextQSAIndexer(config, layer_idx=0).eval()


def _inputs(batch, length, seed, rotary=4):
    generator = torch.Generator().manual_seed(seed)
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    visible = causal & (torch.rand(batch, 1, length, length, generator=generator) > 0.3)  # padding-like holes
    angles = torch.rand(batch, length, rotary, generator=generator) * 6
    return {"hidden_states": torch.randn(batch, length, 16, generator=generator),
            "position_embeddings": (angles.cos(), angles.sin()), "attention_mask": visible, "cache": None}


def _boundary_ties(scores, valid, k):
    """Per query, whether its k-th and next best valid block scores are equal: where ``topk`` (the model's loop)
    may return either block, the rewrite the earlier one."""
    ranked = torch.where(valid, scores, float("-inf")).sort(dim=-1, descending=True).values
    if k == 0 or ranked.shape[-1] <= k:
        return torch.zeros(scores.shape[:-1], dtype=torch.bool)
    return (ranked[..., k - 1] == ranked[..., k]) & (ranked[..., k] > float("-inf"))


@pytest.mark.parametrize("budget,ratio,heads", [(4, 2, 2), (6, 3, 1), (8, 2, 4)])
def test_selection_equals_the_models_loop(budget, ratio, heads, monkeypatch):
    """Masks with holes, at lengths with and without an incomplete tail block: each query selects the model's
    tokens, but where two blocks tie for the last place (a score of exactly 0: every head's product negative)."""
    indexer = _indexer(budget, ratio, heads)
    original = qwen4_exp.Qwen4ExpTextQSAIndexer.forward
    ties = []

    def recording(scores, valid, k):  # the rewrite's own scores, to find the queries with a tie for the last place
        ties.append(_boundary_ties(scores, valid, k))
        return best_blocks(scores, valid, k)

    monkeypatch.setattr(block_selection, "best_blocks", recording)
    compared = total = 0
    for seed, (batch, length) in enumerate([(2, 8), (3, 11), (1, 1), (2, 16), (2, 13)]):
        inputs = _inputs(batch, length, seed)
        with torch.no_grad():
            expected = original(indexer, *inputs.values())[:, 0]
            got = select_blocks(indexer, *inputs.values())[:, 0]
        determined = ~ties.pop()
        assert torch.equal(got[determined], expected[determined]), (budget, ratio, heads, batch, length)
        compared, total = compared + int(determined.sum()), total + determined.numel()
    assert compared >= 0.8 * total  # the ties are the exception


def test_indexer_exports_for_any_mask():
    """Traced at batch 2 x 8 tokens, the program selects the model's tokens for 3 x 11 with another mask; the
    model's own loop does not export (its nonzero() count is data-dependent)."""
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    from engine import DynamoConfig, DynamoExporter
    from engine.shapes import auto_dynamic_shapes

    indexer = _indexer()
    program = DynamoExporter().export(indexer, _inputs(2, 8, seed=0), config=DynamoConfig(dynamic=True))
    other = _inputs(3, 11, seed=1)
    with torch.no_grad():
        expected = indexer(*other.values())
    other.pop("cache")  # None: not an input of the program
    assert torch.equal(program.module()(**other), expected)
    with pytest.raises(GuardOnDataDependentSymNode):
        torch.export.export(indexer, (), kwargs=_inputs(2, 8, seed=0), strict=False,
                            dynamic_shapes=auto_dynamic_shapes(_inputs(2, 8, seed=0)))
