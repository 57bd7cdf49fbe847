"""export-sweep's pytest plugin (the runner, these modules) and the tiny-model zoo it sweeps over (:mod:`sweep.zoo`).

``sweep`` imports ``engine``; ``engine`` never imports ``sweep``; the zoo never imports the runner.

The runner, by concern:

- ``plugin``: pytest options, collection of one case per (class, backend, shapes), reporting hooks; ``test_export``
  the module it collects. ``selection`` (``--models``), ``shard`` (``--shard``), ``skiplist`` (known failures).
- ``case``: one case's stages (build, eager, export, save, load, run, compare) as a plain row dict;
  ``isolation``: each case in a child forked from a warmed forkserver (``warmup``, ``warm_env``).
- ``results``: the row file, appended safely by many processes; ``fingerprint`` and ``reuse``: ``--reuse-from``;
  ``categories``: an error's cause as a short phrase.
- ``matrix`` and ``html``: matrices from rows; ``diff``: two sweeps compared (``export-sweep compare``);
  ``drift``: the sweep in a second environment; ``cli``: the ``export-sweep`` command.
"""
