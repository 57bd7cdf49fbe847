"""Python branches on a buffer's values (engine.patches.model.buffer_branches): traced with the values as numbers,
the buffer registered again afterwards."""

from __future__ import annotations

import pytest
import torch

from engine.patches.model.buffer_branches import branch_buffers, buffer_branches_as_python_numbers
from tests.engine.patches.export_checks import assert_exports_and_runs


class _AnnealedBlocks(torch.nn.Module):
    """EoMT's pattern: a per-block schedule in a buffer decides in Python whether a block runs its extra step, and
    the probability is passed on and compared again."""

    def __init__(self, probs):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)
        self.register_buffer("probs", torch.tensor(probs))
        self.register_buffer("scale", torch.ones(4))

    def forward(self, x):
        for i in range(len(self.probs)):
            if self.training or self.probs[i] > 0:
                x = self.proj(x) * self.scale
                x = self._drop(x, self.probs[i])
        return x

    @staticmethod
    def _drop(x, prob):
        return x if prob >= 1 else x * prob


def test_only_indexed_buffers_compared_in_a_branch_are_found():
    """``probs`` is compared inside an ``if`` and otherwise only indexed; ``scale`` is used as a tensor."""
    assert branch_buffers(_AnnealedBlocks.forward) == {"probs"}


def test_a_schedule_read_in_python_branches_exports_and_is_restored():
    """Plain torch.export fails on the buffer's value in the ``if``; inside the context the values are numbers, the
    program computes eager's numbers, and the buffer is registered again in its place."""
    module, x = _AnnealedBlocks([1.0, 0.0, 0.5]).eval(), torch.randn(2, 4)
    with pytest.raises(Exception, match="data-dependent"):
        torch.export.export(module, (x,), strict=False)
    before = list(module.state_dict())
    with buffer_branches_as_python_numbers(module) as swapped:
        assert swapped == ["_AnnealedBlocks.probs"]
        assert module.probs == (1.0, 0.0, 0.5)
    assert list(module.state_dict()) == before and isinstance(module.probs, torch.Tensor)
    assert_exports_and_runs(module, {"x": x}, {"x": torch.randn(3, 4)}, "dynamo", tolerance=1e-6)
