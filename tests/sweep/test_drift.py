"""Following upstream: the second environment's requirements, the drift folder's name, and the pins-vs-baseline
check that stops a pin move from landing without its baseline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.versions import pinned_versions
from sweep.drift import DriftError, folder_name, parse_overrides, requirements
from sweep.results import latest_rows, read_rows

REPO = Path(__file__).resolve().parents[2]


def test_requirements_replace_only_the_named_pins_and_keep_the_rest():
    reqs = requirements(parse_overrides(["torch==9.9.9", "torchvision==9.9.8", "onnxruntime==8.8.8"]))
    assert "torch==9.9.9" in reqs and "torchvision==9.9.8" in reqs and "onnxruntime==8.8.8" in reqs
    pins = pinned_versions()
    for name in ("transformers", "executorch", "onnx", "onnxscript", "torchao"):
        assert f"{name}=={pins[name]}" in reqs  # every other pin, extras included (export-sweep[onnx,executorch])
    assert not any(r.startswith("export-sweep") for r in reqs)
    assert any(r.startswith("pytest") for r in reqs)


def test_torchvision_moves_with_torch_or_the_move_is_refused_by_name():
    assert "torchvision==0.30.0" in requirements(parse_overrides(["torch==2.15.0"]))
    assert "torchvision==0.29.1" in requirements(parse_overrides(["torch==2.14.1+cu128"]))
    assert "torchvision==0.29.2" in requirements(parse_overrides(["torch==2.15.0", "torchvision==0.29.2"]))
    with pytest.raises(DriftError, match="torchvision is built for one torch release and moves with it"):
        requirements(parse_overrides(["torch==3.0.0"]))


@pytest.mark.parametrize("spec, message", [
    ("torch", "expected PACKAGE==VERSION"),
    ("torch>=2.14", "expected PACKAGE==VERSION"),
    ("numpy==2.0", "'numpy' is not pinned in pyproject.toml; pinned: executorch, onnx"),
])
def test_overrides_are_exact_pins_of_pinned_packages(spec, message):
    with pytest.raises(DriftError, match=message):
        parse_overrides([spec])


def test_folder_name_names_the_packages_that_moved():
    old = {"torch": "2.13.0", "transformers": "5.23.0", "onnx": "1.23.2"}
    new = {"torch": "2.14.1+cu128", "transformers": "5.24.0", "onnx": "1.23.2"}
    assert folder_name(old, new) == "torch-2.13.0_transformers-5.23.0-to-torch-2.14.1_transformers-5.24.0"
    assert folder_name(old, {**old, "torch": "2.13.0+cpu"}) == "same-versions"


def test_cli_refuses_a_missing_environment(capsys):
    from sweep.cli import main

    assert main(["drift", "no-such-venv", "--models=smoke"]) == 2
    assert "no-such-venv: no such environment" in capsys.readouterr().err


@pytest.mark.parametrize("report", ["baseline", "generate"])
def test_the_committed_baseline_was_run_at_the_pins(report):
    """A pin move in pyproject.toml lands with its regenerated baseline, or this fails (naming what disagrees)."""
    rows = latest_rows(list(read_rows(REPO / "reports" / report / "results.jsonl")))
    pins = pinned_versions()
    disagree: dict[str, set[str]] = {}
    for row in rows:
        for name, pinned in pins.items():
            got = (row.get("versions") or {}).get(name)
            if got is not None and got.split("+", 1)[0] != pinned:
                disagree.setdefault(f"{name} (pinned {pinned})", set()).add(got)
    assert not disagree, (f"reports/{report} was not run at pyproject.toml's pins: "
                          + json.dumps({k: sorted(v) for k, v in disagree.items()})
                          + "; regenerate it (reports/README.md) in the change that moves the pins")


def test_drift_sweeps_with_the_other_python_and_gates_on_the_compare(tmp_path, capsys):
    """The whole recipe on one eager case, with this interpreter standing in for the second environment: the
    sweep runs in a child process, its rows land in --out beside compare.md, and the compare's exit code is the
    verdict (0 here: the case passed before and passes now)."""
    import sys

    from sweep.drift import run_drift
    from sweep.results import append_row

    baseline = tmp_path / "baseline"
    append_row(baseline / "results.jsonl", {"case_id": "BertModel-eager-static", "model": "BertModel",
                                            "backend": "eager", "status": "pass", "versions": {}})
    out = tmp_path / "drift"
    assert run_drift(sys.executable, baseline, out, ["--models=BertModel", "--backend=eager", "-n", "0"]) == 0
    rows = list(read_rows(out / "results.jsonl"))
    assert [(r["case_id"], r["status"]) for r in rows] == [("BertModel-eager-static", "pass")]
    assert (out / "compare.md").is_file() and "ok: " in capsys.readouterr().out
