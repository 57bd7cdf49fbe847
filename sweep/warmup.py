"""Warm the case forkserver: import each backend's stack and export one tiny module through it, once.

Every case runs in a child forked from a forkserver (:mod:`sweep.isolation`). Without warming, each child pays
its backend's first-use costs again: importing ``executorch.exir`` and the XNNPACK partitioner, building the
decomposition tables, resolving op overloads and the lazy imports inside torch.export, the ONNX exporter and the
ExecuTorch passes. For a tiny BERT that is 7 of 20 seconds of an ExecuTorch export, 1.6 of 4.3 s of an ONNX export
and 0.8 of 1.75 s of a torch.export (export seconds in the sweep's rows, cold against warm forkserver). Paying it
once in the forkserver lets every child start warm.

The forkserver imports this module when ``EXPORT_SWEEP_WARM`` (a comma-separated backend list, maybe empty) is
set; it also computes the class catalog there (:func:`warm_catalog`), which every case needs whatever its backend. The
warm-up only exports: it never runs onnxruntime or the ExecuTorch runtime (their thread pools must not exist in
a process that forks), and torch runs with one thread. A backend whose warm-up fails is left cold, with one line
on stderr; the cases then report the real error themselves.
"""

from __future__ import annotations

import os
import sys
import time
import warnings

from sweep.warm_env import WARM_CATALOG_ENV, WARM_ENV, WARMABLE


def tiny_module():
    """``(module, inputs)`` to warm with; torch is imported here so that importing this module stays free."""
    import torch

    class Tiny(torch.nn.Module):
        """Embedding, masked attention, linear, GELU, LayerNorm, softmax: the ops of most tiny models."""

        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(16, 8)
            self.linear = torch.nn.Linear(8, 8)
            self.norm = torch.nn.LayerNorm(8)

        def forward(self, input_ids, attention_mask):
            h = self.embed(input_ids) * attention_mask[..., None]
            q = h[:, None]
            h = torch.nn.functional.scaled_dot_product_attention(q, q, q)[:, 0]
            return {"logits": self.norm(torch.nn.functional.gelu(self.linear(h))).softmax(-1)}

    inputs = {"input_ids": torch.zeros(2, 4, dtype=torch.long), "attention_mask": torch.ones(2, 4)}
    return Tiny().eval(), inputs


def warm(backends) -> dict[str, float]:
    """Export the tiny module with each backend in ``backends`` (``dynamic=True``); seconds per backend."""
    import torch

    from engine import AutoExporter

    torch.set_num_threads(1)
    seconds = {}
    for backend in backends:
        if backend not in WARMABLE:
            continue
        started = time.perf_counter()
        try:
            model, inputs = tiny_module()
            with warnings.catch_warnings(), torch.no_grad():
                warnings.simplefilter("ignore")
                AutoExporter.export(model, inputs, {"export_format": backend, "dynamic": True})
        except Exception as e:  # an optimisation only: the cases report the backend's real error
            print(f"export-sweep: warm-up of {backend} failed ({type(e).__name__}: {e}); its cases start cold", file=sys.stderr)
            continue
        seconds[backend] = round(time.perf_counter() - started, 2)
    return seconds


def warm_catalog() -> None:
    """Compute the class catalog and read the shrinker's overrides once, for every child to inherit.

    Each case looks its class up in the catalog, and building the catalog imports the ~20 model modules whose
    class is listed under several model types: 0.6 to 0.8 s of every case's ``build`` stage, against 15 to 35 ms
    for building the tiny model itself."""
    from sweep.zoo.catalog import catalog
    from sweep.zoo.overrides import load

    catalog()
    load()


if WARM_ENV in os.environ:
    if os.environ.get(WARM_CATALOG_ENV) != "0":
        warm_catalog()
    warm([b for b in os.environ[WARM_ENV].split(",") if b])
