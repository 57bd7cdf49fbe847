"""``len()`` of a tensor in modeling code stays symbolic under export."""


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
