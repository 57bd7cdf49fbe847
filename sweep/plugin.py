"""pytest plugin: one test case per (model class, backend, shapes), each run isolated, each a result row.

    pytest --pyargs sweep --backend=onnx,executorch --models='Llama*,@my_models.txt' -n 16

Options are declared here with the hooks that use them; the work is delegated to :mod:`sweep.selection`,
:mod:`sweep.skiplist`, :mod:`sweep.isolation`, :mod:`sweep.case` and :mod:`sweep.results`.
The plugin is active when the sweep's test module is collected (``--pyargs sweep``, ``sweep/``) or when a
sweep option is given; otherwise it stays out of the way of other test suites.
"""

from __future__ import annotations

import os
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
    group = parser.getgroup("export-sweep", "export every transformers model class and compare with eager")
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
    group.addoption("--shard", default=None, metavar="I/N",
                    help="run part I of N of the cases (deterministic by case id; join the parts with export-sweep merge)")
    group.addoption("--resume", action="store_true",
                    help="keep the row file and skip the cases it already has a row for (continue an interrupted sweep)")
    group.addoption("--generate", action="store_true",
                    help="also export each generative class for generation and compare engine.generate's greedy "
                         "tokens with eager generate (cases Model-backend-generate)")
    group.addoption("--model-module", action="append", default=[],
                    help="import NAME and sweep the models in its SWEEP_MODELS dict {name: build(seed) -> (model, inputs)}")


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
    local_models: dict[str, str]  # model name -> module providing it (--model-module)
    shard: tuple[int, int] | None = None  # (i, n) of --shard i/n
    generate: bool = False
    resume: bool = False
    done: set[str] = field(default_factory=set)  # --resume: case ids already in the row file
    rows: list[dict] = field(default_factory=list)  # controller side: rows seen this session

    @property
    def rows_path(self) -> Path:
        from sweep.results import ROWS_FILE

        return self.report_dir / ROWS_FILE


def _sweep_requested(config: pytest.Config) -> bool:
    if config.option.models is not None or config.option.backend is not None:
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
    from sweep.selection import SelectionError, is_known_class, resolve_models
    from sweep.skiplist import SkiplistError, load_skiplists

    opt = config.option
    backends = _parse_backends(opt.backend)
    if opt.shapes not in SHAPES:
        raise pytest.UsageError(f"--shapes {opt.shapes!r}: choose dynamic, static or both")
    for name in ("atol", "rtol"):
        if getattr(opt, name) < 0:
            raise pytest.UsageError(f"--{name} must be >= 0, got {getattr(opt, name)}")
    if opt.case_timeout <= 0:
        raise pytest.UsageError(f"--case-timeout must be > 0 seconds, got {opt.case_timeout}")
    local = _local_models(opt.model_module)
    from sweep.shard import ShardError, parse_shard

    try:
        shard = parse_shard(opt.shard) if opt.shard is not None else None
    except ShardError as e:
        raise pytest.UsageError(str(e)) from None
    try:
        models = resolve_models(opt.models or "all", extra=local)
        skiplists = load_skiplists(Path(opt.skiplist_dir), lambda name: name in local or is_known_class(name))
    except (SelectionError, SkiplistError) as e:
        raise pytest.UsageError(str(e)) from None
    return SweepSettings(backends, models, SHAPES[opt.shapes], opt.atol, opt.rtol, opt.case_timeout,
                         Path(opt.report_dir), opt.run_skipped, skiplists, local, shard=shard, resume=opt.resume,
                         generate=opt.generate)


def _local_models(modules: list[str]) -> dict[str, str]:
    import importlib

    local: dict[str, str] = {}
    for name in modules:
        try:
            module = importlib.import_module(name)
        except ImportError as e:
            raise pytest.UsageError(f"--model-module {name}: cannot import it: {e}") from None
        models = getattr(module, "SWEEP_MODELS", None)
        if not isinstance(models, dict) or not models:
            raise pytest.UsageError(f"--model-module {name}: define SWEEP_MODELS = {{name: build(seed) -> (model, inputs)}}")
        local.update(dict.fromkeys(models, name))
    return local


_SETTINGS = pytest.StashKey[SweepSettings]()


def pytest_configure(config: pytest.Config) -> None:
    for backend in BACKENDS:
        config.addinivalue_line("markers", f"{backend}: export-sweep case on the {backend} backend")
    if not _sweep_requested(config):
        return
    settings = _settings(config)
    config.stash[_SETTINGS] = settings
    if hasattr(config, "workerinput"):  # the controller decided what is done (see pytest_configure_node)
        settings.done = set(config.workerinput.get("sweep_done", ()))
        return
    # The controller runs before any worker starts. Without --resume the session starts afresh: the whole
    # row file, or with --shard only this shard's rows (shards may share a report folder).
    from sweep.results import case_id, drop_rows, read_rows
    from sweep.shard import shard_of

    if settings.resume:
        if settings.rows_path.is_file():
            settings.done = {case_id(r) for r in read_rows(settings.rows_path, on_corrupt=_warn_corrupt(config))}
    elif settings.shard:
        index, count = settings.shard
        drop_rows(settings.rows_path, lambda row: shard_of(case_id(row), count) == index)
    else:
        settings.rows_path.unlink(missing_ok=True)


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


