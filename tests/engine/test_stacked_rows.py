"""A per-item list output exported as one stacked tensor: every runner gives back eager's per-item leaves."""

from __future__ import annotations

import pytest
import torch

from engine.stacked_rows import StackedRows, expand_stacked_rows


class PerItemFeatures(torch.nn.Module):
    """LLaVA's pattern (transformers 5.24): one feature tensor per image, concatenated by the model and also
    returned as a list. ``split`` is ``list`` as written, or :class:`StackedRows` as the patch makes it."""

    def __init__(self, split):
        super().__init__()
        self.split = split
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, pixel_values):
        features = self.split(self.proj(pixel_values))
        return {"merged": torch.cat(features, dim=0).sum(-1), "pooler_output": features}


def _sample(images: int) -> dict:
    return {"pixel_values": torch.randn(images, 3, 4, generator=torch.Generator().manual_seed(images))}


def test_the_rows_read_as_the_list_they_replace():
    stacked = torch.randn(3, 2, 4)
    rows = StackedRows(stacked)
    assert len(rows) == 1 and torch.equal(torch.cat(rows, dim=0), torch.cat(list(stacked), dim=0))
    assert [name for name, _ in rows.named_rows()] == ["0", "1", "2"]
    expanded = expand_stacked_rows({"a": torch.zeros(1), "x.pooler_output.*": stacked})
    assert list(expanded) == ["a", "x.pooler_output.0", "x.pooler_output.1", "x.pooler_output.2"]
    assert torch.equal(expanded["x.pooler_output.2"], stacked[2])


@pytest.mark.parametrize("backend", ["dynamo", "onnx", "executorch"])
def test_a_per_item_list_output_runs_any_item_count(backend, tmp_path):
    """With ``list``, the traced image count is fixed in the program's outputs (torch.export refuses the dynamic
    count); with :class:`StackedRows` one program returns eager's ``pooler_output.<i>`` for 2 or 3 images."""
    from engine import AutoExporter
    from engine.artifacts import SUFFIX, load_artifact, save_artifact
    from engine.compare import compare_leaves
    from engine.pytree import get_leaf_tensors
    from engine.runtime import run_exported

    config = {"export_format": backend, "dynamic": True}
    eager_model = PerItemFeatures(list).eval()
    if backend == "dynamo":
        with pytest.raises(Exception):  # the list's length is the traced image count
            artifact = AutoExporter.export(eager_model, _sample(2), config)
            run_exported(artifact, _sample(3))
    model = PerItemFeatures(StackedRows).eval()
    model.load_state_dict(eager_model.state_dict())
    path = tmp_path / f"model{SUFFIX[backend]}"
    save_artifact(AutoExporter.export(model, _sample(2), config), path)
    artifact = load_artifact(path)
    for images in (2, 3):
        with torch.no_grad():
            expected = get_leaf_tensors(eager_model(**_sample(images)))
        got = run_exported(artifact, _sample(images))
        assert list(got) == list(expected)  # merged, pooler_output.0, ..., pooler_output.<images - 1>
        assert compare_leaves(expected, got).ok


def test_ragged_items_of_their_own_shapes_read_as_the_list_they_replace():
    """Per-image 2-D crops of different shapes: named per item by the pytree and by the runners' leaf names, and
    round-tripped through the pytree with their shapes."""
    import torch.utils._pytree as pytree

    from engine.stacked_rows import RaggedRows

    crops = [torch.arange(6).view(2, 3), torch.arange(4).view(4, 1), torch.zeros(0, 5, dtype=torch.long)]
    ragged = RaggedRows(torch.cat([c.flatten() for c in crops]), torch.tensor([6, 4, 0]),
                        torch.tensor([[2, 3], [4, 1], [0, 5]]))
    for (name, item), crop in zip(ragged.named_rows(), crops):
        assert name.isdigit() and torch.equal(item, crop)
    leaves, spec = pytree.tree_flatten(ragged)
    assert len(leaves) == 3 and torch.equal(pytree.tree_unflatten(leaves, spec).shapes, ragged.shapes)
    expanded = expand_stacked_rows({"x.image_tokens.*": ragged.rows, "x.image_tokens.*rows": ragged.counts,
                                    "x.image_tokens.*shapes": ragged.shapes})
    assert list(expanded) == ["x.image_tokens.0", "x.image_tokens.1", "x.image_tokens.2"]
    assert all(torch.equal(expanded[f"x.image_tokens.{i}"], crop) for i, crop in enumerate(crops))
