"""The one-pass lowering (:mod:`engine.executorch_lowering`) writes the bytes ``to_edge_transform_and_lower`` writes,
and falls back to it on an ExecuTorch that lacks one of its steps."""

from __future__ import annotations


import pytest


pytest.importorskip("executorch", reason="the executorch extra is not installed")


from tests.engine.executorch_cases import pte_bytes, pte_bytes_with_every_patch  # noqa: E402



def _reference_lowering(program, partitioners, config, constant_methods):
    from executorch.exir import to_edge_transform_and_lower

    return to_edge_transform_and_lower(program, partitioner=partitioners, compile_config=config, constant_methods=constant_methods)


def test_one_pass_lowering_gives_the_bytes_of_to_edge_transform_and_lower(monkeypatch):
    import engine.exporter_executorch as exporter

    ours = pte_bytes_with_every_patch()  # (before the swap: the cache must hold our lowering's bytes)
    monkeypatch.setattr(exporter, "lower", _reference_lowering)
    assert pte_bytes() == ours


def test_lowering_falls_back_when_executorch_lacks_a_step(monkeypatch):
    from executorch.exir.program import _program

    import engine.executorch_lowering as lowering

    calls = []
    real = _program.to_edge_transform_and_lower
    monkeypatch.setattr(lowering, "_ONE_PASS_HELPERS", (*lowering._ONE_PASS_HELPERS, "_a_step_of_a_future_executorch"))
    monkeypatch.setattr(_program, "to_edge_transform_and_lower", lambda *a, **k: calls.append(1) or real(*a, **k))
    assert pte_bytes() and calls == [1]
