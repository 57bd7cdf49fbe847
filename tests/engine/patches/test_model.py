"""Model patches compute what the code they replace computes."""

import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.models.mamba.modeling_mamba import mamba_selective_scan

from engine.patches.model import _GATED_DELTA_MODULES, closed_form_selective_scan, unit_lower_triangular_inverse


@settings(max_examples=25, deadline=None)
@given(
    batch=st.integers(1, 3),
    channels=st.integers(1, 6),
    state=st.integers(1, 5),
    seq=st.integers(1, 12),
    with_skip=st.booleans(),
    with_gate=st.booleans(),
    last_state=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_closed_form_scan_equals_the_recurrent_loop(batch, channels, state, seq, with_skip, with_gate, last_state, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, channels, seq, generator=g)
    dt = torch.randn(batch, channels, seq, generator=g)
    A = -torch.rand(channels, state, generator=g) * 2  # Mamba's A = -exp(A_log): negative
    B = torch.randn(batch, state, seq, generator=g)
    C = torch.randn(batch, state, seq, generator=g)
    kwargs = dict(
        D=torch.randn(channels, generator=g) if with_skip else None,
        z=torch.randn(batch, channels, seq, generator=g) if with_gate else None,
        delta_bias=torch.randn(channels, generator=g),
        delta_softplus=True,
        return_last_state=last_state,
    )
    expected = mamba_selective_scan(x, dt, A, B, C, **kwargs)  # eager: the recurrent loop
    got = closed_form_selective_scan(x, dt, A, B, C, **kwargs)
    for e, o in zip(expected if last_state else (expected,), got if last_state else (got,)):
        torch.testing.assert_close(o, e, atol=1e-5, rtol=1e-4)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 70), batch=st.integers(1, 3), columns=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_unit_lower_triangular_inverse_solves_like_torch(n, batch, columns, seed):
    """The series of squares is the forward substitution: same solution as LAPACK's unitriangular solve
    (entries scaled like a gated delta rule's UT system: decays below 1 times normalised key products)."""
    g = torch.Generator().manual_seed(seed)
    matrix = torch.randn(batch, n, n, generator=g, dtype=torch.float64) / n  # diagonal and upper part ignored
    rhs = torch.randn(batch, n, columns, generator=g, dtype=torch.float64)
    expected = torch.linalg.solve_triangular(matrix, rhs, upper=False, unitriangular=True)
    torch.testing.assert_close(unit_lower_triangular_inverse(matrix) @ rhs, expected, atol=1e-10, rtol=1e-10)


def test_gated_delta_modules_use_the_export_flag_only_for_the_solve():
    """``_patch_gated_delta_forward_substitution`` turns ``is_torchdynamo_exporting`` off module-wide: safe only
    while the flag guards nothing but the ``solve_triangular`` branch."""
    import importlib
    import inspect

    for module_name in _GATED_DELTA_MODULES:
        source = inspect.getsource(importlib.import_module(f"transformers.models.{module_name}.modeling_{module_name}"))
        uses = re.findall(r"is_torchdynamo_exporting\(\)[^\n]*\n[^\n]*", source)
        assert len(uses) == 1 and "solve_triangular(" in uses[0], (module_name, uses)


def test_exported_gated_delta_rule_has_no_substitution_loop():
    """A 2-layer Qwen3-Next exports with the solve as a few matmuls (no unrolled 63-step loop, no
    ``linalg_solve_triangular`` for ONNX or ExecuTorch to miss) and still computes the eager numbers."""
    from transformers import Qwen3NextConfig, Qwen3NextModel

    from engine import DynamoExporter
    from engine.compare import compare_leaves
    from engine.pytree import get_leaf_tensors
    from engine.runtime import run_exported

    config = Qwen3NextConfig(vocab_size=128, hidden_size=32, intermediate_size=64, moe_intermediate_size=32,
                             shared_expert_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, head_dim=8, linear_num_key_heads=2, linear_num_value_heads=4,
                             linear_key_head_dim=8, linear_value_head_dim=8, num_experts=4, num_experts_per_tok=2,
                             layer_types=["linear_attention", "full_attention"])
    torch.manual_seed(0)
    model = Qwen3NextModel(config).eval()
    inputs = {"input_ids": torch.randint(0, 128, (2, 8)), "attention_mask": torch.ones(2, 8, dtype=torch.long)}
    program = DynamoExporter().export(model, inputs, {"dynamic": True})
    targets = [str(node.target) for node in program.graph.nodes if node.op == "call_function"]
    assert not any("solve_triangular" in t for t in targets)
    assert sum("index_put" in t or "copy_" in t for t in targets) < 10, "the forward substitution was unrolled"
    with torch.no_grad():
        expected = get_leaf_tensors(model(**inputs))
    other = {"input_ids": torch.randint(0, 128, (3, 13)), "attention_mask": torch.ones(3, 13, dtype=torch.long)}
    assert compare_leaves(expected, run_exported(program, inputs)).ok
    with torch.no_grad():
        assert compare_leaves(get_leaf_tensors(model(**other)), run_exported(program, other)).ok


