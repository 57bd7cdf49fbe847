"""Normalised error categories: many failures, few causes.

``categorize(row)`` maps a result row to a short, stable phrase that names the *cause* of a non-passing case,
so that 300 failures read as a dozen groups. Known causes of torch.export, ONNX, onnxruntime and ExecuTorch get
a fixed name (keeping only what tells causes apart, e.g. the ATen op or the ONNX operator); anything else falls
back to the exception type and the first line of its message with numbers, paths, shapes, quoted names and
the model's own names replaced by placeholders.

Passing rows have the category ``None``. Categories are recomputed from ``status``/``error_type``/``error``
whenever a matrix is built, so improving a rule here regroups old row files too.
"""

from __future__ import annotations

import re
from typing import Any

MAX_LENGTH = 120
BUILD_ERRORS = ("config_error", "init_error", "forward_error")


# Terminal control sequences (torch.onnx colours its messages: "\x1b[1m...\x1b[0m"): colours and any other CSI.
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")


def strip_ansi(text: Any) -> str | None:
    """``text`` as a string without terminal escape sequences (``None`` stays ``None``)."""
    return None if text is None else _ANSI.sub("", str(text))


_BARE_TYPE = re.compile(r"^[\w.]+:$")  # "SpecViolationError:" with its message on the lines below


def first_line(error: str | None) -> str | None:
    """The first non-blank line of an error message, terminal colours removed (``None`` for no message).

    A line that is only the exception's type (``SpecViolationError:``, ExecuTorch's verifier starts its message
    on a new line) gets the next non-blank line appended, so the line names the cause."""
    if not error:
        return None
    lines = [line.strip() for line in strip_ansi(error).splitlines() if line.strip()]
    if not lines:
        return None
    if _BARE_TYPE.match(lines[0]) and len(lines) > 1:
        return f"{lines[0]} {lines[1]}"
    return lines[0]


# ─── Generic normalisation ───────────────────────────────────────────────────────────────────────

_KEEP_QUOTED = {"NoneType", "int", "str", "list", "tuple", "dict", "bool", "float", "Tensor", "Parameter", "bytes"}
_SUBSTITUTIONS = [
    (re.compile(r"(?:[A-Za-z]:)?(?:[\w.\-~]*/)+[\w.\-]+(?::\d+)?"), "<path>"),  # /a/b/c.py:12, ./x/y
    (re.compile(r"\b0x[0-9a-fA-F]+\b"), "<hex>"),
    (re.compile(r"torch\.Size\(\[[^\]]*\]\)"), "torch.Size([…])"),
    (re.compile(r"\[\s*-?\d+(?:\s*,\s*-?\d+)*\s*,?\s*\]"), "[…]"),  # [2, 8], [-1]
    (re.compile(r"\(\s*-?\d+(?:\s*,\s*-?\d+)+\s*,?\s*\)|\(\s*-?\d+\s*,\s*\)"), "(…)"),  # (2, 3), (2,)
    (re.compile(r"\{\s*-?\d+(?:\s*,\s*-?\d+)*\s*\}"), "{…}"),  # onnxruntime shapes {2,8,16}
    (re.compile(r"\b[suqc]\d+\b"), "s?"),  # sympy symbols of torch.export: s0, u12
    (re.compile(r"\b\d+(?:x\d+)+\b"), "NxN"),  # 2x64 (matmul shapes)
    (re.compile(r"(?<![A-Za-z\d])-?\d+(?:\.\d+)?(?:e[-+]?\d+)?"), "N"),  # numbers, but not conv1d/float16
]
_QUOTED = re.compile(r"'([^'\n]{1,200})'|\"([^\"\n]{1,200})\"|`([^`\n]{1,200})`")


def _quoted(match: re.Match) -> str:
    text = next(g for g in match.groups() if g is not None)
    quote = match.group(0)[0]
    keep = text in _KEEP_QUOTED or re.fullmatch(r"[a-z_][a-z0-9_]*", text)  # types, attribute and key names
    return match.group(0) if keep else f"{quote}…{quote}"


