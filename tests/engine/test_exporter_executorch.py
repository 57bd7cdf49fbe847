"""ExecutorchExporter on the twelve tiny architectures: a dynamic ``.pte`` runs on the ExecuTorch runtime at the
traced shape and at another batch/length within its bounds; static programs at the traced shape; clear errors.

Every output leaf is compared with eager at atol=rtol=1e-4; no architecture needed the 1e-3 that the issue allows
for XNNPACK fp32 (should one need it, give it here with the reason).
"""

from __future__ import annotations

import contextlib
import functools
import json
import operator
import sys
import warnings

import pytest
import torch
from transformers import PretrainedConfig

from engine import (
    AutoExportConfig,
    AutoExporter,
    ConfigError,
    ExecutorchConfig,
    ExportStageError,
    InputError,
    MissingDependencyError,
    SpecialisationWarning,
    get_leaf_tensors,
    run_exported,
)
from engine.compare import compare_leaves
from tests.engine.tiny_models import REAL_LIMIT_MODELS, TINY_MODELS, eager_leaves

pytest.importorskip("executorch", reason="the executorch extra is not installed")

from engine.exporter_executorch import (  # noqa: E402
    META_METHOD,
    ExecutorchExporter,
    UnboundedDimWarning,
    _warn_specialised_by_lowering,
)

ATOL = RTOL = 1e-4
#: the planned activation arena of a tiny model stays small: bounds come from the config and the sample, not a
#: large generic cap (which plans GBs); the largest today is t5 (~69 MiB: no position limit, so 256 tokens x batch 8)
MAX_PLANNED_BYTES = 128 * 2**20
#: the subset exported static as well (each export costs seconds; these three cover text, vision and convs)
STATIC_SUBSET = ("bert", "vit", "convnext")




@functools.cache
def _dynamic_export(name: str):
    """One dynamic export per architecture for the whole session: (model, manager, caught warnings)."""
    tiny = TINY_MODELS[name]
    model = tiny.model()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        manager = ExecutorchExporter().export(model, tiny.inputs("trace"), config=ExecutorchConfig(dynamic=True))
    return model, manager, [w for w in caught if issubclass(w.category, UnboundedDimWarning)]


def _meta(manager) -> dict:
    return json.loads(manager._config_methods[META_METHOD])


@pytest.mark.parametrize("name", list(TINY_MODELS))
def test_dynamic_pte_matches_eager(name, tmp_path):
    tiny = TINY_MODELS[name]
    model, manager, caps = _dynamic_export(name)
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
    _, manager, caps = _dynamic_export("bert")
    message = str(caps[0].message)
    # the batch is capped from the sample; the length is already bounded (by 128) by the model's own guards
    assert "input_ids dim 0 <= 8 (batch: 4 x traced 2)" in message and "input_ids dim 1" not in message, message
    bounds = {spec["name"]: spec["bounds"] for spec in _meta(manager)["inputs"]}
    assert bounds["input_ids"] == [[0, 8], [0, 128]]  # torch.export's 0/1 minimum of 2 is recorded as 0


def test_manager_runs_in_memory():
    tiny = TINY_MODELS["bert"]
    model, manager, _ = _dynamic_export("bert")
    inputs = tiny.inputs("run", seed=2)
    comparison = compare_leaves(eager_leaves(model, inputs), run_exported(manager, inputs), atol=ATOL, rtol=RTOL)
    assert comparison.ok, str(comparison)


def test_shape_outside_bounds_is_a_clear_error():
    _, manager, _ = _dynamic_export("bert")
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


class _TwoLinear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(4, 8), torch.nn.Linear(8, 3)

    def forward(self, x):
        return {"y": self.b(torch.relu(self.a(x)))}


