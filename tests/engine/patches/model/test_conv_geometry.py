"""Conv geometry in integer math equals the tensor form, and exports with a dynamic length."""


import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st


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

    from engine.patches.model.conv_geometry import _patch_extra_conv_padding_in_integer_math, conv_geometry

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
