"""Running a case: isolated in a child process (or its row reused), one row written, its status a test outcome."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from sweep.plugin.collection import case_of
from sweep.plugin.options import SETTINGS, SweepSettings


def _versions() -> dict[str, str | None]:
    from engine import installed_versions

    return installed_versions()


@pytest.fixture
def sweep_case(request: pytest.FixtureRequest) -> dict:
    return request.param


@pytest.fixture
def sweep_run(request: pytest.FixtureRequest):
    """``sweep_run(spec)`` runs the case isolated, writes its row and turns its status into a test outcome."""
    from engine.versions import pinned_versions
    from sweep.case import run_case
    from sweep.categories import categorize, first_line
    from sweep.isolation import run_isolated, warm_backends
    from sweep.zoo.errors import installable

    settings: SweepSettings = request.config.stash[SETTINGS]

    needs_catalog = any(m not in settings.local_models for m in settings.models)

    def run(spec: dict) -> dict:
        from sweep import reuse
        from sweep.fingerprint import fingerprint, fingerprint_parts

        cid = case_of(request.node.nodeid)
        skipped = spec.get("skiplist") and not settings.run_skipped
        # what the result depends on besides the spec: --run-skipped only matters to a listed case
        parts = fingerprint_parts(spec, {"timeout": settings.timeout,
                                         "run_skipped": settings.run_skipped if spec.get("skiplist") else None})
        if settings.reuse_from:
            earlier, rerun_reason = reuse.find(settings.reuse_from, cid, parts)
            if earlier is not None:
                return _record(reuse.reused_row(earlier, settings.reuse_from))
        else:
            rerun_reason = None
        if not skipped:  # the forkserver starts before the first case that runs (a skipped case never needs it)
            warm_backends(_worth_warming(request.session, settings), catalog=needs_catalog)  # once: the first case
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
            "shard": "{}/{}".format(*settings.shard) if settings.shard else None,
            "fingerprint": fingerprint(parts), "fingerprint_parts": parts,
            **({"rerun_reason": rerun_reason} if rerun_reason else {}),
            **result,
        }
        row["error_line"] = first_line(row.get("error"))
        row["category"] = categorize(row)
        return _record(row)

    def _record(row: dict) -> dict:
        from sweep.results import append_row

        # the row is this run's (a reused one too): its run, and when it was recorded, decide which row of a case
        # is the latest (sweep.results.latest_rows), whenever the case itself ran
        row = {**row, "run": settings.run_id, "recorded": time.time()}
        row.pop("selection", None)  # rows of older runs carried their run's --models; the run record holds it now
        append_row(settings.rows_path, row)
        request.node.user_properties.append(("sweep_row", {k: v for k, v in row.items() if k != "traceback"}))
        status = row["status"]
        if status == "skip":
            pytest.skip(row.get("skip_reason", "skipped"))
        if status != "pass":
            pytest.fail(failure_summary(row, request.config.option.tbstyle, settings), pytrace=False)
        return row

    return run


#: a backend's warm-up (its first export, in the forkserver: 1 s for dynamo, 3 s for ONNX, 12 s for ExecuTorch)
#: pays off from this many of its cases per process; below it each case pays its own first-use costs instead
WARM_FROM_CASES = 2


_WARMED = pytest.StashKey[tuple]()


def _worth_warming(session: pytest.Session, settings: SweepSettings) -> tuple[str, ...]:
    """The backends this process can expect :data:`WARM_FROM_CASES` cases of: its share of the collected cases
    (under xdist every worker collects them all and runs about 1/n of them). A small run at ``-n 2`` then does not
    warm every backend in every worker for one case each. Counted once per session (the forkserver starts once)."""
    if _WARMED in session.stash:
        return session.stash[_WARMED]
    from collections import Counter

    workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    per_backend = Counter(case_of(item.nodeid).rsplit("-", 2)[1] for item in session.items if "test_export[" in item.nodeid)
    session.stash[_WARMED] = tuple(b for b in settings.backends if per_backend[b] / workers >= WARM_FROM_CASES)
    return session.stash[_WARMED]


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


def failure_summary(row: dict, tbstyle: str, settings: SweepSettings) -> str:
    """What the terminal shows for a failing case: class, backend, stage, category, the error's first lines and
    how to list it as known; ``--tb=long`` adds the child's traceback. The full error stays in the row."""
    from sweep.categories import strip_ansi

    rows_path: Path = settings.rows_path
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
    if row["model"] in settings.local_models:
        lines.append("a model of yours (--config/--model-module): export-sweep's skiplists list catalog classes only")
    else:
        lines.append("known failure? list it with its cause and upstream link in a skiplist "
                     f"(draft: export-sweep skiplist {rows_path.parent})")
    return "\n".join(lines)