def test_caps_come_from_the_config():
    torch.manual_seed(0)
    model = _TwoLinear().eval()
    model.config = PretrainedConfig(max_position_embeddings=16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        manager = ExecutorchExporter().export(model, {"x": torch.randn(3, 5, 4)}, config=ExecutorchConfig(dynamic=True))
    caps = [str(w.message) for w in caught if issubclass(w.category, UnboundedDimWarning)]
    assert len(caps) == 1, caps
    assert "x dim 0 <= 12 (batch: 4 x traced 3); x dim 1 <= 16 (config max_position_embeddings=16)" in caps[0]
    assert _meta(manager)["inputs"][0]["bounds"] == [[0, 12], [0, 16], [4, 4]]
    with pytest.raises(InputError, match="x dim 1 is 17, outside the exported bounds: it must be between 0 and 16"):
        run_exported(manager, {"x": torch.randn(3, 17, 4)})


def test_explicit_dim_bounds_are_respected():
    torch.manual_seed(0)
    model = _TwoLinear().eval()
    x = torch.randn(3, 5, 4)
    batch = torch.export.Dim("batch", min=1, max=6)
    config = ExecutorchConfig(dynamic_shapes={"x": {0: batch, 1: torch.export.Dim.AUTO}})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        manager = ExecutorchExporter().export(model, {"x": x}, config=config)
    caps = [str(w.message) for w in caught if issubclass(w.category, UnboundedDimWarning)]
    # the explicit batch bound is kept; only the AUTO length is capped (no config: 4 x traced, floor 256)
    assert len(caps) == 1 and "x dim 1 <= 256" in caps[0] and "dim 0" not in caps[0], caps
    # the max is the explicit one; the min is 0 as ExportedProgram.module() has it: torch.export states 2 (its
    # 0/1-specialisation assumption, for min=1 too) and its own input check accepts 0 and 1 there
    assert _meta(manager)["inputs"] == [{"name": "x", "dtype": "float32", "bounds": [[0, 6], [0, 256], [4, 4]]}]
    x6 = torch.randn(6, 9, 4)
    with torch.no_grad():
        expected = get_leaf_tensors(model(x6))
    comparison = compare_leaves(expected, run_exported(manager, {"x": x6}), atol=ATOL, rtol=RTOL)
    assert comparison.ok, str(comparison)
    with pytest.raises(InputError, match="x dim 0 is 7, outside the exported bounds: it must be between 0 and 6"):
        run_exported(manager, {"x": torch.randn(7, 5, 4)})


def test_max_seq_len_lowers_a_bound_the_guards_derived():
    tiny = TINY_MODELS["bert"]
    model = tiny.model()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        manager = ExecutorchExporter().export(model, tiny.inputs("trace"), config=ExecutorchConfig(dynamic=True, max_seq_len=16))
    caps = [str(w.message) for w in caught if issubclass(w.category, UnboundedDimWarning)]
    # bert's position table bounds the length by 128 (a guard); max_seq_len lowers it, the batch cap is unchanged
    assert len(caps) == 1 and "input_ids dim 1 <= 16 (max_seq_len=16, was 128)" in caps[0], caps
    assert {s["name"]: s["bounds"] for s in _meta(manager)["inputs"]}["input_ids"] == [[0, 8], [0, 16]]
    default_plan = sum(_dynamic_export("bert")[1].executorch_program.execution_plan[0].non_const_buffer_sizes)
    assert sum(manager.executorch_program.execution_plan[0].non_const_buffer_sizes) < default_plan / 4
    inputs = tiny.make_inputs(3, 16, 1)
    comparison = compare_leaves(eager_leaves(model, inputs), run_exported(manager, inputs), atol=ATOL, rtol=RTOL)
    assert comparison.ok, str(comparison)
    with pytest.raises(InputError, match="input_ids dim 1 is 17, outside the exported bounds: it must be between 0 and 16"):
        run_exported(manager, tiny.make_inputs(2, 17, 0))


@pytest.mark.parametrize("bad", [1, 0, "64", True, 8.0])
def test_max_seq_len_must_be_an_int_of_at_least_two(bad):
    with pytest.raises(ConfigError, match=r"ExecutorchConfig.max_seq_len must be None or an int >= 2, got"):
        ExecutorchConfig(max_seq_len=bad)


def test_auto_classes_pick_the_executorch_exporter():
    config = AutoExportConfig.from_dict({"export_format": "executorch", "backend": "xnnpack", "dynamic": True})
    assert isinstance(config, ExecutorchConfig)
    assert isinstance(AutoExporter.from_config(config), ExecutorchExporter)


def test_unknown_backend_lists_known_ones():
    with pytest.raises(ConfigError, match="unknown ExecuTorch backend 'vulkan'; known backends: xnnpack, cuda"):
        ExecutorchExporter().export(_TwoLinear(), {"x": torch.randn(2, 4)}, config=ExecutorchConfig(backend="vulkan"))


def test_cuda_backend_without_cuda_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="backend='cuda'.*needs a CUDA device.*use backend='xnnpack'"):
        ExecutorchExporter().export(_TwoLinear(), {"x": torch.randn(2, 4)}, config=ExecutorchConfig(backend="cuda"))


