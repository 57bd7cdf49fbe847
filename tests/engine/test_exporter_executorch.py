"""ExecutorchExporter on the twelve tiny architectures: a dynamic ``.pte`` runs on the ExecuTorch runtime at the
traced shape and at another batch/length within its bounds; static programs at the traced shape; clear errors.

Every output leaf is compared with eager at atol=rtol=1e-4; no architecture needed the 1e-3 that the issue allows
for XNNPACK fp32 (should one need it, give it here with the reason).
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import warnings

import pytest
import torch
from transformers.modeling_outputs import BaseModelOutputWithPooling

from engine import (
    AutoExportConfig,
    AutoExporter,
    ConfigError,
    ExecutorchConfig,
    ExportStageError,
    InputError,
    MissingDependencyError,
    SpecialisationWarning,
    run_exported,
)
from engine.compare import compare_leaves
from tests.engine.tiny_models import CI_LOWERING, TINY_MODELS, ci_cover, eager_leaves

pytest.importorskip("executorch", reason="the executorch extra is not installed")

from engine.exporter_executorch import ExecutorchExporter  # noqa: E402
from engine.pte_metadata import warn_specialised_by_lowering  # noqa: E402
from tests.engine.executorch_cases import MAX_PLANNED_BYTES, TwoLinear, dynamic_export, pte_meta  # noqa: E402

ATOL = RTOL = 1e-4


#: the subset exported static as well (each export costs seconds; these three cover text, vision and convs)
STATIC_SUBSET = ("bert", "vit", "convnext")


@pytest.mark.parametrize("name", ci_cover(TINY_MODELS, CI_LOWERING["executorch"]))
def test_dynamic_pte_matches_eager(name, tmp_path):
    tiny = TINY_MODELS[name]
    model, manager, caps = dynamic_export(name)
    path = ExecutorchExporter.save(manager, tmp_path / f"{name}.pte")
    assert path.endswith(".pte") and (tmp_path / f"{name}.pte").stat().st_size > 0

    for which in ("trace", "run"):  # the traced shape, then another batch and length within the bounds
        inputs = tiny.inputs(which, seed=1)
        got = run_exported(path, inputs)  # a .pte loaded alone: input order and output names come from the file
        comparison = compare_leaves(eager_leaves(model, inputs), got, atol=ATOL, rtol=RTOL)
        assert comparison.ok, f"{which} shape: {comparison}"

    # unbounded dims got finite caps, listed in one warning; the memory plan stays small
    assert len(caps) == 1, [str(w.message) for w in caps]
    planned = sum(manager.executorch_program.execution_plan[0].non_const_buffer_sizes)
    assert planned < MAX_PLANNED_BYTES, f"{planned / 2**20:.0f} MiB planned"


def test_bounds_of_a_bert():
    _, manager, caps = dynamic_export("bert")
    message = str(caps[0].message)
    # the batch is capped from the sample; the length is already bounded (by 128) by the model's own guards
    assert "input_ids dim 0 <= 8 (batch: 4 x traced 2)" in message and "input_ids dim 1" not in message, message
    bounds = {spec["name"]: spec["bounds"] for spec in pte_meta(manager)["inputs"]}
    assert bounds["input_ids"] == [[0, 8], [0, 128]]  # torch.export's 0/1 minimum of 2 is recorded as 0


def test_manager_runs_in_memory():
    tiny = TINY_MODELS["bert"]
    model, manager, _ = dynamic_export("bert")
    inputs = tiny.inputs("run", seed=2)
    comparison = compare_leaves(eager_leaves(model, inputs), run_exported(manager, inputs), atol=ATOL, rtol=RTOL)
    assert comparison.ok, str(comparison)


def test_shape_outside_bounds_is_a_clear_error():
    _, manager, _ = dynamic_export("bert")
    too_long = TINY_MODELS["bert"].make_inputs(2, 129, 0)
    with pytest.raises(InputError, match=r"input_ids dim 1 is 129, outside the exported bounds: it must be between 0 and 128"):
        run_exported(manager, too_long)
    with pytest.raises(InputError, match="missing: token_type_ids"):
        run_exported(manager, {k: v for k, v in too_long.items() if k != "token_type_ids"})


@pytest.mark.parametrize("name", STATIC_SUBSET)
def test_static_export_at_traced_shape(name, tmp_path):
    tiny = TINY_MODELS[name]
    model = tiny.model()
    inputs = tiny.inputs("trace")
    manager = ExecutorchExporter().export(model, inputs, config={"dynamic": False})
    path = ExecutorchExporter.save(manager, tmp_path / "static.pte")
    comparison = compare_leaves(eager_leaves(model, inputs), run_exported(path, inputs), atol=ATOL, rtol=RTOL)
    assert comparison.ok, str(comparison)
    # a static program rejects another shape with a named error instead of a native crash
    with pytest.raises(InputError, match="dim 0 is 3, outside the exported bounds: it must be exactly 2"):
        run_exported(path, tiny.inputs("run", seed=1))


@pytest.mark.parametrize("bad", [1, 0, "64", True, 8.0])
def test_max_seq_len_must_be_an_int_of_at_least_two(bad):
    with pytest.raises(ConfigError, match=r"ExecutorchConfig.max_seq_len must be None or an int >= 2, got"):
        ExecutorchConfig(max_seq_len=bad)


@pytest.mark.parametrize("bad", [0, -1, "4096", True, 1.5])
def test_max_planned_tensor_mb_must_be_a_positive_int(bad):
    with pytest.raises(ConfigError, match=r"ExecutorchConfig.max_planned_tensor_mb must be None or an int >= 1, got"):
        ExecutorchConfig(max_planned_tensor_mb=bad)


def test_auto_classes_pick_the_executorch_exporter():
    config = AutoExportConfig.from_dict({"export_format": "executorch", "backend": "xnnpack", "dynamic": True})
    assert isinstance(config, ExecutorchConfig)
    assert isinstance(AutoExporter.from_config(config), ExecutorchExporter)


def test_unknown_backend_lists_known_ones():
    with pytest.raises(ConfigError, match="unknown ExecuTorch backend 'vulkan'; known backends: xnnpack, cuda"):
        ExecutorchExporter().export(TwoLinear(), {"x": torch.randn(2, 4)}, config=ExecutorchConfig(backend="vulkan"))


def test_cuda_backend_without_cuda_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="backend='cuda'.*needs a CUDA device.*use backend='xnnpack'"):
        ExecutorchExporter().export(TwoLinear(), {"x": torch.randn(2, 4)}, config=ExecutorchConfig(backend="cuda"))


def test_cuda_backend_without_executorch_cuda_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setitem(sys.modules, "executorch.backends.cuda.cuda_backend", None)  # import fails
    with pytest.raises(MissingDependencyError, match="ExecuTorch's CUDA backend cannot be imported"):
        ExecutorchExporter().export(TwoLinear(), {"x": torch.randn(2, 4)}, config=ExecutorchConfig(backend="cuda"))


def test_missing_executorch_names_the_extra(monkeypatch):
    for module in ("executorch", "executorch.runtime"):
        monkeypatch.setitem(sys.modules, module, None)  # as if the extra were not installed
    with pytest.raises(MissingDependencyError, match=r"pip install 'export-sweep\[executorch\]'"):
        ExecutorchExporter().export(TwoLinear(), {"x": torch.randn(2, 4)}, config=ExecutorchConfig())
    with pytest.raises(MissingDependencyError, match="executorch"):
        run_exported("model.pte", {"x": torch.randn(2, 4)})


def test_pte_path_that_does_not_exist(tmp_path):
    with pytest.raises(ExportStageError, match="stage 'load' failed.*no such .pte file"):
        run_exported(tmp_path / "missing.pte", {"x": torch.randn(2, 4)})


class _SegmentMeans(torch.nn.Module):
    """Segment sums of integer values: a ``scatter_reduce`` the rewrite for ExecuTorch leaves as it is (it takes
    floating sources: ``engine.patches.unlowerable_ops._fix_scatter_reduce_as_comparisons``)."""

    def forward(self, values, segments):
        out = torch.zeros(4, values.shape[1], dtype=values.dtype)
        return out.scatter_reduce(0, segments, values, reduce="sum", include_self=False)


_SEGMENT_INPUTS = {"values": torch.randint(0, 9, (6, 2)),
                   "segments": torch.tensor([0, 1, 1, 2, 0, 3])[:, None].expand(6, 2)}


@functools.cache
def _segment_means_manager():
    """One export for both parametrizations (the manager, and the .pte saved from it)."""
    return ExecutorchExporter().export(_SegmentMeans(), _SEGMENT_INPUTS, config={"dynamic": False})


@pytest.mark.parametrize("saved", [False, True], ids=["manager", "pte"])
def test_a_kernel_missing_from_the_runtime_is_named(saved, tmp_path):
    # the portable library has no scatter_reduce (https://github.com/pytorch/executorch/issues/11330): loading the
    # method fails with 0x14 and names no operator, so the error lists what the runtime lacks
    inputs = _SEGMENT_INPUTS
    artifact = _segment_means_manager()
    if saved:
        artifact = ExecutorchExporter.save(artifact, tmp_path / "segments.pte")
    with pytest.raises(ExportStageError, match=r"stage 'run' .*no kernel for aten::scatter_reduce\.two_out, which"):
        run_exported(artifact, inputs)


def test_lowering_that_pins_or_narrows_a_dim_is_named():
    before = {"inputs": [{"name": "input_ids", "bounds": [[0, 8], [0, 64]]}]}
    with pytest.warns(SpecialisationWarning) as caught:
        warn_specialised_by_lowering("M", before, {"inputs": [{"name": "input_ids", "bounds": [[0, 2], [8, 8]]}]})
    (message,) = [str(w.message) for w in caught]
    assert "accepts only one size there: input_ids dim 1 (bounds 0..64, lowered to 8)" in message
    assert "narrowed the bounds of 1 input dim(s): input_ids dim 0 (bounds 0..8, lowered to 0..2)" in message
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_specialised_by_lowering("M", before, before)  # unchanged bounds: silent


def test_a_plan_the_runtime_cannot_allocate_is_a_named_load_error(monkeypatch, tmp_path):
    from executorch import runtime

    _, manager, _ = dynamic_export("bert")
    path = ExecutorchExporter.save(manager, tmp_path / "bert.pte")

    class NoMemory:
        def load_program(self, *args, **kwargs):
            raise MemoryError("std::bad_alloc")

    monkeypatch.setattr(runtime.Runtime, "get", staticmethod(lambda: NoMemory()))
    with pytest.raises(ExportStageError, match=r"(?s)load.*std::bad_alloc: the runtime could not allocate the "
                                               r"program's memory plan.*ExecutorchConfig.max_seq_len"):
        run_exported(path, TINY_MODELS["bert"].inputs("trace"))


class _NoneFields(torch.nn.Module):
    """Returns a ModelOutput-like structure with None fields between tensors (transformers 5.24's image_outputs)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        a = self.lin(x)
        return {"a": a, "hidden": (None, None, a * 2), "pooled": a.mean(1)}


def test_none_outputs_are_left_out_of_the_lowered_program_and_every_tensor_keeps_its_name(tmp_path):
    """ExecuTorch's lowering moved a tensor output ahead of None outputs while the names came from the traced order
    (AyaVision, QianfanOCR at transformers 5.24): the program is lowered without its None outputs and named from
    the traced order."""
    model, x = _NoneFields().eval(), {"x": torch.randn(2, 3, 4)}
    manager = ExecutorchExporter().export(model, x, config=ExecutorchConfig(dynamic=True))
    assert pte_meta(manager)["outputs"] == ["a", "hidden.2", "pooled"]
    path = ExecutorchExporter.save(manager, tmp_path / "none_fields.pte")
    comparison = compare_leaves(eager_leaves(model, x), run_exported(path, x), atol=ATOL, rtol=RTOL)
    assert comparison.ok and len(comparison.leaves) == 3, str(comparison)


@dataclasses.dataclass
class _TokensOutput(BaseModelOutputWithPooling):
    tokens: torch.Tensor | None = None
    loss: torch.Tensor | None = None


class _PoolerSetLast(torch.nn.Module):
    """Chameleon's get_image_features: a field (``pooler_output``) set on a ModelOutput after it was built."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.emb = torch.nn.Embedding(10, 3)

    def forward(self, x):
        h = self.lin(x)
        tokens = h.argmin(-1)
        out = _TokensOutput(last_hidden_state=h, tokens=tokens, loss=(h**2).mean())
        out.pooler_output = self.emb(tokens)
        return out


def test_a_model_output_field_set_after_construction_keeps_its_name(monkeypatch):
    """The lowering's decomposition retrace re-flattens a ModelOutput's outputs in declaration order: traced in
    insertion order, the .pte's ``pooler_output`` came back holding another field's tensor (two passes; a single
    trace the lowering need not decompose again keeps the traced order). Traced in declaration order, every leaf
    matches either way."""
    import engine.signature

    model, x = _PoolerSetLast().eval(), {"x": torch.randn(2, 5, 4)}
    manager = ExecutorchExporter().export(model, x, config=ExecutorchConfig(dynamic=True))
    other = {"x": torch.randn(3, 7, 4)}
    comparison = compare_leaves(eager_leaves(model, other), run_exported(manager, other), atol=ATOL, rtol=RTOL)
    assert comparison.ok and len(comparison.leaves) == 4, str(comparison)
    monkeypatch.setattr(engine.signature, "in_field_order", lambda outputs: outputs)
    unordered = ExecutorchExporter().export(model, x, config=ExecutorchConfig(dynamic=True, single_trace=False))
    assert not compare_leaves(eager_leaves(model, other), run_exported(unordered, other), atol=ATOL, rtol=RTOL).ok


def test_experts_of_a_sub_model_are_set_where_the_composite_cannot():
    """Kimi-K2.5's composite model cannot set its experts, its MoE text model can (and asks for ``grouped_mm``,
    which has no ExecuTorch kernel): the sub-model's are set to ``batched_mm``; a settable top level is set alone."""
    from engine.patches.model.experts import use_batched_experts

    class Settable(torch.nn.Module):
        def __init__(self, can: bool):
            super().__init__()
            self.can, self.implementation = can, "grouped_mm"

        def _can_set_experts_implementation(self):
            return self.can

        def set_experts_implementation(self, name):
            self.implementation = name

    composite = Settable(False)
    composite.text, composite.vision = Settable(True), torch.nn.Linear(2, 2)
    use_batched_experts(composite)
    assert (composite.implementation, composite.text.implementation) == ("grouped_mm", "batched_mm")
    top = Settable(True)
    top.text = Settable(True)
    use_batched_experts(top)
    assert (top.implementation, top.text.implementation) == ("batched_mm", "grouped_mm")
