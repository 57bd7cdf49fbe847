"""Recurrences over the sequence traced as one step over a symbolic length (scope ``"dynamo"``).

Pattern: a Python ``for t in range(seq_len)`` carrying a state (Mamba's selective scan, RWKV's WKV, RecurrentGemma's
RG-LRU, xLSTM's mLSTM) is unrolled by torch.export for the traced length, which pins it. The selective scan has a
closed form (cumulative sums of its log-decays); the others run their loop body as ``torch._higher_order_ops.scan``.
ExecuTorch runs a scan only while its carry keeps the traced shape: its exporter unrolls the steps up to the traced
length instead (:func:`unrolled_scan`, ``engine.patches.executorch``).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from engine.patches.registry import register_patch


# ── Correctness (this scope has no speed patches) ───────────────────────────────────────────────────────────

#: modules with the same (copied) ``mamba_selective_scan``
_SELECTIVE_SCAN_MODULES = ("mamba", "falcon_mamba", "jamba", "zamba")


def closed_form_selective_scan(
    hidden_states: torch.Tensor,  # [batch, intermediate, seq]
    dt: torch.Tensor,  # [batch, intermediate, seq]
    A: torch.Tensor,  # [intermediate, state]
    B: torch.Tensor,  # [batch, state, seq]
    C: torch.Tensor,  # [batch, state, seq]
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    delta_bias: torch.Tensor | None = None,
    delta_softplus: bool = False,
    return_last_state: bool = False,
    **_,
):
    """The selective scan ``h_t = exp(A dt_t) h_(t-1) + dt_t B_t x_t``, ``y_t = C_t h_t`` without a loop.

    ``h_t = sum_(s<=t) exp(L_t - L_s) dt_s B_s x_s`` with ``L = cumsum(A dt)``: the decay between two steps is
    one masked ``exp`` of a difference of cumulative sums (never above 1, since ``A dt <= 0``), so the result is
    stable and the sequence length stays symbolic. Memory is O(seq^2) per channel, which export-sized inputs
    afford.
    """
    input_dtype = hidden_states.dtype
    if delta_bias is not None:
        dt = dt + delta_bias.to(dt.dtype)[..., None]
    if delta_softplus:
        dt = F.softplus(dt)
    B, C = B.transpose(1, 2).float(), C.transpose(1, 2).float()  # [batch, seq, state]
    log_decay = A[None, :, None, :] * dt[:, :, :, None]  # [batch, inter, seq, state]
    cumulative = log_decay.cumsum(dim=2)
    seq = hidden_states.shape[-1]
    causal = torch.ones(seq, seq, dtype=torch.bool, device=hidden_states.device).tril()  # [t, s]: s <= t
    between = cumulative[:, :, :, None, :] - cumulative[:, :, None, :, :]  # [batch, inter, t, s, state]
    decay = torch.exp(between.masked_fill(~causal[None, None, :, :, None], float("-inf")))
    inputs = dt[:, :, :, None] * B[:, None, :, :] * hidden_states[:, :, :, None].float()  # [batch, inter, s, state]
    states = (decay * inputs[:, :, None, :, :]).sum(dim=3)  # [batch, inter, t, state]
    scan_output = (states.to(input_dtype) * C[:, None, :, :].to(input_dtype)).sum(dim=-1)  # [batch, inter, seq]
    if D is not None:
        scan_output = scan_output + hidden_states * D[None, :, None]
    if z is not None:
        scan_output = scan_output * F.silu(z)
    if return_last_state:
        return scan_output, states[:, :, -1]
    return scan_output


@register_patch("dynamo", *(f"transformers.models.{m}.modeling_{m}.mamba_selective_scan" for m in _SELECTIVE_SCAN_MODULES))
def _patch_selective_scan_loop(original):
    """Pattern: ``mamba_selective_scan``'s torch path runs ``for index in range(seq_len)`` under export (its
    associative scan is disabled while exporting), so torch.export unrolls the loop and pins the sequence length
    to the traced one (``Eq(seq, 8)``: the program then rejects every other prompt length). Replaced by the
    closed-form scan above. No upstream issue found; TODO (transformers): a loop-free scan for the export path.
    """
    return closed_form_selective_scan


# ── Recurrences over the sequence as a scan ────────────────────────────────────────────────────────────────
# A Python ``for t in range(seq_len)`` carrying a recurrent state is unrolled by torch.export for the traced
# length, which pins it. ``torch._higher_order_ops.scan`` traces one step and runs it over the symbolic length;
# the step is the loop body as written (the same ops in the same order: the values are eager's to the bit). A
# length known as an int (a static export) keeps the loop. The ExecuTorch exporter cannot run the scan of a dynamic
# batch, and runs the steps unrolled up to the traced length instead (:func:`unrolled_scan`,
# engine.patches.executorch._patch_time_loops_unrolled_for_executorch).


_WKV_LOOP = "transformers.models.rwkv.modeling_rwkv.rwkv_linear_attention_cpu"
_RG_LRU_LOOP = "transformers.models.recurrent_gemma.modeling_recurrent_gemma.RecurrentGemmaRglru._rnn_scan"
_MLSTM_BACKEND = "transformers.models.xlstm.modeling_xlstm.xLSTMBackend.forward"


def _symbolic_length(tensor: torch.Tensor, dim: int = 1) -> bool:
    return isinstance(tensor.shape[dim], torch.SymInt)


def _scan(step, carry, xs, dim: int):
    """``torch._higher_order_ops.scan`` of ``step`` over ``dim`` of ``xs`` (:func:`_higher_order_scan`); the
    ExecuTorch exporter swaps in :func:`unrolled_scan`."""
    return _higher_order_scan(step, carry, xs, dim)


def _higher_order_scan(step, carry, xs, dim: int):
    """``torch._higher_order_ops.scan`` of ``step`` over ``dim`` of ``xs``, its initial carry made contiguous: scan
    wants the carry laid out as its steps return it (a state sliced from the input, ``key[:, 0]``, is strided)."""
    from torch._higher_order_ops.scan import scan
    from torch.utils._pytree import tree_map

    return scan(step, tree_map(torch.Tensor.contiguous, carry), xs, dim=dim)


def unrolled_scan(step, carry, xs, dim: int):
    """:func:`_scan` as ``T`` unrolled steps, ``T`` the traced length, for lengths up to ``T``: the inputs padded to
    ``T``, each step's carry kept only while ``t`` is below the length, the outputs cut back to it. Steps below the
    length compute what the loop computes, in the same order; the program states ``length <= T``. For ExecuTorch,
    whose emitted scan copies the initial carry into a buffer planned for the batch's bound and fails at any other
    batch (``skiplists/repros/scan_with_dynamic_carry.py``), while an unrolled loop's carry is plain tensors."""
    length = xs[0].shape[dim]
    steps = length.node.hint if isinstance(length, torch.SymInt) else length
    if not isinstance(steps, int):  # a data-dependent length: no traced value to unroll to
        return _higher_order_scan(step, carry, xs, dim)
    torch._check(length <= steps)
    for x in xs[1:]:  # scan's contract: every input has the scanned length
        torch._check(x.shape[dim] == length)
    # two rows past T: a pad whose size is 0 or 1 at the traced length would be specialised there, pinning the length
    padded = [torch.cat([x, x.new_zeros(*x.shape[:dim], steps + 2 - length, *x.shape[dim + 1:])], dim) for x in xs]
    below = torch.arange(steps, device=xs[0].device) < length
    outputs = []
    for t in range(steps):
        stepped, output = step(carry, [x.select(dim, t) for x in padded])
        carry = torch.utils._pytree.tree_map(lambda new, old: torch.where(below[t], new, old), stepped, carry)
        outputs.append(output)
    kept = torch.arange(length, device=xs[0].device)  # a gather, not a narrowed view (its strides would pin the length)
    return carry, torch.stack(outputs, dim).index_select(dim, kept)


