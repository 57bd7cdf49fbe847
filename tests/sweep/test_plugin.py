"""The sweep plugin, driven through pytester in subprocesses (as users run it)."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest

from sweep.__main__ import BLOCK_UNUSED_PLUGINS
from sweep.cli import main

pytest_plugins = ["pytester"]

LOCAL_MODELS = '''
import os, time, torch

class Good(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)

    def forward(self, x):
        return self.lin(x)

class Abort(Good):
    def forward(self, x):
        os.abort()

class Hang(Good):
    def forward(self, x):
        while True:
            time.sleep(0.05)

class ExportsDifferently(Good):
    def forward(self, x):
        out = self.lin(x)
        return out + 1.0 if torch.compiler.is_exporting() else out

def _make(cls):
    return lambda seed: (cls(), {"x": torch.randn(2, 4, generator=torch.Generator().manual_seed(seed))})

SWEEP_MODELS = {"GoodModel": _make(Good), "OtherGoodModel": _make(Good), "AbortModel": _make(Abort),
                "HangModel": _make(Hang), "DriftModel": _make(ExportsDifferently)}
'''


@pytest.fixture
def sweep(pytester):
    pytester.makepyfile(local_models=LOCAL_MODELS)
    (pytester.path / "skiplists").mkdir()

    def run(*args, **kwargs):
        base = ["--pyargs", "sweep", "-p", "no:cacheprovider", *BLOCK_UNUSED_PLUGINS,
                "--model-module=local_models",
                f"--skiplist-dir={pytester.path / 'skiplists'}", f"--report-dir={pytester.path / 'reports'}"]
        return pytester.runpytest_subprocess(*base, *args, **kwargs)

    return run


def rows(pytester, report_dir="reports"):
    path = pytester.path / report_dir / "results.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_ids_selection_and_markers(sweep):
    result = sweep("--collect-only", "-q", "--models=GoodModel,Other*", "--backend=dynamo,onnx", "--shapes=both")
    ids = [line.split("[")[1].rstrip("]") for line in result.outlines if "test_export[" in line]
    assert ids == [f"{m}-{b}-{s}" for m in ("GoodModel", "OtherGoodModel") for b in ("dynamo", "onnx") for s in ("dynamic", "static")]
    result = sweep("--collect-only", "-q", "--models=GoodModel", "--backend=all", "-m", "onnx")
    assert [line for line in result.outlines if "test_export[" in line] == [
        line for line in result.outlines if "GoodModel-onnx-dynamic" in line
    ]
    result = sweep("--collect-only", "-q", "--models=GoodModel,OtherGoodModel", "-k", "Other")
    assert sum("test_export[" in line for line in result.outlines) == 1


def test_models_from_a_file_and_named_sets(sweep, pytester):
    (pytester.path / "models.txt").write_text("GoodModel  # a comment\n\nOtherGoodModel\n")
    result = sweep("--collect-only", "-q", "--models=@models.txt")
    assert sum("test_export[" in line for line in result.outlines) == 2
    result = sweep("--collect-only", "-q", "--models=smoke", "--backend=eager")
    assert sum("test_export[" in line for line in result.outlines) >= 20


@pytest.mark.parametrize(
    "args, message",
    [
        (["--backend=tflite"], "--backend tflite: unknown; choose from eager, dynamo, onnx, executorch or all"),
        (["--models=LlamaForCausalLLM"], "did you mean LlamaForCausalLM"),
        (["--skiplist-dir=no/such/folder"], "--skiplist-dir no/such/folder: no such folder"),
        (["--atol=nan"], "--atol must be a finite number >= 0, got nan"),
        (["--rtol=inf"], "--rtol must be a finite number >= 0, got inf"),
        (["--strict-skiplists"], "--strict-skiplists needs --run-skipped"),
        (["--config=nowhere"], "--config nowhere: no such file"),
        (["--models="], "--models is empty (an unset variable?)"),  # never the whole catalog
        (["--backend="], "--backend is empty"),  # never a green run of nothing
    ],
)
def test_option_errors_are_usage_errors(sweep, args, message):
    result = sweep("--collect-only", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{message}*"])


def test_invalid_skiplist_stops_the_run_naming_file_and_line(sweep, pytester):
    (pytester.path / "skiplists" / "export_skip.yaml").write_text("- class: GoodModel\n  reason: r\n")
    result = sweep("--collect-only", "--models=GoodModel")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*skiplists/export_skip.yaml:1: GoodModel: give 'link'*"])


def test_crash_and_hang_are_results_and_the_sweep_goes_on(sweep, pytester):
    result = sweep("--models=AbortModel,HangModel,GoodModel,DriftModel", "--backend=dynamo", "--case-timeout=10")
    by_model = {r["model"]: r for r in rows(pytester)}
    assert by_model["AbortModel"]["status"] == "crash" and by_model["AbortModel"]["stage"] == "eager"
    assert "SIGABRT" in by_model["AbortModel"]["error"]
    assert by_model["HangModel"]["status"] == "timeout" and by_model["HangModel"]["stage"] == "eager"
    assert by_model["GoodModel"]["status"] == "pass"
    drift = by_model["DriftModel"]
    assert drift["status"] == "discrepancy" and drift["stage"] == "compare"
    assert drift["diffs"]["traced:"]["max_abs"] == pytest.approx(1.0)
    result.assert_outcomes(passed=1, failed=3)
    result.stdout.fnmatch_lines(["*export-sweep summary*", "dynamo*1*1*0*0*1*1*4"])
    assert (pytester.path / "reports" / "matrix.md").is_file()


def test_skiplisted_cases_skip_and_run_skipped_reports_stale_entries(sweep, pytester):
    (pytester.path / "skiplists" / "export_skip.yaml").write_text(textwrap.dedent("""\
        - class: GoodModel
          backends: [dynamo]
          reason: pretend it cannot export
          todo: nothing, it is a test
        """))
    result = sweep("--models=GoodModel", "--backend=dynamo")
    result.assert_outcomes(skipped=1)
    # the reason is in the summary without -rs: one line per entry
    result.stdout.fnmatch_lines(["known failures: 1 cases skipped, listed by 1 skiplist entries*",
                                 "*1 GoodModel-dynamo-dynamic: pretend it cannot export (TODO: nothing, it is a test) "
                                 "[[]export_skip: GoodModel on dynamo[]]"])
    (row,) = rows(pytester)  # the matrix shows the skip and its entry
    assert row["status"] == "skip" and "pretend it cannot export" in row["skiplist"] and "TODO: nothing" in row["skiplist"]
    (pytester.path / "reports" / "results.jsonl").unlink()
    result = sweep("--models=GoodModel", "--backend=dynamo", "--run-skipped")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*stale skiplist entries (the case now passes): 1*", "*pretend it cannot export*"])


def test_the_printed_rerun_command_reruns_just_the_failures(sweep, pytester):
    import shlex

    first = sweep("--models=GoodModel,DriftModel,AbortModel", "--backend=eager,dynamo")
    assert first.ret == 1
    line = next(l for l in first.outlines if l.startswith("rerun the 3 failing case(s): "))
    command = shlex.split(line.split(": ", 1)[1])
    assert command[0] == "pytest" and {"AbortModel-eager-static", "AbortModel-dynamo-dynamic",
                                       "DriftModel-dynamo-dynamic"} <= set(command)
    os.remove(pytester.path / "reports" / "results.jsonl")
    again = pytester.run(sys.executable, "-m", "pytest", *BLOCK_UNUSED_PLUGINS, *command[1:])
    assert again.ret == 1
    assert sorted(r["case_id"] for r in rows(pytester)) == ["AbortModel-dynamo-dynamic", "AbortModel-eager-static",
                                                            "DriftModel-dynamo-dynamic"]
    # the node id pytest printed for a case works as an argument too
    pasted = sweep("::test_export[GoodModel-dynamo-dynamic]", "--collect-only", "-q")
    assert [l for l in pasted.outlines if "test_export[" in l] == ["::test_export[GoodModel-dynamo-dynamic]"]


def test_python_m_sweep_keeps_pytests_last_failed(pytester):
    pytester.makepyfile(local_models=LOCAL_MODELS)
    (pytester.path / "skiplists").mkdir()
    args = ["--model-module=local_models", "--models=GoodModel,DriftModel", "--backend=dynamo", "-n", "0",
            f"--skiplist-dir={pytester.path / 'skiplists'}"]
    assert pytester.run(sys.executable, "-m", "sweep", *args).ret == 1
    last_failed = pytester.run(sys.executable, "-m", "sweep", *args, "--lf")
    assert last_failed.ret == 1
    last_failed.stdout.fnmatch_lines(["*1 failed, 1 deselected*"])
    stepwise = pytester.run(sys.executable, "-m", "sweep", *args, "--sw")
    assert stepwise.ret == pytest.ExitCode.INTERRUPTED  # pytest's own --sw stop, not a usage error
    stepwise.stdout.fnmatch_lines(["*Interrupted: Test failed, continuing from this test next run*"])


def _cells(matrix_path):
    matrix = json.loads(matrix_path.read_text())
    return {(m, col): (c["status"], c["stage"], c["category"]) for m, cols in matrix["models"].items()
            for col, c in cols.items()}


def test_xdist_run_and_merged_shards_equal_a_serial_run(sweep, pytester):
    args = ("--models=GoodModel,OtherGoodModel,DriftModel,AbortModel", "--backend=eager,dynamo")
    serial = sweep(*args, f"--report-dir={pytester.path / 'serial'}")
    serial.assert_outcomes(passed=5, failed=3)
    serial_cells = _cells(pytester.path / "serial" / "matrix.json")

    parallel = sweep(*args, "-n", "2", f"--report-dir={pytester.path / 'parallel'}")
    assert _cells(pytester.path / "parallel" / "matrix.json") == serial_cells
    assert {r["worker"] for r in rows(pytester, "parallel")} <= {"gw0", "gw1"}
    parallel.stdout.fnmatch_lines(["*export-sweep summary*"])  # the controller summarises the workers' rows

    ran = []
    for i in (1, 2):
        part = sweep(*args, f"--shard={i}/2", f"--report-dir={pytester.path / f'shard{i}'}")
        outcomes = part.parseoutcomes()
        ran.append(outcomes.get("passed", 0) + outcomes.get("failed", 0))
        assert outcomes.get("deselected", 0) == 8 - ran[-1]
    assert sorted(ran) != [0, 8] and sum(ran) == 8  # both shards did some work, together all of it
    assert main(["merge", str(pytester.path / "shard1"), str(pytester.path / "shard2"),
                 "--out", str(pytester.path / "merged")]) == 0
    assert _cells(pytester.path / "merged" / "matrix.json") == serial_cells
    assert {r["shard"] for r in rows(pytester, "shard1")} == {"1/2"}
    bad = sweep(*args, "--shard=3/2", "--collect-only")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*--shard 3/2: need 1 <= i <= n*"])


def test_generate_adds_a_case_per_generative_class_and_backend(sweep, pytester):
    # PI0 sits in a generative mapping (image-text-to-text) but defines no generate(): no generation case
    result = sweep("--collect-only", "-q", "--models=LlamaForCausalLM,BertForMaskedLM,PI0ForConditionalGeneration",
                   "--backend=eager,dynamo", "--generate")
    ids = [line.split("[")[1].rstrip("]") for line in result.outlines if "test_export[" in line]
    assert sorted(ids) == sorted(["BertForMaskedLM-eager-static", "BertForMaskedLM-dynamo-dynamic", "LlamaForCausalLM-eager-static",
                                  "LlamaForCausalLM-dynamo-dynamic", "LlamaForCausalLM-dynamo-generate",
                                  "PI0ForConditionalGeneration-eager-static", "PI0ForConditionalGeneration-dynamo-dynamic"])
    (pytester.path / "skiplists" / "generate_skip.yaml").write_text(textwrap.dedent("""\
        - class: LlamaForCausalLM
          backends: [dynamo]
          reason: pretend its generate cannot be decomposed
          todo: nothing, it is a test
        """))
    result = sweep("--models=LlamaForCausalLM", "--backend=dynamo", "--generate", "-k", "generate")
    result.assert_outcomes(skipped=1)


def test_generate_case_compares_greedy_tokens_with_eager(sweep, pytester):
    result = sweep("--models=LlamaForCausalLM", "--backend=dynamo", "--generate", "-k", "generate")
    result.assert_outcomes(passed=1)
    (row,) = rows(pytester)
    assert row["case_id"] == "LlamaForCausalLM-dynamo-generate" and row["status"] == "pass"
    assert row["tokens"]["got"] == row["tokens"]["expected"]
    assert {"prefill", "decode"} <= set(row["components"])


# ─── The headline command and the CI gate ────────────────────────────────────────────────────────

PYTEST_SCRIPT = str(Path(sys.executable).with_name("pytest"))  # as users run it: cwd is not on sys.path


def _pytest(pytester, *args):
    """``pytest ARGS`` in pytester's folder, no --pyargs, the installed script."""
    return pytester.run(PYTEST_SCRIPT, "-p", "no:cacheprovider", *BLOCK_UNUSED_PLUGINS,
                        f"--skiplist-dir={pytester.path / 'skiplists'}", *args)


