"""Case isolation: a killed sweep leaves no case process running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest


def sleeper(spec, progress):
    """A case that records its pid and then runs far longer than the test waits."""
    Path(spec["pid_file"]).write_text(str(os.getpid()))
    time.sleep(300)
    return {"status": "pass"}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead; only its parent (here init or a subreaper) has not reaped it yet
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def _wait_for_pid(path: Path, process: subprocess.Popen) -> int:
    deadline = time.monotonic() + 240
    while not path.exists() or not path.read_text():
        assert process.poll() is None and time.monotonic() < deadline, f"{path.name} was never written"
        time.sleep(0.2)
    return int(path.read_text())


def _gone(pid: int, seconds: float = 30) -> bool:
    deadline = time.monotonic() + seconds
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    return not _alive(pid)


_CASE = """
from sweep.isolation import run_isolated
from tests.sweep.test_isolation import sleeper

run_isolated(sleeper, {{"pid_file": {pid_file!r}}}, timeout=600)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="a closed pipe reader shows as POLLERR on Linux")
def test_a_killed_sweep_leaves_no_case_running(tmp_path):
    """The process that ran the case is killed (no cleanup code of it runs): the case process exits."""
    pid_file = tmp_path / "case.pid"
    root = Path(__file__).resolve().parents[2]
    sweep = subprocess.Popen([sys.executable, "-c", _CASE.format(pid_file=str(pid_file))], cwd=root)
    try:
        case = _wait_for_pid(pid_file, sweep)
        assert _alive(case)
        sweep.send_signal(signal.SIGKILL)
        sweep.wait()
        assert _gone(case), "the case outlived the sweep that started it"
    finally:
        sweep.kill()


@pytest.mark.skipif(sys.platform != "linux", reason="a closed pipe reader shows as POLLERR on Linux")
def test_an_xdist_worker_whose_controller_died_stops_its_case(tmp_path):
    """A worker (``PYTEST_XDIST_WORKER`` set) outlives its killed controller, as xdist's do: it kills its case and
    exits instead of running the case to the end."""
    pid_file, worker_file = tmp_path / "case.pid", tmp_path / "worker.pid"
    controller_script = textwrap.dedent(f"""
        import os, subprocess, sys, time
        worker = subprocess.Popen([sys.executable, "-c", {_CASE.format(pid_file=str(pid_file))!r}],
                                  env=dict(os.environ, PYTEST_XDIST_WORKER="gw0"))
        open({str(worker_file)!r}, "w").write(str(worker.pid))
        time.sleep(600)
    """)
    root = Path(__file__).resolve().parents[2]
    controller = subprocess.Popen([sys.executable, "-c", controller_script], cwd=root)
    try:
        case = _wait_for_pid(pid_file, controller)
        worker = int(worker_file.read_text())
        controller.send_signal(signal.SIGKILL)
        controller.wait()
        assert _gone(worker), "the worker ran on without its controller"
        assert _gone(case), "the case outlived its worker"
    finally:
        controller.kill()