def _greedy_through_exported_steps(model, inputs, new_tokens=6):
    import copy

    from engine import AutoExporter, generate

    components = AutoExporter.export_for_generation(model, inputs, {"dynamic": True})
    other = {k: v.flip(0) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}  # other rows
    with torch.no_grad():
        expected = model.generate(**copy.deepcopy(other), do_sample=False, max_new_tokens=new_tokens)
    return components, generate(components, other, max_new_tokens=new_tokens), expected


def test_prophetnet_decode_steps_take_any_cache_length():
    """ProphetNet's cached position was ``int(padding_idx + cache length + 1)``, which pinned the exported decode
    step to the traced cache length: the second generated token was rejected. Its decode step also asserts one
    token per cached step, so the program is the one-token call (engine.decompose's fallback)."""
    import transformers as tf

    torch.manual_seed(0)
    config = tf.ProphetNetConfig(vocab_size=64, hidden_size=32, encoder_ffn_dim=32, decoder_ffn_dim=32, num_encoder_layers=1,
                                 num_decoder_layers=1, num_encoder_attention_heads=2, num_decoder_attention_heads=2, ngram=2,
                                 num_buckets=8, relative_max_distance=16, max_position_embeddings=64, is_decoder=True,
                                 add_cross_attention=False)
    model = tf.ProphetNetForCausalLM(config).eval()
    inputs = {"input_ids": torch.randint(3, 64, (2, 6), generator=torch.Generator().manual_seed(0))}
    components, got, expected = _greedy_through_exported_steps(model, inputs)
    assert components.plan.templates["decode"]["input_ids"].shape[1] == 1
    assert torch.equal(got, expected), f"\neager:    {expected}\nexported: {got}"


def test_a_returned_recurrent_state_is_fed_to_the_next_step():
    """RWKV takes its ``state`` back each step (generate() does ``model_kwargs["state"] = outputs.state``); the loop
    feeds the step's ``state`` output under that name instead of the captured one. Its WKV recurrence is a Python
    loop over the tokens, so the decode program is the one-token call."""
    import transformers as tf

    torch.manual_seed(0)
    config = tf.RwkvConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, attention_hidden_size=32,
                           intermediate_size=64, context_length=64)
    model = tf.RwkvForCausalLM(config).eval()
    inputs = {"input_ids": torch.randint(0, 64, (2, 6), generator=torch.Generator().manual_seed(0))}
    components, got, expected = _greedy_through_exported_steps(model, inputs)
    assert "state" in components.plan.templates["decode"]
    assert torch.equal(got, expected), f"\neager:    {expected}\nexported: {got}"


def test_len_of_a_tensor_stays_symbolic_under_export():
    """``batch_size = len(source_flatten)`` pins the batch under export; the patched ``len`` keeps it symbolic,
    and returns what the builtin returns in eager."""
    import builtins
    import importlib
    import inspect

    from engine.patches.model import _TENSOR_LEN_MODULES, _patch_len_of_tensor_as_symbolic_size

    len_ = _patch_len_of_tensor_as_symbolic_size(builtins.len)

    class Flatten(torch.nn.Module):
        def __init__(self, length):
            super().__init__()
            self.length = length

        def forward(self, x):
            return x.reshape(self.length(x), -1).sum(-1)

    batch = torch.export.Dim("batch", min=1, max=16)
    for length, accepts_other_batch in ((builtins.len, False), (len_, True)):
        try:
            program = torch.export.export(Flatten(length), (torch.randn(2, 3, 4),), dynamic_shapes=({0: batch},))
        except Exception:  # the builtin pins the dim marked dynamic: torch.export refuses the spec
            assert not accepts_other_batch
            continue
        assert accepts_other_batch
        x = torch.randn(5, 3, 4)
        assert torch.equal(program.module()(x), x.reshape(5, -1).sum(-1))
    assert len_(torch.zeros(3, 2)) == 3 and len_([1, 2]) == 2
    for module_name in _TENSOR_LEN_MODULES:
        source = inspect.getsource(importlib.import_module(f"transformers.models.{module_name}.modeling_{module_name}"))
        assert "batch_size = len(source_flatten)" in source or "[len(i) for i in scaled_images]" in source, module_name