def test_sweep_options_without_paths_run_the_sweep_from_an_empty_folder(pytester):
    pytester.makepyfile(local_models=LOCAL_MODELS)
    (pytester.path / "skiplists").mkdir()
    result = _pytest(pytester, "--backend=dynamo", "--model-module=local_models", "--models=GoodModel")
    result.assert_outcomes(passed=1)
    assert [r["case_id"] for r in rows(pytester)] == ["GoodModel-dynamo-dynamic"]
    # only local models given: they are the selection (not the 1,500-class catalog)
    result = _pytest(pytester, "--backend=eager", "--model-module=local_models", "--collect-only", "-q")
    assert sum("test_export[" in line for line in result.outlines) == 5


def test_a_folder_with_its_own_tests_keeps_them_for_explicit_paths(pytester):
    pytester.makepyfile(local_models=LOCAL_MODELS)
    (pytester.path / "skiplists").mkdir()
    pytester.makeini("[pytest]\ntestpaths = own_tests\n")
    (pytester.path / "own_tests").mkdir()
    (pytester.path / "own_tests" / "test_own.py").write_text("def test_own():\n    assert True\n")
    result = _pytest(pytester, "--backend=dynamo", "--model-module=local_models", "--models=GoodModel", "-v")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*test_export[[]GoodModel-dynamo-dynamic[]] PASSED*"])
    result = _pytest(pytester, "own_tests", "--backend=dynamo", "--model-module=local_models", "-v")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*test_own PASSED*"])
    assert "sweep" in _pytest(pytester, "--help").stdout.str().split("export-sweep", 1)[1][:400]


