"""The sweep's command line: its options, the case ids given as arguments, and the settings a run reads."""

from __future__ import annotations

import math
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

BACKENDS = ("eager", "dynamo", "onnx", "executorch")
SHAPES = {"dynamic": ("dynamic",), "static": ("static",), "both": ("dynamic", "static")}
STATUSES = ("pass", "discrepancy", "fail", "skip", "timeout", "crash")
#: the test function every case is a parameter of (sweep/test_export.py)
TEST_FILE = Path(__file__).resolve().parent.parent / "test_export.py"
#: ``Model-backend-shapes``, alone or as the node id pytest prints (``[path]::test_export[Model-backend-shapes]``)
CASE_ID = re.compile(rf"^(?P<model>.+)-(?P<backend>{'|'.join(BACKENDS)})-(?P<shapes>dynamic|static|generate)$")
NODE_ID = re.compile(r"^(?P<path>[^\[]*)::test_export\[(?P<case>.+)\]$")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("export-sweep", "export every transformers model class and compare with eager "
                            "(with any of these options, or case ids as arguments, and no path arguments, pytest "
                            "runs the sweep)")
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
    group.addoption("--skiplist-dir", default=None,
                    help="folder of the skiplist YAML files (default: the ones shipped for the pinned versions)")
    group.addoption("--run-skipped", action="store_true", help="run skiplisted cases; report entries that now pass")
    group.addoption("--strict-skiplists", action="store_true",
                    help="with --run-skipped: a skiplist entry whose case now passes (stale) fails the run")
    group.addoption("--shard", default=None, metavar="I/N",
                    help="run part I of N of the cases, balanced by the baseline's recorded case durations (every "
                         "runner computes the same split; join the parts with export-sweep merge)")
    group.addoption("--durations-from", default=None, metavar="DIR",
                    help="--shard: the report folder whose case durations balance the shards (default: the "
                         "packaged baseline)")
    group.addoption("--resume", action="store_true",
                    help="keep the row file and skip the cases it already has a row for (continue an interrupted sweep)")
    group.addoption("--reuse-from", default=None, metavar="DIR", nargs="?", const="baseline",
                    help="an earlier run's report folder (alone: the packaged baseline): a case whose fingerprint "
                         "(class and modeling sources, config and inputs recipe, versions, export-sweep's sources, "
                         "skiplist entry, tolerances, shapes) matches its row there is not run again; the row is "
                         "copied, marked reused")
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
    durations_from: list[Path] = field(default_factory=list)  # --shard: row files whose durations balance it
    generate: bool = False
    resume: bool = False
    done: set[str] = field(default_factory=set)  # --resume: case ids already in the row file
    reuse_from: list[Path] = field(default_factory=list)  # --reuse-from: row files of earlier runs
    selection: str = "all"  # what --models selected (the run's record keeps it)
    cases: frozenset[str] | None = None  # case ids given as arguments: only these run
    strict_skiplists: bool = False
    run_id: str = ""  # this run (sweep.runs); every row it writes names it
    shared_dir: Path | None = None  # several backends: the run's folder of built classes (sweep.shared_build)

    @property
    def rows_path(self) -> Path:
        from sweep.results import ROWS_FILE

        return self.report_dir / ROWS_FILE


SETTINGS = pytest.StashKey[SweepSettings]()


# ─── Case ids as arguments ───────────────────────────────────────────────────────────────────────

def case_id_of_arg(arg: str) -> str | None:
    """The case an argument names: a case id (``BertModel-onnx-dynamic``) or the node id pytest printed for it
    (``::test_export[...]``, ``.../sweep/test_export.py::test_export[...]``); None for anything else."""
    node = NODE_ID.match(arg)
    if node:
        path = node.group("path")
        if path in ("", ".") or Path(path).name == TEST_FILE.name:
            return node.group("case") if CASE_ID.match(node.group("case")) else None
        return None
    if CASE_ID.match(arg) and not os.path.exists(arg):
        return arg
    return None


_GIVEN_CASES = pytest.StashKey["frozenset[str] | None"]()


def given_cases(config: pytest.Config) -> frozenset[str] | None:
    """The case ids given as arguments, when every argument is one (a real path keeps pytest's meaning); read once,
    before the sweep replaces the arguments with its test file."""
    if _GIVEN_CASES not in config.stash:
        args = [a for a in config.args if not (config.option.pyargs and a in ("sweep", "sweep.test_export"))]
        cases = [case_id_of_arg(arg) for arg in args] if config.args_source == pytest.Config.ArgsSource.ARGS else []
        config.stash[_GIVEN_CASES] = frozenset(cases) if cases and all(cases) else None
    return config.stash[_GIVEN_CASES]


def sweep_option_given(config: pytest.Config) -> bool:
    opt = config.option
    return (opt.models is not None or opt.backend is not None or bool(opt.model_module) or bool(opt.sweep_configs)
            or opt.generate)


def sweep_requested(config: pytest.Config) -> bool:
    if sweep_option_given(config) or given_cases(config):
        return True
    package = TEST_FILE.parent
    for arg in config.args:
        path = Path(arg.split("::")[0])
        if arg.split("::")[0] in ("sweep", "sweep.test_export") and config.option.pyargs:
            return True
        if path.exists() and path.resolve() in (package, TEST_FILE):
            return True
    return False


# ─── Settings ────────────────────────────────────────────────────────────────────────────────────

