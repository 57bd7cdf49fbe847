"""``auto_dynamic_shapes``: every dim dynamic except the model's constants."""

import pytest
import torch
import transformers as tf
from torch.export import Dim

from engine.pytree import pytree_attributes
from engine.shapes import auto_dynamic_shapes, configured_image_sizes
from tests.engine.tiny_models import ci_cover


def test_image_at_the_configured_size_keeps_channels_height_width_static():
    config = tf.CLIPConfig(vision_config=dict(image_size=32))
    assert (32, 32) in configured_image_sizes(config)  # found in the vision sub-config
    spec = auto_dynamic_shapes({"pixel_values": torch.zeros(2, 3, 32, 32), "input_ids": torch.zeros(2, 5, dtype=torch.long)}, config)
    assert spec["pixel_values"] == {0: Dim.AUTO}
    assert spec["input_ids"] == {0: Dim.AUTO, 1: Dim.AUTO}


def test_image_at_another_size_stays_fully_dynamic():
    config = tf.ConvNextConfig()  # image_size 224
    spec = auto_dynamic_shapes({"pixel_values": torch.zeros(2, 3, 64, 48)}, config)
    assert spec["pixel_values"] == {d: Dim.AUTO for d in range(4)}


def test_rectangular_image_size_and_video_frames():
    config = tf.PretrainedConfig(image_size=[16, 24])
    spec = auto_dynamic_shapes({"pixel_values_videos": torch.zeros(1, 4, 3, 16, 24)}, config)
    assert spec["pixel_values_videos"] == {0: Dim.AUTO, 1: Dim.AUTO}  # batch and frames


def test_without_a_config_every_dim_is_dynamic():
    assert auto_dynamic_shapes({"pixel_values": torch.zeros(1, 3, 32, 32)}) == {"pixel_values": {d: Dim.AUTO for d in range(4)}}


def test_cache_keys_values_grow_and_recurrent_states_vary_by_batch_only():
    from transformers import cache_utils

    attention = cache_utils.DynamicLayer()
    attention.keys, attention.values = torch.zeros(2, 4, 3, 8), torch.zeros(2, 4, 3, 8)
    recurrent = cache_utils.LinearAttentionLayer()
    recurrent.conv_states, recurrent.recurrent_states = {0: torch.zeros(2, 80, 4)}, {0: torch.zeros(2, 8, 8, 8)}
    cache = cache_utils.DynamicCache.__new__(cache_utils.DynamicCache)
    cache_utils.Cache.__init__(cache, layers=[attention, recurrent])

    (layers,) = auto_dynamic_shapes({"past_key_values": cache})["past_key_values"]
    keys_spec = layers[0][[name for name, _ in pytree_attributes(attention)].index("keys")]
    assert keys_spec == {0: Dim.AUTO, 2: Dim.AUTO(min=0)}  # heads and head_dim are the model's; the cache may be empty
    for name, value in zip([name for name, _ in pytree_attributes(recurrent)], layers[1]):
        if name in ("conv_states", "recurrent_states"):
            assert value == {0: {0: Dim.AUTO}}  # [batch, <model constants>]


def test_a_cache_state_with_one_entry_per_cached_token_grows_with_the_keys():
    """DeepSeek-V3.2's indexer keys [batch, seq, dim] beside keys [batch, heads, seq, head_dim]: the sequence dim is
    dynamic (a decode step over a longer cache failed a guard when it was not); a Mamba-like state stays batch-only."""
    from engine.shapes import _cache_layer_spec

    sequence = 9
    assert _cache_layer_spec("indexer_keys", torch.zeros(2, sequence, 16), sequence) == {0: Dim.AUTO, 1: Dim.AUTO(min=0)}
    assert _cache_layer_spec("conv_states", torch.zeros(2, 32, 4), sequence) == {0: Dim.AUTO}
    assert _cache_layer_spec("conv_states", torch.zeros(2, 32, 4), None) == {0: Dim.AUTO}


# ── Lower bounds derived from the 0/1-specialisation floor ──────────────────────────────────────────

class _MaskedStep(torch.nn.Module):
    """A decode step's shape relation: the mask is as long as the cache plus the new tokens."""

    def forward(self, tokens, cache, mask):
        return torch.cat([cache, tokens], dim=1) * mask