def test_two_sweeps_sharing_a_report_dir_lose_no_rows(sweep, pytester):
    base = [sys.executable, "-m", "pytest", "--pyargs", "sweep", "-p", "no:cacheprovider", *BLOCK_UNUSED_PLUGINS,
            "--model-module=local_models", f"--skiplist-dir={pytester.path / 'skiplists'}",
            f"--report-dir={pytester.path / 'reports'}", "--backend=eager,dynamo"]
    first = pytester.popen([*base, "--models=GoodModel,DriftModel"], stdin=None)
    second = pytester.popen([*base, "--models=OtherGoodModel"], stdin=None)
    assert first.wait(300) == 1 and second.wait(300) == 0  # DriftModel's discrepancy fails the first run
    got = sorted(r["case_id"] for r in rows(pytester))
    assert got == sorted(f"{m}-{b}" for m in ("GoodModel", "DriftModel", "OtherGoodModel")
                         for b in ("eager-static", "dynamo-dynamic"))
    matrix = json.loads((pytester.path / "reports" / "matrix.json").read_text())
    assert matrix["cases"] == 6  # whichever run finished last wrote the matrix of the whole folder


def test_lf_and_collect_only_keep_the_other_rows(pytester):
    pytester.makepyfile(local_models=LOCAL_MODELS)
    (pytester.path / "skiplists").mkdir()
    args = ["--backend=dynamo", "--model-module=local_models", "--models=GoodModel,DriftModel"]
    run = lambda *more: pytester.run(PYTEST_SCRIPT, *BLOCK_UNUSED_PLUGINS,  # noqa: E731 (the cache provider on)
                                     f"--skiplist-dir={pytester.path / 'skiplists'}", *args, *more)
    run().assert_outcomes(passed=1, failed=1)
    before = (pytester.path / "reports" / "results.jsonl").read_bytes()
    run("--collect-only")
    assert (pytester.path / "reports" / "results.jsonl").read_bytes() == before
    result = run("--lf")
    result.assert_outcomes(failed=1)
    assert sorted(r["case_id"] for r in rows(pytester)) == ["DriftModel-dynamo-dynamic", "DriftModel-dynamo-dynamic",
                                                            "GoodModel-dynamo-dynamic"]
    matrix = json.loads((pytester.path / "reports" / "matrix.json").read_text())
    assert set(matrix["models"]) == {"GoodModel", "DriftModel"} and matrix["cases"] == 2


