"""One input contract for the three runners: the same bad input is the same InputError (problem, input, message) on
dynamo, ONNX and ExecuTorch, never a raw runtime error, a crash or a silent result; and every artifact loads and runs
in a fresh process that imported only ``engine``."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import AutoExporter, InputError, load_artifact, run_exported, save_artifact
from engine.artifacts import SUFFIX

VOCAB, MAX_POSITIONS = 64, 64
BACKENDS = ("dynamo", "onnx", "executorch")


def _bert():
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=MAX_POSITIONS)
    return BertModel(config).eval()


def _inputs(batch=2, length=7, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return {"input_ids": torch.randint(0, VOCAB, (batch, length), generator=generator),
            "attention_mask": torch.ones(batch, length, dtype=torch.long)}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A tiny BERT exported with dynamic shapes on each backend, saved, and loaded back."""
    folder = tmp_path_factory.mktemp("contract")
    model, inputs = _bert(), _inputs()
    paths = {}
    for backend in BACKENDS:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            artifact = AutoExporter.export(model, inputs, {"export_format": backend, "dynamic": True})
        paths[backend] = save_artifact(artifact, folder / f"bert{SUFFIX[backend]}")
    return model, paths


@pytest.fixture(scope="module")
def artifacts(saved):
    return {backend: load_artifact(path) for backend, path in saved[1].items()}


def _errors(artifacts, inputs) -> dict[str, InputError]:
    found = {}
    for backend, artifact in artifacts.items():
        with pytest.raises(InputError) as caught:
            run_exported(artifact, inputs)
        found[backend] = caught.value
    return found


def _mistake(kind: str, data) -> tuple[dict, str, str | None]:
    """Good inputs made bad in one way: ``(inputs, problem, input at fault)``."""
    inputs = _inputs(batch=data.draw(st.integers(1, 3)), length=data.draw(st.integers(2, 9)))
    ids = inputs["input_ids"]
    if kind == "missing":
        name = data.draw(st.sampled_from(sorted(inputs)))
        inputs.pop(name)
        return inputs, "missing", name
    if kind == "unknown":
        name = data.draw(st.sampled_from(["token_typo", "pixel_values", "labels_x"]))
        return {**inputs, name: ids}, "unknown", name
    if kind == "dtype":
        return {**inputs, "input_ids": ids.to(data.draw(st.sampled_from([torch.float32, torch.float64])))}, "dtype", "input_ids"
    if kind == "rank":
        bad = ids[0] if data.draw(st.booleans()) else ids[..., None]
        return {**inputs, "input_ids": bad}, "rank", "input_ids"
    if kind == "size":
        length = data.draw(st.integers(MAX_POSITIONS + 1, 4 * MAX_POSITIONS))
        return _inputs(batch=2, length=length), "size", "input_ids"
    if kind == "index":
        value = data.draw(st.one_of(st.integers(-10**6, -1), st.integers(VOCAB, 10**6)))
        at = (data.draw(st.integers(0, ids.shape[0] - 1)), data.draw(st.integers(0, ids.shape[1] - 1)))
        bad = ids.clone()
        bad[at] = value
        return {**inputs, "input_ids": bad}, "index", "input_ids"
    value = data.draw(st.sampled_from(["hello", b"bytes"]))
    return {**inputs, "input_ids": value}, "type", "input_ids"


@given(st.sampled_from(["missing", "unknown", "dtype", "rank", "size", "index", "type"]), st.data())
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_every_runner_refuses_the_same_mistake_with_the_same_error(artifacts, kind, data):
    inputs, problem, culprit = _mistake(kind, data)
    errors = _errors(artifacts, inputs)
    assert {(e.problem, e.input) for e in errors.values()} == {(problem, culprit)}
    assert all(str(e).startswith("BertModel: ") for e in errors.values())
    if kind != "rank":  # the rank message shows the bounds, which ExecuTorch's memory plan sets for the batch too
        assert len({str(e) for e in errors.values()}) == 1, {b: str(e) for b, e in errors.items()}


def test_lists_and_arrays_are_converted_and_every_runner_gives_eagers_values(saved, artifacts):
    model, _ = saved
    inputs = _inputs(batch=3, length=5, seed=1)
    with torch.no_grad():
        expected = model(**inputs).last_hidden_state
    for fed in ({k: v.tolist() for k, v in inputs.items()}, {k: v.numpy() for k, v in inputs.items()},
                {k: v.int() for k, v in inputs.items()}):  # int32 ids are cast as int64 ones on every backend
        for backend, artifact in artifacts.items():
            got = run_exported(artifact, fed)["last_hidden_state"]
            torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4, msg=backend)


def test_an_empty_input_is_named_not_left_to_the_runtime(artifacts):
    inputs = _inputs()
    empty = {name: tensor[:, :0] for name, tensor in inputs.items()}  # a slice: strides of its base (ExecuTorch aborted)
    errors = _errors(artifacts, empty)
    assert {(e.problem, e.input) for e in errors.values()} == {("empty", "input_ids")}


