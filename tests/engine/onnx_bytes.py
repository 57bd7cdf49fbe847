"""Byte-for-byte comparison of two ONNX models, blind to the one field that differs between exports of the same model.

torch.onnx copies each FX node's stack trace into the model's metadata, and a node that torch.fx generated code for
names its frame ``<eval_with_key>.N``, where N counts the graph modules this process compiled so far. Two exports of
the same model in one process differ in N only; :func:`comparable_bytes` writes every ``N`` as ``*``.
"""

from __future__ import annotations

import re

_GENERATED_FRAME = re.compile(r"<eval_with_key>\.\d+")
STACK_TRACE_KEY = "pkg.torch.onnx.stack_trace"


def comparable_bytes(model) -> bytes:
    """The serialized ``onnx_ir`` model with the generated-code counter of its stack traces masked."""
    import onnx_ir as ir

    proto = ir.serde.serialize_model(model)
    for node in _nodes(proto.graph):
        for prop in node.metadata_props:
            if prop.key == STACK_TRACE_KEY:
                prop.value = _GENERATED_FRAME.sub("<eval_with_key>.*", prop.value)
    return proto.SerializeToString(deterministic=True)


def _nodes(graph):
    for node in graph.node:
        yield node
        for attribute in node.attribute:
            for sub in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs):
                yield from _nodes(sub)