def _encodec_conv(kernel: int, stride: int, dilation: int, causal: bool, pad_mode: str):
    import transformers as tf
    from transformers.models.encodec.modeling_encodec import EncodecConv1d

    config = tf.EncodecConfig(use_causal_conv=causal, pad_mode=pad_mode, norm_type="weight_norm")
    return EncodecConv1d(config, 2, 3, kernel, stride, dilation).eval()


@settings(max_examples=150, deadline=None)
@given(kernel=st.integers(1, 9), stride=st.integers(1, 5), dilation=st.integers(1, 3), length=st.integers(1, 3000))
def test_conv_padding_in_integer_math_equals_the_tensor_form(kernel, stride, dilation, length):
    """The extra right padding of an Encodec-style conv, computed in integer math from the geometry the conv's
    ``nn.Conv1d`` gives, equals the original's float computation on the tensor buffers."""
    import types

    from transformers.models.encodec.modeling_encodec import EncodecConv1d

    from engine.patches.model import _patch_extra_conv_padding_in_integer_math, conv_geometry

    conv = _encodec_conv(kernel, stride, dilation, causal=True, pad_mode="constant")
    geometry = conv_geometry(conv.conv)
    assert all(geometry[name] == int(getattr(conv, name)) for name in ("stride", "kernel_size", "padding_total"))
    x = torch.zeros(1, 2, length)
    original = EncodecConv1d._get_extra_padding_for_conv1d
    patched = _patch_extra_conv_padding_in_integer_math(original)
    assert patched(types.SimpleNamespace(**geometry), x) == int(original(conv, x))
    assert int(patched(conv, x)) == int(original(conv, x))  # tensors (outside the patched forward): the original


def test_conv_geometry_in_buffers_exports_with_a_dynamic_length():
    """With stride/kernel/padding as 0-d tensor buffers, the pad amounts are unbacked under export (reflect padding
    then branches on them); with the patches the program takes other lengths and matches eager, and the buffers
    are as they were afterwards."""
    import engine

    from engine import DynamoExporter, run_exported

    conv = _encodec_conv(7, 2, 1, causal=False, pad_mode="reflect")
    model = torch.nn.Sequential(conv).eval()  # a submodule, as in a model (the exporter binds the top forward)
    inputs = {"input": torch.randn(2, 2, 23)}
    with engine.patches.patch_disabled("dynamo", "_patch_conv_geometry_as_python_ints"):
        with pytest.raises(Exception, match="data-dependent|GuardOnDataDependent|unbacked"):
            DynamoExporter().export(model, inputs, config={"dynamic": True})
    program = DynamoExporter().export(model, inputs, config={"dynamic": True})
    for length in (23, 40, 9):
        x = {"input": torch.randn(3, 2, length)}
        with torch.no_grad():
            expected = model(**x)
        (got,) = run_exported(program, x).values()
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert torch.is_tensor(conv.padding_total) and "padding_total" in conv._buffers and "stride" not in vars(conv)


@settings(max_examples=25, deadline=None)
@given(
    axial=st.tuples(st.integers(1, 6), st.integers(1, 6)),
    dims=st.tuples(st.integers(1, 4), st.integers(1, 4)),
    batch=st.integers(1, 4),
    data=st.data(),
)
def test_axial_positions_as_one_gather_equal_the_per_sample_selection(axial, dims, batch, data):
    """Reformer's eval axial position embeddings: one index of the whole grid selects each sample's rows as the
    per-sample ``index_select`` of the cut grid does, for any position ids below the grid size."""
    from transformers import ReformerConfig
    from transformers.models.reformer.modeling_reformer import AxialPositionEmbeddings

    from engine.patches.model import _patch_axial_positions_as_one_gather

    seq = data.draw(st.integers(1, axial[0] * axial[1]))
    ids = torch.tensor(data.draw(st.lists(st.lists(st.integers(0, axial[0] * axial[1] - 1), min_size=seq, max_size=seq),
                                          min_size=batch, max_size=batch)))
    config = ReformerConfig(axial_pos_shape=list(axial), axial_pos_embds_dim=list(dims), hidden_size=sum(dims),
                            attn_layers=["local"], local_attn_chunk_length=1)
    module = AxialPositionEmbeddings(config).eval()
    for weight in module.weights:
        torch.nn.init.normal_(weight)
    patched = _patch_axial_positions_as_one_gather(AxialPositionEmbeddings.forward)
    assert torch.equal(patched(module, ids), AxialPositionEmbeddings.forward(module, ids))


