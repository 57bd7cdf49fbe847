"""pytest plugin: one test case per (model class, backend, shapes), each run isolated, each a result row.

    pytest --backend=onnx,executorch --models='Llama*,@my_models.txt' -n 16

With a sweep option (``--backend``, ``--models``, ``--model-module``, ``--config``, ``--generate``) and no path
arguments, ``pytest`` collects the sweep itself (:mod:`sweep.test_export`), from any folder, whatever the folder's
own ``testpaths``; explicit paths keep their meaning (``pytest tests --backend=...`` runs ``tests``), and
``pytest --pyargs sweep`` still works. Without a sweep option the plugin stays out of the way of other suites.

Options are declared here with the hooks that use them; the work is delegated to :mod:`sweep.selection`,
:mod:`sweep.skiplist`, :mod:`sweep.isolation`, :mod:`sweep.case` and :mod:`sweep.results`.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

BACKENDS = ("eager", "dynamo", "onnx", "executorch")
SHAPES = {"dynamic": ("dynamic",), "static": ("static",), "both": ("dynamic", "static")}
STATUSES = ("pass", "discrepancy", "fail", "skip", "timeout", "crash")
DEFAULT_SKIPLISTS = Path(__file__).resolve().parent.parent / "skiplists"


# ─── Options ─────────────────────────────────────────────────────────────────────────────────────

def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("export-sweep", "export every transformers model class and compare with eager "
                            "(with any of these options and no path arguments, pytest runs the sweep)")
    group.addoption("--backend", action="append", default=None,
                    help="eager, dynamo, onnx, executorch or all; repeat or comma-separate (default: dynamo)")
    group.addoption("--models", default=None,
                    help="class names, globs, @file lists, or the sets 'smoke' and 'all' (default: all)")
    group.addoption("--shapes", default="dynamic", help="dynamic, static or both (default: dynamic)")
    group.addoption("--atol", type=float, default=1e-4, help="absolute tolerance per output leaf (default 1e-4)")
    group.addoption("--rtol", type=float, default=1e-4, help="relative tolerance per output leaf (default 1e-4)")
    group.addoption("--case-timeout", type=float, default=600.0,
                    help="seconds before a case is killed and recorded as timeout (default 600)")
    group.addoption("--report-dir", default="reports", help="where results.jsonl and the matrices go (default reports/)")
    group.addoption("--skiplist-dir", default=str(DEFAULT_SKIPLISTS), help="folder of the skiplist YAML files")
    group.addoption("--run-skipped", action="store_true", help="run skiplisted cases; report entries that now pass")
    group.addoption("--strict-skiplists", action="store_true",
                    help="with --run-skipped: a skiplist entry whose case now passes (stale) fails the run")
    group.addoption("--shard", default=None, metavar="I/N",
                    help="run part I of N of the cases (deterministic by case id; join the parts with export-sweep merge)")
    group.addoption("--resume", action="store_true",
                    help="keep the row file and skip the cases it already has a row for (continue an interrupted sweep)")
    group.addoption("--reuse-from", default=None, metavar="DIR",
                    help="an earlier run's report folder: a case whose fingerprint (class and modeling sources, "
                         "config and inputs recipe, versions, export-sweep's sources, skiplist entry, tolerances, "
                         "shapes) matches its row there is not run again; the row is copied, marked reused")
    group.addoption("--generate", action="store_true",
                    help="also export each generative class for generation and compare engine.generate's greedy "
                         "tokens with eager generate (cases Model-backend-generate)")
    group.addoption("--model-module", action="append", default=[],
                    help="import NAME (found in the current folder too) and sweep the models in its SWEEP_MODELS "
                         "dict {name: build(seed) -> (model, inputs)}; repeatable")
    group.addoption("--config", action="append", default=[], dest="sweep_configs", metavar="PATH",
                    help="a folder with config.json (or the file): sweep every class of its model type, built from "
                         "it with synthesised inputs, offline; repeatable. With only --config/--model-module models, "
                         "--models defaults to them")


@dataclass
class SweepSettings:
    backends: tuple[str, ...]
    models: list[str]
    shapes: tuple[str, ...]
    atol: float
    rtol: float
    timeout: float
    report_dir: Path
    run_skipped: bool
    skiplists: Any
    local_models: dict[str, dict]  # model name -> spec keys that build it (--model-module, --config)
    shard: tuple[int, int] | None = None  # (i, n) of --shard i/n
    generate: bool = False
    resume: bool = False
    done: set[str] = field(default_factory=set)  # --resume: case ids already in the row file
    reuse_from: Path | None = None  # --reuse-from: an earlier run's row file
    selection: str = "all"  # what --models selected; rows record it (compare treats a partial run as a subset)
    strict_skiplists: bool = False
    rows: list[dict] = field(default_factory=list)  # controller side: rows seen this session
    shared_dir: Path | None = None  # several backends: the run's folder of built classes (sweep.shared_build)

    @property
    def rows_path(self) -> Path:
        from sweep.results import ROWS_FILE

        return self.report_dir / ROWS_FILE


def _sweep_option_given(config: pytest.Config) -> bool:
    opt = config.option
    return (opt.models is not None or opt.backend is not None or bool(opt.model_module) or bool(opt.sweep_configs)
            or opt.generate)


def _sweep_requested(config: pytest.Config) -> bool:
    if _sweep_option_given(config):
        return True
    package = Path(__file__).resolve().parent
    for arg in config.args:
        path = Path(arg.split("::")[0])
        if arg.split("::")[0] in ("sweep", "sweep.test_export") and config.option.pyargs:
            return True
        if path.exists() and path.resolve() in (package, package / "test_export.py"):
            return True
    return False


def _parse_backends(values: list[str] | None) -> tuple[str, ...]:
    names = [n.strip() for v in (values or ["dynamo"]) for n in v.split(",") if n.strip()]
    unknown = [n for n in names if n not in (*BACKENDS, "all")]
    if unknown:
        raise pytest.UsageError(f"--backend {', '.join(unknown)}: unknown; choose from {', '.join(BACKENDS)} or all")
    if "all" in names:
        return BACKENDS
    return tuple(b for b in BACKENDS if b in names)


def _settings(config: pytest.Config) -> SweepSettings:
    from sweep.zoo import catalog
    from sweep.selection import SelectionError, is_known_class, resolve_models
    from sweep.skiplist import SkiplistError, load_skiplists

    opt = config.option
    backends = _parse_backends(opt.backend)
    if opt.shapes not in SHAPES:
        raise pytest.UsageError(f"--shapes {opt.shapes!r}: choose dynamic, static or both")
    for name in ("atol", "rtol"):
        value = getattr(opt, name)
        if not math.isfinite(value) or value < 0:
            raise pytest.UsageError(f"--{name} must be a finite number >= 0, got {value}")
    if not math.isfinite(opt.case_timeout) or opt.case_timeout <= 0:
        raise pytest.UsageError(f"--case-timeout must be a finite number of seconds > 0, got {opt.case_timeout}")
    skiplist_dir = _invocation_path(config, opt.skiplist_dir)
    if not skiplist_dir.is_dir():
        raise pytest.UsageError(f"--skiplist-dir {opt.skiplist_dir}: no such folder (it holds export_skip.yaml, "
                                "onnx_disable_optimize.yaml and generate_skip.yaml; default: the project's skiplists/)")
    if opt.strict_skiplists and not opt.run_skipped:
        raise pytest.UsageError("--strict-skiplists needs --run-skipped (listed cases must run to be found stale)")
    local = {**_local_models(config, opt.model_module), **_config_models(config, opt.sweep_configs)}
    from sweep.shard import ShardError, parse_shard

    try:
        shard = parse_shard(opt.shard) if opt.shard is not None else None
    except ShardError as e:
        raise pytest.UsageError(str(e)) from None
    reuse_from = None
    if opt.reuse_from is not None:
        from sweep.reuse import ReuseError, check_source

        try:
            reuse_from = check_source(_invocation_path(config, opt.reuse_from))
        except ReuseError as e:
            raise pytest.UsageError(str(e)) from None
    # only local models given (--model-module/--config): they are the selection, not the whole catalog
    selection = opt.models or (",".join(sorted(local)) if local else "all")
    try:
        models = resolve_models(selection, extra=local)
        skiplists = load_skiplists(skiplist_dir, lambda name: name in local or is_known_class(name),
                                   lambda: [*catalog.all_classes(), *local])
    except (SelectionError, SkiplistError) as e:
        raise pytest.UsageError(str(e)) from None
    return SweepSettings(backends, models, SHAPES[opt.shapes], opt.atol, opt.rtol, opt.case_timeout,
                         _invocation_path(config, opt.report_dir), opt.run_skipped, skiplists, local, shard=shard,
                         resume=opt.resume, generate=opt.generate, selection=selection,
                         strict_skiplists=opt.strict_skiplists, reuse_from=reuse_from)


def _invocation_path(config: pytest.Config, path: str) -> Path:
    """A path option relative to the folder pytest was invoked from (not the rootdir, not a worker's cwd)."""
    return Path(config.invocation_params.dir, os.path.expanduser(path))


def _local_models(config: pytest.Config, modules: list[str]) -> dict[str, dict]:
    import importlib

    here = str(config.invocation_params.dir)
    if modules and here not in sys.path:  # the `pytest` script, unlike `python -m pytest`, leaves cwd off sys.path
        sys.path.insert(0, here)
    local: dict[str, dict] = {}
    for name in modules:
        try:
            module = importlib.import_module(name)
        except ImportError as e:
            raise pytest.UsageError(f"--model-module {name}: cannot import it: {e}") from None
        models = getattr(module, "SWEEP_MODELS", None)
        if not isinstance(models, dict) or not models:
            raise pytest.UsageError(f"--model-module {name}: define SWEEP_MODELS = {{name: build(seed) -> (model, inputs)}}")
        local.update({model: {"model_module": name, "module_path": here} for model in models})
    return local


def _config_models(config: pytest.Config, paths: list[str]) -> dict[str, dict]:
    """``--config PATH``: every catalogued class of the config's model type, as ``Class@<folder name>``."""
    local: dict[str, dict] = {}
    for given in paths:
        path = _invocation_path(config, given).resolve()
        file = path / "config.json" if path.is_dir() else path
        if not file.is_file():
            raise pytest.UsageError(f"--config {given}: no such file {file} (give a folder with config.json, or the file)")
        try:
            import json

            model_type = json.loads(file.read_text()).get("model_type")
        except (ValueError, AttributeError) as e:
            raise pytest.UsageError(f"--config {given}: {file} is not a JSON object: {e}") from None
        from sweep.zoo.catalog import classes_of_type

        classes = classes_of_type(model_type) if isinstance(model_type, str) else []
        if not classes:
            raise pytest.UsageError(f"--config {given}: model_type {model_type!r} has no model class in transformers' "
                                    "auto mappings (a config.json names its model_type, e.g. \"llama\")")
        label = (path if path.is_dir() else path.parent).name or "config"
        local.update({f"{cls}@{label}": {"config": str(path), "class": cls} for cls in classes})
    return local


_SETTINGS = pytest.StashKey[SweepSettings]()


def pytest_configure(config: pytest.Config) -> None:
    for backend in BACKENDS:
        config.addinivalue_line("markers", f"{backend}: export-sweep case on the {backend} backend")
    if not _sweep_requested(config):
        return
    if _sweep_option_given(config) and config.args_source != pytest.Config.ArgsSource.ARGS:
        # the headline command: sweep options and no paths collect the sweep, not the folder's own tests
        config.args = [str(Path(__file__).resolve().with_name("test_export.py"))]
    settings = _settings(config)
    config.stash[_SETTINGS] = settings
    if hasattr(config, "workerinput"):  # the controller decided what is done (see pytest_configure_node)
        settings.done = set(config.workerinput.get("sweep_done", ()))
        shared = config.workerinput.get("sweep_shared")
        settings.shared_dir = Path(shared) if shared else None
        return
    if len(settings.backends) > 1:  # one build and eager run per class (a folder of this run's own)
        import tempfile

        settings.shared_dir = Path(tempfile.mkdtemp(prefix="export-sweep-shared-"))
    # Rows are never deleted: every run appends, and a case's latest row is its result (sweep.results). So two
    # sweeps sharing a folder, --lf, -k and --collect-only keep every other case's row. --resume skips the cases
    # that already have one.
    from sweep.results import case_id, read_rows

    if settings.resume and settings.rows_path.is_file():
        settings.done = {case_id(r) for r in read_rows(settings.rows_path, on_corrupt=_warn_corrupt(config))}
    config.stash[_PROGRESS] = _Progress(0)  # elapsed counts from here


def _warn_corrupt(config: pytest.Config):
    def warn(problem) -> None:
        config.issue_config_time_warning(pytest.PytestWarning(str(problem)), stacklevel=2)
    return warn


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """xdist: hand the controller's --resume decision to each worker, so that all collect the same cases."""
    settings = node.config.stash.get(_SETTINGS, None)
    if settings is not None:
        node.workerinput["sweep_done"] = sorted(settings.done)
        node.workerinput["sweep_shared"] = str(settings.shared_dir) if settings.shared_dir else None


# ─── Collection ──────────────────────────────────────────────────────────────────────────────────

#: the task mappings whose classes generate text (--generate adds a generation case for each)
GENERATIVE_MAPPINGS = frozenset({"causal_lm", "seq_to_seq_causal_lm", "speech_seq_2_seq", "image_text_to_text", "multimodal_lm"})


def _is_generative(model: str, settings: SweepSettings) -> bool:
    local = settings.local_models.get(model)
    if local is not None and "class" not in local:  # a --model-module model: no generate() we know of
        return False
    from sweep.zoo.catalog import mappings_of

    return bool(GENERATIVE_MAPPINGS.intersection(mappings_of(local["class"] if local else model)))


def _cases(settings: SweepSettings) -> list:
    from sweep.case import GENERATE

    params = []
    for model in settings.models:
        generative = settings.generate and _is_generative(model, settings)
        for backend in settings.backends:
            shapes_run = settings.shapes if backend != "eager" else ("static",)
            if generative and backend != "eager":
                shapes_run = (*shapes_run, GENERATE)
            for shapes in shapes_run:
                spec = {"model": model, "backend": backend, "shapes": shapes, "atol": settings.atol,
                        "rtol": settings.rtol, "seed": 0}
                spec.update(settings.local_models.get(model, {}))
                marks = [getattr(pytest.mark, backend)]
                skip = settings.skiplists.find("generate_skip" if shapes == GENERATE else "export_skip", model, backend)
                if skip is not None:  # skipped when the case runs, so that its row says why
                    spec["skiplist"] = skip.describe()
                if backend == "onnx" and settings.skiplists.find("onnx_disable_optimize", model, backend):
                    spec["onnx_disable_optimize"] = True
                params.append(pytest.param(spec, marks=marks, id=f"{model}-{backend}-{shapes}"))
    return params


def _selected(settings: SweepSettings, case: str) -> bool:
    """Whether this run runs ``case``: in its ``--shard``, not already done (``--resume``)."""
    from sweep.shard import shard_of

    return case not in settings.done and (not settings.shard or shard_of(case, settings.shard[1]) == settings.shard[0])


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """--shard keeps this shard's cases, --resume drops the cases already done; the rest is deselected."""
    settings = config.stash.get(_SETTINGS, None)
    if settings is None or not (settings.shard or settings.done):
        return
    keep, drop = [], []
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is None or "sweep_case" not in callspec.params:
            keep.append(item)
            continue
        (keep if _selected(settings, callspec.id) else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "sweep_case" not in metafunc.fixturenames:
        return
    settings = metafunc.config.stash.get(_SETTINGS, None)
    if settings is None:
        settings = metafunc.config.stash[_SETTINGS] = _settings(metafunc.config)
    metafunc.parametrize("sweep_case", _cases(settings))


# ─── Running a case ──────────────────────────────────────────────────────────────────────────────

def _versions() -> dict[str, str | None]:
    from engine import installed_versions

    return installed_versions()


@pytest.fixture
def sweep_case(request: pytest.FixtureRequest) -> dict:
    return request.param


@pytest.fixture
def sweep_run(request: pytest.FixtureRequest):
    """``sweep_run(spec)`` runs the case isolated, writes its row and turns its status into a test outcome."""
    from sweep.case import run_case
    from sweep.isolation import run_isolated, warm_backends
    from sweep.zoo.errors import installable
    from sweep.categories import categorize, first_line
    from engine.versions import pinned_versions

    settings: SweepSettings = request.config.stash[_SETTINGS]

    needs_catalog = any(m not in settings.local_models for m in settings.models)

    def run(spec: dict) -> dict:
        from sweep import reuse
        from sweep.fingerprint import fingerprint, fingerprint_parts

        cid = request.node.nodeid.split("[")[-1].rstrip("]")
        skipped = spec.get("skiplist") and not settings.run_skipped
        # what the result depends on besides the spec: --run-skipped only matters to a listed case
        parts = fingerprint_parts(spec, {"timeout": settings.timeout,
                                         "run_skipped": settings.run_skipped if spec.get("skiplist") else None})
        earlier, rerun_reason = reuse.find(settings.reuse_from, cid, parts) if settings.reuse_from else (None, None)
        if earlier is not None:
            return _record(reuse.reused_row(earlier, settings.reuse_from.parent))
        if not skipped:  # the forkserver starts before the first case that runs (a skipped case never needs it)
            warm_backends(settings.backends, catalog=needs_catalog)
        started = time.time()
        if skipped:
            result = {"status": "skip", "skip_reason": f"skiplist: {spec['skiplist']}"}
        else:
            result = run_isolated(run_case, _with_shared_build(spec, settings), settings.timeout)
        if result.get("error_type") == "missing_dependency" and not installable(result.get("package")):
            result["status"] = "skip"
            result["skip_reason"] = f"needs {result.get('package')}, which cannot be installed here"
        row = {
            "model": spec["model"], "backend": spec["backend"], "shapes": spec["shapes"], "case_id": cid,
            "started": started, "wall_seconds": round(time.time() - started, 3),
            "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"), "versions": _versions(),
            "pinned": pinned_versions(), "skiplist": spec.get("skiplist"),
            "shard": "{}/{}".format(*settings.shard) if settings.shard else None, "selection": settings.selection,
            "fingerprint": fingerprint(parts), "fingerprint_parts": parts,
            **({"rerun_reason": rerun_reason} if rerun_reason else {}),
            **result,
        }
        row["error_line"] = first_line(row.get("error"))
        row["category"] = categorize(row)
        return _record(row)

    def _record(row: dict) -> dict:
        from sweep.results import append_row

        append_row(settings.rows_path, row)
        request.node.user_properties.append(("sweep_row", {k: v for k, v in row.items() if k != "traceback"}))
        status = row["status"]
        if status == "skip":
            pytest.skip(row.get("skip_reason", "skipped"))
        if status != "pass":
            pytest.fail(failure_summary(row, request.config.option.tbstyle, settings.rows_path), pytrace=False)
        return row

    return run


def _with_shared_build(spec: dict, settings: SweepSettings) -> dict:
    """The spec with its class's shared file (several backends; not for generation cases); not part of the
    fingerprint: where a case loads its built class from does not change its result."""
    from sweep.case import GENERATE
    from sweep.shared_build import class_file

    if settings.shared_dir is None or spec["shapes"] == GENERATE:
        return spec
    return {**spec, "shared_build": str(class_file(settings.shared_dir, spec["model"], spec.get("seed", 0))),
            "shared_second": "dynamic" in settings.shapes}


#: lines of the error message shown per failing case at the default --tb=auto (--tb=short: 3, line: 1)
ERROR_LINES = {"line": 1, "short": 3, "auto": 8, "native": 8, "long": 8}


def failure_summary(row: dict, tbstyle: str, rows_path: Path) -> str:
    """What the terminal shows for a failing case: class, backend, stage, category, the error's first lines and
    how to list it as known; ``--tb=long`` adds the child's traceback. The full error stays in the row."""
    from sweep.categories import strip_ansi

    error_lines = [line for line in strip_ansi(row.get("error") or "").splitlines() if line.strip()]
    if tbstyle == "line":
        return f"{row['status']} in {row.get('stage') or '?'}: {error_lines[0] if error_lines else ''}"
    shown = error_lines[: ERROR_LINES.get(tbstyle, 8)]
    lines = [f"{row['status']}: {row['model']} on {row['backend']} ({row['shapes']}), stage {row.get('stage') or '?'}",
             f"category: {row.get('category') or '-'}", *(f"  {line}" for line in shown)]
    if len(error_lines) > len(shown):
        lines.append(f"  ... {len(error_lines) - len(shown)} more lines in the row ({rows_path})")
    if tbstyle in ("long", "native") and row.get("traceback"):
        lines += ["traceback (child process):", strip_ansi(row["traceback"]).rstrip()]
    lines.append(f"known failure? list it in skiplists/export_skip.yaml with its cause and upstream link "
                 f"(draft: export-sweep skiplist {rows_path.parent})")
    return "\n".join(lines)


# ─── Reporting ───────────────────────────────────────────────────────────────────────────────────

_ROWS_SEEN: list[dict] = []  # on the controller: every row reported this session (xdist ships user_properties)


#: a long run prints a progress line (cases done of total, elapsed, ETA) at most this often, in seconds
PROGRESS_EVERY = 60.0


@dataclass
class _Progress:
    total: int
    started: float = field(default_factory=time.time)
    done: int = 0
    last: float = field(default_factory=time.time)
    left: Counter = field(default_factory=Counter)  # cases of each class not reported yet

    def line(self, now: float) -> str:
        elapsed = now - self.started
        rate = self.done / elapsed if elapsed > 0 else 0.0
        eta = (self.total - self.done) / rate if rate else math.inf
        return (f"export-sweep: {self.done:,} of {self.total:,} cases ({100 * self.done / self.total:.0f}%), "
                f"{_duration(elapsed)} elapsed, ETA {_duration(eta)} ({60 * rate:.1f} cases/min)")


def _duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    minutes = int(round(seconds / 60))
    return f"{minutes // 60}h {minutes % 60:02d}m" if minutes >= 60 else f"{minutes}m" if minutes else f"{seconds:.0f}s"


_PROGRESS = pytest.StashKey[_Progress]()


def _class_of(nodeid: str) -> str:
    """``sweep/test_export.py::test_export[Bert@my-bert-onnx-dynamic]`` -> ``Bert@my-bert``."""
    return nodeid.split("[", 1)[1].rstrip("]").rsplit("-", 2)[0]


def _count_collected(config: pytest.Config, nodeids: list[str]) -> None:
    """The progress total: the cases collected after every deselection (``-k``, ``-m``, ``--shard``, ``--resume``),
    said once when the run starts."""
    progress = config.stash.setdefault(_PROGRESS, _Progress(0))
    if progress.total or config.stash.get(_SETTINGS, None) is None:
        return
    left = Counter(_class_of(n) for n in nodeids if "test_export[" in n)
    if not left:
        return
    progress.left, progress.total = left, sum(left.values())
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"export-sweep: {progress.total:,} cases to run ({len(left):,} classes)")


