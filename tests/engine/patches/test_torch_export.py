"""torch.export internals (:mod:`engine.patches.torch_export`): each patched probe or solver step answers as the
original where the original answers, and the pattern it unblocks exports and runs."""

from __future__ import annotations


import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import engine.patches.torch_export  # noqa: F401  (registers the patches under test)
from engine import run_exported
from engine.compare import compare_leaves
from tests.engine.patches.export_checks import assert_exports_and_runs
from tests.engine.tiny_models import ci_cover, eager_leaves




@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 40)), min_size=0, max_size=4))
def test_contiguity_probe_answers_as_torch_on_concrete_sizes(dims):
    """On concrete sizes the no-guard contiguity probe answers what torch's does (it differs only in not
    recording guards on symbolic sizes)."""
    import torch._prims_common as prims

    from engine.patches.torch_export import (_patch_contiguity_probe_without_numel_guards,
                                             _patch_contiguity_probe_without_singleton_guards)

    sizes, strides = [d[0] for d in dims], [d[1] for d in dims]
    check = _patch_contiguity_probe_without_singleton_guards(prims.check_contiguous_sizes_strides)
    assert check(sizes, strides, false_if_dde=True) == prims.check_contiguous_sizes_strides(sizes, strides, false_if_dde=True)
    tensor = torch.empty_strided(sizes, strides)
    is_contiguous = _patch_contiguity_probe_without_numel_guards(prims.is_contiguous)
    assert is_contiguous(tensor, false_if_dde=True) == prims.is_contiguous(tensor, false_if_dde=True)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(2, 9), min_size=1, max_size=4), st.randoms(use_true_random=False))
def test_contiguity_probe_is_answered_once_per_layout_as_probed_anew(hints, rng):
    """The memo of the contiguity probe answers every layout as the probe does in a fresh shape env, and a trace's
    repeated question about one layout (the same size and stride expressions) runs the probe once."""
    from unittest import mock

    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    import engine.patches.torch_export as patches
    from tests.engine.executorch_cases import size_symint

    order = list(range(len(hints)))
    rng.shuffle(order)

    def layouts(shape_env):
        sizes = [size_symint(shape_env, f"s{i}", hint, 2, 4096) for i, hint in enumerate(hints)]
        strides, step = [0] * len(sizes), 1
        for dim in reversed(order):  # contiguous in a drawn dim order
            strides[dim], step = step, step * sizes[dim]
        return [(sizes, strides), (sizes, [1] * len(sizes))]  # and every stride 1

    expected = [patches.contiguity_probe(*layout) for layout in layouts(ShapeEnv())]
    asked = layouts(ShapeEnv())
    with mock.patch.object(patches, "contiguity_probe", wraps=patches.contiguity_probe) as probe:
        answers = [patches.contiguity_answered_once(*layout) for layout in asked + asked]
    assert answers == expected + expected
    assert probe.call_count == len({tuple(map(str, sizes + strides)) for sizes, strides in asked})


def test_a_strided_slice_exports_for_its_whole_range():
    """``x[::9]`` is a single row for inputs of 1 to 9 rows; torch's layout probe guarded that it is not (and that
    it has 2 or more elements) at the traced 12 rows, so a named ``Dim(min=1)`` export failed. Patched, the program
    takes 5 rows too."""
    from torch._dynamo.exc import UserError

    from engine.patches.registry import apply_patches

    class EveryNinthRow(torch.nn.Module):
        def forward(self, x):
            return x[::9, :].sum(-1)

    rows = torch.export.Dim("rows", min=1, max=1000)
    with pytest.raises(UserError, match="Constraints violated"):
        torch.export.export(EveryNinthRow(), (torch.randn(12, 4),), dynamic_shapes=({0: rows},))
    with apply_patches("dynamo"):
        program = torch.export.export(EveryNinthRow(), (torch.randn(12, 4),), dynamic_shapes=({0: rows},))
    short = torch.randn(5, 4)
    assert torch.equal(program.module()(short), short[::9].sum(-1))


