"""onnxruntime's int64 Pow and ReduceSum do not compute torch's exact, wrapping int64 arithmetic.

Pattern: Blt's byte-group hash (modeling_blt.py:1003-1028): each byte's window of g bytes times the powers of a prime
near 1e9, summed, modulo the hash vocabulary, `(windows * prime ** arange(g)).sum(-1) % vocab`, in int64. Torch
computes the powers exactly (1000000007**2 = 1000000014000000049 needs 60 bits) and wraps modulo 2**64 where the
products overflow. onnxruntime's int64 Pow and ReduceSum round results past 2**53 as a double would (the square
comes back as 1000000014000000000, a sum of three products 9 off; the overflowing cube as the int64 minimum where
torch wraps), so the ONNX program's hash ids differ.
Error: not an exception: onnxruntime's Pow and ReduceSum results differ from numpy's (and torch's) int64 ones.
Tracker: microsoft/onnxruntime
"""

import sys

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper


def run(node, inputs):
    graph = helper.make_graph(
        [node], "int64", [helper.make_tensor_value_info(n, TensorProto.INT64, list(a.shape)) for n, a in inputs.items()],
        [helper.make_tensor_value_info("y", TensorProto.INT64, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, inputs)[0]


base, exponents = np.array([1000000007], dtype=np.int64), np.arange(4, dtype=np.int64)
powers = run(helper.make_node("Pow", ["x", "e"], ["y"]), {"x": base, "e": exponents})
exact = np.array([1, 1000000007, 1000000014000000049, -4377642754154037417], dtype=np.int64)  # wrapped, as torch
with np.errstate(over="ignore"):
    products = np.array([[255, 17, 3]], dtype=np.int64) * exact[:3]
    wrapped_sum = products.sum(-1)  # numpy and torch wrap modulo 2**64
sums = run(helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0),
           {"x": products, "axes": np.array([-1], dtype=np.int64)})
wrong = [name for name, got, want in (("Pow", powers, exact), ("ReduceSum", sums, wrapped_sum))
         if not np.array_equal(got, want)]
if wrong:
    print(f"reproduced: onnxruntime's int64 {' and '.join(wrong)} differ from the exact wrapping results "
          f"(Pow {powers.tolist()} vs {exact.tolist()}; ReduceSum {sums.tolist()} vs {wrapped_sum.tolist()})",
          file=sys.stderr)
    raise SystemExit(10)
print("passes now: onnxruntime computes exact, wrapping int64 powers and sums")