def test_axial_positions_export_with_any_batch():
    """Without the patch the per-sample loop pins the batch to the traced one (the exported program rejects 3)."""
    from transformers import ReformerConfig
    from transformers.models.reformer.modeling_reformer import AxialPositionEmbeddings

    from engine.patches.registry import apply_patches

    config = ReformerConfig(axial_pos_shape=[4, 4], axial_pos_embds_dim=[2, 3], hidden_size=5,
                            attn_layers=["local"], local_attn_chunk_length=1)
    module = AxialPositionEmbeddings(config).eval()
    ids = torch.arange(6).expand(2, 6)
    batch = torch.export.Dim("batch", min=1, max=8)
    with apply_patches("dynamo"):
        program = torch.export.export(module, (ids,), dynamic_shapes=({0: batch},), strict=False)
    other = torch.tensor([[3, 1, 0, 4, 4, 9], [15, 2, 2, 0, 1, 1], [7, 7, 8, 12, 13, 14]])
    assert torch.equal(program.module()(other), module(other))


def _funnel_config(separate_cls: bool, truncate_seq: bool, blocks: int):
    from transformers import FunnelConfig

    return FunnelConfig(block_sizes=[1] * blocks, d_model=16, n_head=2, d_head=8, d_inner=32, vocab_size=50,
                        separate_cls=separate_cls, truncate_seq=truncate_seq, num_decoder_layers=1)


@settings(max_examples=60, deadline=None)
@given(separate_cls=st.booleans(), truncate_seq=st.booleans(), blocks=st.integers(1, 4), seq=st.integers(1, 40))
def test_funnel_positions_pool_and_measure_as_the_lists(separate_cls, truncate_seq, blocks, seq):
    """The pooled position lists described by first/last/count give the relative-position aranges the lists give,
    block after block."""
    from transformers.models.funnel.modeling_funnel import FunnelAttentionStructure

    from engine.patches.model import ArithmeticPositions, _patch_funnel_pooled_positions, _patch_funnel_relative_positions

    structure = FunnelAttentionStructure(_funnel_config(separate_cls, truncate_seq, blocks))
    pool = _patch_funnel_pooled_positions(FunnelAttentionStructure.stride_pool_pos)
    relative = _patch_funnel_relative_positions(FunnelAttentionStructure.relative_pos)
    as_list, described = list(range(seq)), ArithmeticPositions(0, 1, seq)
    for block_index in range(blocks):
        if block_index > 0:
            pooled_list, pooled = structure.stride_pool_pos(as_list, block_index), pool(structure, described, block_index)
            if not pooled_list or not as_list:
                return  # eager's gather fails on an empty list: nothing to compare
            expected = structure.relative_pos(as_list, 2 ** (block_index - 1), pooled_list, shift=2)
            assert torch.equal(relative(structure, described, 2 ** (block_index - 1), pooled, shift=2), expected)
            as_list, described = pooled_list, pooled
        assert described.size == len(as_list)
        assert torch.equal(relative(structure, described, 2**block_index), structure.relative_pos(as_list, 2**block_index))


def test_funnel_exports_with_any_sequence_length():
    """Funnel (relative-shift attention, 3 pooling blocks, decoder upsampling): without the patches the program
    accepts 8 tokens only; with them, traced at 8, it computes eager's numbers at 5, 9 and 12, and the patched
    gathers equal the reshapes they replace in eager on every length the model accepts."""
    from transformers import FunnelModel

    from engine import DynamoExporter
    from engine.patches.registry import apply_patches

    for separate_cls, truncate_seq in ((True, True), (False, False)):
        torch.manual_seed(0)
        model = FunnelModel(_funnel_config(separate_cls, truncate_seq, 3)).eval()
        for seq in range(5, 17):
            ids = torch.randint(0, 50, (2, seq))
            with torch.no_grad():
                expected = model(ids).last_hidden_state
                with apply_patches("dynamo"):
                    assert torch.equal(model(ids).last_hidden_state, expected), seq
    program = DynamoExporter().export(model, {"input_ids": torch.randint(0, 50, (2, 8))}, {"dynamic": True})
    for seq in (5, 9, 12):
        ids = torch.randint(0, 50, (3, seq))
        with torch.no_grad():
            assert torch.allclose(program.module()(input_ids=ids).last_hidden_state, model(ids).last_hidden_state,
                                  atol=1e-5), seq


@settings(max_examples=40, deadline=None)
@given(batch=st.integers(1, 3), q=st.integers(1, 7), kv_extra=st.integers(0, 5), window=st.integers(1, 6),
       combine=st.sampled_from(["and", "or"]), data=st.data())
