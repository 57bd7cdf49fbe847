"""The zoo: a tiny random model of every catalogued transformers class, with sample inputs, or a named reason.

A subpackage of :mod:`sweep` because it exists to feed the sweep: the runner (``sweep/*.py``) imports it, and it
never imports the runner (``sweep.plugin``, ``sweep.case``, ``engine.runtime*``, the exporters), so it can be read,
tested and benchmarked on its own. It imports torch, transformers and PyYAML; timm where a config names a timm
tower; and three engine helpers, each inside the function that uses it: ``engine.pytree`` (leaf tensors of an
output), ``engine.compare`` (the conditioning check) and ``engine.with_rope_position_ids`` (taken from the ``engine``
package, wherever its module lives). The entry point is :func:`sweep.zoo.build.build_case`; this ``__init__``
imports nothing.

Map (lower layers first; a module imports only modules above it in this list):

- ``errors``: :class:`ZooError` and its categories; a missing package's pip name (``data/dependencies.yaml``).
- ``catalog``: every class in transformers' auto mappings -> its model type, config class and mappings.
- ``sample``: the CI eager test's deterministic sample of classes over every task mapping.
- ``config_tree``: a config as a tree of raw constructor arguments, and back through the class's validation.
- ``fields``: what config field names mean (widths, heads, layers, ...), shared by the shrinker and the lessons.
- ``profiles``: the shrink ladder's target sizes.
- ``context``: sample sizes, the :class:`Context` recipes read, the :class:`Hints` errors taught, signature helpers.
- ``frames``: what a failing traceback holds (the failing statements, the input an operation was handed).
- ``modalities``: one input recipe per forward parameter.
- ``layouts``: other layouts of the same sample (audio, waveform, image and id layouts that differ by family).
- ``fallback``: samples for forward parameters no recipe knows.
- ``repairs``: values for config fields a default leaves unset, and the nested overrides carrying them.
- ``validation_lessons``: a config class's validation error -> edits of the raw config tree.
- ``init_lessons``: a model ``__init__`` error (or a head class's warning) -> nested config overrides.
- ``implicit_default_lessons``: a forward error -> values the modeling code assumes when the config leaves them out.
- ``input_lessons``: a forward error (or a forward that ran) -> the :class:`Hints` for the next candidate inputs.
- ``timm_towers``: a timm tower a config names, shrunk through its ``model_args``.
- ``shrink_rules``: the per-node shrinking rules, one named function per pattern, in :data:`RULES` order.
- ``layer_counts``: how few layers a stack keeps, and the per-layer fields that follow a new count.
- ``shrink``: the shrinking pipeline (:func:`shrink_config`) over the whole config tree.
- ``completion``: a contributor's own config completed (unset fields filled, no size changed).
- ``inputs``: candidate input dicts for a model's forward.
- ``generation_prompt``: a generation case's prompt, with the inputs a class's own ``generate()`` requires.
- ``noise``: the noise a forward draws itself, passed in instead so exported and eager runs compare.
- ``ties``: top-k selections among tied scores, and the wider initialisation that removes them.
- ``conditioning``: whether float32 eager is close enough to float64 eager for the sweep's tolerance to judge.
- ``overrides``: the recorded per-class shrinker overrides (``data/overrides.yaml``).
- ``known_failures``: classes known not to build or run, and those over the parameter budget (``data/*.yaml``).
- ``build``: :func:`build_case`, the shrink ladder, the parameter budget, bring-your-own model.

Where the zoo learns from an error: the four ``*_lessons`` modules, each pattern with the fix it yields.
``README.md`` beside this file describes how the zoo works and how to extend it.
"""