def test_cuda_backend_without_executorch_cuda_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setitem(sys.modules, "executorch.backends.cuda.cuda_backend", None)  # import fails
    with pytest.raises(MissingDependencyError, match="ExecuTorch's CUDA backend cannot be imported"):
        ExecutorchExporter().export(_TwoLinear(), {"x": torch.randn(2, 4)}, config=ExecutorchConfig(backend="cuda"))


def test_missing_executorch_names_the_extra(monkeypatch):
    for module in ("executorch", "executorch.runtime"):
        monkeypatch.setitem(sys.modules, module, None)  # as if the extra were not installed
    with pytest.raises(MissingDependencyError, match=r"pip install 'export-sweep\[executorch\]'"):
        ExecutorchExporter().export(_TwoLinear(), {"x": torch.randn(2, 4)}, config=ExecutorchConfig())
    with pytest.raises(MissingDependencyError, match="executorch"):
        run_exported("model.pte", {"x": torch.randn(2, 4)})


def test_pte_path_that_does_not_exist(tmp_path):
    with pytest.raises(ExportStageError, match="stage 'load' failed.*no such .pte file"):
        run_exported(tmp_path / "missing.pte", {"x": torch.randn(2, 4)})


class _Block(torch.nn.Module):
    """Embedding, masked attention, linear, GELU, LayerNorm: XNNPACK takes some nodes, not others (several partitions)."""

    def __init__(self):
        super().__init__()
        self.embed, self.linear, self.norm = torch.nn.Embedding(16, 8), torch.nn.Linear(8, 8), torch.nn.LayerNorm(8)

    def forward(self, input_ids, attention_mask):
        h = self.embed(input_ids) * attention_mask[..., None]
        q = h[:, None]
        h = torch.nn.functional.scaled_dot_product_attention(q, q, q)[:, 0]
        return self.norm(torch.nn.functional.gelu(self.linear(h)))


def _pte_bytes() -> bytes:
    torch.manual_seed(0)
    inputs = {"input_ids": torch.randint(0, 16, (2, 5)), "attention_mask": torch.ones(2, 5)}
    return ExecutorchExporter().export(_Block().eval(), inputs, config=ExecutorchConfig(dynamic=True)).buffer


@functools.cache
def _pte_bytes_with_every_patch() -> bytes:
    """The reference the checks below compare with, exported once per session."""
    return _pte_bytes()


def _reference_lowering(program, partitioners, config, constant_methods):
    from executorch.exir import to_edge_transform_and_lower

    return to_edge_transform_and_lower(program, partitioner=partitioners, compile_config=config, constant_methods=constant_methods)


def test_one_pass_lowering_gives_the_bytes_of_to_edge_transform_and_lower(monkeypatch):
    import engine.exporter_executorch as exporter

    ours = _pte_bytes_with_every_patch()  # (before the swap: the cache must hold our lowering's bytes)
    monkeypatch.setattr(exporter, "lower", _reference_lowering)
    assert _pte_bytes() == ours


def test_lowering_falls_back_when_executorch_lacks_a_step(monkeypatch):
    from executorch.exir.program import _program

    import engine.exporter_executorch as exporter

    calls = []
    real = _program.to_edge_transform_and_lower
    monkeypatch.setattr(exporter, "_ONE_PASS_HELPERS", (*exporter._ONE_PASS_HELPERS, "_a_step_of_a_future_executorch"))
    monkeypatch.setattr(_program, "to_edge_transform_and_lower", lambda *a, **k: calls.append(1) or real(*a, **k))
    assert _pte_bytes() and calls == [1]


def test_idle_xnnpack_passes_skip_their_retrace_and_the_bytes_are_unchanged(monkeypatch):
    from executorch.exir.pass_base import ExportPass

    from engine.patches import patch_disabled

    _pte_bytes()  # XNNPACK exports its pattern graphs (SDPA, bilinear upsampling) on first use: not counted here
    retraces = []
    real_call = ExportPass.call
    monkeypatch.setattr(ExportPass, "call", lambda self, gm: retraces.append(type(self).__name__) or real_call(self, gm))
    with_patch, retraces_with = _pte_bytes(), len(retraces)
    retraces.clear()
    with patch_disabled("executorch", "_patch_xnnpack_idle_retraces"):
        without_patch, retraces_without = _pte_bytes(), len(retraces)
    assert with_patch == without_patch
    assert retraces_with < retraces_without / 2  # most of the 17 passes find nothing to rewrite in this block


class _SigmoidAdd(torch.nn.Module):
    def forward(self, x, y):
        return torch.sigmoid(x) + y


