"""save_program / load_program: the same archive and the same loaded program as torch.export, with each
distinct size expression printed and parsed once."""

from __future__ import annotations

import json
import zipfile

import pytest
import sympy
import torch

from engine import DynamoConfig, DynamoExporter, run_exported
from engine.artifact_meta import PYTREE_TYPES_FILE
from engine.program_io import load_program, save_program
from tests.engine.tiny_models import TINY_MODELS


@pytest.fixture(scope="module", params=["gemma3_text", "mamba2"])  # sliding-window Max() sizes; SSM chunk sizes
def exported(request):
    tiny = TINY_MODELS[request.param]
    program = DynamoExporter().export(tiny.model(), tiny.inputs("trace"), config=DynamoConfig(dynamic=True))
    return tiny, program


def _archive_members(path) -> dict[str, bytes]:
    """Archive contents keyed without the top folder (torch names it after the file)."""
    with zipfile.ZipFile(path) as archive:
        return {name.split("/", 1)[1]: archive.read(name) for name in archive.namelist()}


def test_save_writes_what_torch_export_save_writes(exported, tmp_path):
    _, program = exported
    torch.export.save(program, tmp_path / "torch.pt2")
    save_program(program, tmp_path / "ours.pt2")
    ours = _archive_members(tmp_path / "ours.pt2")
    recorded = ours.pop(f"extra/{PYTREE_TYPES_FILE}")  # the one addition: the pytree classes, for a fresh process
    theirs = _archive_members(tmp_path / "torch.pt2")
    for archive in (ours, theirs):  # a hash of the members, our addition included
        archive.pop(".data/serialization_id", None)
    assert ours == theirs
    assert isinstance(json.loads(recorded), list)


def test_load_gives_what_torch_export_load_gives(exported, tmp_path):
    tiny, program = exported
    path = save_program(program, tmp_path / "model.pt2")
    theirs, ours = torch.export.load(path), load_program(path)
    assert ours.graph_module.code == theirs.graph_module.code
    assert [str(n.meta.get("val")) for n in ours.graph.nodes] == [str(n.meta.get("val")) for n in theirs.graph.nodes]
    assert str(ours.range_constraints) == str(theirs.range_constraints)
    inputs = tiny.inputs("run", seed=1)
    for name, tensor in run_exported(theirs, inputs).items():
        torch.testing.assert_close(run_exported(ours, inputs)[name], tensor, atol=0, rtol=0)


def test_each_distinct_size_expression_is_parsed_once(exported, tmp_path, monkeypatch):
    _, program = exported
    path = save_program(program, tmp_path / "model.pt2")
    parsed: list[str] = []
    sympify = sympy.sympify

    def counting_sympify(a, *args, **kwargs):
        if isinstance(a, str):
            parsed.append(a)
        return sympify(a, *args, **kwargs)

    monkeypatch.setattr(sympy, "sympify", counting_sympify)
    torch.export.load(path)
    torch_parses, parsed[:] = len(parsed), []
    load_program(path)
    assert parsed and len(parsed) == len(set(parsed)) < torch_parses


def test_a_data_dependent_size_checked_equal_to_a_constant_loads(tmp_path):
    """``torch._check(n == 1)`` on a boolean selection's size pins its range to [1, 1]; torch.export.load then finds
    the symbol bound nowhere and refuses the program ("expected no unbacked symbols"). load_program takes it, and
    the loaded program still checks the size."""

    class OnePositive(torch.nn.Module):
        def forward(self, x):
            torch._check(x[x > 0].numel() == 1)
            return x * 2

    program = torch.export.export(OnePositive(), (torch.tensor([1.0, -1.0, -2.0]),))
    loaded = load_program(save_program(program, tmp_path / "one_positive.pt2"))
    x = torch.tensor([-3.0, 4.0, -1.0])
    assert torch.equal(loaded.module()(x), x * 2)
    with pytest.raises(RuntimeError, match="Eq"):
        loaded.module()(torch.tensor([1.0, 2.0, -1.0]))


def test_each_schema_class_has_its_type_hints_resolved_once(exported, tmp_path, monkeypatch):
    """torch's deserializer asks ``typing.get_type_hints`` of a schema class for every node, argument and tensor
    it reads; ``load_program`` resolves each class once."""
    import typing

    _, program = exported
    path = save_program(program, tmp_path / "model.pt2")
    resolved: list = []
    get_type_hints = typing.get_type_hints
    monkeypatch.setattr(typing, "get_type_hints", lambda obj, *a, **k: resolved.append(obj) or get_type_hints(obj, *a, **k))
    torch.export.load(path)
    torch_resolves, resolved[:] = len(resolved), []
    load_program(path)
    assert resolved and len(resolved) == len(set(resolved)) < torch_resolves
