"""Model patches compute what the code they replace computes."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.models.mamba.modeling_mamba import mamba_selective_scan

from engine.model_patches import closed_form_selective_scan


@settings(max_examples=25, deadline=None)
@given(
    batch=st.integers(1, 3),
    channels=st.integers(1, 6),
    state=st.integers(1, 5),
    seq=st.integers(1, 12),
    with_skip=st.booleans(),
    with_gate=st.booleans(),
    last_state=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_closed_form_scan_equals_the_recurrent_loop(batch, channels, state, seq, with_skip, with_gate, last_state, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, channels, seq, generator=g)
    dt = torch.randn(batch, channels, seq, generator=g)
    A = -torch.rand(channels, state, generator=g) * 2  # Mamba's A = -exp(A_log): negative
    B = torch.randn(batch, state, seq, generator=g)
    C = torch.randn(batch, state, seq, generator=g)
    kwargs = dict(
        D=torch.randn(channels, generator=g) if with_skip else None,
        z=torch.randn(batch, channels, seq, generator=g) if with_gate else None,
        delta_bias=torch.randn(channels, generator=g),
        delta_softplus=True,
        return_last_state=last_state,
    )
    expected = mamba_selective_scan(x, dt, A, B, C, **kwargs)  # eager: the recurrent loop
    got = closed_form_selective_scan(x, dt, A, B, C, **kwargs)
    for e, o in zip(expected if last_state else (expected,), got if last_state else (got,)):
        torch.testing.assert_close(o, e, atol=1e-5, rtol=1e-4)
