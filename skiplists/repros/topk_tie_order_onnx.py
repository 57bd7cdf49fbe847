"""onnxruntime and eager select different rows with torch.topk over tied scores: the tie order differs.

Pattern: PPDocLayoutV2's query selection, `_, topk_ind = torch.topk(enc_outputs_class.max(-1).values,
num_queries, dim=1)`, then `enc_outputs_coord_logits.gather(dim=1, index=topk_ind.unsqueeze(-1).repeat(...))`
(modeling_pp_doclayout_v2.py:2264-2267). In the zoo's tiny sample every candidate scores the same: the encoder memory
is ~1e-18, so enc_score_head returns its bias (-0.6931) for all 84 anchors. ONNX TopK breaks ties by the lower index
(0, 1, 2, ...), ATen's CPU topk returns another order (52, 62, 61, ... here; torch does not specify it), so the
gathered boxes (enc_topk_bboxes, the reference points and everything after) differ.
Error: not an exception: the ONNX program's gathered boxes differ from eager's (max abs diff 4.6 on N(0,1) boxes).
Tracker: pytorch/pytorch
"""

import os
import sys
import tempfile

import onnxruntime as ort
import torch


class SelectTopQueries(torch.nn.Module):
    def forward(self, enc_outputs_class, enc_outputs_coord_logits):
        _, topk_ind = torch.topk(enc_outputs_class.max(-1).values, 16, dim=1)
        return enc_outputs_coord_logits.gather(dim=1, index=topk_ind.unsqueeze(-1).repeat(1, 1, 4))


torch.manual_seed(0)
model = SelectTopQueries().eval()
args = (torch.full((2, 84, 2), -0.6931472), torch.randn(2, 84, 4))  # tied scores, distinct boxes
expected = model(*args)
with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "topk.onnx")
    torch.onnx.export(model, args, path, dynamo=True, verbose=False)
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    feeds = {i.name: a.numpy() for i, a in zip(session.get_inputs(), args)}
    got = torch.from_numpy(session.run(None, feeds)[0])
diff = (got - expected).abs().max().item()
if diff > 1e-6:
    eager_ind = torch.topk(args[0].max(-1).values, 16, dim=1).indices[0, :5].tolist()
    print(f"reproduced: onnxruntime gathers other rows than eager on tied scores: max abs diff {diff:.3g} "
          f"(eager topk indices start {eager_ind}, ONNX TopK takes the lowest indices)", file=sys.stderr)
    raise SystemExit(10)
print("passes now: onnxruntime's TopK picks eager's rows on tied scores")
