"""ExecuTorch's portable int64 pow and sum compute through double, and its remainder takes the dividend's sign.

Pattern: Blt's byte-group hash (modeling_blt.py rolling_polynomial_hash / byte_group_hash_function): each window's
bytes times the powers of a prime near 1e9, summed, then `% vocab`. Torch computes the powers and the sum exactly,
wrapping modulo 2**64 (1000000007**2 = 1000000014000000049 needs 60 bits), and its remainder takes the divisor's sign
(Python's). The ExecuTorch program returns the square rounded past 2**53 (1000000014000000000), the overflowing cube
as the int64 minimum, the sum rounded, and -25754 for (-2**63 + 30054) % 30000 where torch gives 4246.
Error: not an exception: the .pte's int64 results differ from torch's.
Tracker: pytorch/executorch
"""

import sys

import torch
from executorch.exir import to_edge_transform_and_lower
from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer


class Hash(torch.nn.Module):
    def forward(self, base, exponents, products, dividends):
        return base ** exponents, products.sum(-1), dividends % 30000


inputs = (torch.tensor([1000000007]), torch.arange(4),
          torch.tensor([[255, 17000000119, 3000000042000000147]]), torch.tensor([-9223372036854745754, 27000]))
et = to_edge_transform_and_lower(torch.export.export(Hash(), inputs)).to_executorch()
got, expected = _load_for_executorch_from_buffer(et.buffer).forward(inputs), Hash()(*inputs)
wrong = [name for name, g, want in zip(("pow", "sum", "remainder"), got, expected) if not torch.equal(g, want)]
if wrong:
    print(f"REPRODUCES: ExecuTorch's int64 {', '.join(wrong)} differ from torch's exact results "
          f"({[g.tolist() for g in got]} vs {[w.tolist() for w in expected]})", file=sys.stderr)
    raise SystemExit(10)
print("PASSES: ExecuTorch computes torch's int64 pow, sum and remainder", file=sys.stderr)
