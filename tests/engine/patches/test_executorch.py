"""ExecuTorch correctness patches and fixes (:mod:`engine.patches.executorch`): each pattern lowers and runs as eager."""

from __future__ import annotations

import contextlib
import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import torch
from transformers import PretrainedConfig

from engine import (
    ExecutorchConfig,
    get_leaf_tensors,
    run_exported,
)
from engine.compare import compare_leaves
from tests.engine.executorch_cases import size_symint
from tests.engine.patches.export_checks import assert_exports_and_runs
from tests.engine.tiny_models import eager_leaves

pytest.importorskip("executorch", reason="the executorch extra is not installed")

from engine.dim_bounds import UnboundedDimWarning  # noqa: E402
from engine.exporter_executorch import ExecutorchExporter  # noqa: E402


from tests.engine.executorch_cases import MAX_PLANNED_BYTES  # noqa: E402

ATOL = RTOL = 1e-4


class _MaxOverDim(torch.nn.Module):
    """``max.dim`` of a 4-D tensor with its indices unused: what XNNPACK's partitioner claims."""

    def __init__(self, dim: int, keepdim: bool):
        super().__init__()
        self.dim, self.keepdim = dim, keepdim
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x):
        x = self.proj(x)
        top = x.max(dim=self.dim, keepdim=self.keepdim).values
        return x - (top if self.keepdim else top.unsqueeze(self.dim))


@pytest.mark.parametrize("dim, keepdim", [(-1, True), (3, False), (1, True), (2, True), (3, True)])
def test_max_over_a_dim_lowers_whatever_its_spelling(dim, keepdim):
    # -1 and keepdim=False used to be claimed by XNNPACK and refused by its serializer (GPT-OSS, Hiera)
    model, inputs = _MaxOverDim(dim, keepdim).eval(), {"x": torch.randn(2, 3, 4, 8)}
    manager = ExecutorchExporter().export(model, inputs, config={"dynamic": False})
    comparison = compare_leaves(eager_leaves(model, inputs), run_exported(manager, inputs), atol=ATOL, rtol=RTOL)
    assert comparison.ok, str(comparison)


class _ConvBatchNorm1d(torch.nn.Module):
    """A Conformer convolution module's tail: depthwise conv1d, then BatchNorm1d over ``[batch, channels, time]``."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv1d(8, 8, 3, padding=1, groups=8)
        self.norm = torch.nn.BatchNorm1d(8)
        self.norm.running_mean.normal_()
        self.norm.running_var.uniform_(0.5, 2.0)

    def forward(self, x):
        return self.norm(self.conv(x).float())


def test_batch_norm_1d_with_dynamic_batch_and_time_lowers():
    # XNNPACK used to claim the norm and fail on the conv1d it rewrites it into (LASR, Canary, Granite Speech)
    model, inputs = _ConvBatchNorm1d().eval(), {"x": torch.randn(2, 8, 12)}
    manager = ExecutorchExporter().export(model, inputs, config={"dynamic": True})
    for x in (inputs["x"], torch.randn(3, 8, 7)):
        comparison = compare_leaves(eager_leaves(model, {"x": x}), run_exported(manager, {"x": x}), atol=ATOL, rtol=RTOL)
        assert comparison.ok, str(comparison)


class _TubeletEmbedding(torch.nn.Module):
    """A video model's patch embedding: a Conv3d whose kernel is its stride (VideoMAE, ViViT, V-JEPA 2)."""

    def __init__(self, kernel, groups=1):
        super().__init__()
        self.config = PretrainedConfig(image_size=16)  # bounds the frames' height and width, as a video config does
        self.proj = torch.nn.Conv3d(4, 8, kernel_size=kernel, stride=kernel, groups=groups)

    def forward(self, pixel_values):
        return self.proj(pixel_values).flatten(2).transpose(1, 2)


@pytest.mark.parametrize("kernel, frames, groups", [((2, 4, 4), 5, 1), ((1, 2, 2), 3, 2)],
                         ids=["tubelets-a-frame-left-over", "per-frame-grouped"])
