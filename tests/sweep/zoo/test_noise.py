"""A forward that draws its own noise gets it as an input, so eager and the exported program can agree."""

from __future__ import annotations

import torch

from sweep.zoo import build, noise


class Masking(torch.nn.Module):
    """ViTMAE's pattern: shuffle by ``torch.rand`` unless the caller passes ``noise``."""

    def __init__(self, draws: int = 1):
        super().__init__()
        self.draws = draws

    def forward(self, x, noise=None):
        for _ in range(self.draws if noise is None else 0):
            noise = torch.rand(x.shape[0], x.shape[1]) if noise is None else noise + torch.rand(x.shape[0], x.shape[1])
        return x.gather(1, torch.argsort(noise, dim=1))


class Plain(torch.nn.Module):
    def forward(self, x, noise=None):
        return x * 2


def test_one_draw_becomes_a_seeded_noise_input_and_the_forward_is_deterministic():
    x = torch.arange(12.0).reshape(2, 6)
    given = build._with_caller_noise(Masking(), {"x": x}, seed=3)
    assert set(given) == {"x", "noise"} and given["noise"].shape == (2, 6)
    assert torch.equal(given["noise"], build._with_caller_noise(Masking(), {"x": x}, seed=3)["noise"])  # seeded
    assert noise.run_recording_draws(Masking(), given) == []
    assert torch.equal(Masking()(**given), Masking()(**given))


def test_no_noise_for_a_forward_that_draws_nothing_or_several_times():
    x = torch.ones(2, 6)
    assert build._with_caller_noise(Plain(), {"x": x}, seed=0) == {"x": x}
    assert len(noise.run_recording_draws(Masking(draws=2), {"x": x})) == 2
    assert build._with_caller_noise(Masking(draws=2), {"x": x}, seed=0) == {"x": x}


def test_the_stand_in_has_the_draws_kind():
    normal = noise.noise_for([(torch.randn, (4000,), torch.float32)], seed=0)
    uniform = noise.noise_for([(torch.rand, (4000,), torch.float32)], seed=0)
    assert normal.min() < 0 < normal.max() and 0 <= uniform.min() and uniform.max() < 1
