"""Build and run eagerly a deterministic sample of catalogued classes spread over every task mapping.

A class that fails fails its test. The only skip is ``missing_dependency`` for a package that cannot be installed
in this environment (``sweep/zoo/data/dependencies.yaml``); a missing installable package is a failure of the test
install. Classes known to fail are listed with their reason in ``sweep/zoo/data/known_failures.yaml`` and run as
strict xfails, so a fix shows up as an unexpected pass.
The full catalog runs by hand: ``python bench/zoo_catalog.py`` (see its docstring).
"""

from __future__ import annotations

import os

import pytest
import torch

from sweep.zoo import build, known_failures
from sweep.zoo.context import BATCH
from sweep.zoo.errors import ZooError, installable
from sweep.zoo.sample import eager_sample, stable_key

os.environ.setdefault("HF_HUB_OFFLINE", "1")
SAMPLE = eager_sample()
KNOWN = known_failures.load()
OVER_BUDGET = known_failures.over_budget()
#: the classes whose case is built twice to check it is deterministic for a seed: one in this many, by name hash
DETERMINISM_EVERY = 4


def _params():
    for name in SAMPLE:
        marks = []
        if name in KNOWN:
            marks.append(pytest.mark.xfail(reason=KNOWN[name], strict=True, raises=ZooError))
        yield pytest.param(name, id=name, marks=marks)


def test_sample_spans_every_mapping():
    from sweep.zoo import catalog

    covered = {m for name in SAMPLE for m in catalog.catalog()[name].mappings}
    assert covered == set(catalog.mapping_labels())
    assert len(SAMPLE) >= 150


@pytest.mark.parametrize("name", _params())
def test_build_and_forward(name):
    torch.set_num_threads(1)
    try:
        case = build.build_case(name)
    except ZooError as exc:
        if exc.category == "missing_dependency" and not installable(exc.package):
            pytest.skip(f"needs {exc.package}, which cannot be installed here")
        raise
    assert not case.model.training
    assert case.num_parameters <= build.PARAMETER_BUDGET or name in OVER_BUDGET, (
        f"{case.num_parameters} parameters; record it in sweep/zoo/data/over_budget.yaml if the architecture needs it")
    assert not any("label" in key for key in case.inputs)
    batched = [v for v in case.inputs.values() if isinstance(v, torch.Tensor) and v.dim() > 0]
    assert any(v.shape[0] == BATCH for v in batched), {k: tuple(v.shape) for k, v in case.inputs.items()}
    # deterministic for a seed
    if int(stable_key(name), 16) % DETERMINISM_EVERY:
        return  # a second build checks determinism on a fixed part of the sample (it doubles the build's time)
    again = build.build_case(name)
    for key, value in case.inputs.items():
        if isinstance(value, torch.Tensor):
            torch.testing.assert_close(value, again.inputs[key], rtol=0, atol=0)


def test_an_m_rope_case_passes_the_models_own_positions():
    """Qwen2-VL computes its 3-D rotary positions in a loop torch.export cannot trace; its case passes them
    (engine/patches/model/rope_positions.py), and only because eager computes the same outputs with them (checked in the build)."""
    case = build.build_case("Qwen2VLModel")
    ids = case.inputs["input_ids"]
    assert case.inputs["position_ids"].shape == (3, *ids.shape)


def test_inputs_an_override_names_are_in_the_sample():
    """PaliGemma is a prefix LM: its processor always returns token_type_ids, and without them its eager forward
    disagrees with itself (a causal mask SDPA drops when all ones, attention said bidirectional). Its override names
    them, so the sample holds them, and with them the SDPA and eager attention paths agree."""
    case = build.build_case("PaliGemmaModel")
    ids = case.inputs["token_type_ids"]
    assert ids.shape == case.inputs["input_ids"].shape and not ids.any()  # the whole prompt is the prefix
    outputs = {}
    for implementation in ("sdpa", "eager"):
        case.model.set_attn_implementation(implementation)
        with torch.no_grad():
            outputs[implementation] = case.model(**case.inputs).last_hidden_state
    torch.testing.assert_close(outputs["sdpa"], outputs["eager"], rtol=1e-4, atol=1e-4)


def test_omdet_turbo_builds_with_sizes_following_its_shrunk_towers():
    """OmDet-Turbo sizes its encoder inputs, LayerNorms and class projection apart from its towers: the override
    makes them agree with the shrunk Swin and text towers, and the detector runs."""
    case = build.build_case("OmDetTurboForObjectDetection")
    assert case.num_parameters <= build.PARAMETER_BUDGET
    assert {"pixel_values", "classes_input_ids", "tasks_input_ids"} <= set(case.inputs)


def test_audio_placeholders_are_written_as_the_processor_writes_them():
    """Qwen2-Audio still merges one placeholder per clip into its features itself (a legacy path torch.export never
    takes): the zoo learns it from the output, longer than the text, and writes one placeholder per audio feature,
    as the processor does; the forward then returns a sequence as long as its text."""
    from sweep.zoo import input_lessons
    from sweep.zoo.context import Hints

    case = build.build_case("Qwen2AudioModel")
    ids = case.inputs["input_ids"]
    placeholders = (ids == case.model.config.audio_token_id).sum(-1)
    assert (placeholders == placeholders[0]).all() and placeholders[0] > 1
    with torch.no_grad():
        output = case.model(**case.inputs)
    assert output.last_hidden_state.shape[1] == ids.shape[1]
    assert input_lessons.placeholders_expanded_inside(case.model, case.inputs, output, Hints()) is None
    count = int(placeholders[0])
    assert (ids[:, 1:1 + count] == case.model.config.audio_token_id).all()  # written after the first token
    one_per_clip = torch.cat([ids[:, :2], ids[:, 1 + count:]], 1)
    single = {**case.inputs, "input_ids": one_per_clip, "attention_mask": torch.ones_like(one_per_clip)}
    with torch.no_grad():
        legacy = case.model(**single)  # one placeholder per clip: the legacy merge lengthens the sequence
    learned = input_lessons.placeholders_expanded_inside(case.model, single, legacy, Hints())
    assert learned is not None and learned.audio_tokens == count
