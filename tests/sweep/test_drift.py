"""Following upstream: the second environment's requirements, the drift folder's name and versions.json, and the
pins-vs-baseline check that stops a pin move from landing without its baseline."""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path

import pytest

from engine.versions import pinned_versions
from sweep.drift import MAX_NAME, DriftError, folder_name, parse_overrides, requirements, write_versions
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


def test_folder_name_is_the_month_and_the_new_versions_of_what_moved():
    old = {"torch": "2.13.0+cpu", "transformers": "5.23.0", "onnx": "1.23.2", "torchvision": "0.28.0"}
    month = date(2026, 12, 3)
    assert folder_name(old, {**old, "torch": "2.15.0"}, month) == "2026-12-torch2.15.0"
    # torchvision moving with torch is implied by it; another torchvision is named
    assert folder_name(old, {**old, "torch": "2.13.1", "torchvision": "0.28.1"}, month) == "2026-12-torch2.13.1"
    assert (folder_name(old, {**old, "torch": "2.13.1", "torchvision": "0.28.5"}, month)
            == "2026-12-torch2.13.1-torchvision0.28.5")
    # torch and transformers first; what does not fit is left to versions.json
    new = {"torch": "2.14.1", "transformers": "5.24.0", "onnx": "1.24.0", "executorch": "1.5.1", "timm": "1.0.31"}
    name = folder_name({**old, "executorch": "1.4.1"}, new, date(2026, 11, 26))
    assert name == "2026-11-torch2.14.1-transformers5.24.0" and len(name) <= MAX_NAME
    assert folder_name(old, {**old, "onnx": "1.24.0"}, month) == "2026-12-onnx1.24.0"
    # a build tag is not a move, nor is a package the baseline never recorded (timm above)
    assert folder_name(old, {**old, "torch": "2.13.0+cu128", "timm": "1.0.31"}, month) == "2026-12-same-versions"


def test_versions_json_holds_both_sides_and_guards_the_folder(tmp_path):
    old, new = {"torch": "2.14.1", "timm": None}, {"torch": "2.15.0", "timm": "1.0.31"}
    path = write_versions(tmp_path, old, new)
    assert json.loads(path.read_text()) == {"old": old, "new": new}
    write_versions(tmp_path, old, new)  # the same environment again (--resume): fine
    with pytest.raises(DriftError, match="holds a drift run at other versions"):
        write_versions(tmp_path, old, {**new, "torch": "2.15.1"})


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


#: the share of a report's rows that must come from the one code state the README names (its commit's sources)
ONE_STATE_SHARE = 0.95


@pytest.mark.parametrize("report", ["baseline", "generate"])
def test_the_committed_baseline_comes_from_the_commit_the_readme_names(report, tmp_path):
    """At least 95 % of a report's rows carry one ``export-sweep`` fingerprint, and it is the one of the sources of
    the commit that reports/README.md names (``Baseline commit: `<sha>` ``)."""
    import collections
    import re
    import subprocess
    import tarfile

    from sweep.fingerprint import OWN_SOURCES, own_sources_digest

    rows = latest_rows(list(read_rows(REPO / "reports" / report / "results.jsonl")))
    states = collections.Counter((row.get("fingerprint_parts") or {}).get("export-sweep") for row in rows)
    state, count = states.most_common(1)[0]
    assert count >= ONE_STATE_SHARE * len(rows), (
        f"reports/{report}: {len(states)} code states, the largest {count} of {len(rows)} rows")
    named = re.search(r"Baseline commit: `([0-9a-f]{7,40})`", (REPO / "reports" / "README.md").read_text())
    assert named, "reports/README.md names no `Baseline commit: `<sha>``"
    archive = tmp_path / "sources.tar"
    subprocess.run(["git", "-C", str(REPO), "archive", "-o", str(archive), named[1], *OWN_SOURCES], check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path / "sources", filter="data")
    assert own_sources_digest(tmp_path / "sources") == state, f"the rows' code state is not {named[1]}'s"


def test_drift_sweeps_with_the_other_python_and_gates_on_the_compare(tmp_path, capsys):
    """The whole recipe on one eager case, with this interpreter standing in for the second environment: the
    sweep runs in a child process, its rows land in --out beside compare.md, versions.json and the repros' verdicts
    (one repro here: the skiplists' take minutes), and the compare's exit code is the verdict (0 here: the case
    passed before and passes now)."""
    import sys

    from sweep.drift import run_drift
    from sweep.results import append_row

    baseline = tmp_path / "baseline"
    append_row(baseline / "results.jsonl", {"case_id": "BertModel-eager-static", "model": "BertModel",
                                            "backend": "eager", "status": "pass", "versions": {}})
    out = tmp_path / "drift"
    (tmp_path / "repros").mkdir()
    (tmp_path / "repros" / "still_fails.py").write_text('"""Still fails.\nTracker: pytorch/pytorch\n"""\nraise SystemExit(10)\n')
    assert run_drift(sys.executable, baseline, out, ["--models=BertModel", "--backend=eager", "-n", "0"],
                     repros=tmp_path / "repros") == 0
    assert [(r["repro"], r["verdict"]) for r in json.loads((out / "repros.json").read_text())] == [
        ("still_fails.py", "reproduces")]
    rows = list(read_rows(out / "results.jsonl"))
    assert [(r["case_id"], r["status"]) for r in rows] == [("BertModel-eager-static", "pass")]
    assert (out / "compare.md").is_file() and "ok: " in capsys.readouterr().out
    versions = json.loads((out / "versions.json").read_text())  # every pinned package, old (none recorded) and new
    assert set(versions["old"]) == set(versions["new"]) == set(pinned_versions()) and not any(versions["old"].values())
