"""Names the exporters write into their artifacts and the runtimes read back: one place, so neither imports the other.

ONNX: graph input/output names and ``metadata_props`` keys (:mod:`engine.onnx_io`, :mod:`engine.runtime.onnx`).
ExecuTorch: the constant method of the ``.pte`` that returns its metadata (:mod:`engine.exporter_executorch`,
:mod:`engine.runtime.executorch`).
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
#: ``metadata_props`` keys: the exported model's class name (what every error message starts with), the input
#: specs (:func:`engine.input_checks.specs_to_json`) and the inputs used as indices (:mod:`engine.index_inputs`)
MODEL_KEY, INPUTS_KEY, INDEX_INPUTS_KEY = "export_sweep.model", "export_sweep.inputs", "export_sweep.index_inputs"
#: ``metadata_props`` key holding the draws made program inputs (:mod:`engine.random_draws`), as JSON
DRAWS_KEY = "export_sweep.random_draws"

# ── ExecuTorch ──────────────────────────────────────────────────────────────────────────────────────────────
#: name of the constant method that carries the program's metadata (a JSON string) inside the ``.pte``
META_METHOD = "export_sweep_meta"
META_FORMAT = "export-sweep/executorch/1"

# ── torch.export (.pt2) ─────────────────────────────────────────────────────────────────────────────────────
#: the extra file of a saved ``.pt2`` listing the pytree types (ModelOutput, Cache classes) its inputs and outputs
#: use, as ``module.QualName`` strings: registered before the program is loaded (:mod:`engine.program_io`)
PYTREE_TYPES_FILE = "export_sweep_pytree_types.json"
