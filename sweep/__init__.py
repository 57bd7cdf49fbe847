"""export-sweep's pytest plugin (the runner, these modules) and the tiny-model zoo it sweeps over (:mod:`sweep.zoo`).

``sweep`` imports ``engine``; ``engine`` never imports ``sweep``; the zoo never imports the runner.

The runner, by concern:

- ``plugin`` (a package, one module per pytest phase: ``options``, ``collection``, ``running``, ``reporting``): the
  sweep as pytest cases, one per (class, backend, shapes); ``test_export`` the module it collects. ``selection``
  (``--models``), ``shard`` (``--shard``, balanced by recorded durations), ``skiplist`` (known failures),
  ``packaged`` (the skiplists and baseline a checkout or a wheel holds).
- ``case``: one case's stages (build, eager, export, save, load, run, compare) as a plain row dict;
  ``isolation``: each case in a child forked from a warmed forkserver (``warmup``, ``warm_env``);
  ``shared_build``: one build per class when several backends run.
- ``results``: the row file, appended safely by many processes; ``runs``: what each run selected (its record, which
  the gate reads); ``fingerprint``, ``shared_tables`` and ``reuse``: ``--reuse-from``; ``categories``: an error's
  cause as a short phrase.
- ``matrix`` and ``html``: matrices from rows; ``diff``: two sweeps compared (``export-sweep compare``);
  ``drift``: the sweep in a second environment; ``repros``: the skiplists' standalone repros run by name;
  ``cli``: the ``export-sweep`` command.
"""