def pytest_collection_finish(session: pytest.Session) -> None:
    if not hasattr(session.config, "workerinput"):
        _count_collected(session.config, [item.nodeid for item in session.items])


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids: list[str]) -> None:
    """Under xdist the controller collects nothing; each worker reports the ids it will run, -k and -m applied."""
    _count_collected(node.config, ids)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call":
        _ROWS_SEEN.extend(row for key, row in report.user_properties if key == "sweep_row")


def pytest_report_teststatus(report: pytest.TestReport, config: pytest.Config):
    """Count finished cases on the controller; past :data:`PROGRESS_EVERY` seconds, print where the run stands."""
    settings = config.stash.get(_SETTINGS, None)
    if settings is None or hasattr(config, "workerinput") or report.when != "teardown" or "test_export[" not in report.nodeid:
        return None
    progress = config.stash.setdefault(_PROGRESS, _Progress(0))  # its total and per-class counts: _count_collected
    progress.done += 1
    model = _class_of(report.nodeid)
    progress.left[model] -= 1
    if settings.shared_dir is not None and progress.left[model] <= 0:  # all the class's cases reported
        from sweep.shared_build import class_file, remove

        remove(class_file(settings.shared_dir, model, 0))
    now = time.time()
    if now - progress.last >= PROGRESS_EVERY and progress.done < progress.total:
        progress.last = now
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(progress.line(now))
    return None