BREAKABLE = LOCAL_MODELS + '''
class Breakable(Good):
    def forward(self, x):
        if os.environ.get("BREAK_IT"):
            raise ValueError("broken on purpose")
        return self.lin(x)

SWEEP_MODELS["BreakableModel"] = _make(Breakable)
'''


def test_green_with_known_failures_listed_red_when_a_passing_class_breaks(pytester, monkeypatch):
    pytester.makepyfile(local_models=BREAKABLE)
    (pytester.path / "skiplists").mkdir()
    (pytester.path / "skiplists" / "export_skip.yaml").write_text(textwrap.dedent("""\
        - classes: [DriftModel, "Abort*"]
          backends: [dynamo]
          reason: differs when exported, on purpose
          todo: nothing, it is a test
        """))
    args = ["--backend=dynamo", "--model-module=local_models", "--models=GoodModel,DriftModel,AbortModel,BreakableModel",
            "-rs"]
    green = _pytest(pytester, *args)
    assert green.ret == 0
    green.assert_outcomes(passed=2, skipped=2)
    green.stdout.fnmatch_lines(["SKIPPED*skiplist: differs when exported, on purpose (TODO: nothing, it is a test)*"])
    monkeypatch.setenv("BREAK_IT", "1")
    red = _pytest(pytester, *args)
    assert red.ret == 1
    red.assert_outcomes(passed=1, failed=1, skipped=2)
    red.stdout.fnmatch_lines(["*fail: BreakableModel on dynamo (dynamic), stage eager*", "*category: *",
                              "*ValueError: broken on purpose*",
                              "*a model of yours (--config/--model-module): export-sweep's skiplists list catalog classes only*"])
    assert "known failure?" not in red.stdout.str()  # a local model's failure never points at our skiplists
    assert "Traceback" not in red.stdout.str()
    long = _pytest(pytester, *args, "--tb=long")
    long.stdout.fnmatch_lines(["*traceback (child process):*", "*raise ValueError*"])
    line = _pytest(pytester, *args, "--tb=line")
    assert "category:" not in line.stdout.str()
    # the CI that keeps the lists honest: a listed case that passes again fails the run
    monkeypatch.delenv("BREAK_IT")
    (pytester.path / "skiplists" / "export_skip.yaml").write_text(textwrap.dedent("""\
        - class: GoodModel
          backends: [dynamo]
          reason: listed, but it passes
          todo: nothing, it is a test
        """))
    stale = _pytest(pytester, "--backend=dynamo", "--model-module=local_models", "--models=GoodModel",
                    "--run-skipped", "--strict-skiplists")
    assert stale.ret == 1
    stale.stdout.fnmatch_lines(["*stale skiplist entries (the case now passes): 1 -- failing the run*"])


