"""Runtimes: any exported artifact run on its runtime, with one input contract and errors that name their cause.

=============  =====================================================================================================
``dispatch``   :func:`run_exported`: the runner registry, and the ``ExportedProgram`` runner (torch's own)
``onnx``       ``.onnx`` files and ``ONNXProgram`` objects in onnxruntime (imported when such an artifact shows up)
``executorch`` ``.pte`` files and ``ExecutorchProgramManager`` objects in the ExecuTorch runtime (same)
``errors``     what a runtime still refuses, in words that name the cause (kernels, nodes, empty inputs)
=============  =====================================================================================================

The input contract every runner checks is :mod:`engine.input_checks` and :mod:`engine.index_inputs`, shared with
the exporters that record it.
"""

from engine.runtime.dispatch import register_runner, run_exported

__all__ = ["register_runner", "run_exported"]
