"""ExecuTorch FX node fixes (:mod:`engine.patches.executorch_nodes`): each rewritten node lowers and runs as eager."""


from __future__ import annotations

import operator

import pytest
import torch

from engine import (
    ExecutorchConfig,
    run_exported,
)
from engine.compare import compare_leaves
from tests.engine.tiny_models import eager_leaves

pytest.importorskip("executorch", reason="the executorch extra is not installed")

from engine.exporter_executorch import ExecutorchExporter  # noqa: E402



ATOL = RTOL = 1e-4


class _KeysFromTwoHalves(torch.nn.Module):
    """Multi-head latent attention's keys: an uninitialised tensor of the input's (symbolic) shape, filled in two
    halves."""

    def __init__(self, allocate):
        super().__init__()
        self.allocate = allocate

    def forward(self, x):
        keys = self.allocate(x)
        keys[..., : x.shape[-1]] = x
        keys[..., x.shape[-1]:] = x * 2
        return keys


@pytest.mark.parametrize("allocate", [
    lambda x: x.new_empty(*x.shape[:-1], 2 * x.shape[-1]),  # DeepSeek-V3: the .pte took the traced length only
    lambda x: torch.empty_like(torch.cat([x, x], dim=-1)),  # empty_permuted, not in core ATen, failed to lower
], ids=["new_empty", "empty_like"])
def test_empty_of_a_symbolic_size_keeps_its_dims_dynamic(allocate):
    # [batch, length, dim]: two dynamic dims keep the planned arena small (four made it 3 GiB, 30 s a test)
    model, inputs = _KeysFromTwoHalves(allocate), {"x": torch.randn(2, 8, 16)}
    manager = ExecutorchExporter().export(model, inputs, config={"dynamic": True})
    for x in (inputs["x"], torch.randn(3, 5, 16)):
        comparison = compare_leaves(eager_leaves(model, {"x": x}), run_exported(manager, {"x": x}), atol=ATOL, rtol=RTOL)
        assert comparison.ok, str(comparison)


class _SortBoth(torch.nn.Module):
    """Scores sorted descending along a dynamic length, integer ids ascending (JetMoE groups tokens by expert)."""

    def forward(self, scores, ids):
        values, order = scores.sort(dim=-1, descending=True)
        grouped = torch.sort(ids.flatten())
        return values, order, grouped.values, torch.argsort(scores, dim=0)


def test_sort_runs_as_topk():
    # the runtime has no sort kernel: the method failed to load with 0x14 (kernel 'aten::sort.values' not found)
    model = _SortBoth()
    inputs = {"scores": torch.randn(2, 9), "ids": torch.randperm(18).reshape(2, 9)}
    manager = ExecutorchExporter().export(model, inputs, config={"dynamic": True})
    for scores in (inputs["scores"], torch.randn(3, 6)):
        case = {"scores": scores, "ids": torch.randperm(scores.numel()).reshape(scores.shape)}
        comparison = compare_leaves(eager_leaves(model, case), run_exported(manager, case), atol=ATOL, rtol=RTOL)
        assert comparison.ok, str(comparison)


class _PadToBlocks(torch.nn.Module):
    """Pads a length up to whole blocks with ``(-length) % block``, as LongT5's local attention does."""

    def forward(self, x):
        pad = (-x.shape[1]) % 4
        padded = torch.nn.functional.pad(x, (0, 0, 0, pad))
        return padded.reshape(x.shape[0], -1, 4, x.shape[2]).sum(2)


def test_a_symbolic_modulo_is_floored_as_in_python():
    """The runtime's integer ``%`` truncates (``-7 % 4 == -3``): unfixed, the padding came out negative."""
    from engine.patches.executorch_nodes import _FLOORED
    from engine.patches import apply_fx_node_fixes

    manager = ExecutorchExporter().export(_PadToBlocks(), {"x": torch.randn(2, 7, 3)}, config=ExecutorchConfig(dynamic=True))
    for length in (5, 6, 7, 8, 9, 12):  # whole blocks and partial ones
        x = torch.randn(2, length, 3)
        got = run_exported(manager, {"x": x})
        assert torch.allclose(next(iter(got.values())), _PadToBlocks()(x)), length
    program = ExecutorchExporter().trace(_PadToBlocks(), {"x": torch.randn(2, 7, 3)}, ExecutorchConfig(dynamic=True))
    for _ in range(2):  # the fixes may run over a graph twice: a rewritten modulo is not wrapped again
        apply_fx_node_fixes("executorch", program.graph_module)
    mods = [n for n in program.graph.nodes if n.target is operator.mod]
    assert len(mods) == 2 and all(n.meta.get(_FLOORED) for n in mods)


