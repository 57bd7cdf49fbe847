"""Generation: a generative model split into exportable components, exported, and driven by a greedy loop.

=======================  ===========================================================================================
``decompose``            the public decompositions: prefill/decode, multimodal components, both for generation
``capture``              one ``model.generate`` recorded as the forward kwargs of its prefill and decode calls
``decode_merge``         two one-token decode calls merged into one two-token step (a symbolic query length)
``prefill``              the prefill as a decode step over an empty cache, where that computes the eager prefill
``multimodal_prefill``   a multimodal prefill through the reference components, learned where it is exact
``plan``                 :class:`~engine.generation.plan.GenerationPlan`: what the capture learned, for the loop
``export``               ``export_for_generation``: every component exported with one exporter, the plan attached
``loop``                 :func:`~engine.generation.loop.generate`: greedy decoding over the exported components
=======================  ===========================================================================================

Nothing is imported here: ``engine`` exposes the public names lazily (``engine.generate``,
``engine.decompose_for_generation``, ...).
"""