def _parse_backends(values: list[str] | None, cases: frozenset[str] | None) -> tuple[str, ...]:
    if values is None:
        values = [",".join(sorted({CASE_ID.match(c).group("backend") for c in cases}))] if cases else ["dynamo"]
    names = [n.strip() for v in values for n in v.split(",") if n.strip()]
    if not names:
        raise pytest.UsageError(f"--backend is empty; choose from {', '.join(BACKENDS)} or all")
    unknown = [n for n in names if n not in (*BACKENDS, "all")]
    if unknown:
        raise pytest.UsageError(f"--backend {', '.join(unknown)}: unknown; choose from {', '.join(BACKENDS)} or all")
    if "all" in names:
        return BACKENDS
    return tuple(b for b in BACKENDS if b in names)


def _shapes(opt, cases: frozenset[str] | None) -> tuple[str, ...]:
    if cases and opt.shapes == "dynamic":  # the default: take the shapes the ids name
        named = {CASE_ID.match(c).group("shapes") for c in cases} - {"generate"}
        return tuple(s for s in ("dynamic", "static") if s in named) or SHAPES["dynamic"]
    if opt.shapes not in SHAPES:
        raise pytest.UsageError(f"--shapes {opt.shapes!r}: choose dynamic, static or both")
    return SHAPES[opt.shapes]


def _row_files(config: pytest.Config, option: str, value: str | None) -> list[Path]:
    """``--reuse-from`` / ``--durations-from``: a report folder, or ``baseline`` for the packaged baseline."""
    from sweep.packaged import PackagedDataError, baseline_row_files
    from sweep.results import RowFileError, rows_path

    try:
        if value is not None and (value != "baseline" or invocation_path(config, value).exists()):
            return [rows_path(invocation_path(config, value))]
        return baseline_row_files()
    except (RowFileError, PackagedDataError) as e:
        raise pytest.UsageError(f"{option} {value or ''}: {e} (give an earlier run's report folder, or nothing for "
                                "the packaged baseline)") from None


def build_settings(config: pytest.Config) -> SweepSettings:
    from sweep.packaged import skiplist_dir
    from sweep.selection import SelectionError, is_known_class, resolve_models
    from sweep.skiplist import SkiplistError, load_skiplists
    from sweep.zoo import catalog

    opt = config.option
    cases = given_cases(config)
    backends = _parse_backends(opt.backend, cases)
    shapes = _shapes(opt, cases)
    for name in ("atol", "rtol"):
        value = getattr(opt, name)
        if not math.isfinite(value) or value < 0:
            raise pytest.UsageError(f"--{name} must be a finite number >= 0, got {value}")
    if not math.isfinite(opt.case_timeout) or opt.case_timeout <= 0:
        raise pytest.UsageError(f"--case-timeout must be a finite number of seconds > 0, got {opt.case_timeout}")
    skiplists_at = invocation_path(config, opt.skiplist_dir) if opt.skiplist_dir else skiplist_dir()
    if not skiplists_at.is_dir():
        raise pytest.UsageError(f"--skiplist-dir {opt.skiplist_dir}: no such folder (it holds export_skip.yaml, "
                                "onnx_disable_optimize.yaml and generate_skip.yaml; default: the ones export-sweep ships)")
    if opt.strict_skiplists and not opt.run_skipped:
        raise pytest.UsageError("--strict-skiplists needs --run-skipped (listed cases must run to be found stale)")
    if opt.models is not None and not opt.models.strip():
        raise pytest.UsageError("--models is empty (an unset variable?); give class names, globs, @file lists, "
                                "'smoke' or 'all'")
    local = {**_local_models(config, opt.model_module), **_config_models(config, opt.sweep_configs)}
    from sweep.shard import ShardError, parse_shard

    try:
        shard = parse_shard(opt.shard) if opt.shard is not None else None
    except ShardError as e:
        raise pytest.UsageError(str(e)) from None
    reuse_from = _row_files(config, "--reuse-from", opt.reuse_from) if opt.reuse_from is not None else []
    durations_from = _row_files(config, "--durations-from", opt.durations_from) if shard else []
    # only local models given (--model-module/--config): they are the selection, not the whole catalog; case ids
    # given as arguments: their classes
    if opt.models is not None:
        selection = opt.models
    elif cases:
        selection = ",".join(sorted({CASE_ID.match(c).group("model") for c in cases}))
    else:
        selection = ",".join(sorted(local)) if local else "all"
    # an xdist worker takes what its controller resolved and checked (the catalog costs each process seconds)
    handed = getattr(config, "workerinput", {}).get("sweep_models")
    classes = frozenset(config.workerinput["sweep_classes"]) if handed is not None else None
    try:
        models = list(handed) if handed is not None else resolve_models(selection, extra=local)
        skiplists = load_skiplists(
            skiplists_at, lambda name: name in local or (name in classes if classes else is_known_class(name)),
            lambda: [*(classes if classes is not None else catalog.all_classes()), *local])
    except (SelectionError, SkiplistError) as e:
        raise pytest.UsageError(str(e)) from None
    generate = opt.generate or bool(cases and any(c.endswith("-generate") for c in cases))
    return SweepSettings(backends, models, shapes, opt.atol, opt.rtol, opt.case_timeout,
                         invocation_path(config, opt.report_dir), opt.run_skipped, skiplists, local, shard=shard,
                         durations_from=durations_from, resume=opt.resume, generate=generate, selection=selection,
                         cases=cases, strict_skiplists=opt.strict_skiplists, reuse_from=reuse_from)


def invocation_path(config: pytest.Config, path: str) -> Path:
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
        path = invocation_path(config, given).resolve()
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