# ─── Collection ──────────────────────────────────────────────────────────────────────────────────

#: the task mappings whose classes generate text (--generate adds a generation case for each)
GENERATIVE_MAPPINGS = frozenset({"causal_lm", "seq_to_seq_causal_lm", "speech_seq_2_seq", "image_text_to_text", "multimodal_lm"})


def _is_generative(model: str, settings: SweepSettings) -> bool:
    if model in settings.local_models:
        return False
    from sweep.catalog import mappings_of

    return bool(GENERATIVE_MAPPINGS.intersection(mappings_of(model)))


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
                if model in settings.local_models:
                    spec["model_module"] = settings.local_models[model]
                marks = [getattr(pytest.mark, backend)]
                skip = settings.skiplists.find("generate_skip" if shapes == GENERATE else "export_skip", model, backend)
                if skip is not None:  # skipped when the case runs, so that its row says why
                    spec["skiplist"] = skip.describe()
                if backend == "onnx" and settings.skiplists.find("onnx_disable_optimize", model, backend):
                    spec["onnx_disable_optimize"] = True
                params.append(pytest.param(spec, marks=marks, id=f"{model}-{backend}-{shapes}"))
    return params


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """--shard keeps this shard's cases, --resume drops the cases already done; the rest is deselected."""
    settings = config.stash.get(_SETTINGS, None)
    if settings is None or not (settings.shard or settings.done):
        return
    from sweep.shard import shard_of

    keep, drop = [], []
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is None or "sweep_case" not in callspec.params:
            keep.append(item)
            continue
        out_of_shard = settings.shard and shard_of(callspec.id, settings.shard[1]) != settings.shard[0]
        (drop if out_of_shard or callspec.id in settings.done else keep).append(item)
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
    from sweep.errors import installable
    from sweep.categories import categorize, first_line
    from engine.versions import pinned_versions

    settings: SweepSettings = request.config.stash[_SETTINGS]

    needs_catalog = any(m not in settings.local_models for m in settings.models)

    def run(spec: dict) -> dict:
        skipped = spec.get("skiplist") and not settings.run_skipped
        if not skipped:  # the forkserver starts before the first case that runs (a skipped case never needs it)
            warm_backends(settings.backends, catalog=needs_catalog)
        started = time.time()
        if skipped:
            result = {"status": "skip", "skip_reason": f"skiplist: {spec['skiplist']}"}
        else:
            result = run_isolated(run_case, spec, settings.timeout)
        if result.get("error_type") == "missing_dependency" and not installable(result.get("package")):
            result["status"] = "skip"
            result["skip_reason"] = f"needs {result.get('package')}, which cannot be installed here"
        row = {
            "model": spec["model"], "backend": spec["backend"], "shapes": spec["shapes"],
            "case_id": request.node.nodeid.split("[")[-1].rstrip("]"),
            "started": started, "wall_seconds": round(time.time() - started, 3),
            "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
            "versions": _versions(), "pinned": pinned_versions(), "skiplist": spec.get("skiplist"),
            "shard": "{}/{}".format(*settings.shard) if settings.shard else None, **result,
        }
        row["error_line"] = first_line(row.get("error"))
        row["category"] = categorize(row)
        from sweep.results import append_row

        append_row(settings.rows_path, row)
        request.node.user_properties.append(("sweep_row", {k: v for k, v in row.items() if k != "traceback"}))
        status = row["status"]
        if status == "skip":
            pytest.skip(row.get("skip_reason", "skipped"))
        if status != "pass":
            where = f" in stage '{row['stage']}'" if row.get("stage") else ""
            pytest.fail(f"{status}{where}: {row.get('error', '')}\n{row.get('traceback', '')}".rstrip(), pytrace=False)
        return row

    return run


# ─── Reporting ───────────────────────────────────────────────────────────────────────────────────

_ROWS_SEEN: list[dict] = []  # on the controller: every row reported this session (xdist ships user_properties)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call":
        _ROWS_SEEN.extend(row for key, row in report.user_properties if key == "sweep_row")


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    settings = config.stash.get(_SETTINGS, None)
    if settings is None or hasattr(config, "workerinput"):
        return
    rows = list(_ROWS_SEEN)
    tr = terminalreporter
    tr.section("export-sweep summary")
    if settings.done:
        tr.write_line(f"resumed: {len(settings.done)} cases already had a row in {settings.rows_path}")
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
    stale = sorted({r["skiplist"] for r in rows if r.get("skiplist") and r["status"] == "pass"})
    if stale:
        tr.write_line(f"stale skiplist entries (the case now passes): {len(stale)}")
        for entry in stale:
            tr.write_line(f"  {entry}")
    from sweep.matrix import write_matrix
    from sweep.results import read_rows

    def corrupt(problem) -> None:
        tr.write_line(f"warning: {problem}", yellow=True)

    # The matrix covers the whole row file: with --resume the earlier cases too, with --shard in a shared
    # folder the other shards' rows as well (one row per case, the latest).
    all_rows = list(read_rows(settings.rows_path, on_corrupt=corrupt)) if settings.rows_path.is_file() else rows
    paths = write_matrix(all_rows, settings.report_dir)
    tr.write_line(f"rows: {settings.rows_path}   matrix: {paths['md']}, {paths['html']}, {paths['json']}")
