"""engine.patches.onnx: what the optimizer's rewrite rules may not remove."""

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