def test_conv3d_with_its_kernel_as_stride_runs(kernel, frames, groups):
    # the portable kernel takes 3-D or 4-D convolutions only: a 5-D one failed the loaded method with 0x12
    model = _TubeletEmbedding(kernel, groups).eval()
    inputs = {"pixel_values": torch.randn(2, 4, frames, 8, 8)}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        manager = ExecutorchExporter().export(model, inputs, config={"dynamic": True})
    # a video's height and width are image dims, capped by the config's image_size (as lengths, three dims capped
    # at 256 each planned 4 GiB for this module)
    caps = " ".join(str(w.message) for w in caught if issubclass(w.category, UnboundedDimWarning))
    assert "pixel_values dim 3 <= 16 (config image_size=16)" in caps and "dim 4 <= 16" in caps, caps
    assert sum(manager.executorch_program.execution_plan[0].non_const_buffer_sizes) < MAX_PLANNED_BYTES
    for x in (inputs["pixel_values"], torch.randn(3, 4, frames, 8, 8)):
        got = run_exported(manager, {"pixel_values": x})
        comparison = compare_leaves(eager_leaves(model, {"pixel_values": x}), got, atol=ATOL, rtol=RTOL)
        assert comparison.ok, str(comparison)


@pytest.mark.parametrize("kernel, stride, padding, dilation, groups", [
    ((3, 3, 3), 1, 1, 1, 1), ((3, 1, 1), (2, 1, 1), (2, 0, 0), 1, 2), ((2, 3, 3), 1, (0, 1, 1), (2, 1, 1), 1),
    ((3, 2, 2), (1, 2, 2), 0, 1, 4)])