def test_edge_dtype_check_reads_recorded_values_and_keeps_its_verdicts(monkeypatch):
    import executorch.exir.verification.verifier as verifier
    from executorch.exir import to_edge
    from torch._export.verifier import SpecViolationError

    from engine.executorch_patches import _patch_edge_dtype_check_from_meta

    graph = to_edge(torch.export.export(_SigmoidAdd(), (torch.randn(2, 3), torch.randn(2, 3)))).exported_program().graph_module
    original = verifier._check_tensor_args_matching_op_allowed_dtype
    patched = _patch_edge_dtype_check_from_meta(original)
    runs = []
    real_run = torch.fx.Interpreter.run
    monkeypatch.setattr(torch.fx.Interpreter, "run", lambda self, *a, **k: runs.append(1) or real_run(self, *a, **k))
    assert patched(graph) is None and runs == []  # a valid graph passes without re-running a single op
    assert original(graph) is None and runs == [1]
    x = next(n for n in graph.graph.nodes if n.op == "placeholder")
    x.meta["val"] = x.meta["val"].to(torch.float16)  # sigmoid(half) + float: the edge add takes one dtype
    for check in (original, patched):
        with pytest.raises(SpecViolationError, match="taking Tensor inputs with mismatched dtypes"):
            check(graph)


def test_edge_operator_passes_fuse_in_order_and_a_re_entering_pass_starts_a_group():
    from executorch.exir.passes import base_pre_op_replace_passes
    from executorch.exir.passes.memory_format_ops_pass import MemoryFormatOpsPass
    from executorch.exir.passes.remove_mixed_type_operators import RemoveMixedTypeOperators
    from executorch.exir.passes.replace_aten_with_edge_pass import OpReplacePass

    from engine.executorch_patches import _operator_pass_classes, fuse_operator_passes

    passes = [*base_pre_op_replace_passes, RemoveMixedTypeOperators(), OpReplacePass(), MemoryFormatOpsPass()]
    fused = fuse_operator_passes(passes, _operator_pass_classes())
    names = [type(getattr(p, "__wrapped__", p)).__name__ for p in fused]
    assert names == [
        "ReplaceSymSizeOpPass",
        "NormalizeTransposePass+ReplaceBrokenOpsWithFunctionalOpsPass+ScalarToTensorPass",
        "SymToTensorPass",  # re-enters self.call_operator: starts a group, and the next pass is not an operator pass
        "RemoveNoopPass", "PruneEmptyTensorsPass", "RemoveToCopyPass",
        "RemoveMixedTypeOperators+OpReplacePass+MemoryFormatOpsPass",
    ]
    assert fused[0] is passes[0] and fused[3] is passes[5]  # the others keep their pass manager wrapper


@pytest.mark.parametrize(
    "patch", ["_patch_edge_dtype_check_from_meta", "_patch_fused_edge_passes", "_patch_partition_legalize_without_child_recompiles",
              "_patch_spec_prop_reuses_the_dim_order_retrace"]
)
def test_lowering_speed_patch_leaves_the_bytes_unchanged(patch):
    from engine.patches import patch_disabled

    with_patch = _pte_bytes_with_every_patch()  # (outside the block: the cache must hold the patched bytes)
    with patch_disabled("executorch", patch):
        assert _pte_bytes() == with_patch


class _MaxOverDim(torch.nn.Module):
    """``max.dim`` of a 4-D tensor with its indices unused: what XNNPACK's partitioner claims."""

    def __init__(self, dim: int, keepdim: bool):
        super().__init__()
        self.dim, self.keepdim = dim, keepdim
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x):
        x = self.proj(x)
        top = x.max(dim=self.dim, keepdim=self.keepdim).values
        return x - (top if self.keepdim else top.unsqueeze(self.dim))


@pytest.mark.parametrize("dim, keepdim", [(-1, True), (3, False), (1, True), (2, True), (3, True)])
def test_max_over_a_dim_lowers_whatever_its_spelling(dim, keepdim):
    # -1 and keepdim=False used to be claimed by XNNPACK and refused by its serializer (GPT-OSS, Hiera)
    model, inputs = _MaxOverDim(dim, keepdim).eval(), {"x": torch.randn(2, 3, 4, 8)}
    manager = ExecutorchExporter().export(model, inputs, config={"dynamic": False})
    comparison = compare_leaves(eager_leaves(model, inputs), run_exported(manager, inputs), atol=ATOL, rtol=RTOL)
    assert comparison.ok, str(comparison)


