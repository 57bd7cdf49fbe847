"""What the terminal shows: the cases to run, progress with an ETA, and the summary (statuses, known failures by
entry, stale entries, the command that reruns the failures); the matrices written at the end."""

from __future__ import annotations

import math
import shlex
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import pytest

from sweep.plugin.collection import case_of, record_run
from sweep.plugin.options import BACKENDS, SETTINGS, STATUSES, SweepSettings

_ROWS_SEEN: list[dict] = []  # on the controller: every row reported this session (xdist ships user_properties)

#: a long run prints a progress line (cases done of total, elapsed, ETA) after its first case, then at most this
#: often, in seconds
PROGRESS_EVERY = 60.0


@dataclass
class Progress:
    total: int
    started: float = field(default_factory=time.time)
    done: int = 0
    last: float = 0.0  # when the last progress line was printed (0: none yet)
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


PROGRESS = pytest.StashKey[Progress]()


def _class_of(nodeid: str) -> str:
    """``sweep/test_export.py::test_export[Bert@my-bert-onnx-dynamic]`` -> ``Bert@my-bert``."""
    return case_of(nodeid).rsplit("-", 2)[0]


def _count_collected(config: pytest.Config, nodeids: list[str]) -> None:
    """The progress total: the cases collected after every deselection (``-k``, ``-m``, ``--shard``, ``--resume``),
    said once when the run starts; the run's record is written then too."""
    progress = config.stash.setdefault(PROGRESS, Progress(0))
    if progress.total or config.stash.get(SETTINGS, None) is None:
        return
    record_run(config, nodeids)
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
    """Count finished cases on the controller; print where the run stands after the first case, then every
    :data:`PROGRESS_EVERY` seconds."""
    settings = config.stash.get(SETTINGS, None)
    if settings is None or hasattr(config, "workerinput") or report.when != "teardown" or "test_export[" not in report.nodeid:
        return None
    progress = config.stash.setdefault(PROGRESS, Progress(0))  # its total and per-class counts: _count_collected
    progress.done += 1
    model = _class_of(report.nodeid)
    progress.left[model] -= 1
    if settings.shared_dir is not None and progress.left[model] <= 0:  # all the class's cases reported
        from sweep.shared_build import class_file, remove

        remove(class_file(settings.shared_dir, model, 0))
    now = time.time()
    if (not progress.last or now - progress.last >= PROGRESS_EVERY) and progress.done < progress.total:
        progress.last = now
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            if config.pluginmanager.has_plugin("dsession"):  # xdist's progress dots: pytest does not track that line
                reporter.write("\n")
            reporter.write_line(progress.line(now))
    return None


def _stale_entries(rows: list[dict]) -> list[str]:
    return sorted({r["skiplist"] for r in rows if r.get("skiplist") and r["status"] == "pass"})


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """--strict-skiplists: a skiplist entry whose case passes now fails the run (the lists stay honest)."""
    settings = session.config.stash.get(SETTINGS, None)
    if settings is None or hasattr(session.config, "workerinput") or not settings.strict_skiplists:
        return
    if _stale_entries(_ROWS_SEEN) and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_unconfigure(config: pytest.Config) -> None:
    """The run's folder of built classes goes with the run (the controller made it; crashes included)."""
    settings = config.stash.get(SETTINGS, None)
    if settings is not None and settings.shared_dir is not None and not hasattr(config, "workerinput"):
        import shutil

        shutil.rmtree(settings.shared_dir, ignore_errors=True)


# ─── The summary ─────────────────────────────────────────────────────────────────────────────────

def _write_reuse_summary(tr, rows: list[dict], settings: SweepSettings) -> None:
    reused = sum(1 for r in rows if r.get("reused_from"))
    reasons = Counter(r.get("rerun_reason") or "?" for r in rows if not r.get("reused_from"))
    ran = ", ".join(f"{reason} {n}" for reason, n in reasons.most_common())
    source = ", ".join(str(p.parent) for p in settings.reuse_from)
    tr.write_line(f"reused: {reused} of {len(rows)} cases from {source}" + (f"; ran {sum(reasons.values())} ({ran})"
                                                                          if reasons else ""))


def _write_listed(tr, rows: list[dict]) -> None:
    """Known failures, one line per skiplist entry: the reason a CI log reader needs, without ``-rs``."""
    by_entry: dict[str, list[str]] = defaultdict(list)
    for row in rows:
        if row["status"] == "skip" and row.get("skiplist"):
            by_entry[row["skiplist"]].append(row.get("case_id") or row["model"])
    if not by_entry:
        return
    tr.write_line(f"known failures: {sum(map(len, by_entry.values()))} cases skipped, listed by "
                  f"{len(by_entry)} skiplist entries (--run-skipped runs them):")
    for entry, ids in sorted(by_entry.items(), key=lambda item: (-len(item[1]), item[0])):
        shown = ", ".join(sorted(ids)[:3]) + (f" (+{len(ids) - 3})" if len(ids) > 3 else "")
        tr.write_line(f"  {len(ids):>4} {shown}: {entry}")


#: options that choose cases: left out of the command that reruns the failures (their case ids say it all)
_SELECTING = {"--models": True, "--backend": True, "--shard": True, "--shapes": True, "--durations-from": True,
              "-k": True, "-m": True, "--reuse-from": False, "--resume": False, "--lf": False, "--last-failed": False,
              "--sw": False, "--stepwise": False, "--generate": False, "--pyargs": False, "-p": True, "-W": True}
#: a rerun command lists at most this many case ids; more go into a file pytest reads (``pytest @file``)
RERUN_INLINE = 12


def rerun_command(args: list[str], failed: list[str], settings: SweepSettings) -> str:
    """``pytest <the run's other options> <failed case ids>``: pasted into a shell, it reruns just them."""
    from sweep.plugin.options import case_id_of_arg

    kept: list[str] = []
    skip_value = False
    for arg in args:
        if skip_value:
            skip_value = False
            continue
        name = arg.split("=", 1)[0]
        takes_value = _SELECTING.get(name)
        if takes_value is not None:
            skip_value = takes_value and "=" not in arg and not (name in ("-p", "-W", "-k", "-m") and len(arg) > 2)
            continue
        if name.startswith(("-p", "-W")) and len(name) > 2:
            continue
        if not arg.startswith("-") and (case_id_of_arg(arg) or arg in ("sweep", "sweep.test_export")):
            continue
        kept.append(arg)
    if len(failed) <= RERUN_INLINE:
        return shlex.join(["pytest", *kept, *failed])
    from sweep.results import replace_file

    path = settings.report_dir / f"failed-{settings.run_id}.txt"
    replace_file(path, "".join(f"{case}\n" for case in failed))
    return shlex.join(["pytest", *kept]) + f" @{shlex.quote(str(path))}"


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    settings = config.stash.get(SETTINGS, None)
    if settings is None or hasattr(config, "workerinput"):
        return
    rows = list(_ROWS_SEEN)
    tr = terminalreporter
    tr.section("export-sweep summary")
    if settings.done:
        tr.write_line(f"resumed: {len(settings.done)} cases already had a row in {settings.rows_path}")
    if settings.reuse_from:
        _write_reuse_summary(tr, rows, settings)
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
    _write_listed(tr, rows)
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
    failed = sorted(r.get("case_id") or r["model"] for r in rows if r["status"] not in ("pass", "skip"))
    if failed:
        tr.write_line(f"rerun the {len(failed)} failing case(s): "
                      f"{rerun_command(list(config.invocation_params.args), failed, settings)}", bold=True)