def test_masks_by_broadcasting_equal_the_vmapped_ones(batch, q, kv_extra, window, combine, data):
    """transformers' mask functions (causal, sliding windows, padding, chunks), combined with and/or, give by
    broadcasting the mask ``sdpa_mask`` builds with vmap."""
    from transformers import masking_utils as mu

    from engine.patches.model import _mask_by_broadcasting_first

    kv = q + kv_extra
    padding = torch.tensor(data.draw(st.lists(st.lists(st.booleans(), min_size=kv, max_size=kv), min_size=batch,
                                              max_size=batch)))
    first = data.draw(st.sampled_from([mu.causal_mask_function, mu.bidirectional_mask_function]))
    second = data.draw(st.sampled_from([mu.sliding_window_causal_mask_function(window),
                                        mu.sliding_window_bidirectional_mask_function(window),
                                        mu.chunked_causal_mask_function(window, torch.zeros(batch, dtype=torch.long)),
                                        mu.padding_mask_function(padding)]))
    mask_function = (mu.and_masks if combine == "and" else mu.or_masks)(first, second)
    kwargs = dict(batch_size=batch, q_length=q, kv_length=kv, q_offset=kv - q, mask_function=mask_function,
                  allow_is_causal_skip=False, use_vmap=True)
    expected = mu.sdpa_mask(**kwargs)
    assert torch.equal(_mask_by_broadcasting_first(mu.sdpa_mask)(**kwargs), expected)


def test_a_combined_mask_exports_without_vmap(tmp_path):
    """Without the patch the and-combined mask is a vmapped ``flat_apply`` the program cannot be saved with; with
    it the program has none, saves, loads and computes eager's mask for another length."""
    from torch._export.serde.serialize import SerializeError
    from transformers import masking_utils as mu

    from engine import load_program, save_program
    from engine.patches.registry import apply_patches

    class Windowed(torch.nn.Module):
        def forward(self, x, attention_mask):
            mask = mu.sdpa_mask(batch_size=x.shape[0], q_length=x.shape[1], kv_length=x.shape[1],
                                mask_function=mu.and_masks(mu.padding_mask_function(attention_mask.bool()),
                                                           mu.sliding_window_bidirectional_mask_function(2)),
                                allow_is_causal_skip=False, use_vmap=True)
            return x.sum(-1)[:, None, :, None] * mask

    inputs, seq = (torch.randn(2, 8, 3), torch.ones(2, 8, dtype=torch.long)), torch.export.Dim("seq", min=2, max=64)
    program = torch.export.export(Windowed(), inputs, dynamic_shapes=({1: seq}, {1: seq}))
    with pytest.raises(SerializeError, match="flat_apply"):
        save_program(program, tmp_path / "vmapped.pt2")
    with apply_patches("dynamo"):
        program = torch.export.export(Windowed(), inputs, dynamic_shapes=({1: seq}, {1: seq}))
    assert not [n for n in program.graph.nodes if "flat_apply" in str(n.target)]
    program = load_program(save_program(program, tmp_path / "broadcast.pt2"))
    other = (torch.randn(2, 5, 3), torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]))
    assert torch.equal(program.module()(*other), Windowed()(*other))


def _experts(name: str, experts: int):
    """A tiny experts module of each looped kind, its parameters drawn at random."""
    from types import SimpleNamespace

    from transformers.models.dbrx.modeling_dbrx import DbrxExperts
    from transformers.models.longcat_flash.modeling_longcat_flash import LongcatFlashExperts
    from transformers.models.step3p7.modeling_step3p7 import Step3p7Experts

    config = SimpleNamespace(hidden_size=6, ffn_hidden_size=5, moe_num_experts=experts, ffn_act_fn={"name": "silu"},
                             expert_ffn_hidden_size=5, n_routed_experts=experts - 1, zero_expert_num=1,
                             hidden_act="silu", num_local_experts=experts, moe_intermediate_size=5)
    module = {"dbrx": DbrxExperts, "longcat_flash": LongcatFlashExperts, "step3p7": Step3p7Experts}[name](config)
    for parameter in module.parameters():
        torch.nn.init.normal_(parameter)
    return module.eval()