def _step_inputs(tokens: int, cache: int) -> dict:
    return {"tokens": torch.ones(2, tokens), "cache": torch.ones(2, cache), "mask": torch.ones(2, tokens + cache)}


def _mask_bound(program) -> int:
    mask = next(n for n in program.graph.nodes if n.name == "mask").meta["val"]
    return int(program.range_constraints[mask.shape[1].node.expr].lower)


def test_a_dim_tied_to_a_sum_of_dynamic_dims_takes_their_unchecked_floor():
    """dynamic=True: the mask's bound of 4 (2 + 2) is relaxed to the floor of 2, so one token over an empty cache
    runs, as its parts (each >= 2 unchecked) already may; with the bound it was rejected."""
    from engine import DynamoConfig, DynamoExporter

    program = DynamoExporter().export(_MaskedStep().eval(), _step_inputs(2, 2), config=DynamoConfig(dynamic=True))
    assert _mask_bound(program) == 2
    short = _step_inputs(1, 0)
    assert torch.equal(program.module()(**short), _MaskedStep()(**short))


def test_without_the_relaxation_the_floor_sum_is_checked_and_explicit_bounds_are_kept():
    from engine import DynamoConfig, DynamoExporter
    from engine.shapes import relax_floor_derived_lower_bounds

    auto = {"tokens": {1: Dim.AUTO}, "cache": {1: Dim.AUTO}, "mask": {1: Dim.AUTO}}
    program = torch.export.export(_MaskedStep(), (), kwargs=_step_inputs(2, 2), dynamic_shapes=auto)
    assert _mask_bound(program) == 4
    with pytest.raises(AssertionError, match=r"mask.size\(\)\[1\] >= 4"):
        program.module()(**_step_inputs(1, 0))
    assert relax_floor_derived_lower_bounds(program) and _mask_bound(program) == 2

    tokens = Dim("tokens", min=3)
    explicit = {"tokens": {1: tokens}, "cache": {1: Dim.AUTO}, "mask": {1: Dim.AUTO}}
    program = DynamoExporter().export(_MaskedStep().eval(), _step_inputs(3, 2), config=DynamoConfig(dynamic_shapes=explicit))
    assert _mask_bound(program) == 5, "a user's Dim(min=...) bounds what it implies"


def test_a_bound_stated_on_the_dim_alone_is_kept():
    from engine.shapes import relax_floor_derived_lower_bounds

    class Windowed(torch.nn.Module):
        def forward(self, x):
            torch._check(x.shape[1] >= 5)
            return x.unfold(1, 5, 1).sum(-1)

    program = torch.export.export(Windowed(), (torch.ones(1, 8),), dynamic_shapes=({1: Dim.AUTO},))
    expr = next(n for n in program.graph.nodes if n.op == "placeholder").meta["val"].shape[1].node.expr
    before = int(program.range_constraints[expr].lower)
    relax_floor_derived_lower_bounds(program)
    assert before >= 5 and int(program.range_constraints[expr].lower) == before


def test_an_infinite_lower_bound_is_left_alone():
    """torch's ``int_oo`` calls itself finite and integer; a range starting there (Lfm2-VL's language model had
    one) is no bound to relax, and once crashed the relaxation with sympy's ``int(oo)`` error."""
    from torch.utils._sympy.numbers import int_oo
    from torch.utils._sympy.value_ranges import ValueRanges

    from engine.shapes import relax_floor_derived_lower_bounds

    auto = {"tokens": {1: Dim.AUTO}, "cache": {1: Dim.AUTO}, "mask": {1: Dim.AUTO}}
    program = torch.export.export(_MaskedStep(), (), kwargs=_step_inputs(2, 2), dynamic_shapes=auto)
    symbol = next(iter(program.range_constraints))
    program.range_constraints[symbol] = ValueRanges(int_oo, int_oo)
    relaxed = relax_floor_derived_lower_bounds(program)
    assert symbol not in relaxed and program.range_constraints[symbol].lower == int_oo


# ── Size-1 sample dims: traced at 2, kept dynamic where the program reproduces the sample ──────────────

