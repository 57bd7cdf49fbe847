"""torch.onnx.export(dynamo=True) fails on cross_entropy over logits selected with a boolean mask (unbacked size).

Pattern: FLAVA's masked-image loss, `cross_entropy(head(seq[masked_tokens, :]), labels[masked_tokens])`
(flava/modeling_flava.py:1794-1800). torch.export keeps aten.cross_entropy_loss on a (u0, vocab) input; the ONNX
exporter's decomposition runs torch/_refs/nn/functional nll_loss, whose `if input.numel() == 0` shortcut guards
on it: GuardOnDataDependentSymNode 'Could not guard on data-dependent expression Eq(16*u0, 0)' (ConversionError).
Tracker: pytorch/pytorch
"""

import re
import sys

import torch
import torch.nn.functional as F


class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.head = torch.nn.Linear(8, 16)

    def forward(self, seq, labels):
        masked_tokens = labels.ne(-100)
        logits = self.head(seq[masked_tokens, :])  # (u0, 16): u0 is data-dependent
        return F.cross_entropy(logits.view(-1, 16), labels[masked_tokens].view(-1))


torch.manual_seed(0)
model = M().eval()
seq, labels = torch.randn(2, 5, 8), torch.tensor([[3, -100, 7, -100, 1], [-100, 2, 2, 9, -100]])
try:
    onnx_program = torch.onnx.export(model, (seq, labels), dynamo=True, verbose=False)
except Exception as e:  # noqa: BLE001  (torch.onnx._internal.exporter._errors.ConversionError)
    chain, c = [], e
    while c is not None:
        chain.append(c)
        c = c.__cause__ or c.__context__
    msg = "\n".join(str(c) for c in chain)
    if "GuardOnDataDependentSymNode" in msg + str([type(c).__name__ for c in chain]) and "nll_loss" in msg:
        expr = re.search(r"Could not guard on data-dependent expression (.*?) \(unhinted", msg)
        print(f"REPRODUCES: {type(e).__name__}: GuardOnDataDependentSymNode on {expr.group(1) if expr else '?'}"
              " in torch/_refs nll_loss (its numel() == 0 shortcut)", file=sys.stderr)
        raise SystemExit(10)
    raise

import onnxruntime as ort  # noqa: E402

session = ort.InferenceSession(onnx_program.model_proto.SerializeToString(), providers=["CPUExecutionProvider"])
feeds = {i.name: t.numpy() for i, t in zip(session.get_inputs(), (seq, labels))}
got = torch.from_numpy(session.run(None, feeds)[0])
torch.testing.assert_close(got, model(seq, labels).detach(), atol=1e-4, rtol=1e-4)
print("PASSES: the masked cross_entropy exports to ONNX and matches eager", file=sys.stderr)