class _ShiftAndCrop(torch.nn.Module):
    """RWKV's time shift (``ZeroPad2d((0, 0, 1, -1))``: one step later, the last step cropped) and a crop of the
    first feature with two padded after it."""

    def __init__(self):
        super().__init__()
        self.shift = torch.nn.ZeroPad2d((0, 0, 1, -1))
        self.crop = torch.nn.ConstantPad1d((-1, 2), 3.0)

    def forward(self, x):
        return self.shift(x), self.crop(x)


def test_a_negative_pad_crops_as_in_torch():
    """The runtime's constant_pad_nd rejects negative amounts (0x12); they become slices. The rewrite computes its
    nodes' shapes with the symbolic meta kernels: the C++ ones pinned the batch and length to the traced 2 and 7."""
    manager = ExecutorchExporter().export(_ShiftAndCrop(), {"x": torch.randn(2, 7, 3)},
                                          config=ExecutorchConfig(dynamic=True))
    for x in (torch.randn(2, 7, 3), torch.randn(3, 5, 3)):
        got = list(run_exported(manager, {"x": x}).values())
        assert all(torch.equal(g, e) for g, e in zip(got, _ShiftAndCrop()(x), strict=True))


class _SelectedKeyCounts(torch.nn.Module):
    """GLM-5-Next's top-k attention mask: how often each key is selected, counted with int32 indices."""

    def forward(self, scores):
        indices = scores.topk(2, dim=-1).indices.to(torch.int32)
        counts = torch.zeros(scores.shape, dtype=torch.int32)
        counts.scatter_add_(-1, indices, torch.ones_like(indices))  # in place, as the model writes it
        return counts.scatter_add(-1, indices, torch.ones_like(indices)), scores.gather(-1, indices)


def test_int32_scatter_and_gather_indices():
    model = _SelectedKeyCounts().eval()
    sample = {"scores": torch.randn(2, 5, 6)}
    manager = ExecutorchExporter().export(model, sample, config={"dynamic": True})
    for inputs in (sample, {"scores": torch.randn(3, 4, 7)}):
        comparison = compare_leaves(eager_leaves(model, inputs), run_exported(manager, inputs), atol=0, rtol=0)
        assert comparison.ok, str(comparison)


class _ZeroWidthCacheHalf(torch.nn.Module):
    """A no-rope layer's zero-width rotary half of its cache, concatenated with the past (GLM-5-Next)."""

    def forward(self, x):
        rotary = x[..., :0]
        legacy = x.new_zeros(0)  # torch.cat skips a 1-D empty tensor of any other rank (a cache's initial value)
        return torch.cat([legacy, rotary, rotary], dim=1), x * 2


def test_a_cat_of_empty_tensors_with_symbolic_sizes():
    model = _ZeroWidthCacheHalf().eval()
    sample = {"x": torch.randn(2, 5, 4)}
    manager = ExecutorchExporter().export(model, sample, config={"dynamic": True})
    for inputs in (sample, {"x": torch.randn(3, 6, 4)}):
        got = run_exported(manager, inputs)
        expected = eager_leaves(model, inputs)
        assert [tuple(t.shape) for t in got.values()] == [tuple(t.shape) for t in expected.values()]
        comparison = compare_leaves(expected, got, atol=0, rtol=0)
        assert comparison.ok, str(comparison)


class _DataSizedRows(torch.nn.Module):
    """Rows of a count read from data, viewed flat (Qwen2.5-Omni views its audio frames so), and a view of an input."""

    def forward(self, x, mask):
        n = mask.sum().item()
        torch._check(n >= 0)
        torch._check(n <= x.shape[0])
        rows = x.narrow(0, 0, n) * 2
        return rows.view(-1, x.shape[-1]).sum(0), x.view(-1)


def test_a_view_of_a_data_sized_tensor_views_its_contiguous_copy():
    """The lowering's retrace cannot prove such a view's input contiguous (GuardOnDataDependentSymNode on Qwen2.5-Omni);
    a view of a copy needs no proof. Only views of data-sized tensors change, and the program computes the same."""
    from engine.patches.executorch_nodes import _fix_data_sized_view_of_a_copy

    inputs = (torch.randn(6, 3, 4), torch.tensor([1, 0, 1, 1, 0, 0], dtype=torch.bool))
    program = torch.export.export(_DataSizedRows(), inputs)
    views = [n for n in program.graph.nodes if n.target is torch.ops.aten.view.default]
    changed = [n for n in views if _fix_data_sized_view_of_a_copy(program.graph_module, n)]
    program.graph_module.recompile()
    assert len(views) == 2 and len(changed) == 1
    assert changed[0].args[0].target is torch.ops.aten.clone.default
    assert not _fix_data_sized_view_of_a_copy(program.graph_module, changed[0])  # once
    for got, expected in zip(program.module()(*inputs), _DataSizedRows()(*inputs)):
        assert torch.equal(got, expected)
