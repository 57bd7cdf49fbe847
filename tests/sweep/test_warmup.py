"""The forkserver warm-up: exports a tiny module per backend, once, and never fails a sweep."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sweep import warmup


def test_warm_exports_each_warmable_backend_and_ignores_the_rest():
    seconds = warmup.warm(["eager", "dynamo", "no-such-backend"])
    assert list(seconds) == ["dynamo"] and seconds["dynamo"] > 0


def test_a_failing_warm_up_leaves_the_backend_cold_with_one_line(monkeypatch, capsys):
    def broken():
        raise RuntimeError("no tiny module today")

    monkeypatch.setattr(warmup, "tiny_module", broken)
    assert warmup.warm(["dynamo"]) == {}
    assert capsys.readouterr().err.strip() == (
        "export-sweep: warm-up of dynamo failed (RuntimeError: no tiny module today); its cases start cold"
    )


def probe(spec, progress):
    """A case target that reports what the forkserver handed it."""
    from sweep.zoo.catalog import catalog

    return {"warmed": "sweep.warmup" in sys.modules, "torch.export loaded": "torch.export" in sys.modules,
            "catalog computed": catalog.cache_info().currsize == 1}


@pytest.mark.parametrize("catalog", [True, False], ids=["catalog", "model-module-only"])
def test_cases_fork_from_a_warmed_forkserver(catalog):
    # a sweep of --model-module models alone never looks a class up: its forkserver skips the catalog (seconds)
    script = textwrap.dedent(f"""
        from sweep.isolation import run_isolated, warm_backends
        from tests.sweep.test_warmup import probe

        warm_backends(["dynamo"], catalog={catalog})
        print(run_isolated(probe, {{}}, timeout=60))
    """)
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=True, cwd=root).stdout
    result = ast.literal_eval(out.strip().splitlines()[-1])
    assert (result["warmed"], result["torch.export loaded"], result["catalog computed"]) == (True, True, catalog)