def test_conv3d_as_a_sum_over_temporal_taps_equals_conv3d(kernel, stride, padding, dilation, groups):
    from engine.patches.executorch import _patch_conv3d_as_conv2d_over_time

    conv3d = _patch_conv3d_as_conv2d_over_time(torch.nn.functional.conv3d)
    x, weight, bias = torch.randn(2, 4, 7, 6, 5), torch.randn(8, 4 // groups, *kernel), torch.randn(8)
    expected = torch.nn.functional.conv3d(x, weight, bias, stride, padding, dilation, groups)
    torch.testing.assert_close(conv3d(x, weight, bias, stride, padding, dilation, groups), expected,
                               rtol=1e-5, atol=1e-5)


class _TemporalConv(torch.nn.Module):
    """Emu3's VQ-VAE temporal layer: a Conv3d over overlapping frames, padded in time."""

    def __init__(self):
        super().__init__()
        self.config = PretrainedConfig(image_size=16)
        self.conv = torch.nn.Conv3d(4, 6, kernel_size=(3, 1, 1), padding=(1, 0, 0))

    def forward(self, x):
        return self.conv(x)


def test_an_overlapping_conv3d_runs():
    # the portable kernel takes 3-D or 4-D convolutions only (pytorch/executorch#11704): 0x12 at run before
    model, inputs = _TemporalConv().eval(), {"x": torch.randn(2, 4, 3, 8, 8)}
    manager = ExecutorchExporter().export(model, inputs, config={"dynamic": True})
    for x in (inputs["x"], torch.randn(3, 4, 3, 6, 8)):
        comparison = compare_leaves(eager_leaves(model, {"x": x}), run_exported(manager, {"x": x}), atol=ATOL, rtol=RTOL)
        assert comparison.ok, str(comparison)


class _TanhGelu(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        return {"y": torch.nn.functional.gelu(self.lin(x), approximate="tanh")}


def test_tanh_gelu_computes_the_tanh_form_not_xnnpacks_exact_gelu():
    from engine.patches import patch_disabled

    torch.manual_seed(0)
    model = _TanhGelu().eval()
    x = torch.linspace(-4, 4, 2 * 5 * 8).reshape(2, 5, 8)
    expected = get_leaf_tensors(model(x))

    def worst(*disabled) -> float:
        with contextlib.ExitStack() as stack:
            for name in disabled:
                stack.enter_context(patch_disabled("executorch", name))
            manager = ExecutorchExporter().export(model, {"x": x}, config=ExecutorchConfig(dynamic=False))
        return (run_exported(manager, {"x": x})["y"] - expected["y"]).abs().max().item()

    assert worst() < 1e-5
    # what the patch prevents: XNNPACK's delegate runs exact (erf) GELU, up to 4.7e-4 away
    assert worst("_patch_tanh_gelu_delegated_as_exact_gelu") > 1e-4


class _PickedRowsTransposed(torch.nn.Module):
    """Rows picked by a boolean mask (a data-dependent count u, as ``pixel_values[real_images_inds]``), then laid
    out with u as the inner dim: strides ``(u, 1)``, which ExecuTorch's dim-order sort cannot compare unpatched."""

    def forward(self, x, mask):
        return x[mask].t().contiguous() * 2


def _picked_inputs(batch, length, seed):
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(batch, length, generator=g) > 0.5
    mask[0, 0] = True
    return {"x": torch.randn(batch, length, 8, generator=g), "mask": mask}


def test_dim_order_of_a_data_dependent_stride():
    import engine.patches.executorch_nodes  # noqa: F401
    import engine.patches.executorch  # noqa: F401  (registers the patch the first export would)
    from engine.patches import patch_disabled

    model = _PickedRowsTransposed().eval()
    with patch_disabled("executorch", "_patch_dim_order_of_unbacked_strides"), pytest.raises(Exception, match="data-dependent"):
        ExecutorchExporter().export(model, _picked_inputs(2, 6, 0), config={"dynamic": True})
    manager = ExecutorchExporter().export(model, _picked_inputs(2, 6, 0), config={"dynamic": True})
    for inputs in (_picked_inputs(2, 6, 0), _picked_inputs(3, 5, 1)):
        comparison = compare_leaves(eager_leaves(model, inputs), run_exported(manager, inputs), atol=ATOL, rtol=RTOL)
        assert comparison.ok, str(comparison)


class _NonzeroIndices(torch.nn.Module):
    """A mask's indices used three ways: squeezed to pick rows (1-D mask), offset, and one column read (2-D mask)."""

    def forward(self, x, grid):
        rows = (x > 0).nonzero().squeeze(-1)
        cells = (grid > 0).nonzero()
        return x.index_select(0, rows) * 2, cells + 1, cells[:, 1] * 3


@pytest.mark.parametrize("dynamic", [False, True])
def test_nonzero_indices_are_planned_as_the_kernel_writes_them(dynamic):
    """Without the patch the program fails (0x12: squeeze_copy and add check their dim orders) or, past a copy to
    contiguous order, reads the row-major indices transposed."""
    import engine.patches.executorch_nodes  # noqa: F401
    import engine.patches.executorch  # noqa: F401  (registers the patch the first export would)
    from engine.patches import patch_disabled

    model = _NonzeroIndices().eval()
    torch.manual_seed(0)
    sample = {"x": torch.randn(16), "grid": torch.randn(4, 5)}
    with patch_disabled("executorch", "_patch_nonzero_planned_row_major"), pytest.raises(Exception, match="0x12"):
        run_exported(ExecutorchExporter().export(model, sample, config={"dynamic": dynamic}), sample)
    manager = ExecutorchExporter().export(model, sample, config={"dynamic": dynamic})
    others = [{"x": torch.randn(12), "grid": torch.randn(3, 6)}] if dynamic else []
    for inputs in (sample, *others):
        comparison = compare_leaves(eager_leaves(model, inputs), run_exported(manager, inputs), atol=0, rtol=0)
        assert comparison.ok, str(comparison)


class _EightDimPatches(torch.nn.Module):
    """Patches viewed as an 8-D tensor and permuted (Inkling's image packing): above XNNPACK's six dims."""

    def forward(self, x):
        b, t, c, h, w = x.shape
        patches = x.view(b, t, 1, c, 2, h // 2, 2, w // 2).permute(0, 1, 2, 4, 6, 5, 7, 3)
        return (patches * 2 + 1).reshape(b, t * 4, -1)


def test_an_op_above_xnnpacks_rank_runs_on_the_portable_kernels():
    import engine.patches.executorch_nodes  # noqa: F401
    import engine.patches.executorch  # noqa: F401  (registers the patch the first export would)
    from engine.patches import patch_disabled

    model = _EightDimPatches().eval()
    sample = {"x": torch.randn(2, 3, 4, 6, 8)}
    with patch_disabled("executorch", "_patch_tensors_above_xnnpacks_rank"), pytest.raises(Exception, match="0x"):
        run_exported(ExecutorchExporter().export(model, sample, config={"dynamic": False}), sample)
    manager = ExecutorchExporter().export(model, sample, config={"dynamic": False})
    comparison = compare_leaves(eager_leaves(model, sample), run_exported(manager, sample), atol=0, rtol=0)
    assert comparison.ok, str(comparison)


def test_a_size_without_an_interval_bound_is_planned_at_its_exact_maximum_not_the_traced_hint():
    """SEW-D's attention view ``s * ((4*s) // ((4*s*L**2) // (L*(4*L + 4))))`` (a ``view(-1, ...)`` torch inferred):
    interval arithmetic finds no bound (the inner divisor's range reaches 0) and ExecuTorch plans the traced
    size, which a batch of 3 exceeds at run time (``et_view``: capacity 1152 elements, 1728 needed)."""
    import executorch.exir.sym_util as sym_util
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    import engine.patches.executorch_nodes  # noqa: F401
    import engine.patches.executorch  # noqa: F401 - registers the patch
    from engine.patches import apply_patches

    env = ShapeEnv()
    s, length = size_symint(env, "s", 2, 2, 8), size_symint(env, "L", 12, 2, 12)
    size = s * ((4 * s) // ((4 * s * length * length) // (length * (4 * length + 4))))
    exact = max(b * ((4 * b) // ((4 * b * n * n) // (n * (4 * n + 4))))
                for b in range(2, 9) for n in range(2, 13) if (4 * b * n * n) // (n * (4 * n + 4)))
    assert sym_util.eval_upper_bound(size) == 16  # unpatched: the traced hint
    with apply_patches("executorch"):
        assert sym_util.eval_upper_bound(size) == exact == 49


class _WindowView(torch.nn.Module):
    """Qwen2.5-VL's window view of a packed sequence: ``(s // 4, s // (s // 4), 8)``, outside any delegate."""

    def forward(self, x):
        windows = x.cumsum(0).reshape(x.shape[0] // 4, -1, 8)
        return windows.cumsum(1)


def test_a_view_is_planned_at_its_base_capacity():
    # per dim, (s // 4, s // (s // 4), 8) bounds at [16, 7, 8]: 896 elements planned inside a 512-element base
    import engine.patches.executorch_nodes  # noqa: F401
    import engine.patches.executorch  # noqa: F401 - registers the patch
    from engine.patches import patch_disabled

    model, inputs = _WindowView().eval(), {"x": torch.randn(32, 8)}
    config = {"dynamic": True, "max_seq_len": 64}
    with patch_disabled("executorch", "_patch_view_planned_at_its_base_capacity"):
        unpatched = ExecutorchExporter().export(model, inputs, config=config)
        with pytest.raises(Exception, match="0x:21|MemoryAllocationFailed"):
            run_exported(unpatched, inputs)
    manager = ExecutorchExporter().export(model, inputs, config=config)
    for rows in (32, 64, 8, 12):
        sample = {"x": torch.randn(rows, 8)}
        comparison = compare_leaves(eager_leaves(model, sample), run_exported(manager, sample), atol=ATOL, rtol=RTOL)
        assert comparison.ok, str(comparison)


class _FeaturesPlacedAtDataBounds(torch.nn.Module):
    """MiniCPM-V's pattern: a span of the sequence, its start and length read from data, rewritten in place."""

    def forward(self, x, bounds):
        start, length = bounds.tolist()
        y = x.clone()
        y[0, start:start + length, :] = y[0, start:start + length, :] * 2
        return y


def test_a_slice_with_data_dependent_bounds_lowers_and_clamps_as_in_eager():
    # the lowering re-traced slice_copy through torch._decomp's slice_forward: "Could not guard on ... u26 > 16"
    import engine.patches.executorch_nodes  # noqa: F401
    import engine.patches.executorch  # noqa: F401 - registers the patch
    from engine.errors import ExportStageError
    from engine.patches import patch_disabled

    model, x = _FeaturesPlacedAtDataBounds().eval(), torch.randn(2, 16, 4)
    inputs = {"x": x, "bounds": torch.tensor([3, 5])}
    with patch_disabled("executorch", "_patch_slice_copy_with_data_dependent_bounds"):
        with pytest.raises(ExportStageError, match="data-dependent"):
            ExecutorchExporter().export(model, inputs, config={"dynamic": True})
    manager = ExecutorchExporter().export(model, inputs, config={"dynamic": True})
    for bounds in ([3, 5], [0, 16], [12, 8], [16, 3]):  # past the end: eager's slice clamps, and so does the program
        sample = {"x": x, "bounds": torch.tensor(bounds)}
        comparison = compare_leaves(eager_leaves(model, sample), run_exported(manager, sample), atol=ATOL, rtol=RTOL)
        assert comparison.ok, str(comparison)


class _ReassignedBuffer(torch.nn.Module):
    """CTRL's ``self.pos_encoding = self.pos_encoding.to(device=..., dtype=...)`` before reading it."""

    def __init__(self):
        super().__init__()
        self.table = torch.nn.Buffer(torch.randn(16, 4))

    def forward(self, x, positions):
        self.table = self.table.to(device=x.device, dtype=x.dtype)
        return {"y": x + self.table[positions]}


def test_a_buffer_reassigned_to_itself_stays_constant_on_executorch():
    """The re-assignment is a write-back torch.export records as a buffer mutation; as a mutable buffer of the
    ExecuTorch program it is planned memory, not the weights (CTRL's outputs were off by up to 4.2). The no-op
    write-back is dropped: the program reads the buffer's values, at the traced and at another length."""
    from engine import DynamoExporter
    from engine.patches.executorch import _fix_no_op_buffer_write_back

    def sample(length):
        return {"x": torch.randn(2, length, 4), "positions": torch.arange(length).expand(2, length).contiguous()}

    program = DynamoExporter().export(_ReassignedBuffer().eval(), sample(6), {"dynamic": True})
    writes = lambda p: [n for n in p.graph.nodes if n.target is torch.ops.aten.copy_.default]  # noqa: E731
    assert writes(program)
    _fix_no_op_buffer_write_back(program)
    assert not writes(program)
    torch.manual_seed(0)
    model = _ReassignedBuffer().eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnboundedDimWarning)
        manager = ExecutorchExporter().export(model, sample(6), config=ExecutorchConfig(dynamic=True, max_seq_len=16))
    for length in (6, 11):
        inputs = sample(length)
        comparison = compare_leaves(eager_leaves(model, inputs), run_exported(manager, inputs), atol=ATOL, rtol=RTOL)
        assert comparison.ok, str(comparison)


@settings(max_examples=40, deadline=None)
@given(bags=st.integers(1, 5), size=st.integers(1, 4), mode=st.sampled_from(["sum", "mean", "max"]),
       weighted=st.booleans(), seed=st.integers(0, 2**16))
def test_fixed_size_bags_equal_embedding_bag(bags, size, mode, weighted, seed):
    """The bag of each row of a 2-D input, gathered and reduced, equals ``F.embedding_bag`` (weights with ``sum``
    only, as torch allows)."""
    import torch.nn.functional as F

    from engine.patches.executorch import _patch_fixed_size_bags_as_embedding_sums

    g = torch.Generator().manual_seed(seed)
    table = torch.randn(7, 3, generator=g)
    indices = torch.randint(0, 7, (bags, size), generator=g)
    weights = torch.rand(bags, size, generator=g) if weighted and mode == "sum" else None
    rewritten = _patch_fixed_size_bags_as_embedding_sums(F.embedding_bag)
    torch.testing.assert_close(rewritten(indices, table, mode=mode, per_sample_weights=weights),
                               F.embedding_bag(indices, table, mode=mode, per_sample_weights=weights))


class _WeightedTaps(torch.nn.Module):
    """Kimi-K2.5's position embeddings: interpolation taps gathered and weighted by ``F.embedding_bag``."""

    def __init__(self):
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(16, 4))

    def forward(self, taps, weights):
        return {"y": torch.nn.functional.embedding_bag(taps, self.table, per_sample_weights=weights, mode="sum")}


def test_weighted_bags_run_on_executorch():
    """``_embedding_bag`` has no portable kernel (0x14 at load); the bags as gathers and sums run as eager, at
    another number of bags too."""
    torch.manual_seed(0)
    model = _WeightedTaps().eval()

    def sample(bags):
        return {"taps": torch.randint(0, 16, (bags, 4)), "weights": torch.rand(bags, 4)}

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnboundedDimWarning)
        manager = ExecutorchExporter().export(model, sample(6), config=ExecutorchConfig(dynamic=True))
    for bags in (6, 9):
        inputs = sample(bags)
        comparison = compare_leaves(eager_leaves(model, inputs), run_exported(manager, inputs), atol=ATOL, rtol=RTOL)
        assert comparison.ok, str(comparison)


class _ConstantFirst(torch.nn.Module):
    """Gemma 3's generation components: a first user input that is a constant (its ``attention_mask`` dict of
    ``None`` masks), and a constant tensor built in forward, which ``to_edge`` lifts to a placeholder."""

    def forward(self, attention_mask, x):
        scaled = torch.where(x > 0, x, torch.full_like(x, 0.5)) * torch.tensor([2.0, 3.0, 4.0])
        return {"y": scaled + (attention_mask["full_attention"] is None)}


def test_lifted_constants_follow_a_constant_first_input():
    """``to_edge`` put the lifted constant's spec before the constant input's and its placeholder after it: the
    verifier refused the program ("Input spec name _lifted_tensor_constant0 does not match node name ...").
    With the specs in the placeholders' order it lowers and runs as eager."""
    model = _ConstantFirst().eval()
    masks = {"full_attention": None, "sliding_attention": None}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnboundedDimWarning)
        manager = ExecutorchExporter().export(model, {"attention_mask": masks, "x": torch.randn(4, 3)},
                                              config=ExecutorchConfig(dynamic=True))
    inputs = {"attention_mask": masks, "x": torch.randn(6, 3)}
    comparison = compare_leaves(eager_leaves(model, inputs), run_exported(manager, inputs), atol=ATOL, rtol=RTOL)
    assert comparison.ok, str(comparison)


class _PermuteAndItsCopy(torch.nn.Module):
    """A permuted result returned beside its contiguous copy (RecurrentGemma's conv input): the copy is a no-op
    XNNPACK removes, and a partition holding both would return one value twice."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x):
        y = self.proj(x).permute(0, 2, 1)
        return y, y.contiguous()


def test_a_no_op_copy_of_a_partition_output_lowers_and_runs():
    import engine.patches.executorch  # noqa: F401  (registers the patch the first export would)
    from engine.patches import patch_disabled

    model, sample = _PermuteAndItsCopy().eval(), {"x": torch.rand(2, 5, 8)}
    with patch_disabled("executorch", "_patch_no_op_copies_out_of_partition_outputs"), \
            pytest.raises(Exception, match="already in the inputs"):
        ExecutorchExporter().export(model, sample, config=ExecutorchConfig(dynamic=True))
    assert_exports_and_runs(model, sample, sample, "executorch", tolerance=ATOL)


def test_prelu_on_3d_states_lowers_and_runs():
    """DAB-DETR's activation: ``nn.PReLU`` after a linear on ``(batch, seq, hidden)``, which XNNPACK would take and
    then fail to lay out as NHWC (``skiplists/repros/xnnpack_prelu_3d_nhwc.py``)."""
    import engine.patches.executorch  # noqa: F401  (registers the patch the first export would)
    from engine.patches import patch_disabled

    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.PReLU()).eval()
    sample = {"input": torch.randn(2, 5, 8)}
    with patch_disabled("executorch", "_patch_prelu_of_other_ranks_than_4"), pytest.raises(Exception) as failed:
        ExecutorchExporter().export(model, sample, config=ExecutorchConfig(dynamic=True))
    causes = [failed.value]
    while causes[-1].__cause__ or causes[-1].__context__:
        causes.append(causes[-1].__cause__ or causes[-1].__context__)
    assert any("non-NHWC compatible" in str(cause) for cause in causes), causes
    assert_exports_and_runs(model, sample, sample, "executorch", tolerance=ATOL)