def normalise(message: str, names: tuple[str, ...] = ()) -> str:
    """The first line of ``message`` with names, quoted strings, paths, shapes and numbers replaced."""
    text = first_line(message) or ""
    for name in sorted((n for n in names if n and len(n) > 2), key=len, reverse=True):
        text = text.replace(name, "<model>")
    text = _QUOTED.sub(_quoted, text)
    for pattern, replacement in _SUBSTITUTIONS:
        text = pattern.sub(replacement, text)
    text = re.sub(r"\s+", " ", text).strip(" .:")
    return text if len(text) <= MAX_LENGTH else text[: MAX_LENGTH - 1] + "…"


# ─── Known causes ────────────────────────────────────────────────────────────────────────────────
# Each rule: a pattern searched in "error_type: error" (all lines) and a template filled with its groups.

def _op(name: str) -> str:
    """aten.nonzero.default, torch.ops.aten.nonzero.default, aten::nonzero -> aten.nonzero"""
    name = name.replace("torch.ops.", "").replace("torch._ops.", "").replace("::", ".")
    parts = name.split(".")
    if len(parts) >= 3 and parts[-1] in ("default", "Tensor", "Scalar", "int", "self", "out", "dim", "Tensor_Scalar"):
        parts = parts[:-1]
    return ".".join(parts)


_RULES: list[tuple[re.Pattern, Any]] = [
    (re.compile(r"out of memory|MemoryError|Cannot allocate memory", re.I), "out of memory"),
    # torch.export / dynamo
    (re.compile(r"DynamicOutputShapeException: ([\w.:]+)"),
     lambda m: f"torch.export: data-dependent output shape ({_op(m.group(1))})"),
    (re.compile(r"GuardOnDataDependentSymNode|Could not guard on data-dependent|could not extract specialized integer "
                r"from data-dependent|DataDependentOutputException|data-dependent expression"),
     "torch.export: data-dependent branch or value"),
    (re.compile(r"Constraints violated|ConstraintViolationError|inferred to be a constant|specialized to be|"
                r"marked dynamic but"),
     "torch.export: dynamic dimension specialised to a constant"),
    (re.compile(r"Dynamo failed to run FX node with fake tensors: .*?got (\w+)\((['\"])(.*?)\2\)", re.S),
     lambda m: f"torch.export: fake-tensor propagation failed: {m.group(1)}: {normalise(m.group(3))}"),
    (re.compile(r"(?:torch\._dynamo\.exc\.)?Unsupported: (.*)"),
     lambda m: f"torch.export: dynamo cannot trace: {normalise(m.group(1).split('. ')[0])}"),
    (re.compile(r"Cannot insert a Tensor that requires grad as a constant"),
     "torch.export: a tensor that requires grad is used as a constant"),
    (re.compile(r"Mutating module attribute|mutated (?:a )?module attribute|attribute mutation", re.I),
     "torch.export: module attribute mutated in forward"),
    # torch.onnx
    (re.compile(r"No ONNX function found for <OpOverload\(op='([\w.]+)', overload='(\w+)'\)>"),
     lambda m: f"onnx: no translation for {_op(m.group(1) + '.' + m.group(2))}"),
    (re.compile(r"No ONNX function found for ([\w.:]+)"), lambda m: f"onnx: no translation for {_op(m.group(1))}"),
    (re.compile(r"Error when translating node .*?target=([\w.:]+)", re.S),
     lambda m: f"onnx: translation failed for {_op(m.group(1))}"),
    (re.compile(r"onnx\.onnx_cpp2py_export\.checker\.ValidationError|ValidationError: .*onnx", re.I),
     "onnx: the model fails the ONNX checker"),
    # onnxruntime
    (re.compile(r"NOT_IMPLEMENTED : Could not find an implementation for (\w+)\((\d+)\)"),
     lambda m: f"onnxruntime: no kernel for {m.group(1)}({m.group(2)})"),
    (re.compile(r"INVALID_GRAPH : (?:.*?of operator \((\w+)\))?", re.S),
     lambda m: "onnxruntime: invalid graph" + (f" ({m.group(1)})" if m.group(1) else "")),
    (re.compile(r"INVALID_ARGUMENT : .*?(?:Got invalid dimensions|Unexpected input data type|Invalid rank)", re.S),
     "onnxruntime: inputs rejected (type, rank or dimensions)"),
    (re.compile(r"\[ONNXRuntimeError\] : \d+ : (\w+) : .*?while running (\w+) node", re.S),
     lambda m: f"onnxruntime: {m.group(1)} in {m.group(2)} node"),
    (re.compile(r"\[ONNXRuntimeError\] : \d+ : (\w+)"), lambda m: f"onnxruntime: {m.group(1)}"),
    # ExecuTorch
    (re.compile(r"Operator ([\w.:]+) is not (?:in )?(?:Aten Canonical|core ATen)", re.I),
     lambda m: f"executorch: op not in core ATen ({_op(m.group(1))})"),
    (re.compile(r"Missing out variants: \{'([\w.:]+)'"),
     lambda m: f"executorch: no out variant for {_op(m.group(1))}"),
    # torch.export's verifier on load, or ExecuTorch's edge-dialect verifier: the same error type
    (re.compile(r"SpecViolationError"), "verifier: the program violates its dialect's spec (SpecViolationError)"),
    (re.compile(r"ExecuTorch runtime has no kernel for ([\w:.]+)"),
     lambda m: f"executorch runtime: no kernel for {m.group(1)}"),
    # the pybindings print the code as "0x:14"
    (re.compile(r"Failed to load method \w+, error: 0x:?([0-9a-fA-F]+)"),
     lambda m: f"executorch runtime: loading the method failed with 0x{m.group(1)}"),
    (re.compile(r"(?:Failed to execute|method->execute\(\)|execute\(\) failed|load_method).*?(?:error|Error)"
                r"(?: code)?:? *(0x[0-9a-fA-F]+|\d+)", re.S),
     lambda m: f"executorch runtime: error {m.group(1)}"),
    (re.compile(r"Memory planning|memory_planning", re.I), "executorch: memory planning failed"),
]


