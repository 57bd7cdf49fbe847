"""``len()`` of a tensor in modeling code stays symbolic under export."""


from unittest import mock

import pytest
import torch


def test_len_of_a_tensor_stays_symbolic_under_export():
    """``batch_size = len(source_flatten)`` pins the batch under export; the patched ``len`` keeps it symbolic,
    and returns what the builtin returns in eager."""
    import builtins
    import importlib
    import inspect

    from engine.patches.model.tensor_builtins import _TENSOR_LEN_MODULES, _patch_len_of_tensor_as_symbolic_size

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


def _tiny_timesfm():
    from transformers import TimesFmConfig, TimesFmModelForPrediction

    config = TimesFmConfig(patch_length=4, context_length=16, horizon_length=4, hidden_size=8, intermediate_size=16,
                           num_hidden_layers=1, num_attention_heads=2, head_dim=4)
    torch.manual_seed(0)
    return TimesFmModelForPrediction(config).eval()


@pytest.mark.parametrize("batch, length", [(1, 12), (3, 16), (2, 24)])
def test_a_batch_of_series_as_one_tensor_forecasts_as_the_list(batch, length):
    """The recompiled forecast on a (batch, length) tensor gives the original's forecast of the same series (short,
    exact and long contexts), and a list of series still takes the original's path. (TimesFM 2.5 shares the
    rewrite; its rows in reports/baseline are the check.)"""
    from engine.patches.model.tensor_builtins import _patch_series_padded_at_once, _patch_series_rows_as_one_tensor

    model = _tiny_timesfm()
    cls = type(model)
    forward = _patch_series_rows_as_one_tensor(cls.forward)
    preprocess = _patch_series_padded_at_once(cls._preprocess)
    series = torch.randn(batch, length)
    with torch.no_grad():
        expected = model(past_values=series)
        with mock.patch.object(cls, "_preprocess", preprocess):
            got, listed = forward(model, past_values=series), forward(model, past_values=list(series))
    for output in (got, listed):
        torch.testing.assert_close(output.full_predictions, expected.full_predictions, rtol=1e-6, atol=1e-6)


def test_a_batch_of_series_exports_for_any_batch():
    from tests.engine.patches.export_checks import assert_exports_and_runs

    assert_exports_and_runs(_tiny_timesfm(), {"past_values": torch.randn(2, 16)},
                            {"past_values": torch.randn(3, 16)}, "dynamo", tolerance=1e-5)
