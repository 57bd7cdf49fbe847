"""Complex tensors as real pairs: the rewritten program computes what the complex one does, and ONNX and
ExecuTorch (which run no complex tensors) take it."""

from __future__ import annotations

import functools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.patches.complex_pairs import complex_as_real_pairs
from tests.engine.patches.export_checks import assert_exports_and_runs


class _ComplexRotary(torch.nn.Module):
    """DeepSeek-V2's rotary embedding: ``polar`` frequencies times ``view_as_complex`` pairs of the query."""

    def forward(self, q, positions):
        inv_freq = 1.0 / (10000 ** (torch.arange(0, q.shape[-1], 2, dtype=torch.float32) / q.shape[-1]))
        freqs = positions[..., None].float() * inv_freq
        freqs_cis = torch.polar(torch.ones_like(freqs), freqs) * 0.5
        q_ = torch.view_as_complex(q.float().reshape(*q.shape[:-1], -1, 2))
        rotated = q_ * freqs_cis.unsqueeze(1)[..., : q_.shape[-1]]
        return torch.view_as_real(rotated).flatten(3).type_as(q)


class _FourierMixing(torch.nn.Module):
    """FNet's token mixing: the real part of a 2-D FFT over (sequence, hidden), and of a 1-D one."""

    def forward(self, x):
        return torch.fft.fftn(x, dim=(1, 2)).real + torch.fft.fft(x, dim=1).imag


class _CrossSpectrum(torch.nn.Module):
    """Autoformer's autocorrelation before its inverse transform: the real spectrum of the queries times the
    conjugate spectrum of the keys."""

    def forward(self, q, k):
        spectrum = torch.fft.rfft(q, n=q.shape[1], dim=1) * torch.conj(torch.fft.rfft(k, dim=1))
        return spectrum.real + 2 * spectrum.imag


class _InverseSTFTHead(torch.nn.Module):
    """A vocoder head: a spectrum from magnitude and phase, back to samples with ``irfft``."""

    def __init__(self, norm):
        super().__init__()
        self.norm = norm

    def forward(self, magnitude, phase):
        return torch.fft.irfft(torch.polar(magnitude.exp(), phase), dim=1, norm=self.norm)


def _rotary_inputs(batch, heads, seq, dim, seed):
    g = torch.Generator().manual_seed(seed)
    return {"q": torch.randn(batch, heads, seq, dim, generator=g), "positions": torch.arange(seq).expand(batch, seq)}


def _signal_inputs(batch, bins, frames, seed):
    g = torch.Generator().manual_seed(seed)
    return {"magnitude": torch.randn(batch, bins, frames, generator=g) * 0.1,
            "phase": torch.rand(batch, bins, frames, generator=g) * 6.28}


@functools.cache
def _rewritten(module, inputs_key):
    """``module`` exported at ``_TRACE[inputs_key]`` with every dim dynamic, complex nodes rewritten."""
    inputs = _TRACE[inputs_key]()
    program = torch.export.export(module, (), inputs, strict=False,
                                  dynamic_shapes={k: {d: torch.export.Dim.AUTO for d in range(v.dim())}
                                                  for k, v in inputs.items()})
    assert complex_as_real_pairs(program.graph_module) > 0
    program.graph_module.graph.eliminate_dead_code()
    program.graph_module.recompile()
    assert not any(isinstance(n.meta.get("val"), torch.Tensor) and n.meta["val"].is_complex()
                   for n in program.graph.nodes)
    return program.module()


def _series_inputs(batch, length, channels, seed):
    g = torch.Generator().manual_seed(seed)
    return {"q": torch.randn(batch, length, channels, generator=g), "k": torch.randn(batch, length, channels, generator=g)}


_ROTARY, _FOURIER, _SPECTRUM = _ComplexRotary(), _FourierMixing(), _CrossSpectrum()
_HEADS = {norm: _InverseSTFTHead(norm) for norm in (None, "ortho", "forward")}
_TRACE = {"rotary": lambda: _rotary_inputs(2, 3, 5, 8, 0), "fourier": lambda: {"x": torch.randn(2, 5, 6)},
          "signal": lambda: _signal_inputs(2, 5, 3, 0), "series": lambda: _series_inputs(2, 6, 3, 0)}


