"""The package is the product: a wheel, installed where no checkout is on the path, runs the headline command with
its own skiplists and compares with its own baseline.

The fresh environment gets the stack (torch, transformers, ...) from this one's site-packages through a ``.pth``
line, which Python adds to the path without running the editable install's hooks: what it imports of ``sweep`` and
``engine`` is the wheel's, checked below.
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _run(args, cwd, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=600, **kwargs)


def test_a_wheel_runs_the_headline_command_and_compares_with_its_packaged_baseline(tmp_path):
    built = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                  str(tmp_path / "dist"), str(REPO)], cwd=tmp_path)
    assert built.returncode == 0, built.stderr
    wheel = next((tmp_path / "dist").glob("export_sweep-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert {"sweep/packaged/skiplists/export_skip.yaml", "sweep/packaged/baseline/results.jsonl.gz",
            "sweep/packaged/generate/results.jsonl.gz"} <= set(names)
    assert wheel.stat().st_size < 5_000_000  # rows without their per-row selection, gzipped

    env = tmp_path / "env"
    assert _run([sys.executable, "-m", "venv", "--without-pip", str(env)], cwd=tmp_path).returncode == 0
    python = env / "bin" / "python"
    site = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=tmp_path)
    Path(site.stdout.strip(), "_stack.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    installed = _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)],
                     cwd=tmp_path)
    assert installed.returncode == 0, installed.stderr

    work = tmp_path / "ci"  # an empty folder: no checkout, no skiplists, no reports
    work.mkdir()
    where = _run([str(python), "-c", "import sweep, engine; print(sweep.__file__, engine.__file__)"], cwd=work)
    assert str(REPO) not in where.stdout and str(env) in where.stdout, where.stdout

    # BertModel runs; CsmForConditionalGeneration is listed on dynamo in the packaged skiplists: skipped, with its reason
    swept = _run([str(python), "-m", "pytest", "--backend=dynamo", "--models=BertModel,CsmForConditionalGeneration"],
                 cwd=work)
    assert swept.returncode == 0, swept.stdout[-3000:] + swept.stderr[-2000:]
    assert "known failures: 1 cases skipped" in swept.stdout and "export_skip: CsmForConditionalGeneration" in swept.stdout
    compared = _run([str(env / "bin" / "export-sweep"), "compare", "reports"], cwd=work)
    assert compared.returncode == 0, compared.stdout + compared.stderr
    assert compared.stdout.startswith("ok: 0 regressions, 0 missing cases") and "packaged" in (work / "reports" / "compare.md").read_text()
