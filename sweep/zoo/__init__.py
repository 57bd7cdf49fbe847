"""The zoo: a tiny random model of every catalogued transformers class, with sample inputs, or a named reason.

A subpackage of :mod:`sweep` because it exists to feed the sweep: the runner (``sweep/*.py``) imports it, and it
never imports the runner (``engine`` at most; today only torch and transformers), so it can be read, tested and
benchmarked on its own. The entry point is :func:`sweep.zoo.build.build_case`; this ``__init__`` imports nothing.

Map (lower layers first; a module imports only modules above it in this list):

- ``errors``: :class:`ZooError` and its categories; the missing package's pip name (``data/dependencies.yaml``).
- ``catalog``: class -> model type, config class, mappings. ``sample``: the CI eager sample over every mapping.
- ``config_tree``: a config as a tree of raw constructor arguments, and back through the class's validation.
- ``fields``: what config field names mean (widths, heads, layers, ... ) shared by the shrinker and the lessons.
- ``profiles``: the shrink ladder's target sizes.
- ``context``: batch and sequence sizes, the :class:`Context` recipes read, the :class:`Hints` errors taught,
  the forward-signature helpers.
- ``frames``: what a failing traceback holds (the failing statements, the input an operation was handed).
- ``modalities``: one recipe per forward parameter; ``layouts``: other layouts of the same sample; ``fallback``:
  samples for parameters no recipe knows.
- ``repairs``: values for config fields a default leaves unset, and the nested overrides carrying them.
- ``lessons``: every lesson learned from an error message (config validation, ``__init__``, forward), each
  regex with the fix it yields. Where the zoo learns from an error: read this one.
- ``shrink_rules``: the per-node shrinking rules, one named function per pattern, in :data:`RULES` order;
  ``shrink``: the pipeline (:func:`shrink_config`) over the whole tree.
- ``completion``: a contributor's own config completed: the unset fields the shrinker's fill rules and the
  ``__init__`` lessons fill, no size changed.
- ``inputs``: candidate input dicts for a model's forward.
- ``noise``: the noise a forward draws itself, passed in instead so exported and eager runs compare.
- ``overrides`` (``data/overrides.yaml``) and ``known_failures`` (``data/known_failures.yaml``,
  ``data/over_budget.yaml``): the recorded per-class exceptions.
- ``build``: :func:`build_case`, the shrink ladder, the parameter budget, bring-your-own model.

``README.md`` beside this file describes how the zoo works and how to extend it.
"""
