"""Repros: a script's exit code is its verdict; an entry names an existing repro; the command says which pass now."""

import sys
import textwrap

import pytest

from sweep.cli import main
from sweep.repros import REPRODUCED, describe, run_repro
from sweep.skiplist import SkiplistError, load_skiplist


def _script(folder, name, body, doc="What fails.\n\nTracker: pytorch/executorch"):
    path = folder / name
    path.write_text(f'"""{doc}"""\n' + textwrap.dedent(body))
    return path


def test_the_exit_code_is_the_verdict(tmp_path):
    still = _script(tmp_path, "still.py", f"raise SystemExit({REPRODUCED})\n")
    fixed = _script(tmp_path, "fixed.py", "print('ok')\n")
    broken = _script(tmp_path, "broken.py", "import no_such_module\n")
    assert run_repro(still).verdict == "reproduces"
    assert run_repro(fixed).verdict == "passes now"
    result = run_repro(broken)
    assert result.verdict == "broken" and "no_such_module" in result.detail
    assert run_repro(_script(tmp_path, "slow.py", "import time; time.sleep(5)\n"), timeout=0.5).verdict == "timeout"
    assert describe(still) == ("What fails.", "pytorch/executorch")


def test_a_relative_interpreter_path_is_the_one_from_here(tmp_path, monkeypatch):
    """``--python .venv-new/bin/python`` names the interpreter from where the command runs, not from the repro's folder."""
    from sweep.repros import run_all

    (tmp_path / "repros").mkdir()
    (tmp_path / "repros" / "ok.py").write_text('"""Passes."""\nraise SystemExit(10)\n')
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python").symlink_to(sys.executable)
    monkeypatch.chdir(tmp_path)
    [result] = run_all(tmp_path / "repros", python="bin/python")
    assert result.verdict == "reproduces", result


def test_the_command_fails_on_a_broken_repro_and_with_strict_on_a_fixed_one(tmp_path, capsys):
    _script(tmp_path, "still.py", f"raise SystemExit({REPRODUCED})\n")
    _script(tmp_path, "fixed.py", "pass\n")
    assert main(["repros", "--dir", str(tmp_path), "--out", str(tmp_path / "out")]) == 0
    assert "passes now" in capsys.readouterr().out and (tmp_path / "out" / "repros.json").is_file()
    assert main(["repros", "--dir", str(tmp_path), "--strict"]) == 1
    _script(tmp_path, "broken.py", "raise RuntimeError('another error')\n")
    assert main(["repros", "--dir", str(tmp_path)]) == 1


def test_an_entry_names_a_repro_that_exists_and_a_tracker(tmp_path):
    (tmp_path / "repros").mkdir()
    _script(tmp_path / "repros", "case.py", f"raise SystemExit({REPRODUCED})\n")
    skiplist = tmp_path / "export_skip.yaml"
    entry = "- class: Foo\n  reason: r\n  todo: t\n  repro: {}\n  tracker: {}\n"
    skiplist.write_text(entry.format("repros/case.py", "pytorch/executorch"))
    (loaded,) = load_skiplist(skiplist, "export_skip", lambda name: name == "Foo")
    assert loaded.repro == "repros/case.py" and "repro: repros/case.py" in loaded.describe()
    for repro, tracker in (("repros/missing.py", "pytorch/executorch"), ("repros/case.py", "not a tracker")):
        skiplist.write_text(entry.format(repro, tracker))
        with pytest.raises(SkiplistError):
            load_skiplist(skiplist, "export_skip", lambda name: name == "Foo")