def test_group_norm_of_a_data_sized_input_exports():
    """``F.group_norm`` checks that a channel group holds more than one value with a Python ``if``; on a width read
    from data that is a data-dependent guard. Patched, it is a runtime assert: the program runs, and raises where
    eager raises."""
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    from engine.patches.registry import apply_patches

    class DataWide(torch.nn.Module):
        def forward(self, x, width):
            width = width.item()
            torch._check(width >= 1)
            torch._check(width <= x.shape[2])
            return torch.nn.functional.group_norm(x[:, :, :width], 2)

    inputs = (torch.randn(1, 2, 9), torch.tensor(5))
    with pytest.raises(GuardOnDataDependentSymNode):
        torch.export.export(DataWide(), inputs)
    with apply_patches("dynamo"):
        program = torch.export.export(DataWide(), inputs)
    x = torch.randn(1, 2, 9)
    torch.testing.assert_close(program.module()(x, torch.tensor(7)), DataWide()(x, torch.tensor(7)))
    with pytest.raises(ValueError):
        DataWide()(x, torch.tensor(1))  # one value per channel group
    with pytest.raises(RuntimeError):
        program.module()(x, torch.tensor(1))


@given(values=st.lists(st.one_of(st.integers(-2, 2).map(float), st.just(float("nan"))), max_size=12),
       shape=st.sampled_from([(-1,), (1, -1)]))
@settings(max_examples=60, deadline=None)
def test_run_starts_equal_unique_consecutive(values, shape):
    from engine.patches.torch_export import _patch_unique_consecutive_as_run_starts

    x = torch.tensor(values, dtype=torch.float32).reshape(shape)
    got = _patch_unique_consecutive_as_run_starts(torch.unique_consecutive)(x)
    torch.testing.assert_close(got, torch.unique_consecutive(x), equal_nan=True, rtol=0, atol=0)


class _SameCountPerRow(torch.nn.Module):
    """The sequence-classification heads' check: every row holds the same number of EOS tokens."""

    def forward(self, ids):
        eos = ids == 2
        torch._check(torch.unique_consecutive(eos.sum(1)).numel() == 1)
        return ids * 3


@pytest.mark.parametrize("backend", ["dynamo", "executorch"])
def test_a_same_count_check_exports_and_runs(backend):
    """``aten.unique_consecutive`` is not Core ATen (ExecuTorch refuses it) and its size did not survive the
    ``.pt2`` round trip; as run starts it does both."""
    assert_exports_and_runs(_SameCountPerRow().eval(), {"ids": torch.tensor([[1, 2, 5], [2, 0, 1]])},
                             {"ids": torch.tensor([[2, 2, 5, 1], [2, 0, 2, 1], [1, 2, 2, 7]])}, backend, tolerance=0)


class _PlaceholderScatter(torch.nn.Module):
    """A multimodal placeholder check (Inkling2's ``get_placeholder_mask``): the masked embedding count equals the
    features' numel, then the features are scattered into the placeholders."""

    def forward(self, ids, feats):
        mask = (ids == 7).unsqueeze(-1).expand(*ids.shape, feats.shape[-1])
        embeds = torch.zeros(*ids.shape, feats.shape[-1])
        torch._check(embeds[mask].numel() == feats.numel())
        return embeds.masked_scatter(mask, feats)


def test_a_placeholder_count_check_exports_saves_and_loads(tmp_path):
    """torch solves ``count == 64 * n`` for ``n`` and then asserts its own rounded bounds nest, which they do not
    near ``2**63`` (``tgt_bound=VR[128, 9223372036854775808] not a subset of src_bound=...``): plain torch.export
    fails, and so did loading the saved program. Patched, the equality stays a runtime assert of the program."""
    from engine import DynamoExporter, load_program, save_program

    def sample(rows):
        ids = torch.tensor(rows)
        return {"ids": ids, "feats": torch.randn(int((ids == 7).sum()), 64, generator=torch.Generator().manual_seed(0))}

    module = _PlaceholderScatter().eval()
    first = sample([[7, 1, 7], [7, 7, 2]])
    dims = torch.export.Dim.AUTO
    with pytest.raises(AssertionError, match="not a subset of src_bound"):
        torch.export.export(module, (), first, dynamic_shapes={"ids": {0: dims, 1: dims}, "feats": {0: dims, 1: 64}},
                            strict=False)
    program = load_program(save_program(DynamoExporter().export(module, first, {"dynamic": True}), tmp_path / "p.pt2"))
    for rows in ([[7, 1, 7], [7, 7, 2]], [[7, 7, 7, 1], [2, 7, 1, 1], [1, 1, 1, 7]]):
        inputs = sample(rows)
        comparison = compare_leaves(eager_leaves(module, inputs), run_exported(program, inputs), atol=0, rtol=0)
        assert comparison.ok, str(comparison)
    with pytest.raises(Exception):  # the count check is kept: one feature row short
        run_exported(program, {"ids": torch.tensor([[7, 7]]), "feats": torch.randn(1, 64)})


