"""Model patches (scope ``"dynamo"``, so every exporter traces with them): model code torch.export cannot trace with
dynamic shapes, rewritten to compute the same numbers with shape-generic tensor ops. One module per pattern family,
named after the pattern (never a model); importing this package registers them all.

=========================  =========================================================================================
``sequence_scans``         loops over the sequence carrying a state (selective scan, WKV, RG-LRU, mLSTM) as a scan
``tensor_builtins``        ``list``/``len``/``int`` of a tensor in modeling code, as shape-generic tensor code
``split_by_counts``        features split by a ``.tolist()`` of counts (one ragged output; audio chunks, windows)
``position_lists``         positions built as Python lists/ints of sizes (Funnel, Reformer, CPM-Ant, ProphetNet)
``rope_positions``         multimodal rotary positions (M-RoPE) computed before the graph, passed as ``position_ids``
``packed_grids``           packed vision towers' grid helpers (positions, windows, frames) without per-image loops
``image_grids``            per-image crops, position-grid resizes and patch merges, per packed position
``anyres_grids``           LLaVA-NeXT's any-resolution tile grids, unpadded and packed per image, for all at once
``packed_attention``       variable-length attention over ``cu_seqlens`` as one block-diagonal masked SDPA
``global_token_attention`` Longformer-style global attention and sliding windows with no data-dependent shape
``chunked_attention``      local attention looped window by window, as one block-masked attention
``block_selection``        sparse-attention indexers picking each query's key blocks with ``nonzero()`` in a loop
``placeholder_merges``     multimodal merges whose placeholder tests/counts read data (``mask.any()``, ``numel()``)
``experts``                mixture-of-experts loops over the experts that received tokens
``triangular_solves``      unit lower-triangular solves of gated delta rules, by forward substitution
``conv_geometry``          conv and window padding, lengths: in Python integer math, one copy of each size
``masks``                  attention masks by broadcasting instead of ``torch.vmap``; none for unpadded encoders
``caches``                 cache updates that branch on the traced prompt length
``buffer_branches``        Python branches on a small buffer's values (EoMT's schedule), the values as numbers
``padded_selections``     per-sample boolean selections padded to one length (UDOP's patch merge), as a scatter by rank
=========================  =========================================================================================

A family module imports the registry, :mod:`engine.patches.source_rewrite`, :mod:`engine.patches.packed_positions`,
:mod:`engine.swap`, the output types of :mod:`engine.stacked_rows`, torch and transformers; never another family, a
scope module or an exporter (checked by the import-linter contracts in ``pyproject.toml``).
"""

# Registration order is the order patches of one dotted path compose in (each wraps the one before).
from engine.patches.model import (  # noqa: F401
    sequence_scans,
    tensor_builtins,
    split_by_counts,
    packed_attention,
    packed_grids,
    image_grids,
    anyres_grids,
    triangular_solves,
    position_lists,
    conv_geometry,
    masks,
    buffer_branches,
    experts,
    global_token_attention,
    chunked_attention,
    block_selection,
    placeholder_merges,
    padded_selections,
    caches,
    rope_positions,
)
