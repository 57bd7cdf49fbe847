"""Error normalisation: realistic torch.export / ONNX / onnxruntime / ExecuTorch messages map to few causes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sweep.categories import categorize, first_line, normalise


def fail(error_type, error, **extra):
    return {"status": "fail", "stage": extra.pop("stage", "export"), "error_type": error_type, "error": error, **extra}


_ONNX_STEP = ("ConversionError: Failed to decompose the FX graph for ONNX compatibility. \x1b[96mThis is step 2/3\x1b[0m "
              "of exporting the model to ONNX. Next steps:\n- Create an issue\n\n## Exception summary\n\n")

REALISTIC = [
    (fail("ConversionError", _ONNX_STEP + "<class 'RuntimeError'>: Either your tensor may have escaped from inside a "
          "function being vmapped\n\nWhile executing %new_ones"),
     "torch.onnx decomposition: RuntimeError: Either your tensor may have escaped from inside a function being vmapped"),
    (fail("ConversionError", _ONNX_STEP + "<class 'torch.fx.experimental.symbolic_shapes.GuardOnDataDependentSymNode'>: "
          "Could not guard on data-dependent expression Eq(1024*u0, 0)"),
     "torch.export: data-dependent branch or value"),
    (fail("GuardOnDataDependentSymNode", "GuardOnDataDependentSymNode: Could not guard on data-dependent expression "
          "Eq(u0, 1) (unhinted: Eq(u0, 1)).  (Size-like symbols: u0)\n\nCaused by: x = y.item()  # modeling_x.py:12"),
     "torch.export: data-dependent branch or value"),
    (fail("UserError", "UserError: Constraints violated (batch)! For more information, run with TORCH_LOGS=\"+dynamic\".\n"
          "  - Not all values of batch = L['args'][0].size()[0] in the specified range batch <= 1024 are valid because "
          "batch was inferred to be a constant (2)."),
     "torch.export: dynamic dimension specialised to a constant"),
    (fail("DynamicOutputShapeException", "DynamicOutputShapeException: aten.nonzero.default"),
     "torch.export: data-dependent output shape (aten.nonzero)"),
    (fail("TorchRuntimeError", "TorchRuntimeError: Dynamo failed to run FX node with fake tensors: call_function "
          "<built-in function mul>(*(FakeTensor(..., size=(2, 8)), FakeTensor(..., size=(3, 8))), **{}): got "
          "RuntimeError('The size of tensor a (8) must match the size of tensor b (3) at non-singleton dimension 1')"),
     "torch.export: fake-tensor propagation failed: RuntimeError: The size of tensor a (N) must match the size of "
     "tensor b (N) at non-singleton dimension N"),
    (fail("Unsupported", "Unsupported: Dynamic control flow is not supported at the moment. Please use "
          "functorch.experimental.control_flow.cond to explicitly capture the control flow."),
     "torch.export: dynamo cannot trace: Dynamic control flow is not supported at the moment"),
    (fail("DispatchError", "DispatchError: No ONNX function found for <OpOverload(op='aten.bincount', "
          "overload='default')>. Failure message: No decompositions registered", stage="translate"),
     "onnx: no translation for aten.bincount"),
    (fail("ConversionError", "ConversionError: Error when translating node %_local_scalar_dense : [num_users=1] = "
          "call_function[target=torch.ops.aten._local_scalar_dense.default](args = (%select,), kwargs = {}). See the "
          "stack trace for more information.", stage="translate"),
     "onnx: translation failed for aten._local_scalar_dense"),
    (fail("Fail", "Fail: [ONNXRuntimeError] : 1 : FAIL : Non-zero status code returned while running Reshape node. "
          "Name:'node_Reshape_123' Status Message: /onnxruntime_src/onnxruntime/core/providers/cpu/tensor/"
          "reshape_helper.h:47 onnxruntime::ReshapeHelper::ReshapeHelper(...) input_shape_size == size was false. "
          "Input shape:{2,8,16}, requested shape:{3,8,-1}", stage="run"),
     "onnxruntime: FAIL in Reshape node"),
    (fail("InvalidGraph", "InvalidGraph: [ONNXRuntimeError] : 10 : INVALID_GRAPH : Load model from /tmp/sweep-x/m.onnx "
          "failed:This is an invalid model. Type Error: Type 'tensor(int64)' of input parameter (val_3) of operator "
          "(Mul) in node (node_Mul_4) is invalid.", stage="load"),
     "onnxruntime: invalid graph (Mul)"),
    (fail("NotImplemented", "NotImplemented: [ONNXRuntimeError] : 9 : NOT_IMPLEMENTED : Could not find an "
          "implementation for ScatterND(18) node with name 'node_ScatterND_5'", stage="load"),
     "onnxruntime: no kernel for ScatterND(18)"),
    (fail("ExportError", "ExportError: [ExportErrorType.VIOLATION_OF_SPEC]: Operator torch._ops.aten.nonzero.default "
          "is not Aten Canonical.", stage="lower"),
     "executorch: op not in core ATen (aten.nonzero)"),
    # ExecuTorch's edge verifier: the same cause, worded anew, its message starting on the next line
    (fail("SpecViolationError", "SpecViolationError: \nOperator torch._ops.aten._fft_c2c.default is not in Core ATen "
          "opset (https://pytorch.org/docs/stable/torch.compiler_ir.html#core-aten-ir).\nThere are a few things to try:",
          stage="lower"), "executorch: op not in core ATen (aten._fft_c2c)"),
    (fail("RuntimeError", "RuntimeError: Missing out variants: {'aten::_upsample_bicubic2d_aa'}", stage="lower"),
     "executorch: no out variant for aten._upsample_bicubic2d_aa"),
    # seen on the dynamo backend (torch.export's verifier while loading a saved program): not ExecuTorch's
    (fail("SpecViolationError", "SpecViolationError: Node.meta wrap_with_set_grad_enabled is missing val field.",
          stage="load"), "verifier: the program violates its dialect's spec (SpecViolationError)"),
    (fail("RuntimeError", "RuntimeError: method->execute() failed with error 0x12", stage="run"),
     "executorch runtime: error 0x12"),
    (fail("ExportStageError", "ExportStageError: stage 'run' failed for TapasModel: RuntimeError: the ExecuTorch runtime "
          "has no kernel for aten::scatter_reduce.two_out, which the program calls outside its delegates (Failed to "
          "load method forward, error: 0x:14)", stage="run"),
     "executorch runtime: no kernel for aten::scatter_reduce.two_out"),
    (fail("RuntimeError", "RuntimeError: Failed to load method forward, error: 0x:21", stage="run"),
     "executorch runtime: loading the method failed with 0x21"),
    (fail("forward_error", "ASTForAudioClassification: forward_error: IndexError: Dimension out of range (expected to "
          "be in range of [-3, 2], but got 3)", stage="build", model="ASTForAudioClassification"),
     "build (forward error): IndexError: Dimension out of range (expected to be in range of […], but got N)"),
    (fail("init_error", "DbrxModel: init_error: [tiny] AttributeError: 'DbrxAttentionConfig' object has no attribute "
          "'rope_theta'", stage="build", model="DbrxModel"),
     "build (init error): AttributeError: '…' object has no attribute 'rope_theta'"),
    (fail("missing_dependency", "TimmBackbone: missing_dependency: ImportError: \nTimmBackbone requires the timm "
          "library but it was not found in your environment.", stage="build"),
     "missing dependency: timm"),
    ({"status": "crash", "stage": "lower", "error": "the case process died (SIGSEGV) in stage 'lower'"},
     "crash (SIGSEGV) in lower"),
    ({"status": "timeout", "stage": "export", "error": "case ran past --case-timeout=600s in stage 'export'"},
     "timeout in export"),
    ({"status": "discrepancy", "stage": "compare",
      "error": "second shape: 1 of 3 leaves differ: logits: max abs diff 0.5, max rel diff 1"},
     "discrepancy: values differ at the second (dynamic) shape"),
    ({"status": "discrepancy", "stage": "compare", "error": "traced shape: 1 of 1 leaves differ: logits: shape (2, 3) != eager (2, 4)"},
     "discrepancy: output shape differs from eager"),
    ({"status": "discrepancy", "stage": "compare", "error": "traced shape: 1 of 2 leaves differ: loss: nan mismatch"},
     "discrepancy: NaN or inf where eager has none"),
    (fail("RuntimeError", "RuntimeError: shape '[-1, 2, 20]' is invalid for input of size 21600 in FooModel at "
          "/x/transformers/models/foo/modeling_foo.py:123", model="FooModel"),
     "RuntimeError: shape '…' is invalid for input of size N in <model> at <path>"),
    (fail("RuntimeError", "RuntimeError: mat1 and mat2 shapes cannot be multiplied (2x64 and 32x16)"),
     "RuntimeError: mat1 and mat2 shapes cannot be multiplied (NxN and NxN)"),
]


@pytest.mark.parametrize("row, category", REALISTIC, ids=[c for _, c in REALISTIC])
def test_realistic_messages_map_to_their_cause(row, category):
    assert categorize(row) == category


def test_pass_has_no_category_and_empty_error_still_gets_one():
    assert categorize({"status": "pass"}) is None
    assert categorize({"status": "fail", "stage": "run"}) == "fail in run (no error message)"


_NUMBERS = st.lists(st.integers(0, 10**6), min_size=4, max_size=4)
_PATHS = st.sampled_from(["/tmp/a", "/home/ci/w/x.py:7", "./modeling_x.py"])


def _expanded(numbers, path):
    a, b, c, d = numbers
    return fail("RuntimeError", f"RuntimeError: The expanded size of the tensor ({a}) must match the existing size "
                f"({b}) at dim {c}. Target sizes: [{a}, {d}] in {path}", model=f"Model{a}ForX")


@given(_NUMBERS, _PATHS, _NUMBERS, _PATHS)
def test_messages_that_differ_only_in_numbers_paths_and_names_share_a_category(n1, p1, n2, p2):
    assert categorize(_expanded(n1, p1)) == categorize(_expanded(n2, p2)) == (
        "RuntimeError: The expanded size of the tensor (N) must match the existing size (N) at dim N. "
        "Target sizes: […] in <path>")


def test_twelve_architectures_with_one_cause_read_as_one_category():
    rows = [fail("GuardOnDataDependentSymNode", f"GuardOnDataDependentSymNode: Could not guard on data-dependent "
                 f"expression Eq(u{i}, {i}) (unhinted: Eq(u{i}, {i}))", model=f"M{i}") for i in range(12)]
    rows += [fail("ValueError", f"ValueError: Image features and image tokens do not match, tokens: {i}, features: {i+1}")
             for i in range(12)]
    assert len({categorize(r) for r in rows}) == 2


def test_normalise_keeps_type_and_attribute_names_and_bounds_length():
    assert normalise("TypeError: unsupported operand type(s) for //: 'int' and 'NoneType'") == \
        "TypeError: unsupported operand type(s) for //: 'int' and 'NoneType'"
    assert normalise("KeyError: 'full_attention'") == "KeyError: 'full_attention'"
    assert len(normalise("ValueError: " + "word " * 100)) <= 120
    assert normalise("x conv1d float16 node_Mul_4 -1.5e-3") == "x conv1d float16 node_Mul_N N"


def test_first_line_drops_terminal_colours():
    assert first_line("\n  Failed. \x1b[96mThis is step 2/3\x1b[0m of exporting\nmore") == "Failed. This is step 2/3 of exporting"


def test_first_line():
    assert first_line("\n  \n  ValueError: x\nmore") == "ValueError: x"
    assert first_line(None) is None and first_line("") is None
    # a message that starts below its type line: the line names the cause, not the type alone
    assert first_line("SpecViolationError: \nOperator aten.polar is not in Core ATen\nmore") == (
        "SpecViolationError: Operator aten.polar is not in Core ATen")
    assert first_line("ValueError:") == "ValueError:"