@pytest.mark.parametrize("name", ["dbrx", "longcat_flash", "step3p7"])
@settings(max_examples=20, deadline=None)
@given(tokens=st.integers(1, 9), experts=st.integers(2, 6), data=st.data())
def test_dense_expert_mixture_equals_the_looped_experts(name, tokens, experts, data):
    """Every expert on every token, weighted by the token's routing weight to it, equals the loop over the hit
    experts (at 1e-4 relative, the sweep's tolerance: the matmuls see more rows), for random routings."""
    import importlib

    from engine.patches import model as patches

    # Longcat's loop squeezes the top-k dim of its mask (``expert_mask[e].squeeze(0)``): it needs top_k >= 2
    top_k = data.draw(st.integers(2 if name == "longcat_flash" else 1, experts))
    module = _experts(name, experts)
    index = torch.stack([torch.randperm(experts)[:top_k] for _ in range(tokens)])
    weights = torch.rand(tokens, top_k)
    hidden = torch.randn(1, tokens, 6) if name == "dbrx" else torch.randn(tokens, 6)
    cls = type(module)
    factory = {"dbrx": patches._patch_dbrx_experts_without_the_hit_loop,
               "longcat_flash": patches._patch_longcat_experts_without_the_hit_loop,
               "step3p7": patches._patch_step3p7_experts_without_the_hit_loop}[name]
    assert importlib.import_module(cls.__module__) is not None
    with torch.no_grad():
        expected = cls.forward(module, hidden, index, weights)
        got = factory(cls.forward)(module, hidden, index, weights)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_eager_experts_trace_as_batched_mm():
    """The OpenAI privacy filter defaults its decorated experts to the looped ``eager`` implementation; traced with
    ``batched_mm`` instead, its program takes another token count, and the model is ``eager`` again afterwards."""
    from transformers import OpenAIPrivacyFilterConfig, OpenAIPrivacyFilterModel

    from engine import DynamoExporter

    torch.manual_seed(0)
    config = OpenAIPrivacyFilterConfig(hidden_size=16, intermediate_size=8, num_hidden_layers=1, num_attention_heads=2,
                                       num_key_value_heads=1, head_dim=8, num_local_experts=4, num_experts_per_tok=2,
                                       vocab_size=50, pad_token_id=0)
    model = OpenAIPrivacyFilterModel(config).eval()
    assert model.config._experts_implementation == "eager"
    program = DynamoExporter().export(model, {"input_ids": torch.randint(0, 50, (2, 8))}, {"dynamic": True})
    assert model.config._experts_implementation == "eager"
    ids = torch.randint(0, 50, (3, 5))
    with torch.no_grad():
        torch.testing.assert_close(program.module()(input_ids=ids).last_hidden_state, model(ids).last_hidden_state,
                                   rtol=1e-4, atol=1e-4)


@settings(max_examples=40, deadline=None)
@given(batch=st.integers(1, 3), prompt=st.integers(0, 4), extra=st.integers(1, 9), seed=st.integers(0, 2**16))
def test_cpmant_mask_with_arange_equals_the_list_one(batch, prompt, extra, seed):
    """CpmAnt's attention mask with the descending positions from ``torch.arange`` equals the one built from a
    reversed Python list, for any padding lengths, spans and contexts."""
    from types import SimpleNamespace

    from transformers.models.cpmant.modeling_cpmant import CpmAntModel

    from engine.patches.model import _patch_descending_positions_as_arange

    g = torch.Generator().manual_seed(seed)
    seqlen = prompt + extra
    owner = SimpleNamespace(prompt_length=prompt)
    input_ids = torch.zeros(batch, seqlen, dtype=torch.long)
    span = torch.randint(0, 2, (batch, seqlen), generator=g)
    context = torch.randint(0, 2, (batch, seqlen), generator=g).bool()
    length = torch.randint(0, extra + 1, (batch,), generator=g)
    patched = _patch_descending_positions_as_arange(CpmAntModel._prepare_attention_mask)
    expected = CpmAntModel._prepare_attention_mask(owner, input_ids, span, context, length)
    assert torch.equal(patched(owner, input_ids, span, context, length), expected)