def _stale_entries(rows: list[dict]) -> list[str]:
    return sorted({r["skiplist"] for r in rows if r.get("skiplist") and r["status"] == "pass"})


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """--strict-skiplists: a skiplist entry whose case passes now fails the run (the lists stay honest)."""
    settings = session.config.stash.get(_SETTINGS, None)
    if settings is None or hasattr(session.config, "workerinput") or not settings.strict_skiplists:
        return
    if _stale_entries(_ROWS_SEEN) and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_unconfigure(config: pytest.Config) -> None:
    """The run's folder of built classes goes with the run (the controller made it; crashes included)."""
    settings = config.stash.get(_SETTINGS, None)
    if settings is not None and settings.shared_dir is not None and not hasattr(config, "workerinput"):
        import shutil

        shutil.rmtree(settings.shared_dir, ignore_errors=True)


def _write_reuse_summary(tr, rows: list[dict], source: Path) -> None:
    reused = sum(1 for r in rows if r.get("reused_from"))
    reasons = Counter(r.get("rerun_reason") or "?" for r in rows if not r.get("reused_from"))
    ran = ", ".join(f"{reason} {n}" for reason, n in reasons.most_common())
    tr.write_line(f"reused: {reused} of {len(rows)} cases from {source}" + (f"; ran {sum(reasons.values())} ({ran})"
                                                                          if reasons else ""))


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    settings = config.stash.get(_SETTINGS, None)
    if settings is None or hasattr(config, "workerinput"):
        return
    rows = list(_ROWS_SEEN)
    tr = terminalreporter
    tr.section("export-sweep summary")
    if settings.done:
        tr.write_line(f"resumed: {len(settings.done)} cases already had a row in {settings.rows_path}")
    if settings.reuse_from:
        _write_reuse_summary(tr, rows, settings.reuse_from.parent)
    if not rows and not settings.done:
        tr.write_line("no sweep case ran")
        return
    counts: dict[str, Counter] = defaultdict(Counter)
    for row in rows:
        counts[row["backend"]][row["status"]] += 1
    tr.write_line(f"{'backend':<12}" + "".join(f"{s:>13}" for s in STATUSES) + f"{'total':>8}")
    for backend in BACKENDS:
        if backend in counts:
            c = counts[backend]
            tr.write_line(f"{backend:<12}" + "".join(f"{c[s]:>13}" for s in STATUSES) + f"{sum(c.values()):>8}")
    stale = _stale_entries(rows)
    if stale:
        tr.write_line(f"stale skiplist entries (the case now passes): {len(stale)}"
                      + (" -- failing the run (--strict-skiplists)" if settings.strict_skiplists else ""),
                      red=settings.strict_skiplists, yellow=not settings.strict_skiplists)
        for entry in stale:
            tr.write_line(f"  {entry}")
    from sweep.matrix import versions_table, write_matrix

    drift = [v for v in versions_table(rows) if v["state"] != "ok"]
    if drift:
        listing = ", ".join(f"{v['package']} {'/'.join(v['installed']) or 'not installed'} (pinned {v['pinned']})"
                            for v in drift)
        tr.write_line(f"version drift: {listing}; results may differ from the baseline", yellow=True)
    from sweep.results import read_rows

    def corrupt(problem) -> None:
        tr.write_line(f"warning: {problem}", yellow=True)

    # The matrix covers the whole row file: with --resume the earlier cases too, with --shard in a shared
    # folder the other shards' rows as well (one row per case, the latest).
    all_rows = list(read_rows(settings.rows_path, on_corrupt=corrupt)) if settings.rows_path.is_file() else rows
    paths = write_matrix(all_rows, settings.report_dir)
    tr.write_line(f"rows: {settings.rows_path}   matrix: {paths['md']}, {paths['html']}, {paths['json']}")
