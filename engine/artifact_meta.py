"""Names the exporters write into their artifacts and the runtimes read back: one place, so neither imports the other.

ONNX: graph input/output names and ``metadata_props`` keys (:mod:`engine.onnx_io`, :mod:`engine.runtime_onnx`).
ExecuTorch: the constant method of the ``.pte`` that returns its metadata (:mod:`engine.exporter_executorch`,
:mod:`engine.runtime_executorch`).
"""

from __future__ import annotations

# ── ONNX ────────────────────────────────────────────────────────────────────────────────────────────────────
#: prefix of a graph input whose leaf name is also an output's (a cache fed in and returned updated)
INPUT_PREFIX = "input."
#: name of the graph output when the model returns a bare tensor (whose leaf name is "")
BARE_OUTPUT = "output"
#: ``metadata_props`` keys holding the leaf names of the graph's inputs and outputs, as JSON lists
INPUT_LEAVES_KEY, OUTPUT_LEAVES_KEY = "export_sweep.input_leaves", "export_sweep.output_leaves"
#: ``metadata_props`` key holding the trace's guards on input sizes (:mod:`engine.shape_guards`), as JSON
GUARDS_KEY = "export_sweep.shape_guards"

# ── ExecuTorch ──────────────────────────────────────────────────────────────────────────────────────────────
#: name of the constant method that carries the program's metadata (a JSON string) inside the ``.pte``
META_METHOD = "export_sweep_meta"
META_FORMAT = "export-sweep/executorch/1"
