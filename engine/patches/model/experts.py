"""Mixture-of-experts layers traced without their loop over the experts that received tokens.

Pattern: ``for expert_idx in expert_hit`` with ``expert_hit = (...).nonzero()``: a loop whose length is data
(``Eq(u0, 0)``). Experts behind transformers' ``use_experts_implementation`` switch to its loop-free
``batched_mm`` (:func:`data_independent_experts`, registered as a trace context; ExecuTorch also for its kernels:
:func:`use_batched_experts`); experts written outside it are patched to :func:`dense_expert_mixture`.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from engine.patches.registry import register_patch, register_trace_context


def dense_expert_mixture(hidden, top_k_index, top_k_weights, num_experts: int, expert):
    """``sum_e w_e * expert(e, hidden)`` over every expert in index order, ``w_e`` each token's routing weight to expert
    ``e`` (0 where the token is not routed there, and then no contribution, even from an inf).

    The experts that received no token add nothing, so this is the looped dispatch's sum in its order (each routed
    token's contributions added expert by expert, from zeros) without its data-dependent loop; every expert runs on
    every token, which costs ``num_experts`` times the routed work."""
    out = torch.zeros_like(hidden)
    for index in range(num_experts):
        weight = (top_k_weights * (top_k_index == index)).sum(-1, keepdim=True)
        contribution = (expert(index, hidden) * weight).to(out.dtype)
        out = out + torch.where(weight != 0, contribution, torch.zeros((), dtype=out.dtype))
    return out


_EXPERT_LOOP_PATTERN = """Pattern: experts outside transformers' ``use_experts_implementation`` (so without its
    ``batched_mm`` path) dispatch tokens with a Python loop over the experts that received some
    (``for expert_idx in expert_hit``, ``expert_hit = (...).nonzero()``): the loop's length is data, export fails
    (``Eq(u0, 0)``). Here every expert runs on every token and is weighted by the token's routing weight to it
    (:func:`dense_expert_mixture`): the routed sum without the loop, checked against the looped experts at 1e-4.
    No upstream issue found; TODO (transformers): put these experts behind ``use_experts_implementation``."""


@register_patch("dynamo", "transformers.models.dbrx.modeling_dbrx.DbrxExperts.forward")
def _patch_hit_loop_over_flat_expert_weights(original):
    def forward(self, hidden_states, top_k_index, top_k_weights):
        batch = hidden_states.shape[0]
        flat = hidden_states.reshape(-1, self.hidden_size)
        shape = (-1, self.ffn_hidden_size, self.hidden_size)
        w1, v1, w2 = (weight.view(shape) for weight in (self.mlp.w1, self.mlp.v1, self.mlp.w2))
        out = dense_expert_mixture(flat, top_k_index, top_k_weights, self.num_experts,
                                   lambda e, x: self.mlp(x, w1[e], v1[e], w2[e]))
        return out.view(batch, -1, self.hidden_size)

    return forward


@register_patch("dynamo", "transformers.models.longcat_flash.modeling_longcat_flash.LongcatFlashExperts.forward")
def _patch_hit_loop_with_identity_experts(original):
    def forward(self, hidden_states, top_k_index, top_k_weights):
        if top_k_index.numel() == 0:
            return original(self, hidden_states, top_k_index, top_k_weights)

        def expert(index, x):
            if index >= self.num_routed_experts or self.gate_up_proj is None:  # a zero-compute (identity) expert
                return self.identity_expert(x)
            gate, up = F.linear(x, self.gate_up_proj[index]).chunk(2, dim=-1)
            return F.linear(self.act_fn(gate) * up, self.down_proj[index])

        return dense_expert_mixture(hidden_states, top_k_index, top_k_weights, self.total_experts, expert)

    return forward


@register_patch("dynamo", "transformers.models.step3p7.modeling_step3p7.Step3p7Experts.forward")
def _patch_hit_loop_over_gated_expert_projections(original):
    def forward(self, hidden_states, top_k_index, top_k_weights):
        def expert(index, x):
            return F.linear(self._apply_gate(F.linear(x, self.gate_up_proj[index])), self.down_proj[index])

        return dense_expert_mixture(hidden_states, top_k_index, top_k_weights, self.num_experts, expert)

    return forward


for _factory in (_patch_hit_loop_over_flat_expert_weights, _patch_hit_loop_with_identity_experts,
                 _patch_hit_loop_over_gated_expert_projections):
    _factory.__doc__ = _EXPERT_LOOP_PATTERN


def has_settable_experts(model: torch.nn.Module) -> bool:
    """Whether the model's MoE experts sit behind transformers' ``use_experts_implementation`` (so
    ``set_experts_implementation`` can pick ``eager``, ``batched_mm`` or ``grouped_mm``)."""
    can_set = getattr(model, "_can_set_experts_implementation", None)
    return can_set is not None and bool(can_set())


@register_trace_context("dynamo")
@contextlib.contextmanager
def data_independent_experts(model: torch.nn.Module):
    """While tracing, MoE experts whose implementation is ``"eager"`` run as ``"batched_mm"``; restored on exit.

    Pattern: transformers' eager experts loop over the experts that received tokens (``for expert_idx in expert_hit``,
    ``expert_hit = (...).nonzero()``), a loop whose length is data (``Eq(u0, 0)``); a model can pick it as its default
    (OpenAI privacy filter). ``batched_mm`` is transformers' own loop-free path for the same experts (per-token expert
    weights gathered, one batched matmul): the eager numbers without the loop (the sweep checks them at 1e-4). Experts
    outside ``use_experts_implementation``, or on another implementation, are left alone. Yields whether it switched the
    implementation."""
    if getattr(getattr(model, "config", None), "_experts_implementation", None) != "eager" or not has_settable_experts(model):
        yield False
        return
    model.set_experts_implementation("batched_mm")
    try:
        yield True
    finally:
        model.set_experts_implementation("eager")


def use_batched_experts(model: torch.nn.Module) -> None:
    """MoE experts default to ``grouped_mm``, which has no ExecuTorch kernel: use ``batched_mm``. A composite model
    that cannot set them itself (Kimi-K2.5: a vision tower beside its MoE text model, whose own config asks for
    ``grouped_mm``) has them set on each sub-model that can."""
    if has_settable_experts(model):
        model.set_experts_implementation("batched_mm")
        return
    for sub in model.modules():
        if sub is not model and has_settable_experts(sub):
            sub.set_experts_implementation("batched_mm")
