"""engine.patches.onnx: what the optimizer's rewrite rules may not remove."""

import pytest
import torch

import engine.exporter_onnx  # noqa: F401  (registers the "onnx" patches)
import engine.patches
from engine import OnnxConfig, OnnxExporter, run_exported


class _EpsilonNorm(torch.nn.Module):
    """MuseGlimmer's post-norm: ``x * rsqrt(mean(x**2) + 1e-8)``, on an input whose mean square is the epsilon."""

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-8)


def _max_diff_after_optimizing() -> float:
    model, inputs = _EpsilonNorm().eval(), {"x": torch.full((2, 8), 1e-4)}
    artifact = OnnxExporter().export(model, inputs, OnnxConfig(dynamic=False, optimize=True))
    [got] = run_exported(artifact, inputs).values()
    return float((got - model(**inputs)).abs().max())


def test_an_epsilon_of_1e8_survives_the_no_op_rules():
    assert _max_diff_after_optimizing() < 1e-5
    with engine.patches.patch_disabled("onnx", "_patch_zero_constant_matches_only_zero"):
        assert _max_diff_after_optimizing() > 0.1  # onnxscript's add_0 rule takes the 1e-8 for a 0


class _SqueezeOfSelectedRows(torch.nn.Module):
    """Mistral3's merged image patches: rows selected by a mask (a data-dependent count), then ``squeeze(0)``."""

    def forward(self, x, keep):
        return (x[keep] * 2).squeeze(0)


def test_a_squeeze_traced_as_a_no_op_is_not_an_onnx_squeeze(monkeypatch):
    """torch keeps the selected rows' dim (its size is not known to be 1); so does the ONNX program, for any count,
    which ONNX's Squeeze of that dim refuses when the fix is left out."""
    from engine.patches import registry
    from engine.patches.onnx import _fix_squeeze_traced_as_no_op

    model = _SqueezeOfSelectedRows().eval()
    trace = {"x": torch.randn(5, 3), "keep": torch.tensor([True, False, True, True, False])}
    run = {"x": torch.randn(4, 3), "keep": torch.tensor([True, True, False, True])}
    config = OnnxConfig(dynamic=True)
    [got] = run_exported(OnnxExporter().export(model, trace, config), run).values()
    torch.testing.assert_close(got, model(**run))
    fixes = [f for f in registry._FX_NODE_FIXES["onnx"] if f is not _fix_squeeze_traced_as_no_op]
    monkeypatch.setitem(registry._FX_NODE_FIXES, "onnx", fixes)
    with pytest.raises(Exception, match="Squeeze"):
        run_exported(OnnxExporter().export(model, trace, config), run)