def test_runtime_failures_name_their_cause():
    from engine.runtime.errors import executorch_message, onnxruntime_message

    assert executorch_message(RuntimeError("method->execute() failed with error 0x12")).startswith(
        "InvalidArgument (0x12): a kernel refused its arguments")
    raw = ("[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : Non-zero status code returned while running Expand node. "
           "Name:'node_expand_1' Status Message: invalid expand shape")
    assert onnxruntime_message(RuntimeError(raw), {"input_ids": torch.zeros(2, 5)}).startswith(
        "node node_expand_1 (Expand) failed on inputs input_ids (2, 5): ")


_FRESH = """
import json, sys, torch
import engine
artifact = engine.load_artifact(sys.argv[1])
inputs = torch.load(sys.argv[2])
out = engine.run_exported(artifact, inputs)
print(json.dumps({"modules": sorted(m for m in ("transformers.modeling_outputs",) if m in sys.modules),
                  "leaves": sorted(out), "max_diff": float((out["last_hidden_state"] - torch.load(sys.argv[3])).abs().max())}))
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_each_artifact_loads_and_runs_in_a_fresh_process(saved, tmp_path, backend):
    model, paths = saved
    inputs = _inputs(batch=2, length=6, seed=2)
    with torch.no_grad():
        expected = model(**inputs).last_hidden_state
    torch.save(inputs, tmp_path / "inputs.pt")
    torch.save(expected, tmp_path / "expected.pt")
    done = subprocess.run([sys.executable, "-c", _FRESH, paths[backend], str(tmp_path / "inputs.pt"),
                           str(tmp_path / "expected.pt")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["leaves"] == ["last_hidden_state", "pooler_output"] and result["max_diff"] < 1e-4


def test_a_pt2_records_its_pytree_types_and_an_unrecorded_one_still_loads(tmp_path):
    """A program returning a cache: the .pt2 names DynamicCache and the ModelOutput; a file without the record
    (written by torch.export.save) loads too, each class torch names as missing registered in turn."""
    import zipfile

    from transformers import LlamaConfig, LlamaForCausalLM

    from engine import DynamoExporter
    from engine.artifact_meta import PYTREE_TYPES_FILE

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(num_hidden_layers=1, hidden_size=16, intermediate_size=32,
                                         num_attention_heads=2, num_key_value_heads=1, vocab_size=32)).eval()
    program = DynamoExporter().export(model, {"input_ids": torch.randint(0, 32, (2, 5)), "use_cache": True},
                                      config={"dynamic": True})
    recorded = save_artifact(program, tmp_path / "llama.pt2")
    names = json.loads(next(zipfile.ZipFile(recorded).read(n) for n in zipfile.ZipFile(recorded).namelist()
                            if n.endswith(PYTREE_TYPES_FILE)))
    assert "transformers.cache_utils.DynamicCache" in names
    assert any(name.endswith("CausalLMOutputWithPast") for name in names)
    torch.export.save(program, tmp_path / "plain.pt2")
    script = ("import sys, torch, engine\n"
              "program = engine.load_artifact(sys.argv[1])\n"
              "out = engine.run_exported(program, {'input_ids': torch.randint(0, 32, (2, 4))})\n"
              "print(sorted(out))")
    for path in (recorded, tmp_path / "plain.pt2"):
        done = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "logits" in done.stdout


def test_index_inputs_are_found_through_views_and_casts():
    from engine import DynamoExporter
    from engine.index_inputs import find_index_inputs

    class Lookup(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.table = torch.nn.Embedding(10, 4)
            self.other = torch.nn.Parameter(torch.randn(7, 4))

        def forward(self, ids, rows, picked, scores):
            embedded = self.table(ids.view(-1, ids.shape[-1]).to(torch.int64))
            selected = self.other.index_select(0, rows)
            hot = torch.nn.functional.one_hot(picked, num_classes=5)
            shifted = self.table(ids.clamp(min=0))  # a computed index: its input is not checked by value
            return embedded.sum() + selected.sum() + hot.sum() + shifted.sum() + scores.sum()

    inputs = {"ids": torch.randint(0, 10, (2, 3), dtype=torch.int32), "rows": torch.tensor([0, 6]),
              "picked": torch.tensor([1, 4]), "scores": torch.randn(2)}
    program = DynamoExporter().export(Lookup().eval(), inputs, config={"dynamic": True})
    found = find_index_inputs(program)
    assert found == {"ids": [0, 10, "embedding"], "rows": [0, 7, "index_select"], "picked": [0, 5, "one_hot"]}
    with pytest.raises(InputError, match=r"input rows holds 7, outside \[0, 7\)") as caught:
        run_exported(program, {**inputs, "rows": torch.tensor([0, 7])})
    assert (caught.value.problem, caught.value.input) == ("index", "rows")
    assert run_exported(program, {**inputs, "scores": np.ones(2, dtype=np.float32)})  # an array is converted