class WindowPermutingTower(torch.nn.Module):
    """Qwen2.5-VL's pattern: merged tokens reordered into attention windows by an index computed from the grid
    (its length read from data), by ``reshape(seq_len // unit, unit, -1)[window_index]``."""

    spatial_merge_unit = 4

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(6, 6)

    def permute_input_for_window_attn(self, input_tensor, window_index, seq_len):
        input_tensor = input_tensor.reshape(seq_len // self.spatial_merge_unit, self.spatial_merge_unit, -1)
        return input_tensor[window_index, :, :].reshape(seq_len, -1)

    def forward(self, hidden_states, tokens_per_image):
        count = tokens_per_image.sum().item()  # the merged tokens, read from the grid as the helpers do
        torch._check(count >= 0)
        window_index = torch.arange(count).flip(0)
        hidden_states = self.proj(hidden_states)
        seq_len, _ = hidden_states.size()
        return self.permute_input_for_window_attn(hidden_states, window_index, seq_len)


def test_window_permutation_sizes_tied_to_the_packed_input():
    """Unpatched, the permuted rows are ``u`` merged tokens (read from data) times a quotient of the input length,
    and ExecuTorch plans memory for every symbol at its worst case (Qwen2.5-VL: 11.9 GB, which the runtime cannot
    allocate: load_method fails with 0x21); with the lengths checked against the packed input the sizes are
    functions of the input length, the plan is smaller, and one program runs any number of merged tokens as eager
    does."""
    from engine import AutoExporter, run_exported
    from engine.patches.model import _patch_window_permutation_sizes_tied_to_the_input

    def sample(tokens):
        g = torch.Generator().manual_seed(len(tokens))
        return {"hidden_states": torch.randn(4 * sum(tokens), 6, generator=g), "tokens_per_image": torch.tensor(tokens)}

    class Patched(WindowPermutingTower):
        permute_input_for_window_attn = _patch_window_permutation_sizes_tied_to_the_input(
            WindowPermutingTower.permute_input_for_window_attn)

    config = {"export_format": "executorch", "dynamic": True}
    eager = WindowPermutingTower().eval()
    model = Patched().eval()
    model.load_state_dict(eager.state_dict())
    unpatched = AutoExporter.export(eager, sample([3, 5]), config)
    artifact = AutoExporter.export(model, sample([3, 5]), config)
    planned = [sum(a.executorch_program.execution_plan[0].non_const_buffer_sizes) for a in (unpatched, artifact)]
    assert planned[1] < planned[0]
    for tokens in ([3, 5], [2, 4, 6]):
        with torch.no_grad():
            expected = eager(**sample(tokens))
        got = next(iter(run_exported(artifact, sample(tokens)).values()))
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=4), st.integers(1, 6), st.integers(0, 2**16))
def test_audio_chunks_padded_by_gather_equal_the_split(lengths, n_window, seed):
    """Qwen-Omni's ``chunk_and_pad_features`` (split by ``tolist()`` and ``pad_sequence``) and the gather that
    replaces it give the same padded chunks and chunk lengths for any audio lengths and window."""
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import chunk_and_pad_features

    from engine.patches.model import chunk_and_pad_by_gather

    feature_lens = torch.tensor(lengths)
    features = torch.randn(3, int(feature_lens.sum()), generator=torch.Generator().manual_seed(seed))
    expected = chunk_and_pad_features(features, feature_lens, n_window)
    got = chunk_and_pad_by_gather(features, feature_lens, n_window)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_audio_chunks_padded_by_gather_export_for_any_lengths():
    """The split by ``tolist()`` of a tensor of data-dependent length cannot be traced (``Eq(u, 0)``); the gather
    exports once and pads other audio lengths as the original does."""
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import chunk_and_pad_features

    from engine import DynamoExporter, run_exported
    from engine.patches.model import chunk_and_pad_by_gather

    class Chunks(torch.nn.Module):
        def __init__(self, fn):
            super().__init__()
            self.fn = fn

        def forward(self, input_features, feature_lens):
            return self.fn(input_features, feature_lens, 4)

    def sample(lengths):
        lens = torch.tensor(lengths)
        return {"input_features": torch.randn(3, int(lens.sum())), "feature_lens": lens}

    with pytest.raises(Exception):
        DynamoExporter().export(Chunks(chunk_and_pad_features), sample([11, 5]), {"dynamic": True})
    program = DynamoExporter().export(Chunks(chunk_and_pad_by_gather), sample([11, 5]), {"dynamic": True})
    for lengths in ([11, 5], [3, 20, 8]):
        inputs = sample(lengths)
        expected = chunk_and_pad_features(inputs["input_features"], inputs["feature_lens"], 4)
        got = list(run_exported(program, inputs).values())
        for a, b in zip(got, expected):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def _indicator_write(embeds, ids, indicators):
    """Ovis2's visual-indicator write: each indicator's embedding where its id sits, behind an emptiness test."""
    embeds = embeds.clone()
    for i, indicator in enumerate(indicators):
        mask = ids == i
        if mask.any():
            embeds[mask] = indicator
    return embeds


def _rewritten_indicator_write():
    from engine.patches.model import _MaskedWriteWithoutItsEmptinessTest
    from engine.source_rewrite import recompiled

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


def _tiny_rwkv():
    from transformers import RwkvConfig, RwkvModel

    torch.manual_seed(0)
    return RwkvModel(RwkvConfig(vocab_size=50, hidden_size=16, attention_hidden_size=16, intermediate_size=32,
                                num_hidden_layers=2, context_length=64)).eval()


def _tiny_recurrent_gemma():
    from transformers import RecurrentGemmaConfig, RecurrentGemmaModel

    torch.manual_seed(0)
    config = RecurrentGemmaConfig(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                  num_attention_heads=2, num_key_value_heads=1, head_dim=8, lru_width=16,
                                  attention_window_size=16, conv1d_width=4, block_types=["recurrent", "attention"])
    return RecurrentGemmaModel(config).eval()


