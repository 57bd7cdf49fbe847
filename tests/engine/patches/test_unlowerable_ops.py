"""Ops no lowering takes (:mod:`engine.patches.unlowerable_ops`): each rewrite equals the op it replaces, and the
pattern exports and runs on the backends it is registered for."""


from __future__ import annotations

import functools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import engine.patches.unlowerable_ops  # noqa: F401  (registers the fixes under test)
from engine import AutoExporter, run_exported
from engine.compare import compare_leaves
from engine.patches.registry import apply_fx_node_fixes
from tests.engine.patches.export_checks import assert_exports_and_runs


class _Buckets(torch.nn.Module):
    """``bucketize`` against fixed boundaries (a vision tower's patch coordinates) and ``searchsorted`` in batched
    sorted rows, with a ``sorter`` and both sides."""

    def __init__(self, right: bool):
        super().__init__()
        self.right = right
        self.register_buffer("boundaries", torch.arange(1, 8) / 8)

    def forward(self, coords, rows, order, values):
        buckets = torch.bucketize(coords, self.boundaries, right=self.right)
        left = torch.searchsorted(rows, values, out_int32=True)
        right = torch.searchsorted(rows.gather(-1, order), values, sorter=order.argsort(-1), side="right")
        return buckets, left, right


def _bucket_inputs(batch: int, length: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    rows = torch.randint(0, 6, (batch, 5), generator=g).float().sort(-1).values  # ties: left and right differ
    return {"coords": torch.rand(batch, length, generator=g), "rows": rows,
            "order": torch.stack([torch.randperm(5, generator=g) for _ in range(batch)]),
            "values": torch.randint(-1, 7, (batch, length), generator=g).float()}


_HISTOGRAMS = [(4, 0.0, 3.0), (3, -1.0, 1.0), (1, 0.0, 0.0), (5, 2.0, 2.0)]


def _rewritten(module: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> torch.nn.Module:
    program = torch.export.export(module, (), inputs, strict=False)
    graph = program.graph_module
    assert any(n.target in (torch.ops.aten.bucketize.Tensor, torch.ops.aten.searchsorted.Tensor) for n in graph.graph.nodes)
    assert apply_fx_node_fixes("executorch", graph) > 0
    assert not any(n.target in (torch.ops.aten.bucketize.Tensor, torch.ops.aten.searchsorted.Tensor) for n in graph.graph.nodes)
    return program.module()


@pytest.mark.parametrize("right", [False, True])
@given(seed=st.integers(0, 2**16))
@settings(max_examples=25, deadline=None)
def test_comparison_count_equals_searchsorted(right, seed):
    module = _Buckets(right).eval()
    rewritten = _rewritten(module, _bucket_inputs(2, 3, 0))
    inputs = _bucket_inputs(2, 3, seed)
    for expected, got in zip(module(**inputs), rewritten(**inputs)):
        assert got.dtype == expected.dtype
        assert torch.equal(got, expected)


@pytest.mark.parametrize("backend", ["onnx", "executorch"])
def test_searchsorted_and_bucketize_export_and_run(backend):
    module = _Buckets(right=True).eval()
    assert_exports_and_runs(module, _bucket_inputs(2, 6, 0), _bucket_inputs(3, 9, 1), backend, tolerance=0)


class _Histogram(torch.nn.Module):
    """``torch.histc`` with a fixed range (an MoE's tokens per expert) and with ``min == max`` (the data's range,
    which a one-expert config gives)."""

    def __init__(self, bins: int, low: float, high: float):
        super().__init__()
        self.bins, self.low, self.high = bins, low, high

    def forward(self, x):
        return torch.histc(x, bins=self.bins, min=self.low, max=self.high)


@pytest.mark.parametrize("bins, low, high", _HISTOGRAMS)
@given(values=st.lists(st.one_of(st.integers(-2, 5).map(float), st.floats(-2, 5, width=32)), min_size=1, max_size=12))
@settings(max_examples=30, deadline=None)
def test_comparison_count_equals_histc(bins, low, high, values):
    module = _Histogram(bins, low, high).eval()
    program = torch.export.export(module, (torch.tensor([0.0, 1.0, 2.5]),), dynamic_shapes=({0: torch.export.Dim.AUTO},))
    assert apply_fx_node_fixes("executorch", program.graph_module) > 0
    assert not any(n.target is torch.ops.aten.histc.default for n in program.graph_module.graph.nodes)
    x = torch.tensor(values, dtype=torch.float32)
    assert torch.equal(program.module()(x), module(x))


@pytest.mark.parametrize("backend", ["onnx", "executorch"])
@pytest.mark.parametrize("bins, low, high", [_HISTOGRAMS[0], _HISTOGRAMS[2]])
def test_histc_exports_and_runs(backend, bins, low, high):
    module = _Histogram(bins, low, high).eval()
    assert_exports_and_runs(module, {"x": torch.tensor([0.0, 1.0, 3.0, 2.0, 1.0])},
                             {"x": torch.tensor([3.0, 3.0, 0.0, 1.0, 2.0, 0.0, 3.0])}, backend, tolerance=0)


class _InverseErf(torch.nn.Module):
    """``Normal(0, 1).icdf(p)``, as Gemma3n's activation sparsity computes it (``sqrt(2) * erfinv(2p - 1)``)."""

    def forward(self, p):
        return torch.distributions.Normal(0.0, 1.0).icdf(p)


class _Erfinv(torch.nn.Module):
    def forward(self, x):
        return torch.erfinv(x)


@functools.cache
def _rewritten_erfinv() -> torch.nn.Module:
    program = torch.export.export(_Erfinv(), (torch.rand(5),), dynamic_shapes=({0: torch.export.Dim.AUTO},))
    assert apply_fx_node_fixes("executorch", program.graph_module) == 1
    assert not any(n.target is torch.ops.aten.erfinv.default for n in program.graph_module.graph.nodes)
    return program.module()


@given(values=st.lists(st.floats(-1, 1, width=32), min_size=1, max_size=16))
@settings(max_examples=50, deadline=None)
def test_polynomial_erfinv_is_torch_erfinv_to_float_rounding(values):
    x = torch.tensor(values + [1.0, -1.0, 1.5, -2.0, 0.0, 1e-8, 0.9999999], dtype=torch.float32)
    got, expected = _rewritten_erfinv()(x), torch.erfinv(x)
    assert torch.equal(torch.isnan(got), torch.isnan(expected))
    assert torch.equal(got[torch.isinf(expected)], expected[torch.isinf(expected)])
    finite = torch.isfinite(expected)
    torch.testing.assert_close(got[finite], expected[finite], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("backend", ["onnx", "executorch"])
def test_inverse_normal_cdf_exports_and_runs(backend):
    module = _InverseErf().eval()
    assert_exports_and_runs(module, {"p": torch.tensor([0.5, 0.95, 0.01])},
                             {"p": torch.tensor([0.2, 0.999, 0.5, 1e-4, 0.75])}, backend, tolerance=1e-5)


class _GaussianTopK(torch.nn.Module):
    """Gemma3n's activation sparsity: a cutoff at the mean plus ``icdf(p)`` standard deviations."""

    def forward(self, x, p):
        cutoff = x.mean(-1, keepdim=True) + torch.std(x, dim=-1, keepdim=True, unbiased=False) * \
            torch.distributions.Normal(0.0, 1.0).icdf(p)
        return torch.relu(x - cutoff)


def test_erfinv_rewrite_keeps_the_single_onnx_trace():
    """The rewrite writes no op ONNX's table decomposes: one (``rsub``) sent the single trace through torch.onnx's
    decomposition again, which refuses the ``prims.var`` the trace made of ``torch.std`` (Gemma3n's ONNX export).
    Fails with the rewrite's ``1 - x`` as ``rsub``."""
    from engine.patches.onnx import onnx_decomposition_table

    program = torch.export.export(_Erfinv(), (torch.rand(5),), dynamic_shapes=({0: torch.export.Dim.AUTO},))
    assert apply_fx_node_fixes("onnx", program.graph_module) == 1
    table = onnx_decomposition_table(None)
    assert not [n.target for n in program.graph_module.graph.nodes if n.op == "call_function" and n.target in table]
    module = _GaussianTopK().eval()
    assert_exports_and_runs(module, {"x": torch.randn(2, 3, 8), "p": torch.tensor(0.95)},
                            {"x": torch.randn(3, 5, 8), "p": torch.tensor(0.9)}, "onnx", tolerance=1e-5)


class _VideoOfEachPatch(torch.nn.Module):
    """Kimi-K2.5's temporal merge index: each packed patch's video, from the patches per video and their total."""

    def forward(self, grid):
        patches = grid.prod(-1)
        total = patches.sum().item()
        videos = torch.arange(grid.shape[0]) * 10
        return (torch.repeat_interleave(patches, output_size=total),
                torch.repeat_interleave(videos, patches, output_size=total))


@pytest.mark.parametrize("backend", ["onnx", "executorch"])
def test_repeat_interleave_of_a_known_length_exports_and_runs(backend):
    module = _VideoOfEachPatch().eval()
    assert_exports_and_runs(module, {"grid": torch.tensor([[1, 2, 2], [2, 1, 3]])},
                             {"grid": torch.tensor([[2, 2, 2], [1, 1, 3], [1, 2, 1]])}, backend, tolerance=0)


class _ImageOfEachPatch(torch.nn.Module):
    """Inkling2's patch index: each patch's image, ``repeat_interleave`` without ``output_size``; the patches per
    image are read from the grid (their total is data-dependent) or tied to the pixels' count."""

    def __init__(self, tied: bool):
        super().__init__()
        self.tied = tied

    def forward(self, grid, pixels):
        patches = grid.prod(-1)
        if self.tied:
            torch._check(patches.sum().item() == pixels.shape[0] * 4)
        image_ids = torch.arange(grid.shape[0]) + 1
        return torch.repeat_interleave(image_ids, patches) * 2, torch.repeat_interleave(patches)


@pytest.mark.parametrize("tied", [False, True], ids=["data-dependent", "from-input-sizes"])
def test_repeat_interleave_without_output_size_runs_on_executorch(tied):
    """``aten.repeat_interleave.Tensor`` is not Core ATen: the edge verifier refused it. The comparison count takes
    its length from the inputs' sizes where torch derived it, else from ``repeats.sum()`` bound to the symbol."""
    module = _ImageOfEachPatch(tied).eval()
    first = {"grid": torch.tensor([[1, 2, 2], [1, 2, 4]]), "pixels": torch.zeros(3, 5)}
    second = {"grid": torch.tensor([[1, 2, 2], [1, 2, 2], [1, 4, 2]]), "pixels": torch.zeros(4, 5)}
    assert_exports_and_runs(module, first, second, "executorch", tolerance=0)


class _RunningExtrema(torch.nn.Module):
    """GroundingDino's delimiter positions: a running max along dim 1, a running min along dim 0."""

    def forward(self, x, y):
        ahead, behind = torch.cummax(x, dim=1), torch.cummin(y, dim=0)
        return {"max": ahead.values, "argmax": ahead.indices, "min": behind[0], "argmin": behind[1]}


@given(data=st.data(), rows=st.integers(1, 4), length=st.integers(1, 9), floats=st.booleans())
@settings(max_examples=40, deadline=None)
def test_masked_reduction_equals_cummax_and_cummin(data, rows, length, floats):
    """Values and indices, ties included (small integer ranges tie often), equal torch's."""
    draw = st.floats(-3, 3, width=32) if floats else st.integers(-2, 2)
    x = torch.tensor(data.draw(st.lists(st.lists(draw, min_size=length, max_size=length), min_size=rows, max_size=rows)))
    y = x.t().contiguous()
    module = _RunningExtrema().eval()
    program = torch.export.export(module, (x, y), strict=False)
    assert apply_fx_node_fixes("executorch", program.graph_module) == 2
    assert not any(n.target in (torch.ops.aten.cummax.default, torch.ops.aten.cummin.default)
                   for n in program.graph_module.graph.nodes)
    got, expected = program.module()(x, y), module(x, y)
    assert all(torch.equal(got[k], expected[k]) for k in expected)


@pytest.mark.parametrize("backend", ["onnx", "executorch"])
def test_running_extrema_export_and_run(backend):
    x, y = torch.tensor([[1, 3, 3, 2, 5, 5, 1], [0, 0, -1, 2, 2, 1, 4]]), torch.randn(6, 3)
    y[2] = y[1]
    assert_exports_and_runs(_RunningExtrema().eval(), {"x": x, "y": y},
                             {"x": torch.randint(-3, 4, (3, 7)), "y": torch.randn(6, 2)}, backend, tolerance=0)


class _JointSqueeze(torch.nn.Module):
    """Parakeet's RNNT joint: ``[B, T, U, V].squeeze(2)``, a no-op where ``U`` is not 1."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 5)

    def forward(self, x):
        return {"logits": self.proj(x).squeeze(2).squeeze(-1)}


def test_a_squeeze_of_a_dim_that_is_not_one_loads_in_onnxruntime():
    """torchlib writes the no-op squeeze as ``Squeeze(axes=[2])`` on a dim of 3, which onnxruntime refuses at load
    ('Dimension of input 2 must be 1'); without the dims that are not 1 it runs as eager, at another batch too."""
    pytest.importorskip("onnxruntime")
    torch.manual_seed(0)
    model = _JointSqueeze().eval()
    sample = {"x": torch.randn(2, 6, 3, 4)}
    artifact = AutoExporter.export(model, sample, {"export_format": "onnx", "dynamic": True})
    for inputs in (sample, {"x": torch.randn(3, 7, 3, 4)}):
        with torch.no_grad():
            expected = model(**inputs)
        comparison = compare_leaves(expected, run_exported(artifact, inputs), atol=1e-5, rtol=1e-5)
        assert comparison.ok, str(comparison)


class _SegmentReduce(torch.nn.Module):
    """Tapas' ``_segment_reduce``: a reduction of cell values per segment id into a zero vector of segments."""

    def __init__(self, reduce: str, include_self: bool, segments: int = 6):
        super().__init__()
        self.reduce, self.include_self, self.segments = reduce, include_self, segments

    def forward(self, values, index):
        out = torch.arange(self.segments, dtype=torch.float32) - 2.5
        return out.scatter_reduce(0, index, values, reduce=self.reduce, include_self=self.include_self)


_REDUCES = [(r, s) for r in ("sum", "mean", "prod", "amax", "amin") for s in (False, True)]


@functools.cache
def _rewritten_segment_reduce(reduce: str, include_self: bool):
    module = _SegmentReduce(reduce, include_self).eval()
    auto = {0: torch.export.Dim.AUTO}
    program = torch.export.export(module, (torch.tensor([1.0, 2.0, 3.0]), torch.tensor([0, 2, 2])),
                                  dynamic_shapes=(auto, auto))
    assert apply_fx_node_fixes("executorch", program.graph_module) > 0
    assert not any(n.target is torch.ops.aten.scatter_reduce.two for n in program.graph_module.graph.nodes)
    return module, program.module()


@given(case=st.sampled_from(_REDUCES),
       data=st.lists(st.tuples(st.floats(-4, 4, width=32), st.integers(0, 5)), min_size=2, max_size=10))
@settings(max_examples=60, deadline=None)
def test_comparison_reduction_equals_scatter_reduce(case, data):
    module, rewritten = _rewritten_segment_reduce(*case)
    values, index = torch.tensor([v for v, _ in data]), torch.tensor([i for _, i in data])
    torch.testing.assert_close(rewritten(values, index), module(values, index), atol=1e-5, rtol=1e-5)


class _LineReduce(torch.nn.Module):
    """Blt's ``patch_reduce``: each row's byte embeddings pooled per patch id along dim 1 of a
    ``(batch, patches, hidden)`` target, the index the source's shape."""

    def __init__(self, reduce: str, include_self: bool, segments: int = 4):
        super().__init__()
        self.reduce, self.include_self, self.segments = reduce, include_self, segments

    def forward(self, values, index):
        out = torch.arange(values.shape[0] * self.segments * 3, dtype=torch.float32).reshape(-1, self.segments, 3) - 2.5
        return out.scatter_reduce(1, index, values, reduce=self.reduce, include_self=self.include_self)


@functools.cache
def _rewritten_line_reduce(reduce: str, include_self: bool):
    module = _LineReduce(reduce, include_self).eval()
    auto = {0: torch.export.Dim.AUTO, 1: torch.export.Dim.AUTO}
    program = torch.export.export(module, (torch.randn(2, 5, 3), torch.randint(0, 4, (2, 5, 3))),
                                  dynamic_shapes=(auto, auto))
    assert apply_fx_node_fixes("executorch", program.graph_module) > 0
    assert not any(n.target is torch.ops.aten.scatter_reduce.two for n in program.graph_module.graph.nodes)
    return module, program.module()


@given(case=st.sampled_from(_REDUCES), batch=st.integers(1, 3), length=st.integers(2, 7), seed=st.integers(0, 2**16))
@settings(max_examples=60, deadline=None)
def test_comparison_reduction_along_a_dim_equals_scatter_reduce(case, batch, length, seed):
    module, rewritten = _rewritten_line_reduce(*case)
    g = torch.Generator().manual_seed(seed)
    values, index = torch.randn(batch, length, 3, generator=g), torch.randint(0, 4, (batch, length, 3), generator=g)
    torch.testing.assert_close(rewritten(values, index), module(values, index), atol=1e-5, rtol=1e-5)


def test_segment_maxima_run_on_executorch():
    """``amax``, which has no ``scatter_add`` form (the other reductions are the same graph with another op)."""
    module = _SegmentReduce("amax", include_self=False).eval()
    assert_exports_and_runs(module, {"values": torch.tensor([1.0, 2.0, 3.0]), "index": torch.tensor([0, 2, 2])},
                            {"values": torch.tensor([3.0, -1.0, 0.5, 2.0, 4.0]), "index": torch.tensor([5, 1, 1, 5, 0])},
                            "executorch", tolerance=0)


@given(ids=st.lists(st.integers(0, 9), max_size=12), minlength=st.integers(0, 12),
       weighted=st.sampled_from([None, torch.float32, torch.float64]), seed=st.integers(0, 2**16))
@settings(max_examples=60, deadline=None)
def test_scatter_add_counts_equal_bincount(ids, minlength, weighted, seed):
    from engine.patches.unlowerable_ops import _patch_bincount_as_scatter_add

    ids = torch.tensor(ids, dtype=torch.long)
    weights = None if weighted is None else torch.rand(len(ids), generator=torch.Generator().manual_seed(seed),
                                                      dtype=weighted)
    expected = torch.bincount(ids, weights, minlength)
    got = _patch_bincount_as_scatter_add(torch.bincount)(ids, weights, minlength)
    assert got.dtype == expected.dtype and torch.equal(got, expected)


class _QuestionsPerRow(torch.nn.Module):
    """Splinter's questions per sample: the rows of the question tokens, counted."""

    def forward(self, input_ids):
        rows, _ = torch.where(input_ids == 3)
        return torch.bincount(rows, minlength=input_ids.shape[0]) * 2


def test_bincount_exports_and_runs_on_executorch():
    """Without the rewrite ExecuTorch's verifier refuses aten.bincount (not Core ATen)."""
    trace = {"input_ids": torch.tensor([[3, 1, 3, 0], [2, 3, 1, 1]])}
    run = {"input_ids": torch.tensor([[3, 3, 3, 0, 1], [2, 1, 1, 1, 0], [3, 0, 0, 0, 3]])}
    assert_exports_and_runs(_QuestionsPerRow().eval(), trace, run, "executorch", tolerance=0)


class _PolynomialHash(torch.nn.Module):
    """Blt's byte-group hash (``byte_group_hash_function``): each byte's window of ``group`` bytes times the powers of
    a prime near 1e9, summed, modulo the vocabulary (the powers past 2**53, the cube wrapping modulo 2**64)."""

    def __init__(self, group: int):
        super().__init__()
        self.group = group

    def forward(self, tokens):
        padded = torch.cat([tokens.new_zeros(tokens.shape[0], self.group - 1), tokens], dim=1)
        windows = padded.unfold(1, self.group, 1)
        powers = torch.tensor(1000000007, dtype=torch.int64) ** torch.arange(windows.shape[-1])
        return (windows * powers).sum(-1) % 30000


@functools.cache
def _rewritten_hash(group: int):
    module = _PolynomialHash(group).eval()
    program = torch.export.export(module, (torch.randint(0, 256, (2, 16)),),
                                  dynamic_shapes=({0: torch.export.Dim.AUTO, 1: torch.export.Dim.AUTO},))
    assert apply_fx_node_fixes("onnx", program.graph_module) > 0
    targets = {n.target for n in program.graph_module.graph.nodes}
    assert torch.ops.aten.pow.Tensor_Tensor not in targets and torch.ops.aten.sum.dim_IntList not in targets
    return module, program.module()


@given(group=st.integers(2, 9), rows=st.integers(1, 4), length=st.integers(10, 20), seed=st.integers(0, 2**16))
@settings(max_examples=40, deadline=None)
def test_integer_powers_and_sums_as_products_and_additions_equal_torchs(group, rows, length, seed):
    module, rewritten = _rewritten_hash(group)
    tokens = torch.randint(0, 256, (rows, length), generator=torch.Generator().manual_seed(seed))
    assert torch.equal(rewritten(tokens), module(tokens))


@pytest.mark.parametrize("backend", ["onnx", "executorch"])
def test_polynomial_hashes_are_exact_on_the_runtimes(backend):
    """onnxruntime's int64 Pow/ReduceSum and ExecuTorch's pow/sum kernels compute in double and round these."""
    tokens = torch.tensor([[255, 17, 3, 9, 200, 1], [1, 2, 3, 4, 5, 6]])
    assert_exports_and_runs(_PolynomialHash(4).eval(), {"tokens": tokens}, {"tokens": tokens[:, :5].flip(-1)}, backend,
                            tolerance=0)


@given(mode=st.sampled_from(["bilinear", "bicubic"]), sizes=st.lists(st.integers(1, 24), min_size=3, max_size=3),
       out_width=st.integers(2, 24), align_corners=st.booleans(), seed=st.integers(0, 2**16))
@settings(max_examples=60, deadline=None)
def test_weight_matrices_equal_antialiased_interpolate(mode, sizes, out_width, align_corners, seed):
    """(An output width of 1 is left out: there ATen's CPU kernel gives every row the first row's weights.)"""
    from engine.patches.unlowerable_ops import _patch_antialiased_resize_as_matmuls

    height, width, out_height = sizes
    grid = torch.randn(2, 3, height, width, generator=torch.Generator().manual_seed(seed))
    kwargs = {"size": (out_height, out_width), "mode": mode, "align_corners": align_corners, "antialias": True}
    expected = torch.nn.functional.interpolate(grid, **kwargs)
    got = _patch_antialiased_resize_as_matmuls(torch.nn.functional.interpolate)(grid, **kwargs)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


class _ResizedPositionGrid(torch.nn.Module):
    """UnlimitedOcr's ``interpolate_pos_encoding``: a learned position grid resized (antialiased bicubic) to a fixed
    patch grid, and an antialiased bilinear shrink of the features, added to each sequence position."""

    def __init__(self):
        super().__init__()
        self.grid = torch.nn.Parameter(torch.randn(1, 8, 12, 12, generator=torch.Generator().manual_seed(0)))

    def forward(self, hidden):
        grid = torch.nn.functional.interpolate(self.grid, size=(5, 5), mode="bicubic", antialias=True, align_corners=False)
        small = torch.nn.functional.interpolate(grid, scale_factor=0.5, mode="bilinear", antialias=True)
        return hidden + grid.flatten(2).transpose(1, 2).sum(1, keepdim=True) + small.mean()


def test_antialiased_resize_exports_and_runs_on_executorch():
    """Without the rewrite ExecuTorch's verifier refuses aten._upsample_bicubic2d_aa (not Core ATen)."""
    g = torch.Generator().manual_seed(1)
    trace, run = {"hidden": torch.randn(2, 7, 8, generator=g)}, {"hidden": torch.randn(3, 4, 8, generator=g)}
    assert_exports_and_runs(_ResizedPositionGrid().eval(), trace, run, "executorch", tolerance=1e-5)
