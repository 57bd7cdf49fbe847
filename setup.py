"""The build step pyproject.toml cannot declare: the skiplists and the baseline rows ship inside the package.

They are committed at the top of the checkout (``skiplists/``, ``reports/baseline/``, ``reports/generate/``), where
people edit them and sweeps write them; a wheel carries copies under ``sweep/packaged/`` (rows gzipped), which
:mod:`sweep.packaged` finds when no checkout is there. An editable install reads the checkout and copies nothing.
"""

import gzip
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
ROW_FOLDERS = {"baseline": HERE / "reports" / "baseline", "generate": HERE / "reports" / "generate"}


class build_py_with_packaged_data(build_py):  # noqa: N801 (setuptools' command naming)
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        target = Path(self.build_lib) / "sweep" / "packaged"
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(HERE / "skiplists", target / "skiplists", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        for name, folder in ROW_FOLDERS.items():
            (target / name).mkdir(parents=True)
            with open(folder / "results.jsonl", "rb") as rows, gzip.open(target / name / "results.jsonl.gz", "wb", 9) as out:
                shutil.copyfileobj(rows, out)


setup(cmdclass={"build_py": build_py_with_packaged_data})