def _tiny_xlstm():
    from transformers import xLSTMConfig, xLSTMModel

    torch.manual_seed(0)
    # 128 wide: narrower, the config rounds its head dims up and the cache disagrees with the layers
    config = xLSTMConfig(vocab_size=50, hidden_size=128, embedding_dim=128, num_heads=4, num_blocks=2, num_hidden_layers=2)
    return xLSTMModel(config).eval()


@pytest.mark.parametrize("build, patch", [(_tiny_rwkv, "_patch_wkv_time_loop_as_scan"),
                                          (_tiny_recurrent_gemma, "_patch_linear_rnn_time_loop_as_scan"),
                                          (_tiny_xlstm, "_patch_mlstm_time_loop_as_scan")])
def test_a_time_loop_as_a_scan_exports_for_any_length(build, patch):
    """RWKV's WKV recurrence, RecurrentGemma's RG-LRU and xLSTM's mLSTM sequence kernel loop over the sequence in
    Python: without the patch the program, traced at 8 tokens, refuses 5 (the loop was unrolled); with it the
    program runs the traced step as a scan and gives eager's values (the same ops in the same order) at 3, 5 and
    13 tokens."""
    from engine import DynamoExporter, run_exported
    from engine.errors import InputError
    from engine.patches.registry import patch_disabled

    model = build()
    sample = {"input_ids": torch.randint(0, 50, (2, 8))}
    with patch_disabled("dynamo", patch):
        unrolled = DynamoExporter().export(model, sample, {"dynamic": True})
    with pytest.raises(InputError, match="outside the exported bounds"):
        run_exported(unrolled, {"input_ids": torch.randint(0, 50, (2, 5))})
    program = DynamoExporter().export(model, sample, {"dynamic": True})
    assert any(node.target is torch.ops.higher_order.scan for node in program.graph.nodes)
    for length in (3, 5, 13):
        ids = torch.randint(0, 50, (3, length))
        with torch.no_grad():
            expected = model(input_ids=ids).last_hidden_state
        torch.testing.assert_close(program.module()(input_ids=ids).last_hidden_state, expected)


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
    from engine.patches.model import _SizeNumelAsProduct
    from engine.source_rewrite import recompiled

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


def test_a_prefill_shorter_than_the_conv_kernel_runs_on_a_longer_trace():
    """Lfm3's short convolution (kernel 7) pads a prefill's conv state only when the prompt is shorter than the
    kernel: without the patch the program traced at 8 tokens refuses 4; with it the program gives eager's hidden
    states and cached conv state at 4, 7 and 12 tokens."""
    from transformers import DynamicCache, Lfm3Config, Lfm3Model

    from engine import DynamoExporter, run_exported
    from engine.errors import InputError
    from engine.patches.registry import patch_disabled

    torch.manual_seed(0)
    config = Lfm3Config(vocab_size=50, pad_token_id=0, bos_token_id=1, eos_token_id=2, hidden_size=32,
                        intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=8, layer_types=["conv", "full_attention"])
    model = Lfm3Model(config).eval()
    assert model.layers[0].conv.conv_kernel_size == 7
    sample = {"input_ids": torch.randint(0, 50, (2, 8))}
    with patch_disabled("dynamo", "_patch_prefill_conv_state_padded_whatever_its_length"):
        bounded = DynamoExporter().export(model, sample, {"dynamic": True})
    with pytest.raises(InputError, match="outside the exported bounds"):
        run_exported(bounded, {"input_ids": torch.randint(0, 50, (2, 4))})
    program = DynamoExporter().export(model, sample, {"dynamic": True})
    for length in (4, 7, 12):
        ids = torch.randint(0, 50, (3, length))
        with torch.no_grad():
            expected = model(input_ids=ids, cache=DynamicCache(config=config))
        got = program.module()(input_ids=ids)
        torch.testing.assert_close(got.last_hidden_state, expected.last_hidden_state)
        torch.testing.assert_close(got.cache.layers[0].conv_states[0], expected.cache.layers[0].conv_states[0])


def test_the_time_loop_scans_are_undone_for_executorch():
    """ExecuTorch does not run the scan: under the ExecuTorch exporter's patches (applied after every exporter's)
    the three recurrences are the models' own loops again; under the others' they are the scans."""
    import engine.patches.executorch  # noqa: F401  (registers the undoing patch)
    from engine.patches.model import _TIME_LOOPS_AS_SCANS
    from engine.patches.registry import apply_patches, resolve_dotted_path

    def current():
        return [getattr(*resolve_dotted_path(path)) for path in _TIME_LOOPS_AS_SCANS]

    originals = current()
    with apply_patches("dynamo"):
        scans = current()
        assert all(scan is not original for scan, original in zip(scans, originals))
        with apply_patches("executorch"):
            assert current() == originals
        assert current() == scans
