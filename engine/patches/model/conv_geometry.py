"""Convolution geometry (padding, output length) computed in Python integer math from the conv's own fields.

Pattern: padding and lengths derived with tensor ops from a conv's kernel, stride and dilation (``torch.tensor``
of ints, ``ceil`` of a tensor): data to torch.export, so the output length is data-dependent. The conv's fields are
Python ints, so the same formulas in integer math keep every length a function of the input's size.
"""

from __future__ import annotations

import torch

from engine.patches.registry import register_patch


_TENSOR_GEOMETRY_CONVS = (
    ("encodec", "EncodecConv1d"),
    ("mimi", "MimiConv1d"),
    ("pocket_tts_audio_tokenizer", "PocketTTSAudioTokenizerConv1d"),
    ("wavtokenizer", "WavTokenizerConv1d"),
)


def conv_geometry(conv: torch.nn.Conv1d) -> dict[str, int]:
    """The padded Conv1d's geometry as ``__init__`` derives it from its ``nn.Conv1d``: effective kernel size
    ``(k - 1) * dilation + 1``, stride, total padding ``kernel - stride`` and its right/left halves."""
    stride = conv.stride[0]
    kernel_size = (conv.kernel_size[0] - 1) * conv.dilation[0] + 1
    padding_total = kernel_size - stride
    return {"stride": stride, "kernel_size": kernel_size, "padding_total": padding_total,
            "padding_right": padding_total // 2, "padding_left": padding_total - padding_total // 2}


@register_patch("dynamo", *(f"transformers.models.{m}.modeling_{m}.{c}.forward" for m, c in _TENSOR_GEOMETRY_CONVS))
def _patch_conv_geometry_as_python_ints(original):
    """Pattern: a Conv1d's stride, kernel size and padding kept as 0-d tensor buffers (``EncodecConv1d`` and its copies
    in Mimi, PocketTTS and WavTokenizer), so the pad amounts handed to ``F.pad`` are tensors; under export buffers are
    fake, ``F.pad`` reads them with ``.item()`` and every later length is unbacked (Mimi guards on it in attention;
    Encodec's reflect padding branches on ``if length <= max_pad``). Rewrite: the geometry is fixed at ``__init__`` from
    the wrapped ``nn.Conv1d``; the forward runs with those Python ints in the instance's ``__dict__`` (read before
    buffers), restored after; see also ``_patch_extra_conv_padding_in_integer_math``. No upstream issue found for the
    buffers."""

    def forward(self, *args, **kwargs):
        geometry = conv_geometry(self.conv)
        saved = {name: self.__dict__[name] for name in geometry if name in self.__dict__}
        self.__dict__.update(geometry)
        try:
            return original(self, *args, **kwargs)
        finally:
            for name in geometry:
                del self.__dict__[name]
            self.__dict__.update(saved)

    return forward


@register_patch("dynamo", *(f"transformers.models.{m}.modeling_{m}.{c}._get_extra_padding_for_conv1d"
                            for m, c in _TENSOR_GEOMETRY_CONVS))
def _patch_extra_conv_padding_in_integer_math(original):
    """Pattern: the right padding that makes the last conv window whole, ``ceil((L - k + p) / s + 1) - 1``
    computed on tensors in float (``_get_extra_padding_for_conv1d``). With the geometry as Python ints
    (``_patch_conv_geometry_as_python_ints``), the same count in integer math, ``ceil((L - k + p) / s)`` as
    ``(L - k + p + s - 1) // s``, keeps the padding a symbolic expression of the length ``L`` (exact, where the
    float form is exact: lengths below 2**24). The numerator is ``L - 1`` (``p = k - s``), never negative: ONNX
    integer ``Div`` truncates, so a floor division of a negative number would round the other way there."""

    def _get_extra_padding_for_conv1d(self, hidden_states):
        if torch.is_tensor(self.stride):  # called outside the patched forward: the original's tensors
            return original(self, hidden_states)
        length = hidden_states.shape[-1]
        n_frames = (length - self.kernel_size + self.padding_total + self.stride - 1) // self.stride
        return n_frames * self.stride + self.kernel_size - self.padding_total - length

    return _get_extra_padding_for_conv1d


#: modules with the same (copied) MuSE ``get_vision_pixel_shuffle_index``
