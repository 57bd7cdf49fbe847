"""engine.signature: call_program is the program's module, called without unlifting it."""

import pytest
import torch

from engine.signature import call_program


class _State(torch.nn.Module):
    """A parameter, a persistent and a non-persistent buffer, a tensor constant, a buffer mutated in forward,
    kwargs in another order than the signature's, and a nested output."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)
        self.register_buffer("scale", torch.tensor(2.0))
        self.register_buffer("offset", torch.arange(3.0), persistent=False)
        self.register_buffer("calls", torch.zeros(()))
        self.constant = torch.tensor([1.0, -1.0, 0.5])

    def forward(self, x, mask):
        self.calls.add_(1)
        y = self.linear(x) * self.scale + self.offset + self.constant
        return {"y": y * mask[..., None], "parts": (y.sum(-1), x.shape[1] * mask.float())}


def test_call_program_gives_the_modules_outputs():
    model = _State().eval()
    inputs = {"mask": torch.ones(2, 5, dtype=torch.bool), "x": torch.randn(2, 5, 4)}
    program = torch.export.export(model, (), inputs, strict=False,
                                  dynamic_shapes={"x": {0: torch.export.Dim.AUTO, 1: torch.export.Dim.AUTO},
                                                  "mask": {0: torch.export.Dim.AUTO, 1: torch.export.Dim.AUTO}})
    other = {"x": torch.randn(3, 7, 4), "mask": torch.rand(3, 7) > 0.5}
    got, expected = call_program(program, other), program.module()(**other)
    assert got.keys() == expected.keys()
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_call_program_checks_the_programs_guards():
    model = _State().eval()
    inputs = {"x": torch.randn(2, 5, 4), "mask": torch.ones(2, 5, dtype=torch.bool)}
    program = torch.export.export(model, (), inputs, strict=False)  # static: (2, 5) only
    with pytest.raises(Exception, match="(?i)expected|guard|shape"):
        call_program(program, {"x": torch.randn(3, 5, 4), "mask": torch.ones(3, 5, dtype=torch.bool)})


def test_call_program_checks_the_guard_code_only_the_module_checks():
    """A relation of input sizes that torch keeps as guard code (``_guards_code``: PI0's ``mask rows != images``)
    is checked by the module's ``_guards_fn`` alone: call_program refuses the inputs it refuses."""
    model = _State().eval()
    inputs = {"x": torch.randn(2, 5, 4), "mask": torch.ones(2, 5, dtype=torch.bool)}
    program = torch.export.export(model, (), inputs, strict=False,
                                  dynamic_shapes={"x": {0: torch.export.Dim.AUTO, 1: torch.export.Dim.AUTO},
                                                  "mask": {0: torch.export.Dim.AUTO, 1: torch.export.Dim.AUTO}})
    program._guards_code = ["L['x'].size()[0] != L['x'].size()[1]"]
    square = {"x": torch.randn(3, 3, 4), "mask": torch.ones(3, 3, dtype=torch.bool)}
    for call in (lambda: program.module()(**square), lambda: call_program(program, square)):
        with pytest.raises(Exception, match="Guard failed"):
            call()
    call_program(program, {"x": torch.randn(3, 4, 4), "mask": torch.ones(3, 4, dtype=torch.bool)})
