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


@settings(max_examples=200, deadline=None)
@given(size=st.integers(1, 5000), kernel=st.integers(1, 9), stride=st.integers(1, 6), dilation=st.integers(1, 3))
def test_same_padding_without_max_equals_timm(size, kernel, stride, dilation):
    """Where the rewrite applies (extent >= stride) it gives timm's padding for every size; elsewhere it declines."""
    from timm.layers.padding import get_same_padding

    from engine.patches.model.conv_geometry import same_padding_without_max

    total = same_padding_without_max(size, kernel, stride, dilation)
    if (kernel - 1) * dilation + 1 >= stride:
        assert total == get_same_padding(size, kernel, stride, dilation)
    else:
        assert total is None


class _SamePaddedStages(torch.nn.Module):
    """Three stride-2 convs, each after timm's 'same' padding (MobileNetV5's stem and stages)."""

    def __init__(self):
        from timm.layers.padding import pad_same  # timm's patches apply once timm is imported, as a model's build does

        super().__init__()
        self.pad_same = pad_same
        self.convs = torch.nn.ModuleList(torch.nn.Conv2d(3 if i == 0 else 4, 4, 3, 2) for i in range(3))

    def forward(self, pixel_values):
        for conv in self.convs:
            pixel_values = conv(self.pad_same(pixel_values, conv.kernel_size, conv.stride)).relu()
        return pixel_values


def _assert_one_copy_of_the_height_and_runs(model: torch.nn.Module, sample: tuple, others: list[tuple]):
    """Export ``model`` with a dynamic image; the output height's expression holds the input height once, and the
    program computes eager's result at the ``others`` image shapes."""
    import sympy

    from engine import AutoExporter, AutoExportConfig, run_exported

    config = AutoExportConfig.from_dict({"export_format": "dynamo", "dynamic": True})
    program = AutoExporter.from_config(config).export(model, {"pixel_values": torch.randn(*sample)}, config=config)
    (output,) = [node for node in program.graph.nodes if node.op == "output"][0].args[0]
    height = output.meta["val"].shape[2].node.expr
    (symbol,) = height.free_symbols
    assert sum(1 for e in sympy.preorder_traversal(height) if e == symbol) == 1
    for shape in others:
        pixel_values = torch.randn(*shape)
        with torch.no_grad():
            expected = model(pixel_values)
        (got,) = run_exported(program, {"pixel_values": pixel_values}).values()
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_same_padded_stages_keep_one_copy_of_the_image_size():
    """The output height's expression holds the input height once (it held it 27 times, three per stage, and torch's
    time on it grew with that), and the program runs at other sizes as eager does. Fails without
    _patch_same_padding_without_an_idle_max."""
    _assert_one_copy_of_the_height_and_runs(_SamePaddedStages().eval(), (2, 3, 40, 52), [(1, 3, 33, 47), (3, 3, 64, 17)])


class _WindowPooledStages(torch.nn.Module):
    """A strided patch embedding, then two stages that pad the image up to a multiple of a window, as Swin and DaViT
    window attention do, and pool each window."""

    window = 4

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Conv2d(3, 4, 2, 2)

    def forward(self, pixel_values):
        w = self.window
        pixel_values = self.embed(pixel_values)
        for _ in range(2):
            batch, channels, height, width = pixel_values.shape
            pad_bottom, pad_right = (w - height % w) % w, (w - width % w) % w
            padded = torch.nn.functional.pad(pixel_values, (0, pad_right, 0, pad_bottom))
            rows, columns = padded.shape[2] // w, padded.shape[3] // w
            pixel_values = padded.view(batch, channels, rows, w, columns, w).mean((3, 5)).tanh()
        return pixel_values


def test_window_padded_stages_keep_one_copy_of_the_image_size():
    """The pooled height's expression holds the input height once (without the patch, twice per stage), and the
    program runs at other sizes as eager does. Fails without _patch_pad_to_a_multiple_as_a_rounded_size."""
    _assert_one_copy_of_the_height_and_runs(_WindowPooledStages().eval(), (2, 3, 74, 100),
                                            [(1, 3, 66, 94), (3, 3, 128, 34), (2, 3, 36, 42)])