class _ConvBatchNorm1d(torch.nn.Module):
    """A Conformer convolution module's tail: depthwise conv1d, then BatchNorm1d over ``[batch, channels, time]``."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv1d(8, 8, 3, padding=1, groups=8)
        self.norm = torch.nn.BatchNorm1d(8)
        self.norm.running_mean.normal_()
        self.norm.running_var.uniform_(0.5, 2.0)

    def forward(self, x):
        return self.norm(self.conv(x).float())


def test_batch_norm_1d_with_dynamic_batch_and_time_lowers():
    # XNNPACK used to claim the norm and fail on the conv1d it rewrites it into (LASR, Canary, Granite Speech)
    model, inputs = _ConvBatchNorm1d().eval(), {"x": torch.randn(2, 8, 12)}
    manager = ExecutorchExporter().export(model, inputs, config={"dynamic": True})
    for x in (inputs["x"], torch.randn(3, 8, 7)):
        comparison = compare_leaves(eager_leaves(model, {"x": x}), run_exported(manager, {"x": x}), atol=ATOL, rtol=RTOL)
        assert comparison.ok, str(comparison)


class _KeysFromTwoHalves(torch.nn.Module):
    """Multi-head latent attention's keys: an uninitialised tensor of the input's (symbolic) shape, filled in two
    halves."""

    def __init__(self, allocate):
        super().__init__()
        self.allocate = allocate

    def forward(self, x):
        keys = self.allocate(x)
        keys[..., : x.shape[-1]] = x
        keys[..., x.shape[-1]:] = x * 2
        return keys


@pytest.mark.parametrize("allocate", [
    lambda x: x.new_empty(*x.shape[:-1], 2 * x.shape[-1]),  # DeepSeek-V3: the .pte took the traced length only
    lambda x: torch.empty_like(torch.cat([x, x], dim=-1)),  # empty_permuted, not in core ATen, failed to lower
], ids=["new_empty", "empty_like"])
def test_empty_of_a_symbolic_size_keeps_its_dims_dynamic(allocate):
    # [batch, length, dim]: two dynamic dims keep the planned arena small (four made it 3 GiB, 30 s a test)
    model, inputs = _KeysFromTwoHalves(allocate), {"x": torch.randn(2, 8, 16)}
    manager = ExecutorchExporter().export(model, inputs, config={"dynamic": True})
    for x in (inputs["x"], torch.randn(3, 5, 16)):
        comparison = compare_leaves(eager_leaves(model, {"x": x}), run_exported(manager, {"x": x}), atol=ATOL, rtol=RTOL)
        assert comparison.ok, str(comparison)


class _TubeletEmbedding(torch.nn.Module):
    """A video model's patch embedding: a Conv3d whose kernel is its stride (VideoMAE, ViViT, V-JEPA 2)."""

    def __init__(self, kernel, groups=1):
        super().__init__()
        self.config = PretrainedConfig(image_size=16)  # bounds the frames' height and width, as a video config does
        self.proj = torch.nn.Conv3d(4, 8, kernel_size=kernel, stride=kernel, groups=groups)

    def forward(self, pixel_values):
        return self.proj(pixel_values).flatten(2).transpose(1, 2)


@pytest.mark.parametrize("kernel, frames, groups", [((2, 4, 4), 5, 1), ((1, 2, 2), 3, 2)],
                         ids=["tubelets-a-frame-left-over", "per-frame-grouped"])
def test_conv3d_with_its_kernel_as_stride_runs(kernel, frames, groups):
    # the portable kernel takes 3-D or 4-D convolutions only: a 5-D one failed the loaded method with 0x12
    model = _TubeletEmbedding(kernel, groups).eval()
    inputs = {"pixel_values": torch.randn(2, 4, frames, 8, 8)}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        manager = ExecutorchExporter().export(model, inputs, config={"dynamic": True})
    # a video's height and width are image dims, capped by the config's image_size (as lengths, three dims capped
    # at 256 each planned 4 GiB for this module)
    caps = " ".join(str(w.message) for w in caught if issubclass(w.category, UnboundedDimWarning))
    assert "pixel_values dim 3 <= 16 (config image_size=16)" in caps and "dim 4 <= 16" in caps, caps
    assert sum(manager.executorch_program.execution_plan[0].non_const_buffer_sizes) < MAX_PLANNED_BYTES
    for x in (inputs["pixel_values"], torch.randn(3, 4, frames, 8, 8)):
        got = run_exported(manager, {"pixel_values": x})
        comparison = compare_leaves(eager_leaves(model, {"pixel_values": x}), got, atol=ATOL, rtol=RTOL)
        assert comparison.ok, str(comparison)


