"""One build and eager run per class for all the backends of a run (:mod:`sweep.shared_build`)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import torch

from sweep import shared_build
from sweep.__main__ import BLOCK_UNUSED_PLUGINS

pytest_plugins = ["pytester"]


def test_the_first_case_claims_the_others_load_what_it_stores(tmp_path):
    path = shared_build.class_file(tmp_path, "Foo@my config", 0)
    assert path.name == "Foo@my_config-seed0.pt"
    assert shared_build.claim_or_load(path) == (None, True)
    payload = {"case": "built", "expected": {"traced": {"y": torch.ones(2)}}}
    later = threading.Timer(0.3, shared_build.store, (path, payload))
    later.start()  # a second case waits for the claimant's file
    loaded, claimed = shared_build.claim_or_load(path, wait=10)
    later.join()
    assert not claimed and loaded["case"] == "built" and torch.equal(loaded["expected"]["traced"]["y"], torch.ones(2))
    shared_build.remove(path)
    assert list(tmp_path.iterdir()) == []


def test_a_claimant_that_gives_up_or_never_stores_leaves_each_case_to_build(tmp_path):
    path = shared_build.class_file(tmp_path, "Foo", 0)
    assert shared_build.claim_or_load(path) == (None, True)
    started = time.monotonic()
    assert shared_build.claim_or_load(path, wait=0.5) == (None, False)  # never stored: waits, then builds itself
    assert time.monotonic() - started >= 0.5
    shared_build.give_up(path)
    started = time.monotonic()
    assert shared_build.claim_or_load(path, wait=30) == (None, False)  # gave up: no waiting
    assert time.monotonic() - started < 5


def test_a_claimant_that_died_before_storing_is_not_waited_for(tmp_path):
    import subprocess
    import sys

    path = shared_build.class_file(tmp_path, "Foo", 0)
    code = "import sys; from sweep import shared_build as s; s.claim_or_load(s.class_file(sys.argv[1], 'Foo', 0))"
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True, cwd=Path(__file__).resolve().parents[2])
    started = time.monotonic()
    assert shared_build.claim_or_load(path, wait=30) == (None, False)  # its pid is gone: builds itself at once
    assert time.monotonic() - started < 5


def test_a_case_that_cannot_be_pickled_is_not_stored(tmp_path):
    path = shared_build.class_file(tmp_path, "Foo", 0)
    assert shared_build.claim_or_load(path) == (None, True)
    assert not shared_build.store(path, {"case": lambda: None})
    started = time.monotonic()
    assert not path.exists() and shared_build.claim_or_load(path, wait=30) == (None, False)  # the others build
    assert time.monotonic() - started < 5


COUNTED_MODELS = '''
import os, torch

class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)

    def forward(self, x):
        return torch.relu(self.lin(x))

class Drifts(Small):
    def forward(self, x):
        out = self.lin(x)
        return out + 1.0 if torch.compiler.is_exporting() else out

def _counted(cls, name):
    def build(seed):
        with open(os.environ["BUILD_LOG"], "a") as log:
            log.write(name + "\\n")
        torch.manual_seed(seed)
        return cls(), {"x": torch.randn(2, 5, 4, generator=torch.Generator().manual_seed(seed))}
    return build

SWEEP_MODELS = {"SmallModel": _counted(Small, "SmallModel"), "DriftModel": _counted(Drifts, "DriftModel")}
'''


def test_a_run_over_every_backend_builds_each_class_once_with_the_statuses_of_separate_runs(pytester, monkeypatch):
    pytester.makepyfile(local_models=COUNTED_MODELS)
    (pytester.path / "skiplists").mkdir()
    log = pytester.path / "builds.log"
    monkeypatch.setenv("BUILD_LOG", str(log))
    base = ["--pyargs", "sweep", "-p", "no:cacheprovider", *BLOCK_UNUSED_PLUGINS, "--model-module=local_models",
            "--models=SmallModel,DriftModel", f"--skiplist-dir={pytester.path / 'skiplists'}"]

    def statuses(report_dir):
        lines = (pytester.path / report_dir / "results.jsonl").read_text().splitlines()
        return {(r["model"], r["backend"]): (r["status"], r.get("shapes_run")) for r in map(json.loads, lines)}

    pytester.runpytest_subprocess(*base, "--backend=all", "--report-dir=together")
    assert sorted(log.read_text().split()) == ["DriftModel", "SmallModel"]  # 8 cases, 2 builds
    rows = [json.loads(line) for line in (pytester.path / "together" / "results.jsonl").read_text().splitlines()]
    assert sorted(r.get("shared_build") for r in rows) == ["loaded"] * 6 + ["stored"] * 2
    log.unlink()
    # a separate run over one backend (a discrepancy and a pass; each separate run costs a process start)
    pytester.runpytest_subprocess(*base, "--backend=dynamo", "--report-dir=apart")
    assert len(log.read_text().split()) == 2  # one build per case
    together = statuses("together")
    assert {key: v for key, v in together.items() if key[1] == "dynamo"} == statuses("apart")
    assert together[("DriftModel", "dynamo")][0] == "discrepancy" and together[("SmallModel", "executorch")][0] == "pass"
