"""Which cases a run collects: one per (model class, backend, shapes), after ``--shard``, ``--resume`` and case ids
given as arguments; the run's record of what it selected (:mod:`sweep.runs`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sweep.plugin.options import BACKENDS, SETTINGS, TEST_FILE, SweepSettings, build_settings, given_cases, \
    sweep_option_given, sweep_requested

#: the task mappings whose classes generate text (--generate adds a generation case for each)
GENERATIVE_MAPPINGS = frozenset({"causal_lm", "seq_to_seq_causal_lm", "speech_seq_2_seq", "image_text_to_text", "multimodal_lm"})


def pytest_configure(config: pytest.Config) -> None:
    for backend in BACKENDS:
        config.addinivalue_line("markers", f"{backend}: export-sweep case on the {backend} backend")
    if not sweep_requested(config):
        return
    if (sweep_option_given(config) and config.args_source != pytest.Config.ArgsSource.ARGS) or given_cases(config):
        # the headline command: sweep options (or case ids) and no paths collect the sweep, not the folder's tests
        config.args = ["sweep.test_export"] if config.option.pyargs else [str(TEST_FILE)]
    settings = build_settings(config)
    config.stash[SETTINGS] = settings
    if hasattr(config, "workerinput"):  # the controller decided what is done (see pytest_configure_node)
        settings.done = set(config.workerinput.get("sweep_done", ()))
        shared = config.workerinput.get("sweep_shared")
        settings.shared_dir = Path(shared) if shared else None
        settings.run_id = config.workerinput.get("sweep_run", "")
        return
    from sweep.runs import new_run_id

    settings.run_id = new_run_id()
    if len(settings.backends) > 1:  # one build and eager run per class (a folder of this run's own)
        import tempfile

        settings.shared_dir = Path(tempfile.mkdtemp(prefix="export-sweep-shared-"))
    # Rows are never deleted: every run appends, and a case's latest row is its result (sweep.results). So two
    # sweeps sharing a folder, --lf, -k and --collect-only keep every other case's row. --resume skips the cases
    # that already have one.
    from sweep.results import case_id, read_rows

    if settings.resume and settings.rows_path.is_file():
        settings.done = {case_id(r) for r in read_rows(settings.rows_path, on_corrupt=warn_corrupt(config))}


def warn_corrupt(config: pytest.Config):
    def warn(problem) -> None:
        config.issue_config_time_warning(pytest.PytestWarning(str(problem)), stacklevel=2)
    return warn


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """xdist: hand the controller's decisions (--resume's done cases, the shared build folder, the run id) to each
    worker, so that all collect the same cases and write rows of the same run."""
    settings = node.config.stash.get(SETTINGS, None)
    if settings is not None:
        node.workerinput["sweep_done"] = sorted(settings.done)
        node.workerinput["sweep_shared"] = str(settings.shared_dir) if settings.shared_dir else None
        node.workerinput["sweep_run"] = settings.run_id
        node.workerinput["sweep_models"] = list(settings.models)
        from sweep.zoo import catalog

        node.workerinput["sweep_classes"] = catalog.all_classes() if any(
            m not in settings.local_models for m in settings.models) else []


def _is_generative(model: str, settings: SweepSettings) -> bool:
    local = settings.local_models.get(model)
    if local is not None and "class" not in local:  # a --model-module model: no generate() we know of
        return False
    from sweep.zoo.catalog import mappings_of

    name = local["class"] if local else model
    return bool(GENERATIVE_MAPPINGS.intersection(mappings_of(name))) and _has_generate(name)


def _has_generate(name: str) -> bool:
    """Whether the class defines ``generate()``: a class of a generative mapping may not (PI0, a flow-matching
    action model listed under image-text-to-text), and then there is no generation to check. A class that does not
    import keeps its case, whose row says why."""
    from sweep.zoo.build import model_class

    try:
        return callable(getattr(model_class(name), "generate", None))
    except Exception:  # noqa: BLE001 - reported by the case itself
        return True


def cases(settings: SweepSettings) -> list:
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


_SHARDS = pytest.StashKey[dict]()


def _shard_of(config: pytest.Config, settings: SweepSettings) -> dict[str, int]:
    """Every case's shard, balanced by the recorded durations of ``--durations-from`` (the packaged baseline by
    default); the same on every runner, since each computes it from the same cases and rows."""
    if _SHARDS not in config.stash:
        from sweep.results import read_rows
        from sweep.shard import balanced_shards, durations_from_rows

        rows = [row for path in settings.durations_from for row in read_rows(path, on_corrupt=warn_corrupt(config))]
        ids = [param.id for param in cases(settings)]
        config.stash[_SHARDS] = balanced_shards(ids, durations_from_rows(rows), settings.shard[1])
    return config.stash[_SHARDS]


def in_scope(config: pytest.Config, settings: SweepSettings, case: str) -> bool:
    """Whether ``case`` is this run's: in its ``--shard`` and among the case ids given as arguments."""
    if settings.cases is not None and case not in settings.cases:
        return False
    return not settings.shard or _shard_of(config, settings).get(case) == settings.shard[0]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """--shard keeps this shard's cases, case ids keep themselves, --resume drops the cases already done."""
    settings = config.stash.get(SETTINGS, None)
    if settings is None or not (settings.shard or settings.done or settings.cases is not None):
        return
    keep, drop = [], []
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is None or "sweep_case" not in callspec.params:
            keep.append(item)
            continue
        (keep if in_scope(config, settings, callspec.id) and callspec.id not in settings.done else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "sweep_case" not in metafunc.fixturenames:
        return
    settings = metafunc.config.stash.get(SETTINGS, None)
    if settings is None:
        settings = metafunc.config.stash[SETTINGS] = build_settings(metafunc.config)
    metafunc.parametrize("sweep_case", cases(settings))


def case_of(nodeid: str) -> str:
    """``.../test_export.py::test_export[Bert@my-bert-onnx-dynamic]`` -> ``Bert@my-bert-onnx-dynamic``."""
    return nodeid.split("[", 1)[1].rstrip("]")


_RECORDED = pytest.StashKey[bool]()


def record_run(config: pytest.Config, nodeids: list[str]) -> None:
    """The run's record (once, on the controller, not for ``--collect-only``): what it selected, after every
    deselection, and whether something other than ``--shard``/``--resume`` left out cases of its scope."""
    settings = config.stash.get(SETTINGS, None)
    if settings is None or config.option.collectonly or _RECORDED in config.stash:
        return
    config.stash[_RECORDED] = True
    from sweep.runs import append_run, record

    collected = {case_of(n) for n in nodeids if "test_export[" in n}
    scope = {p.id for p in cases(settings) if settings.shard is None or in_scope(config, settings, p.id)}
    selected = collected | (settings.done & scope)
    shard = "{}/{}".format(*settings.shard) if settings.shard else None
    append_run(settings.rows_path, record(
        settings.run_id, models=settings.selection, backends=settings.backends, shapes=settings.shapes,
        generate=settings.generate, shard=shard, filtered=selected != scope, selected=selected,
        args=config.invocation_params.args))
