"""Placeholder merges without their data-dependent tests equal the guarded code, and export."""


import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st


def _indicator_write(embeds, ids, indicators):
    """Ovis2's visual-indicator write: each indicator's embedding where its id sits, behind an emptiness test."""
    embeds = embeds.clone()
    for i, indicator in enumerate(indicators):
        mask = ids == i
        if mask.any():
            embeds[mask] = indicator
    return embeds


def _rewritten_indicator_write():
    from engine.patches.model.placeholder_merges import _MaskedWriteWithoutItsEmptinessTest
    from engine.patches.source_rewrite import recompiled

    rewrite = _MaskedWriteWithoutItsEmptinessTest()
    function = recompiled(_indicator_write, rewrite)
    assert rewrite.matched == 1 and function is not _indicator_write
    return function


@settings(max_examples=30, deadline=None)
@given(rows=st.integers(1, 3), length=st.integers(1, 7), present=st.lists(st.booleans(), min_size=3, max_size=3),
       seed=st.integers(0, 2**16))
def test_a_masked_write_without_its_emptiness_test_equals_the_guarded_one(rows, length, present, seed):
    """Writing through an empty mask writes nothing: without the ``if mask.any()`` the result is the same, for
    indicators present or absent."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 3, (rows, length), generator=g)
    for i, keep in enumerate(present):
        if not keep:
            ids[ids == i] = 3
    embeds, indicators = torch.randn(rows, length, 4, generator=g), torch.randn(3, 4, generator=g)
    assert torch.equal(_rewritten_indicator_write()(embeds, ids, indicators), _indicator_write(embeds, ids, indicators))


def test_a_masked_write_without_its_emptiness_test_exports():
    """The guarded write fails the trace (a data-dependent ``Eq(u, 1)``); the rewritten one exports and computes
    eager's write on other ids and lengths, an absent indicator included."""
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    class Write(torch.nn.Module):
        def __init__(self, function):
            super().__init__()
            self.function = function
            self.indicators = torch.nn.Parameter(torch.randn(3, 4))

        def forward(self, embeds, ids):
            return self.function(embeds, ids, self.indicators)

    sample = (torch.randn(2, 6, 4), torch.tensor([[0, 1, 2, 3, 3, 3], [3, 0, 3, 1, 3, 2]]))
    dims = ({0: torch.export.Dim.AUTO, 1: torch.export.Dim.AUTO}, {0: torch.export.Dim.AUTO, 1: torch.export.Dim.AUTO})
    with pytest.raises(GuardOnDataDependentSymNode):
        torch.export.export(Write(_indicator_write), sample, dynamic_shapes=dims, strict=False)
    model = Write(_rewritten_indicator_write())
    program = torch.export.export(model, sample, dynamic_shapes=dims, strict=False)
    embeds, ids = torch.randn(3, 9, 4), torch.tensor([[0, 3, 3, 3, 0, 3, 3, 1, 3]] * 3)  # no indicator 2
    with torch.no_grad():
        torch.testing.assert_close(program.module()(embeds, ids), _indicator_write(embeds, ids, model.indicators))


def _placeholder_check(pixel_features, ids):
    """PerceptionLM's placeholder check: its message counts the features with ``torch.Size.numel()``."""
    features = pixel_features.flatten(0, 1)
    tokens = (ids == 7).sum()
    message = f"Image features and image tokens do not match, tokens: {tokens}, features: {features.size()[:-1].numel()}"
    torch._check(features.shape[0] * features.shape[1] > 0, lambda: message)
    return features.sum(-1)


def test_a_size_numel_in_a_message_keeps_the_batch_symbolic():
    """``features.size()[:-1].numel()`` reads each size as an int and pins the batch (the program refuses 3
    images); recompiled as a product of the sizes the same message is built and the batch stays symbolic."""
    from engine.patches.model.placeholder_merges import _SizeNumelAsProduct
    from engine.patches.source_rewrite import recompiled

    rewrite = _SizeNumelAsProduct()
    rewritten = recompiled(_placeholder_check, rewrite, {"__prod__": __import__("math").prod})
    assert rewrite.matched == 1

    class Check(torch.nn.Module):
        def __init__(self, function):
            super().__init__()
            self.function = function

        def forward(self, features, ids):
            return self.function(features, ids)

    sample = (torch.randn(2, 1, 3, 4), torch.full((2, 3), 7))  # two images of three features
    dims = ({0: torch.export.Dim.AUTO}, {0: torch.export.Dim.AUTO})
    pinned = torch.export.export(Check(_placeholder_check), sample, dynamic_shapes=dims, strict=False)
    assert len(pinned.range_constraints) == 1  # the image count became the traced 2
    program = torch.export.export(Check(rewritten), sample, dynamic_shapes=dims, strict=False)
    assert len(program.range_constraints) == 2
    features, ids = torch.randn(3, 1, 3, 4), torch.full((3, 3), 7)
    torch.testing.assert_close(program.module()(features, ids), features.flatten(0, 1).sum(-1))


def _count_checked_merge(embeds, ids, features):
    """HunYuan-VL's placeholder check: the selected count against the features' count, raised in Python."""
    mask = (ids == 7).unsqueeze(-1).expand_as(embeds)
    if features is not None and embeds[mask].numel() != features.numel():
        raise ValueError(f"Image features and image tokens do not match: features {features.shape[0]}")
    return embeds.masked_scatter(mask, features)


def test_a_count_check_that_raises_becomes_a_runtime_assert():
    """The Python ``if ... raise`` fails the trace (``Ne(u0, ...)`` on data); rewritten as ``torch._check`` the
    program exports, merges as eager does, and still refuses a count mismatch, at run time."""
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    from engine.patches.model.placeholder_merges import _RaiseOnCountMismatchAsCheck, check_unless
    from engine.patches.source_rewrite import recompiled

    rewrite = _RaiseOnCountMismatchAsCheck()
    checked = recompiled(_count_checked_merge, rewrite, {"__check_unless__": check_unless})
    assert rewrite.matched == 1

    class Merge(torch.nn.Module):
        def __init__(self, function):
            super().__init__()
            self.function = function

        def forward(self, embeds, ids, features):
            return self.function(embeds, ids, features)

    ids = torch.tensor([[7, 7, 1, 2], [3, 7, 7, 4]])
    sample = (torch.randn(2, 4, 3), ids, torch.randn(4, 3))
    dims = ({0: torch.export.Dim.AUTO, 1: torch.export.Dim.AUTO}, {0: torch.export.Dim.AUTO, 1: torch.export.Dim.AUTO},
            {0: torch.export.Dim.AUTO})
    with pytest.raises(GuardOnDataDependentSymNode):
        torch.export.export(Merge(_count_checked_merge), sample, dynamic_shapes=dims, strict=False)
    program = torch.export.export(Merge(checked), sample, dynamic_shapes=dims, strict=False)
    other = (torch.randn(3, 5, 3), torch.tensor([[7, 1, 1, 1, 7]] * 3), torch.randn(6, 3))
    torch.testing.assert_close(program.module()(*other), _count_checked_merge(*other))
    with pytest.raises(RuntimeError, match="Runtime assertion failed"):
        program.module()(other[0], other[1], torch.randn(5, 3))
