"""The zoo keeps samples on which float32 eager is within the sweep's tolerance of float64 eager."""

from __future__ import annotations

import torch

from sweep.zoo import build, conditioning
from sweep.zoo.profiles import PROFILES


class _Cancels(torch.nn.Module):
    """``(x + 1e6) - 1e6``: exact in float64, off by float32's spacing at 1e6 (0.06) in float32."""

    def forward(self, x):
        return (x + 1e6) - 1e6


class _Scales(torch.nn.Module):
    def forward(self, x):
        return 3 * x - 1


class _Noisy(torch.nn.Module):
    """Draws noise in its forward: its outputs cannot be compared across precisions."""

    def forward(self, x):
        return x + torch.randn_like(x)


def test_a_cancelling_sample_is_ill_conditioned_and_a_plain_one_is_not():
    x = {"x": torch.linspace(-1, 1, 64)}
    assert not conditioning.well_conditioned(_Cancels(), x)
    assert conditioning.well_conditioned(_Scales(), x)


def test_a_model_drawing_noise_cannot_be_judged_and_the_global_generator_is_left_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    assert conditioning.well_conditioned(_Noisy(), {"x": torch.zeros(16)})
    assert torch.equal(torch.rand(3), expected)


def test_an_ill_conditioned_class_is_built_at_a_profile_where_it_is_not():
    """CpmAnt initialises its embedding with std 1.0: at the tiny profile its float32 logits are 2.6e-4 from float64
    (the onnx and executorch cases differed by 1.9e-4 there); the micro profile's sample is well conditioned."""
    name = "CpmAntForCausalLM"
    record = build.catalog.record(name)
    cls = build.model_class(name)
    rules = build.overrides.for_class(name, record.model_type)
    tiny = next(p for p in PROFILES if p.name == "tiny")
    model, inputs = build._untied_model_and_inputs(cls, tiny, rules, 0, name)
    assert not conditioning.well_conditioned(model, inputs)

    case = build.build_case(name)
    assert case.profile != "tiny"
    assert conditioning.well_conditioned(case.model, case.inputs)


def test_a_well_conditioned_class_keeps_its_first_profile():
    case = build.build_case("BertModel")
    assert case.profile == "tiny"


def test_a_well_conditioned_profile_over_the_budget_beats_an_ill_conditioned_one_within_it():
    """Grounding DINO's tiny sample is 7,800x the tolerance from float64 (its encoder states vanish and LayerNorm
    amplifies what is left); no profile within the 5 M budget builds a well-conditioned one, the small profile
    (5.76 M parameters) does."""
    case = build.build_case("GroundingDinoModel")
    assert case.profile == "small" and case.num_parameters > build.PARAMETER_BUDGET
    assert conditioning.well_conditioned(case.model, case.inputs)