class _HalvedGrid(torch.nn.Module):
    """InternVL's ``pixel_shuffle`` check: a size tested against a float factor before reshaping by it (InternVL
    reshapes by ``int(height * 0.5)``, which torch specialises on its own; here by ``height // 2``)."""

    def forward(self, x):
        batch, width, height, channels = x.shape
        if height % 0.5 != 0 or width % 0.5 != 0:
            raise ValueError("Height and width must be divisible by scale_factor")
        return {"y": x.reshape(batch, width, height // 2, channels * 2) * 2}


@settings(max_examples=60, deadline=None)
@given(divisor=st.one_of(st.floats(0, 2), st.integers(1, 64).map(lambda k: 1 / k)), n=st.integers(0, 2**40))
def test_a_size_modulo_is_zero_only_where_python_says_so(divisor, n):
    """Every divisor the patch answers 0 for gives 0 in Python for any integer (1/3 is refused: ``1 % (1/3)``
    is 0.333...); 0.5 and 1/64 are answered."""
    from engine.patches.torch_export import divides_every_integer

    if divides_every_integer(divisor):
        assert n % divisor == 0.0
    assert divides_every_integer(0.5) and divides_every_integer(1 / 64) and not divides_every_integer(1 / 3)


def test_a_size_modulo_a_float_factor_exports_with_dynamic_sizes():
    """torch's value ranges and sympy Mod take integers only (``ValueRangeError: Invalid ranges [0.5:-0.5]``
    without the patch); with it the check is 0 and the program runs at other sizes."""
    from engine import DynamoExporter
    from engine.errors import ExportStageError
    from engine.patches.registry import patch_disabled

    sample = {"x": torch.randn(2, 6, 4, 6)}
    with patch_disabled("dynamo", "_patch_size_modulo_a_unit_fraction"), pytest.raises(ExportStageError):
        DynamoExporter().export(_HalvedGrid(), sample, {"dynamic": True})
    program = DynamoExporter().export(_HalvedGrid(), sample, {"dynamic": True})
    other = {"x": torch.randn(3, 10, 8, 4)}
    torch.testing.assert_close(program.module()(**other)["y"], _HalvedGrid()(**other)["y"])


class _PooledSkip(torch.nn.Module):
    """EfficientLoFTR's aggregation: three stride-2 convs, a 4x4 max-pool, a 4x upsample, concatenated with the
    map it came from; the sizes must divide evenly, a guard through two floor divisions."""

    def __init__(self):
        super().__init__()
        self.convs = torch.nn.Sequential(*[torch.nn.Conv2d(3, 3, 3, stride=2, padding=1) for _ in range(3)])
        self.pool = torch.nn.MaxPool2d(4, 4)

    def forward(self, x):
        features = self.convs(x)
        pooled = torch.nn.functional.interpolate(self.pool(features), scale_factor=4, mode="bilinear")
        return {"y": torch.cat([features, pooled], 1)}


def test_a_floor_division_equality_does_not_fail_the_constraint_solver():
    """sympy cannot reduce ``Eq(4*(((s/8)//4)), s/8)`` (``NotImplementedError ... solve_univariate_inequality``
    without the patch); with it the program exports, runs at another size that divides evenly, and keeps the
    guard: a size that does not is refused when the program runs."""
    from engine import DynamoExporter
    from engine.errors import ExportStageError
    from engine.patches.registry import patch_disabled

    sample = {"x": torch.randn(2, 3, 64, 64)}
    with patch_disabled("dynamo", "_patch_constraint_solver_past_floor_division_equalities"):
        with pytest.raises(ExportStageError, match="cannot be solved"):
            DynamoExporter().export(_PooledSkip().eval(), sample, {"dynamic": True})
    model = _PooledSkip().eval()
    program = DynamoExporter().export(model, sample, {"dynamic": True})
    other = {"x": torch.randn(3, 3, 96, 128)}
    torch.testing.assert_close(program.module()(**other)["y"], model(**other)["y"])
    with pytest.raises(Exception, match="Guard failed"):
        program.module()(x=torch.randn(3, 3, 72, 96))


@pytest.mark.parametrize("backend", ["onnx", "executorch"])
def test_a_floor_division_equality_exports_and_runs(backend):
    assert_exports_and_runs(_PooledSkip().eval(), {"x": torch.randn(2, 3, 64, 64)}, {"x": torch.randn(3, 3, 96, 128)},
                             backend, 1e-5)


@settings(max_examples=40, deadline=None)
@given(batch=st.integers(1, 3), rows=st.integers(1, 4), picked=st.integers(1, 5), width=st.integers(1, 3),
       broadcast=st.sampled_from(["none", "values", "indices"]), dim=st.sampled_from([1, -2]), seed=st.integers(0, 99))
def test_take_along_dim_as_gather_equals_torch(batch, rows, picked, width, broadcast, dim, seed):
    """The gather form equals ``torch.take_along_dim`` along a dim, with either argument broadcast."""
    import engine.patches.torch_export as patches

    g = torch.Generator().manual_seed(seed)
    values = torch.randn(batch, rows, width if broadcast != "values" else 1, generator=g)
    indices = torch.randint(0, rows, (batch if broadcast != "indices" else 1, picked, width), generator=g)
    gathered = patches._patch_take_along_dim_as_gather(torch.take_along_dim)
    assert torch.equal(gathered(values, indices, dim=dim), torch.take_along_dim(values, indices, dim=dim))


class _SortedDetections(torch.nn.Module):
    """PP-DocLayoutV2's last step: the detections sorted by score with ``take_along_dim``."""

    def forward(self, scores, boxes):
        order = torch.argsort(scores, dim=1, descending=True)
        return {"scores": torch.take_along_dim(scores, order, dim=1),
                "boxes": torch.take_along_dim(boxes, order[..., None].expand(-1, -1, 4), dim=1)}


def test_take_along_dim_keeps_the_batch_symbolic():
    """torch's kernel pins the batch (the program refuses 3 rows); the gather form keeps it and gives torch's
    values."""
    from engine import DynamoExporter
    from engine.errors import InputError
    from engine.patches.registry import patch_disabled

    sample = {"scores": torch.randn(2, 6), "boxes": torch.randn(2, 6, 4)}
    other = {"scores": torch.randn(3, 6), "boxes": torch.randn(3, 6, 4)}
    with patch_disabled("dynamo", "_patch_take_along_dim_as_gather"):
        pinned = DynamoExporter().export(_SortedDetections(), sample, {"dynamic": True})
    with pytest.raises(InputError):
        run_exported(pinned, other)
    program = DynamoExporter().export(_SortedDetections(), sample, {"dynamic": True})
    compare = compare_leaves(eager_leaves(_SortedDetections(), other), run_exported(program, other), atol=0, rtol=0)
    assert compare.ok, str(compare)


class _WindowOffsets(torch.nn.Module):
    """Music Flamingo's window offsets: a cumulative sum of integer lengths shifted by one, ``cat([0.0],
    cumsum(x)[:-1])`` (the promotion to float goes through the density probe)."""

    def forward(self, lengths):
        return {"offsets": torch.cat([torch.zeros(1), torch.cumsum(lengths, dim=0)[:-1]]) * 2}


def test_a_slice_one_shorter_than_the_input_keeps_it_symbolic():
    """At two windows the slice has one element, and the density probe's ``numel < 2`` pinned the input to 2
    (the program refuses 3 windows); without that test the program runs at 3 and 5."""
    from engine import DynamoExporter
    from engine.errors import InputError
    from engine.patches.registry import patch_disabled

    sample = {"lengths": torch.tensor([3, 4])}
    with patch_disabled("dynamo", "_patch_density_probe_without_numel_guards"):
        pinned = DynamoExporter().export(_WindowOffsets(), sample, {"dynamic": True})
    with pytest.raises(InputError):
        run_exported(pinned, {"lengths": torch.tensor([1, 2, 3])})
    program = DynamoExporter().export(_WindowOffsets(), sample, {"dynamic": True})
    for lengths in (torch.tensor([1, 2, 3]), torch.arange(5)):
        assert torch.equal(run_exported(program, {"lengths": lengths})["offsets"], _WindowOffsets()(lengths)["offsets"])


@settings(max_examples=60, deadline=None)
@given(length=st.integers(1, 20), kernel=st.integers(1, 5), stride=st.one_of(st.none(), st.integers(1, 4)),
       padding=st.integers(0, 2), dilation=st.integers(1, 3), ceil_mode=st.booleans(), indices=st.booleans(),
       batched=st.booleans())
def test_max_pool1d_as_2d_equals_max_pool1d(length, kernel, stride, padding, dilation, ceil_mode, indices, batched):
    """The same values and indices as ``F.max_pool1d`` wherever it accepts the arguments, and the same refusal."""
    from engine.patches.torch_export import max_pool1d_as_2d

    x = torch.randn(*((2,) if batched else ()), 3, length, generator=torch.Generator().manual_seed(length))
    args = (x, kernel, stride, padding, dilation, ceil_mode, indices)
    try:
        expected = torch.nn.functional.max_pool1d(*args)
    except RuntimeError:
        with pytest.raises(RuntimeError):
            max_pool1d_as_2d(*args)
        return
    torch.testing.assert_close(max_pool1d_as_2d(*args), expected, rtol=0, atol=0)


class _PoolMask(torch.nn.Module):
    def forward(self, mask):
        return torch.nn.MaxPool1d(kernel_size=4, stride=4)(mask[:, None].float()).squeeze(1)


@pytest.mark.parametrize("backend", ci_cover(["dynamo", "executorch"], ["dynamo"]))
def test_a_max_pooled_length_stays_dynamic(backend):
    """Unpatched, the program takes only the traced length 8 (repro ``max_pool1d_pins_length.py``)."""
    assert_exports_and_runs(_PoolMask(), {"mask": torch.ones(2, 8)}, {"mask": torch.randint(0, 2, (3, 13)).float()},
                            backend, tolerance=0)


class _EntropyOfLogits(torch.nn.Module):
    """Blt's patcher: the entropy of each position's next-token distribution, through ``torch.distributions``."""

    def forward(self, logits):
        return torch.distributions.Categorical(logits=logits).entropy()


def test_a_distribution_built_in_the_forward_exports_and_runs():
    """``Distribution.__init__`` checks its parameters with a Python branch on tensor values, which torch.export
    cannot trace (the default is forced on here: ``torch.compile`` turns it off process-wide). Patched, the check is
    off while exporting, and the entropy matches eager at another shape."""
    from torch.distributions import Distribution
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    logits = torch.randn(2, 5, 7)
    default = Distribution._validate_args
    Distribution.set_default_validate_args(True)
    try:
        with pytest.raises(GuardOnDataDependentSymNode):
            torch.export.export(_EntropyOfLogits(), (logits,), strict=False)
        assert_exports_and_runs(_EntropyOfLogits(), {"logits": logits}, {"logits": torch.randn(3, 4, 7)}, "dynamo",
                                tolerance=1e-6)
        assert Distribution._validate_args is True  # restored after the export
    finally:
        Distribution.set_default_validate_args(default)


class _RollingHash(torch.nn.Module):
    """Blt's byte-group hash: each token's window of the 7 before it (an ``unfold``, whose two last dims both have
    stride 1) times the powers of a prime, summed."""

    def forward(self, ids):
        windows = torch.cat([ids.new_zeros(ids.shape[0], 6), ids], dim=1).unfold(1, 7, 1)
        return (windows * 31 ** torch.arange(7)).sum(-1)


def test_an_elementwise_op_over_tied_strides_keeps_its_length_dynamic():
    """The output layout of ``windows * powers`` compared the length with the window (``seq >= 7``), so plain
    torch.export refuses 5 tokens; patched, the layout choice records no guard and 5 tokens compute eager's hash."""
    ids, shorter = torch.randint(0, 9, (2, 8)), {"ids": torch.randint(0, 9, (3, 5))}
    plain = torch.export.export(_RollingHash(), (ids,), dynamic_shapes=({0: torch.export.Dim.AUTO,
                                                                        1: torch.export.Dim.AUTO},))
    with pytest.raises(AssertionError, match=r"size\(\)\[1\] >= 7"):
        plain.module()(shorter["ids"])
    assert_exports_and_runs(_RollingHash(), {"ids": ids}, shorter, "dynamo", tolerance=0)