class _SortBoth(torch.nn.Module):
    """Scores sorted descending along a dynamic length, integer ids ascending (JetMoE groups tokens by expert)."""

    def forward(self, scores, ids):
        values, order = scores.sort(dim=-1, descending=True)
        grouped = torch.sort(ids.flatten())
        return values, order, grouped.values, torch.argsort(scores, dim=0)


def test_sort_runs_as_topk():
    # the runtime has no sort kernel: the method failed to load with 0x14 (kernel 'aten::sort.values' not found)
    model = _SortBoth()
    inputs = {"scores": torch.randn(2, 9), "ids": torch.randperm(18).reshape(2, 9)}
    manager = ExecutorchExporter().export(model, inputs, config={"dynamic": True})
    for scores in (inputs["scores"], torch.randn(3, 6)):
        case = {"scores": scores, "ids": torch.randperm(scores.numel()).reshape(scores.shape)}
        comparison = compare_leaves(eager_leaves(model, case), run_exported(manager, case), atol=ATOL, rtol=RTOL)
        assert comparison.ok, str(comparison)


class _SegmentMeans(torch.nn.Module):
    """TAPAS's segment reduction: ``scatter_reduce`` with ``include_self=False``."""

    def forward(self, values, segments):
        out = torch.zeros(4, dtype=values.dtype)
        return out.scatter_reduce(0, segments, values, reduce="mean", include_self=False)


_SEGMENT_INPUTS = {"values": torch.randn(6), "segments": torch.tensor([0, 1, 1, 2, 0, 3])}


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
        _warn_specialised_by_lowering("M", before, {"inputs": [{"name": "input_ids", "bounds": [[0, 2], [8, 8]]}]})
    (message,) = [str(w.message) for w in caught]
    assert "accepts only one size there: input_ids dim 1 (bounds 0..64, lowered to 8)" in message
    assert "narrowed the bounds of 1 input dim(s): input_ids dim 0 (bounds 0..8, lowered to 0..2)" in message
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _warn_specialised_by_lowering("M", before, before)  # unchanged bounds: silent


class _PadToBlocks(torch.nn.Module):
    """Pads a length up to whole blocks with ``(-length) % block``, as LongT5's local attention does."""

    def forward(self, x):
        pad = (-x.shape[1]) % 4
        padded = torch.nn.functional.pad(x, (0, 0, 0, pad))
        return padded.reshape(x.shape[0], -1, 4, x.shape[2]).sum(2)


def test_a_symbolic_modulo_is_floored_as_in_python():
    """The runtime's integer ``%`` truncates (``-7 % 4 == -3``): unfixed, the padding came out negative."""
    from engine.fx_fixes import _FLOORED
    from engine.patches import apply_fx_node_fixes

    manager = ExecutorchExporter().export(_PadToBlocks(), {"x": torch.randn(2, 7, 3)}, config=ExecutorchConfig(dynamic=True))
    for length in (5, 6, 7, 8, 9, 12):  # whole blocks and partial ones
        x = torch.randn(2, length, 3)
        got = run_exported(manager, {"x": x})
        assert torch.allclose(next(iter(got.values())), _PadToBlocks()(x)), length
    program = ExecutorchExporter().trace(_PadToBlocks(), {"x": torch.randn(2, 7, 3)}, ExecutorchConfig(dynamic=True))
    for _ in range(2):  # the fixes may run over a graph twice: a rewritten modulo is not wrapped again
        apply_fx_node_fixes("executorch", program.graph_module)
    mods = [n for n in program.graph.nodes if n.target is operator.mod]
    assert len(mods) == 2 and all(n.meta.get(_FLOORED) for n in mods)


class _ShiftAndCrop(torch.nn.Module):
    """RWKV's time shift (``ZeroPad2d((0, 0, 1, -1))``: one step later, the last step cropped) and a crop of the
    first feature with two padded after it."""

    def __init__(self):
        super().__init__()
        self.shift = torch.nn.ZeroPad2d((0, 0, 1, -1))
        self.crop = torch.nn.ConstantPad1d((-1, 2), 3.0)

    def forward(self, x):
        return self.shift(x), self.crop(x)


