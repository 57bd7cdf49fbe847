"""A list with one tensor per item (one per image) exported as one stacked tensor, and given back per item.

Pattern: LLaVA's ``get_image_features`` ends with ``list(image_features)``, one tensor per image. Iterating a tensor
pins its first dim (the program accepts only the traced image count), and from transformers 5.24 that list is also
a model output (``image_outputs.pooler_output``), which a program cannot return for a dynamic count. While traced,
the patched ``list`` returns a :class:`StackedRows`: to the model's own code a one-element list holding the rows
concatenated (its consumer is ``torch.cat(rows, dim=0)``); to export, one output leaf, the stacked tensor, named
``<field>.*``. Every runner gives back eager's leaves, ``<field>.0``, ``<field>.1``, ...: an ``ExportedProgram``
rebuilds a :class:`StackedRows` whose children are its rows, and the ONNX and ExecuTorch runners unbind the outputs
named ``<field>.*`` (:func:`expand_stacked_rows`).

Pattern (ragged): Idefics2/3-like ``get_image_features`` end with ``[f.reshape(-1, d) for f in
features.split(counts.tolist())]``, one tensor of rows per sample holding that sample's images. ``tolist()`` of a
per-sample tensor is a Python list whose length is the batch, so the batch is pinned. :class:`RaggedRows` is the
same list exported as the rows of every sample together plus each sample's row count: two output leaves,
``<field>.*`` and ``<field>.*rows``, which every runner splits back into eager's ``<field>.0``, ``<field>.1``, ...
Items of their own shapes (Emu3's per-image crops of a code grid) add a third leaf, ``<field>.*shapes``.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.utils._pytree as pytree

#: the last part of the leaf name of a stacked output; its rows are named by index in its place
ROWS = "*"
#: the last part of the leaf name of a ragged output's per-item row counts (beside its ``ROWS`` leaf)
ROW_COUNTS = "*rows"
#: the last part of the leaf name of a ragged output's per-item shapes, where its items are not rows of one width
ITEM_SHAPES = "*shapes"


class StackedRows(list):
    """Rows of ``stacked`` (dim 0) that the model code sees as ``[stacked.flatten(0, 1)]``."""

    def __init__(self, stacked: torch.Tensor):
        # a spec is also unflattened with markers (0-d tensors naming leaves, ints in ExecuTorch's emitter)
        rows = isinstance(stacked, torch.Tensor) and stacked.dim() >= 2
        super().__init__([stacked.flatten(0, 1)] if rows else [stacked])
        self.stacked = stacked

    def named_rows(self) -> list[tuple[str, torch.Tensor]]:
        """The children :func:`engine.pytree.iter_leaf_tensors` names: one per row, or the one stacked leaf of a
        spec unflattened with markers (to name a program's outputs)."""
        if not isinstance(self.stacked, torch.Tensor) or self.stacked.dim() == 0:
            return [(ROWS, self.stacked)]
        return [(str(i), row) for i, row in enumerate(self.stacked.unbind(0))]


pytree.register_pytree_node(
    StackedRows,
    lambda rows: ([rows.stacked], None),
    lambda children, _: StackedRows(children[0]),
    serialized_type_name="engine.stacked_rows.StackedRows",
    flatten_with_keys_fn=lambda rows: ([(pytree.GetAttrKey("stacked"), rows.stacked)], None),
)


class RaggedRows(list):
    """Rows of ``rows`` grouped per item by ``counts`` (item ``i`` holds ``counts[i]`` consecutive rows), which the
    model code sees as ``[rows]``: the consumer ``torch.cat(items, dim=0)`` gets every row, as from the eager list.
    With ``shapes`` (items, k), item ``i`` is its rows reshaped to ``shapes[i]`` (per-image 2-D crops of different
    widths: their values one after another, ``counts`` the products of the shapes)."""

    def __init__(self, rows: torch.Tensor, counts: torch.Tensor, shapes: torch.Tensor | None = None):
        super().__init__([rows])
        self.rows, self.counts, self.shapes = rows, counts, shapes

    def named_rows(self) -> list[tuple[str, torch.Tensor]]:
        """One child per item with real tensors; the leaves (rows, counts and shapes) of a spec unflattened with
        markers."""
        if not isinstance(self.counts, torch.Tensor) or self.counts.dim() == 0:
            leaves = [(ROWS, self.rows), (ROW_COUNTS, self.counts)]
            return leaves + ([(ITEM_SHAPES, self.shapes)] if self.shapes is not None else [])
        return [(str(i), item) for i, item in enumerate(_split_by_counts(self.rows, self.counts, self.shapes))]


def _split_by_counts(rows: torch.Tensor, counts: torch.Tensor,
                     shapes: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
    items = rows.split([int(c) for c in counts.tolist()])
    if shapes is None:
        return items
    return tuple(item.reshape(shape) for item, shape in zip(items, shapes.tolist()))


def _flatten_ragged(ragged: RaggedRows):
    children = [ragged.rows, ragged.counts] + ([ragged.shapes] if ragged.shapes is not None else [])
    return children, ragged.shapes is not None


pytree.register_pytree_node(
    RaggedRows,
    _flatten_ragged,
    lambda children, shaped: RaggedRows(children[0], children[1], children[2] if shaped else None),
    serialized_type_name="engine.stacked_rows.RaggedRows",
    flatten_with_keys_fn=lambda ragged: (
        [(pytree.GetAttrKey(name), child) for name, child in zip(("rows", "counts", "shapes"),
                                                                  _flatten_ragged(ragged)[0])],
        ragged.shapes is not None),
)


def expand_stacked_rows(outputs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``outputs`` with each ``<field>.*`` leaf replaced by its rows ``<field>.0``, ``<field>.1``, ..., in place:
    one per stacked row, or one per item of a ragged output (split by its ``<field>.*rows`` counts)."""
    suffix = "." + ROWS
    if not any(name == ROWS or name.endswith(suffix) for name in outputs):
        return dict(outputs)
    expanded: dict[str, torch.Tensor] = {}
    for name, value in outputs.items():
        if any(name == leaf or name.endswith("." + leaf) for leaf in (ROW_COUNTS, ITEM_SHAPES)):
            continue  # read with its rows
        if name == ROWS or name.endswith(suffix):
            stem = name[: -len(ROWS)]
            counts = outputs.get(stem + ROW_COUNTS)
            items = value.unbind(0) if counts is None else _split_by_counts(value, counts, outputs.get(stem + ITEM_SHAPES))
            expanded.update((f"{stem}{i}", item) for i, item in enumerate(items))
        else:
            expanded[name] = value
    return expanded