TINY_BERT = {"model_type": "bert", "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
             "intermediate_size": 32, "vocab_size": 64, "max_position_embeddings": 512}


def test_config_sweeps_the_classes_of_a_local_config_folder(pytester):
    (pytester.path / "skiplists").mkdir()
    (pytester.path / "work" / "my-bert").mkdir(parents=True)
    (pytester.path / "work" / "my-bert" / "config.json").write_text(json.dumps(TINY_BERT))
    listing = _pytest(pytester, "--config=work/my-bert", "--backend=dynamo", "--collect-only", "-q")
    ids = [line.split("[")[1].rstrip("]") for line in listing.outlines if "test_export[" in line]
    assert "BertModel@my-bert-dynamo-dynamic" in ids and all("@my-bert-" in i for i in ids) and len(ids) > 5
    os.chdir(pytester.path / "work")  # relative to where pytest is invoked
    result = _pytest(pytester, "--config=my-bert", "--backend=dynamo", "-k", "BertModel and not For and not LMHead",
                     f"--report-dir={pytester.path / 'reports'}")
    result.assert_outcomes(passed=1)
    (row,) = rows(pytester)
    assert row["model"] == "BertModel@my-bert" and row["num_parameters"] < 50_000 and row["model_type"] == "bert"


def test_progress_line_says_done_of_total_elapsed_and_eta():
    from sweep.plugin.reporting import Progress

    progress = Progress(total=6188, started=0.0, done=1547)
    assert progress.line(now=3600.0) == ("export-sweep: 1,547 of 6,188 cases (25%), 1h 00m elapsed, ETA 3h 00m "
                                         "(25.8 cases/min)")
    assert Progress(total=10, started=0.0, done=0).line(now=30.0).endswith("30s elapsed, ETA ? (0.0 cases/min)")


