"""The sweep's test: one case per (model class, backend, shapes), parametrised by :mod:`sweep.plugin`.

Run it with ``pytest --backend=... --models=...`` (no path: the plugin collects this module) or ``./dev sweep``.
"""


def test_export(sweep_case, sweep_run):
    sweep_run(sweep_case)