@register_patch("dynamo", _WKV_LOOP)
def _patch_wkv_time_loop_as_scan(original):
    """Pattern: RWKV's WKV recurrence on CPU, ``for current_index in range(seq_length)`` carrying the numerator,
    denominator and running-maximum states (models/rwkv/modeling_rwkv.py ``rwkv_linear_attention_cpu``): the program
    accepts only the traced length (``Eq(seq, 8)``). Run as a scan over the sequence dim (see above). No upstream
    issue found; TODO (transformers): a scan (or the chunked closed form) on the export path."""

    @functools.wraps(original)
    def rwkv_linear_attention_cpu(time_decay, time_first, key, value, state=None, return_state=False):
        if not _symbolic_length(key):
            return original(time_decay, time_first, key, value, state=state, return_state=return_state)
        if state is None:
            num_state = torch.zeros_like(key[:, 0], dtype=torch.float32)
            den_state = torch.zeros_like(key[:, 0], dtype=torch.float32)
            max_state = torch.zeros_like(key[:, 0], dtype=torch.float32) - 1e38
        else:
            num_state, den_state, max_state = state
        decay = -torch.exp(time_decay)

        def step(carry, current):
            num_state, den_state, max_state = carry
            current_key, current_value = current[0].float(), current[1]
            max_for_output = torch.maximum(max_state, current_key + time_first)
            e1 = torch.exp(max_state - max_for_output)
            e2 = torch.exp(current_key + time_first - max_for_output)
            output = ((e1 * num_state + e2 * current_value) / (e1 * den_state + e2)).to(key.dtype)
            max_for_state = torch.maximum(max_state + decay, current_key)
            e1 = torch.exp(max_state + decay - max_for_state)
            e2 = torch.exp(current_key - max_for_state)
            return [e1 * num_state + e2 * current_value, e1 * den_state + e2, max_for_state], output

        carry, output = _scan(step, [num_state, den_state, max_state], [key, value], dim=1)
        return output, (list(carry) if return_state or state is not None else state)

    return rwkv_linear_attention_cpu


