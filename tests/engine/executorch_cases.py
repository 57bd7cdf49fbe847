"""Shared by the ExecuTorch tests: one dynamic export per tiny architecture, the ``.pte``'s metadata, and a small block
whose ``.pte`` bytes the lowering and speed-patch tests compare."""

from __future__ import annotations

import functools
import json
import warnings

import torch

from engine import ExecutorchConfig, ExecutorchExporter
from engine.artifact_meta import META_METHOD
from engine.dim_bounds import UnboundedDimWarning
from tests.engine.tiny_models import TINY_MODELS


class Block(torch.nn.Module):
    """Embedding, masked attention, linear, GELU, LayerNorm: XNNPACK takes some nodes, not others (several partitions)."""

    def __init__(self):
        super().__init__()
        self.embed, self.linear, self.norm = torch.nn.Embedding(16, 8), torch.nn.Linear(8, 8), torch.nn.LayerNorm(8)

    def forward(self, input_ids, attention_mask):
        h = self.embed(input_ids) * attention_mask[..., None]
        q = h[:, None]
        h = torch.nn.functional.scaled_dot_product_attention(q, q, q)[:, 0]
        return self.norm(torch.nn.functional.gelu(self.linear(h)))


def size_symint(env, name: str, hint: int, lower: int, upper: int) -> torch.SymInt:
    """A size symbol of shape environment ``env`` in ``[lower, upper]``, traced at ``hint`` (what memory planning bounds)."""
    from torch._dynamo.source import ConstantSource
    from torch.utils._sympy.value_ranges import ValueRanges

    symbol = env.create_symbol(hint, ConstantSource(name))
    env.var_to_range[symbol] = ValueRanges(lower, upper)
    return env.create_symintnode(symbol, hint=hint)


def pte_bytes() -> bytes:
    torch.manual_seed(0)
    inputs = {"input_ids": torch.randint(0, 16, (2, 5)), "attention_mask": torch.ones(2, 5)}
    return ExecutorchExporter().export(Block().eval(), inputs, config=ExecutorchConfig(dynamic=True)).buffer


@functools.cache
def pte_bytes_with_every_patch() -> bytes:
    """The reference the checks below compare with, exported once per session."""
    return pte_bytes()


#: the planned activation arena of a tiny model stays small: bounds come from the config and the sample, not a
#: large generic cap (which plans GBs); the largest today is t5 (~69 MiB: no position limit, so 256 tokens x batch 8)
MAX_PLANNED_BYTES = 128 * 2**20


@functools.cache
def dynamic_export(name: str):
    """One dynamic export per architecture for the whole session: (model, manager, caught warnings)."""
    tiny = TINY_MODELS[name]
    model = tiny.model()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        manager = ExecutorchExporter().export(model, tiny.inputs("trace"), config=ExecutorchConfig(dynamic=True))
    return model, manager, [w for w in caught if issubclass(w.category, UnboundedDimWarning)]


def pte_meta(manager) -> dict:
    return json.loads(manager._config_methods[META_METHOD])


class TwoLinear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(4, 8), torch.nn.Linear(8, 3)

    def forward(self, x):
        return {"y": self.b(torch.relu(self.a(x)))}
