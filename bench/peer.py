"""The peer (``transformers.exporters``): its exporter and config class per backend, for the benchmarks only.

The engine never imports the peer; the files under ``bench/`` that compare with it get it from here.
"""

from __future__ import annotations


def peer_exporter(backend: str):
    """``(exporter class, config class)`` of the peer for ``backend`` (dynamo, onnx or executorch)."""
    import transformers.exporters as peer

    return {
        "dynamo": (peer.DynamoExporter, peer.DynamoConfig),
        "onnx": (peer.OnnxExporter, peer.OnnxConfig),
        "executorch": (peer.ExecutorchExporter, peer.ExecutorchConfig),
    }[backend]
