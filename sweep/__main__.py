"""``python -m sweep [pytest args]``: the main job. Defaults: the smoke set, every backend, ``-n 2``.

Any argument is passed to pytest and overrides the defaults, e.g.
``python -m sweep --models='Llama*' --backend=onnx -n 4``.
"""

from __future__ import annotations

import sys

import pytest


#: pytest plugins that the test stack installs and that a sweep never uses: the controller and every xdist worker
#: would import them (hypothesis's alone takes about 2 of the 6 seconds a process needs to collect a sweep)
UNUSED_PLUGINS = ("hypothesispytest", "hydra_pytest", "kgb", "anyio")
BLOCK_UNUSED_PLUGINS = tuple(f"-pno:{name}" for name in UNUSED_PLUGINS)


def main(argv: list[str]) -> int:
    # `python -m sweep` imported the package before pytest loads it as a plugin: nothing to rewrite, nothing to warn
    # pytest's cache stays on: --lf, --ff and --sw read it
    args = ["--pyargs", "sweep", *BLOCK_UNUSED_PLUGINS, "-q",
            "-W", "ignore::pytest.PytestAssertRewriteWarning"]
    if not any(a.startswith("--models") for a in argv):
        args.append("--models=smoke")
    if not any(a.startswith("--backend") for a in argv):
        args.append("--backend=all")
    if not any(a == "-n" or a.startswith("-n") or a.startswith("--numprocesses") for a in argv):
        args += ["-n", "2"]
    return pytest.main(args + argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