@settings(max_examples=15, deadline=None)
@given(batch=st.integers(2, 3), heads=st.integers(2, 3), seq=st.integers(2, 7), half=st.integers(2, 4),
       seed=st.integers(0, 2**16))
def test_complex_rotary_as_pairs_equals_complex(batch, heads, seq, half, seed):
    module = _ROTARY
    rewritten = _rewritten(module, "rotary")
    inputs = _rotary_inputs(batch, heads, seq, 2 * half, seed)
    torch.testing.assert_close(rewritten(**inputs), module(**inputs), atol=1e-6, rtol=1e-6)


@settings(max_examples=15, deadline=None)
@given(batch=st.integers(2, 3), seq=st.integers(2, 9), hidden=st.integers(2, 9), seed=st.integers(0, 2**16))
def test_fourier_transforms_as_matmuls_equal_fft(batch, seq, hidden, seed):
    module = _FOURIER
    rewritten = _rewritten(module, "fourier")
    x = torch.randn(batch, seq, hidden, generator=torch.Generator().manual_seed(seed))
    torch.testing.assert_close(rewritten(x=x), module(x), atol=1e-5, rtol=1e-5)


@settings(max_examples=15, deadline=None)
@given(batch=st.integers(2, 3), length=st.integers(2, 11), channels=st.integers(2, 4), seed=st.integers(0, 2**16))
def test_real_fourier_and_conjugate_as_pairs_equal_rfft(batch, length, channels, seed):
    """Odd and even lengths: ``rfft`` keeps the ``length // 2 + 1`` non-negative bins."""
    module = _SPECTRUM
    rewritten = _rewritten(module, "series")
    inputs = _series_inputs(batch, length, channels, seed)
    torch.testing.assert_close(rewritten(**inputs), module(**inputs), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("norm", [None, "ortho", "forward"])
@settings(max_examples=10, deadline=None)
@given(batch=st.integers(2, 3), bins=st.integers(2, 9), frames=st.integers(2, 5), seed=st.integers(0, 2**16))
def test_inverse_real_fourier_as_matmuls_equals_irfft(norm, batch, bins, frames, seed):
    module = _HEADS[norm]
    rewritten = _rewritten(module, "signal")
    inputs = _signal_inputs(batch, bins, frames, seed)
    torch.testing.assert_close(rewritten(**inputs), module(**inputs), atol=1e-5, rtol=1e-5)


def test_a_complex_op_without_a_rule_leaves_the_graph_unchanged():
    class Conjugate(torch.nn.Module):
        def forward(self, x):
            return torch.view_as_real(torch.view_as_complex(x).exp())

    program = torch.export.export(Conjugate(), (torch.randn(3, 2),), strict=False)
    before = [n.target for n in program.graph.nodes]
    assert complex_as_real_pairs(program.graph_module) == 0
    assert [n.target for n in program.graph.nodes] == before


@pytest.mark.parametrize("backend", ["onnx", "executorch"])
@pytest.mark.parametrize("case", ["rotary", "fourier", "istft", "spectrum"])
def test_complex_models_export_and_run(backend, case):
    def signal(*shape, seed):
        return {"x": torch.randn(*shape, generator=torch.Generator().manual_seed(seed))}

    module, trace, run = {
        "rotary": (_ComplexRotary(), _rotary_inputs(2, 3, 5, 8, 0), _rotary_inputs(3, 3, 7, 8, 1)),
        "fourier": (_FourierMixing(), signal(2, 5, 6, seed=0), signal(3, 7, 6, seed=1)),
        "istft": (_InverseSTFTHead(None), _signal_inputs(2, 5, 3, 0), _signal_inputs(3, 5, 4, 1)),
        "spectrum": (_CrossSpectrum(), _series_inputs(2, 6, 3, 0), _series_inputs(3, 9, 3, 1)),
    }[case]
    # the 2-D DFT's outputs reach ~20 in float32: 1e-5 absolute is ~4 ulps there, below the rounding of its 42-term
    # sums in either algorithm (onnxruntime's MatMul against torch's pocketfft differed by 1.6e-5 and 2.1e-5 on
    # unseeded inputs); the sweep's own tolerance, 1e-4, for it
    assert_exports_and_runs(module.eval(), trace, run, backend, tolerance=1e-4 if case == "fourier" else 1e-5)