def _missing_package(message: str) -> str:
    for pattern in (r"requires the ([\w.\-]+) library", r"No module named '([\w.\-]+)'",
                    r"'([\w.\-]+)' is not installed", r"requires ([\w.\-]+) to be installed"):
        found = re.search(pattern, message)
        if found:
            return found.group(1).split(".")[0].lower()
    return "unknown package"


def _discrepancy(error: str) -> str:
    if re.search(r"shape \(.*?\) != eager", error):
        return "discrepancy: output shape differs from eager"
    if re.search(r"missing from the artifact's outputs|not among the eager outputs", error):
        return "discrepancy: outputs differ in structure"
    if re.search(r"\bnan\b|\binf\b", error, re.I):
        return "discrepancy: NaN or inf where eager has none"
    where = "at the second (dynamic) shape" if error.startswith("second") else "at the traced shape"
    return f"discrepancy: values differ {where}"


_ONNX_WRAPPED = re.compile(r"## Exception summary\s*<class '(?:\w+\.)*(\w+)'>: (.*)", re.S)


def categorize(row: dict[str, Any]) -> str | None:
    """The normalised cause of a row's status; ``None`` for ``pass``."""
    status = row.get("status")
    stage = row.get("stage") or "?"
    error = str(row.get("error") or "")
    error_type = row.get("error_type") or ""
    if status == "pass":
        return None
    if status == "timeout":
        return f"timeout in {stage}"
    if status == "crash":
        signal = re.search(r"died \(([^)]*)\)", error)
        return f"crash ({signal.group(1) if signal else 'process died'}) in {stage}"
    if status == "discrepancy":
        return _discrepancy(error)
    if error_type == "missing_dependency":
        return f"missing dependency: {row.get('package') or _missing_package(error)}"
    if status == "skip":
        return "skipped: " + normalise(row.get("skip_reason") or row.get("skiplist") or error or "no reason")
    names = tuple(str(n) for n in (row.get("model"), row.get("model_type")) if n)
    if error_type in BUILD_ERRORS:  # ZooError: "Class: forward_error: [tiny] TypeError: ..."
        message = error.split(f"{error_type}: ", 1)[-1]
        message = re.sub(r"^\[\w+\]\s*", "", message)
        return f"build ({error_type.replace('_', ' ')}): {normalise(message, names)}"
    text = f"{error_type}: {error}" if error_type and not error.startswith(error_type) else error
    for pattern, name in _RULES:
        found = pattern.search(text)
        if found:
            return name(found) if callable(name) else name
    if not text.strip():
        return f"{status} in {stage} (no error message)"
    wrapped = _ONNX_WRAPPED.search(text)
    if wrapped:  # torch.onnx's first line is the same for every error it wraps; the cause is in its summary
        return f"torch.onnx decomposition: {normalise(f'{wrapped.group(1)}: {wrapped.group(2)}', names)}"
    return normalise(text, names)