def test_a_negative_pad_crops_as_in_torch():
    """The runtime's constant_pad_nd rejects negative amounts (0x12); they become slices."""
    x = torch.randn(2, 7, 3)
    manager = ExecutorchExporter().export(_ShiftAndCrop(), {"x": x}, config=ExecutorchConfig(dynamic=True))
    got = list(run_exported(manager, {"x": x}).values())
    assert all(torch.equal(g, e) for g, e in zip(got, _ShiftAndCrop()(x), strict=True))


# ── The planned-tensor budget: bounds nobody stated are lowered until every planned tensor fits ───────

from hypothesis import given, settings, strategies as st  # noqa: E402
import sympy  # noqa: E402

from engine.exporter_executorch import PLANNED_TENSOR_BUDGET, _fit_to_budget  # noqa: E402


class _Scores(torch.nn.Module):
    """``h @ h^T``: a ``[batch, seq, seq]`` intermediate, quadratic in the length, like attention scores."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, x):
        h = self.proj(x)
        return {"y": torch.softmax(h @ h.transpose(1, 2), dim=-1) @ h}


def _export_scores(config: ExecutorchConfig, positions: int = 32768):
    torch.manual_seed(0)
    model = _Scores().eval()
    model.config = PretrainedConfig(max_position_embeddings=positions)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        manager = ExecutorchExporter().export(model, {"x": torch.randn(2, 7, 4)}, config=config)
    caps = [str(w.message) for w in caught if issubclass(w.category, UnboundedDimWarning)]
    return model, manager, caps


def test_a_config_limit_that_plans_gigabytes_is_lowered_to_the_budget():
    model, manager, caps = _export_scores(ExecutorchConfig(dynamic=True))
    # 8 x 32768 x 32768 float scores would be 32 GiB; the length is halved (powers of two) until 8 x S x S fits
    assert len(caps) == 1 and "x dim 1 <= 1024 (config max_position_embeddings=32768 = 32768, lowered to fit the 64 MiB" in caps[0], caps
    assert _meta(manager)["inputs"][0]["bounds"] == [[0, 8], [0, 1024], [4, 4]]
    plan = manager.executorch_program.execution_plan[0]
    assert max(plan.non_const_buffer_sizes) < 4 * PLANNED_TENSOR_BUDGET
    x = torch.randn(3, 1024, 4)
    comparison = compare_leaves(get_leaf_tensors(model(x)), run_exported(manager, {"x": x}), atol=ATOL, rtol=RTOL)
    assert comparison.ok, str(comparison)
    with pytest.raises(InputError, match="x dim 1 is 1025, outside the exported bounds: it must be between 0 and 1024"):
        run_exported(manager, {"x": torch.randn(2, 1025, 4)})


def test_a_stated_bound_is_never_lowered_and_the_overrun_is_named():
    _, manager, caps = _export_scores(ExecutorchConfig(dynamic=True, max_seq_len=4096))
    # max_seq_len is the user's: the batch goes down to its floor (2 x traced), the length stays, the warning says so
    assert len(caps) == 1 and "x dim 0 <= 4 (batch: 4 x traced 2 = 8, lowered" in caps[0] and "x dim 1 <= 4096 (max_seq_len=4096" in caps[0], caps
    assert "The largest planned tensor is still 256 MiB, over the 64 MiB budget" in caps[0], caps
    assert _meta(manager)["inputs"][0]["bounds"] == [[0, 4], [0, 4096], [4, 4]]


_SYMS = sympy.symbols("a b c")


@settings(max_examples=60, deadline=None)
@given(caps=st.lists(st.integers(1, 1 << 16), min_size=3, max_size=3),
       floor_frac=st.lists(st.floats(0.0, 1.0), min_size=3, max_size=3),
       movable=st.lists(st.booleans(), min_size=3, max_size=3),
       powers=st.lists(st.lists(st.integers(0, 2), min_size=3, max_size=3), min_size=1, max_size=4),
       budget=st.integers(1, 1 << 30))
def test_fitting_to_the_budget_lowers_only_what_may_move_and_stops_at_the_first_fit(caps, floor_frac, movable, powers,
                                                                                    budget):
    start = dict(zip(_SYMS, caps))
    floors = {s: max(1, int(c * f)) for s, c, f, m in zip(_SYMS, caps, floor_frac, movable) if m}
    sizes = [functools.reduce(operator.mul, (s ** p for s, p in zip(_SYMS, ps)), sympy.Integer(4)) for ps in powers]
    sizes = [e for e in sizes if e.free_symbols] + [_SYMS[2]]  # a one-byte tensor's size is a bare symbol
    out, largest = _fit_to_budget(sizes, start, floors, lambda sym, chosen: 1, budget)
    assert largest == max(int(e.xreplace(out)) for e in sizes)
    for sym in _SYMS:
        assert out[sym] <= start[sym]
        assert out[sym] == start[sym] or (sym in floors and out[sym] >= floors[sym])
    if largest > budget:  # it stopped over the budget only because the largest tensor's dims are all at their floor
        worst = max(sizes, key=lambda e: int(e.xreplace(out)))
        assert all(sym not in floors or out[sym] <= floors[sym] for sym in worst.free_symbols)
    else:  # and it stopped at the first fit: raising any lowered cap back to twice its value breaks the budget or
        # is above where it started (halving moves to the power of two below, so one step back is at most x2)
        assert all(out[s] == start[s] or out[s] >= floors[s] for s in _SYMS)


# ── Real-size configs with the documented call: bounded memory, no native crash ───────────────────────

_REAL_LIMITS = r'''
import json, resource, sys, warnings
from engine import ExecutorchConfig, ExecutorchExporter, run_exported
from engine.compare import compare_leaves
from tests.engine.tiny_models import REAL_LIMIT_MODELS, eager_leaves
tiny = REAL_LIMIT_MODELS[sys.argv[1]]
model = tiny.model()
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    manager = ExecutorchExporter().export(model, tiny.inputs("trace"), config=ExecutorchConfig(backend="xnnpack", dynamic=True))
    ExecutorchExporter.save(manager, sys.argv[2])
    del manager
    failed = []
    for which in ("trace", "run"):  # 13 x 7, then 3 x 12
        inputs = tiny.inputs(which, seed=1)
        comparison = compare_leaves(eager_leaves(model, inputs), run_exported(sys.argv[2], inputs), atol=1e-4, rtol=1e-4)
        failed += [] if comparison.ok else [f"{which}: {comparison}"]
print(json.dumps({"failed": failed, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
'''
#: export + save + load + run of one small-width model at its real limits, imports included (the peer: 17.4 GB)
REAL_LIMITS_RSS_MB = 2048


@pytest.mark.parametrize("name", list(REAL_LIMIT_MODELS))
def test_real_limit_config_exports_and_runs_in_bounded_memory(name, tmp_path):
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", _REAL_LIMITS, name, str(tmp_path / "m.pte")], capture_output=True,
                          text=True, timeout=600, cwd=root)
    assert done.returncode == 0, f"exit {done.returncode} (a native crash is negative):\n{done.stderr[-3000:]}"
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert not result["failed"], result["failed"]
    assert result["rss_mb"] < REAL_LIMITS_RSS_MB, f"peak RSS {result['rss_mb']:.0f} MB"


def test_a_plan_the_runtime_cannot_allocate_is_a_named_load_error(monkeypatch, tmp_path):
    from executorch import runtime

    _, manager, _ = _dynamic_export("bert")
    path = ExecutorchExporter.save(manager, tmp_path / "bert.pte")

    class NoMemory:
        def load_program(self, *args, **kwargs):
            raise MemoryError("std::bad_alloc")

    monkeypatch.setattr(runtime.Runtime, "get", staticmethod(lambda: NoMemory()))
    with pytest.raises(ExportStageError, match=r"(?s)load.*std::bad_alloc: the runtime could not allocate the "
                                               r"program's memory plan.*ExecutorchConfig.max_seq_len"):
        run_exported(path, TINY_MODELS["bert"].inputs("trace"))


class _TanhGelu(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        return {"y": torch.nn.functional.gelu(self.lin(x), approximate="tanh")}


def test_tanh_gelu_computes_the_tanh_form_not_xnnpacks_exact_gelu():
    from engine.patches import patch_disabled

    torch.manual_seed(0)
    model = _TanhGelu().eval()
    x = torch.linspace(-4, 4, 2 * 5 * 8).reshape(2, 5, 8)
    expected = get_leaf_tensors(model(x))

    def worst(*disabled) -> float:
        with contextlib.ExitStack() as stack:
            for name in disabled:
                stack.enter_context(patch_disabled("executorch", name))
            manager = ExecutorchExporter().export(model, {"x": x}, config=ExecutorchConfig(dynamic=False))
        return (run_exported(manager, {"x": x})["y"] - expected["y"]).abs().max().item()

    assert worst() < 1e-5
    # what the patch prevents: XNNPACK's delegate runs exact (erf) GELU, up to 4.7e-4 away
    assert worst("_patch_tanh_gelu_delegated_as_exact_gelu") > 1e-4