from hypothesis import given, settings, strategies as st  # noqa: E402

from engine.shapes import widen_unit_dims  # noqa: E402


@settings(max_examples=50, deadline=None)
@given(shape=st.lists(st.integers(1, 3), min_size=1, max_size=4), marked=st.lists(st.booleans(), min_size=4, max_size=4))
def test_widening_doubles_exactly_the_marked_size_one_dims_and_keeps_every_value(shape, marked):
    value = torch.arange(torch.Size(shape).numel()).reshape(shape)
    spec = {d: Dim.AUTO for d in range(len(shape)) if marked[d]}
    widened = widen_unit_dims({"x": value, "flag": True}, {"x": spec, "flag": None})
    grown = [d for d in spec if shape[d] == 1]
    if not grown:
        assert widened is None
        return
    out = widened["x"]
    assert list(out.shape) == [2 if d in grown else n for d, n in enumerate(shape)]
    assert widened["flag"] is True
    for d in grown:  # each widened dim holds the sample's slice twice
        assert torch.equal(out.narrow(d, 0, 1), out.narrow(d, 1, 1))
    assert torch.equal(out[tuple(slice(0, 1) if d in grown else slice(None) for d in range(len(shape)))], value)


def test_a_dim_with_a_static_spec_or_inside_a_cache_is_not_widened():
    from transformers import cache_utils

    layer = cache_utils.DynamicLayer()
    layer.keys = layer.values = torch.zeros(1, 2, 1, 4)
    assert widen_unit_dims({"x": torch.zeros(1, 5), "cache": layer}, {"x": {1: Dim.AUTO}, "cache": [{0: Dim.AUTO}]}) is None


class _BranchesOnOne(torch.nn.Module):
    """Takes another path when the length is 1 (as code that squeezes a single step does)."""

    def forward(self, x):
        return x * 2 if x.shape[1] == 1 else x + 1


@pytest.mark.parametrize("backend", ci_cover(["dynamo", "onnx", "executorch"], ["dynamo", "onnx"]))
def test_a_one_token_decoder_prompt_stays_dynamic_and_runs_at_three_tokens(backend):
    """Whisper exported with a one-token decoder prompt (generate()'s first call): torch.export specialised the
    length to 1 and the program rejected three tokens ("Guard failed: decoder_input_ids.size()[1] == 1"). Traced at
    two, it runs one and three, matching eager, on every backend; only the features' model constants stay static."""
    import warnings

    from engine import AutoExporter, SpecialisationWarning, run_exported
    from engine.compare import compare_leaves
    from tests.engine.tiny_models import TINY_MODELS, eager_leaves

    if backend == "executorch":
        pytest.importorskip("executorch", reason="the executorch extra is not installed")
    tiny = TINY_MODELS["whisper"]
    model = tiny.model()
    config = {"export_format": backend, "dynamic": True}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        artifact = AutoExporter.from_config(config).export(model, tiny.make_inputs(2, 1, 0), config=config)
    static = [str(w.message) for w in caught if issubclass(w.category, SpecialisationWarning)]
    assert static and "decoder_input_ids" not in static[0], static
    for batch, tokens in ((2, 1), (3, 3)):
        inputs = tiny.make_inputs(batch, tokens, 1)
        comparison = compare_leaves(eager_leaves(model, inputs), run_exported(artifact, inputs), atol=1e-4, rtol=1e-4)
        assert comparison.ok, f"{tokens} tokens: {comparison}"


def test_a_size_one_dim_the_model_branches_on_is_traced_as_sampled_and_named():
    """A program traced at 2 would add 1 where the model doubles a length-1 input: it does not reproduce the sample,
    so the sample is traced as it is, and the specialised dim is named as before."""
    import warnings

    from engine import DynamoExporter, SpecialisationWarning, run_exported

    x = torch.randn(2, 1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        program = DynamoExporter().export(_BranchesOnOne(), {"x": x}, config={"dynamic": True})
    assert torch.equal(run_exported(program, {"x": x})[""], x * 2)  # a bare tensor output is the leaf ""
    assert any("x dim 1 (traced size 1)" in str(w.message) for w in caught if issubclass(w.category, SpecialisationWarning))