@register_patch("dynamo", _RG_LRU_LOOP)
def _patch_linear_rnn_time_loop_as_scan(original):
    """Pattern: RecurrentGemma's RG-LRU in linear mode, ``for t in range(hidden_states.shape[1])`` carrying the
    recurrent state (models/recurrent_gemma/modeling_recurrent_gemma.py ``_rnn_scan``): the program accepts only
    the traced length (``Eq(seq, 8)``). Run as a scan over the sequence dim (see above); one token (sampling mode)
    goes to the original. No upstream issue found; TODO (transformers): a scan on the export path (its own
    ``# TODO refactor``)."""

    @functools.wraps(original)
    def _rnn_scan(self, hidden_states, recurrent_gate, reset, recurrent_states, acc_dtype=torch.float32):
        if not _symbolic_length(hidden_states) or hidden_states.shape[1] == 1:
            return original(self, hidden_states, recurrent_gate, reset, recurrent_states, acc_dtype)
        recurrent_gate = recurrent_gate * ~reset
        if recurrent_states is None:
            recurrent_states = torch.zeros(hidden_states[:, 0].shape, dtype=acc_dtype, device=hidden_states.device)

        def step(state, current):
            gate, hidden = current
            state = gate.type(acc_dtype) * state.to(gate.device)
            state = state + hidden.type(acc_dtype)
            return state, state.to(hidden_states.dtype, copy=True)  # a step's output may not alias its carry

        recurrent_states, contextualized_states = _scan(step, recurrent_states, [recurrent_gate, hidden_states], dim=1)
        return contextualized_states, recurrent_states

    return _rnn_scan


def _mlstm_sequence_as_scan(step_kernel, query, key, value, igate, fgate, c_initial=None, n_initial=None,
                            m_initial=None, return_last_states=False, eps=1e-6, dtype_state=torch.float32, **kwargs):
    """xLSTM's ``mlstm_recurrent_sequence_native`` with its ``for t in range(sequence_length)`` run as a scan of
    ``step_kernel`` (``mlstm_recurrent_step_native``) over dim 2 of ``(batch, heads, seq, dim)``."""

    batch_size, nh, _, dhqk = query.shape
    if c_initial is not None:
        states = [c_initial.to(dtype=dtype_state), n_initial.to(dtype=dtype_state), m_initial.to(dtype=dtype_state)]
    else:
        states = [torch.zeros((batch_size, nh, dhqk, value.shape[-1]), dtype=dtype_state, device=query.device),
                  torch.zeros((batch_size, nh, dhqk), dtype=dtype_state, device=query.device),
                  torch.zeros((batch_size, nh, 1), dtype=dtype_state, device=query.device)]

    def step(carry, current):
        vecQ_t, vecK_t, vecV_t, vecI_t, vecF_t = current
        vecH, (matC, vecN, vecM) = step_kernel(cstate=carry[0], nstate=carry[1], mstate=carry[2], query=vecQ_t,
                                               key=vecK_t, value=vecV_t, igate=vecI_t[..., None],
                                               fgate=vecF_t[..., None], eps=eps, dtype_state=dtype_state, **kwargs)
        return [matC, vecN, vecM], vecH

    states, matH = _scan(step, states, [query, key, value, igate, fgate], dim=2)
    return (matH, tuple(states)) if return_last_states else matH


@register_patch("dynamo", _MLSTM_BACKEND)
def _patch_mlstm_time_loop_as_scan(original):
    """Pattern: xLSTM's inference backend runs the part of the sequence shorter than a chunk through
    ``mlstm_recurrent_sequence_native``, ``for t in range(sequence_length)`` carrying the cell, normalizer and
    max states (models/xlstm/modeling_xlstm.py): the program accepts only the traced length (``Eq(seq, 8)``). With
    a symbolic length the backend's own ``_inference_fn`` is called with that kernel run as a scan of the same
    step kernel (:func:`_mlstm_sequence_as_scan`; see the scan section above). The chunk decision before it is
    left as it is: traced shorter than ``chunk_size``, the program keeps to lengths below it. No upstream issue
    found; TODO (transformers): a scan on the export path."""

    @functools.wraps(original)
    def forward(self, query, key, value, igate, fgate, c_initial=None, n_initial=None, m_initial=None,
                return_last_states=None, mode=None):
        inference = getattr(self, "_inference_fn", None)
        sequence = inference.keywords.get("mlstm_sequence_kernel") if isinstance(inference, functools.partial) else None
        if ("inference" not in (mode or self.config.mode) or not _symbolic_length(query, 2)
                or not isinstance(sequence, functools.partial)):
            return original(self, query, key, value, igate, fgate, c_initial, n_initial, m_initial,
                            return_last_states, mode)
        scanned = functools.partial(_mlstm_sequence_as_scan, self.step_kernel_fn, **sequence.keywords)
        run = functools.partial(inference.func, *inference.args,
                                **{**inference.keywords, "mlstm_sequence_kernel": scanned})
        return run(query=query, key=key, value=value, igate=igate, fgate=fgate, c_initial=c_initial,
                   n_initial=n_initial, m_initial=m_initial)

    return forward