def test_the_progress_total_counts_the_cases_left_after_k_and_m(sweep, pytester):
    result = sweep("--collect-only", "-q", "--models=GoodModel,OtherGoodModel", "--backend=all", "-k", "dynamo or onnx")
    result.stdout.fnmatch_lines(["export-sweep: 4 cases to run (2 classes)"])


def test_under_xdist_the_total_comes_from_the_ids_a_worker_collected(sweep, pytester):
    from types import SimpleNamespace

    from sweep.plugin import pytest_xdist_node_collection_finished
    from sweep.plugin.options import SETTINGS as _SETTINGS
    from sweep.plugin.reporting import PROGRESS as _PROGRESS

    config = pytester.parseconfigure("--pyargs", "sweep", "--model-module=local_models", "--backend=all",
                                     "--models=GoodModel,OtherGoodModel", f"--skiplist-dir={pytester.path / 'skiplists'}")
    assert config.stash[_SETTINGS] is not None
    ids = ["sweep/test_export.py::test_export[GoodModel-onnx-dynamic]",
           "sweep/test_export.py::test_export[Bert@my-bert-onnx-dynamic]", "tests/test_other.py::test_x"]
    pytest_xdist_node_collection_finished(node=SimpleNamespace(config=config), ids=ids)
    progress = config.stash[_PROGRESS]
    assert progress.total == 2 and progress.left == {"GoodModel": 1, "Bert@my-bert": 1}
    pytest_xdist_node_collection_finished(node=SimpleNamespace(config=config), ids=ids[:1])  # the next worker's
    assert progress.total == 2


def test_the_progress_total_is_the_cases_this_run_selects(sweep, pytester):
    import re

    from sweep.results import append_row

    def total(*args) -> int:
        result = sweep("--collect-only", "-q", "--backend=eager,dynamo", "--models=GoodModel,OtherGoodModel", *args)
        said = re.search(r"export-sweep: (\d+) cases to run", result.stdout.str())
        return int(said.group(1)) if said else 0

    assert total() == 4
    append_row(pytester.path / "reports" / "results.jsonl",
               {"model": "GoodModel", "backend": "eager", "shapes": "static", "case_id": "GoodModel-eager-static",
                "status": "pass", "started": 1.0})
    assert total("--resume") == 3
    assert total("--resume", "--shard=1/2") + total("--resume", "--shard=2/2") == 3


def test_progress_is_said_after_the_first_case_under_xdist(sweep, pytester):
    result = sweep("--models=GoodModel,OtherGoodModel", "--backend=eager", "-n", "2")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["export-sweep: 2 cases to run (2 classes)", "export-sweep: 1 of 2 cases (50%), *"])
