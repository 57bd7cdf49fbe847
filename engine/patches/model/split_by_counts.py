"""Per-sample feature lists split by a ``.tolist()`` of counts, rewritten to one ragged output.

Pattern: Idefics2, Idefics3, SmolVLM, ModernVBert and UltraVBert end ``get_image_features`` with::

    [f.reshape(-1, f.shape[-1]) for f in image_features.split(num_real_images_per_batch.tolist())]

one tensor of rows per sample (the rows of that sample's images); GraniteDocling writes the same as
``sizes = (tiles_per_sample * tokens_per_tile).tolist()`` and ``torch.split(rows, sizes)``, Inkling2 as
``rows.split(image_grid_thw.prod(-1).tolist())``. Only functions whose callers concatenate the pieces again are
rewritten (a caller that iterates them per image would see one piece). ``tolist()`` of the per-sample counts is a
Python list as long as the batch, so torch.export pins the batch (``Eq(batch, 2)`` in the split). The comprehension
is the rows of every image in order, grouped per sample; :func:`rewrite_split_by_tolist` recompiles the function
with it replaced by :func:`split_rows_by_counts`, which returns those rows and the per-sample row counts as a
:class:`~engine.stacked_rows.RaggedRows` (to the model's code, ``[all rows]``, which its consumer
``torch.cat(..., dim=0)`` reads as before). The function is compiled from its own source, so only the matched
expression changes; a function without the pattern is returned as it is.

The audio towers' relatives are here too: Qwen-Omni's chunks split by counts (one gather), Qwen3-ASR's and
Qwen3-Omni's attention windows as a Python list repeated by counts (tensor bounds), and Qwen3-Omni's convolution over
a data-sized batch in pieces (one piece).
"""

from __future__ import annotations

import ast
import functools
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from engine.patches.registry import register_patch
from engine.patches.source_rewrite import recompiled
from engine.stacked_rows import RaggedRows

_HELPER = "__split_rows_by_counts__"
_RAGGED = "__ragged_rows__"


def split_rows_by_counts(features: torch.Tensor, counts: torch.Tensor) -> RaggedRows:
    """``[f.reshape(-1, f.shape[-1]) for f in features.split(counts.tolist())]`` as one ragged value: the rows of
    every item (``features`` flattened to its last dim) and each group's row count (``counts`` times the rows of
    one item)."""
    rows_per_item = math.prod(features.shape[1:-1])
    return RaggedRows(features.reshape(-1, features.shape[-1]), counts * rows_per_item)


def _is_minus_one(node: ast.AST) -> bool:
    return (isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub)
            and isinstance(node.operand, ast.Constant) and node.operand.value == 1)


def _rows_of(elt: ast.AST, name: str) -> bool:
    """``elt`` is ``<name>.reshape(-1, <name>.shape[-1])``."""
    return (isinstance(elt, ast.Call) and isinstance(elt.func, ast.Attribute) and elt.func.attr == "reshape"
            and isinstance(elt.func.value, ast.Name) and elt.func.value.id == name and not elt.keywords
            and len(elt.args) == 2 and _is_minus_one(elt.args[0])
            and isinstance(elt.args[1], ast.Subscript) and _is_minus_one(elt.args[1].slice)
            and isinstance(elt.args[1].value, ast.Attribute) and elt.args[1].value.attr == "shape"
            and isinstance(elt.args[1].value.value, ast.Name) and elt.args[1].value.value.id == name)


def _tolist_of(node: ast.AST) -> ast.AST | None:
    """``Y`` where ``node`` is ``Y.tolist()``."""
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "tolist"
            and not node.args and not node.keywords):
        return node.func.value
    return None


_ROW_ARITHMETIC = (ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.Mod)


def _per_row_sizes(node: ast.AST) -> tuple[list[str], ast.AST, ast.AST] | None:
    """``(names, elt, T)`` where ``node`` is ``[elt for a, b in T]`` and ``elt`` is integer arithmetic of ``a``,
    ``b``, constants and attributes (``[(h // r) * (w // r) for h, w in image_sizes]``)."""
    if not (isinstance(node, ast.ListComp) and len(node.generators) == 1):
        return None
    gen = node.generators[0]
    if gen.ifs or gen.is_async or not isinstance(gen.target, ast.Tuple) or not isinstance(gen.iter, ast.Name):
        return None
    names = [getattr(t, "id", None) for t in gen.target.elts]
    allowed = (ast.BinOp, ast.Name, ast.Constant, ast.Attribute, ast.Load, *_ROW_ARITHMETIC)
    if None in names or not all(isinstance(n, allowed) for n in ast.walk(node.elt)):
        return None
    return names, node.elt, gen.iter


def _columns_applied(names: list[str], elt: ast.AST, rows: ast.AST) -> ast.AST:
    """``(lambda a, b: elt)(*torch.as_tensor(T).unbind(-1))``: the per-row arithmetic on whole columns."""
    fn = ast.Lambda(args=ast.arguments(posonlyargs=[], args=[ast.arg(arg=n) for n in names], kwonlyargs=[],
                                       kw_defaults=[], defaults=[]), body=elt)
    columns = ast.parse(f"torch.as_tensor({rows.id}).unbind(-1)", mode="eval").body
    return ast.Call(func=fn, args=[ast.Starred(value=columns, ctx=ast.Load())], keywords=[])


def _helper_call(name: str, args: list[ast.AST], like: ast.AST) -> ast.Call:
    return ast.copy_location(ast.Call(func=ast.Name(id=name, ctx=ast.Load()), args=args, keywords=[]), like)


def _split_sizes(node: ast.AST) -> tuple[ast.AST, ast.AST] | None:
    """``(X, S)`` where ``node`` is ``torch.split(X, S)`` or ``X.split(S)``."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "split"
            and not node.keywords):
        return None
    if isinstance(node.func.value, ast.Name) and node.func.value.id == "torch" and len(node.args) == 2:
        return node.args[0], node.args[1]
    if len(node.args) == 1:
        return node.func.value, node.args[0]
    return None


class _SplitByTolist(ast.NodeTransformer):
    """``[f.reshape(-1, f.shape[-1]) for f in X.split(Y.tolist())]`` -> ``__split_rows_by_counts__(X, Y)``;
    ``X.split(Y.tolist())`` (or ``torch.split``) -> ``__ragged_rows__(X, Y)``; ``S = Y.tolist()``, or ``S = [<integer
    arithmetic of a, b> for a, b in T]``, used only as the sizes of ``torch.split(X, S)`` -> ``S = Y`` (the arithmetic
    on ``T``'s columns) and ``__ragged_rows__(X, S)``; ``list(...)`` of either -> it."""

    def __init__(self):
        self.matched = 0
        self.sizes_names: set[str] = set()

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        assigned = {stmt.targets[0].id for stmt in ast.walk(node) if isinstance(stmt, ast.Assign)
                    and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
                    and (_tolist_of(stmt.value) or _per_row_sizes(stmt.value))}
        as_sizes = {id(split[1]) for call in ast.walk(node) if (split := _split_sizes(call))}
        uses: dict[str, list[ast.Name]] = {}
        for name in ast.walk(node):
            if isinstance(name, ast.Name) and name.id in assigned:
                uses.setdefault(name.id, []).append(name)
        # a name assigned once from .tolist() and read only as split sizes
        self.sizes_names = {n for n in assigned if sum(isinstance(u.ctx, ast.Store) for u in uses[n]) == 1
                            and all(isinstance(u.ctx, ast.Store) or id(u) in as_sizes for u in uses[n])}
        self.generic_visit(node)
        return node

    def visit_Assign(self, node: ast.Assign) -> ast.AST:
        self.generic_visit(node)
        counts = _tolist_of(node.value)
        per_row = _per_row_sizes(node.value)
        if counts is None and per_row is not None:
            counts = _columns_applied(*per_row)
        if counts is not None and isinstance(node.targets[0], ast.Name) and node.targets[0].id in self.sizes_names:
            node.value = counts
        return node

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        if (isinstance(node.func, ast.Name) and node.func.id == "list" and len(node.args) == 1 and not node.keywords
                and isinstance(node.args[0], ast.Call) and getattr(node.args[0].func, "id", None) == _RAGGED):
            return node.args[0]  # list(torch.split(X, S)): the ragged value is the list
        split = _split_sizes(node)
        if split and isinstance(split[1], ast.Name) and split[1].id in self.sizes_names:
            counts = split[1]
        else:
            counts = _tolist_of(split[1]) if split else None  # inline: X.split(Y.tolist())
        if counts is not None:
            self.matched += 1
            return _helper_call(_RAGGED, [split[0], counts], node)
        return node

    def visit_ListComp(self, node: ast.ListComp) -> ast.AST:
        if len(node.generators) == 1:  # matched whole, before its inner split is visited
            gen = node.generators[0]
            split = _split_sizes(gen.iter)
            counts = _tolist_of(split[1]) if split else None
            if (counts is not None and not gen.ifs and not gen.is_async and isinstance(gen.target, ast.Name)
                    and _rows_of(node.elt, gen.target.id)):
                self.matched += 1
                return _helper_call(_HELPER, [split[0], counts], node)
        self.generic_visit(node)
        return node


def rewrite_split_by_tolist(fn: Callable) -> Callable:
    """``fn`` (a function or method, decorators included) recompiled from its source with every per-sample split
    by ``.tolist()`` replaced by :func:`split_rows_by_counts` or a :class:`RaggedRows` of the split tensor and its
    counts; ``fn`` itself where its source has none."""
    return recompiled(fn, _SplitByTolist(), {_HELPER: split_rows_by_counts, _RAGGED: RaggedRows})


def chunk_and_pad_by_gather(input_features: torch.Tensor, feature_lens: torch.Tensor, n_window: int,
                            kwargs: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen-Omni's ``chunk_and_pad_features`` without the split: each audio cut into chunks of ``2 * n_window``
    frames (its last chunk shorter), the chunks right-padded with zeros to the longest, as one gather of the
    ``(features, frames)`` input at ``chunk start + offset`` (masked past each chunk's length)."""
    if kwargs is not None:
        padded_feature = kwargs.pop("padded_feature", None)
        chunk_lengths = kwargs.pop("chunk_lengths", None)
        if padded_feature is not None and chunk_lengths is not None:
            return padded_feature, chunk_lengths
    chunk = n_window * 2
    chunk_num = torch.ceil(feature_lens / chunk).long()
    count = chunk_num.sum().item()
    torch._check(count >= 0)
    chunk_lengths = torch.full((count,), chunk, dtype=torch.long, device=feature_lens.device)
    tail_chunk_index = F.pad(chunk_num, (1, 0), value=-1).cumsum(0)[1:]
    chunk_lengths[tail_chunk_index] = feature_lens % chunk
    chunk_lengths = torch.where(chunk_lengths == 0, chunk, chunk_lengths)
    longest = chunk_lengths.max().item()
    torch._check(longest >= 0)
    torch._check(longest <= chunk)
    offsets = torch.arange(longest, device=feature_lens.device)
    starts = chunk_lengths.cumsum(0) - chunk_lengths
    valid = offsets[None, :] < chunk_lengths[:, None]
    frames = torch.where(valid, starts[:, None] + offsets[None, :], 0)  # (chunks, longest)
    gathered = input_features[:, frames.reshape(-1)].reshape(input_features.shape[0], count, longest)
    padded_feature = torch.where(valid[None], gathered, 0).permute(1, 0, 2)  # (chunks, features, longest)
    return padded_feature, chunk_lengths


@register_patch("dynamo", *(f"transformers.models.{m}.modeling_{m}.chunk_and_pad_features"
                            for m in ("qwen2_5_omni", "qwen3_omni_moe")))
def _patch_audio_chunks_padded_by_gather(original):
    """Pattern: Qwen2.5-Omni / Qwen3-Omni audio towers cut the packed mel frames into chunks with
    ``input_features.T.split(chunk_lengths.tolist())`` and ``pad_sequence``; the chunk count is read from
    ``feature_lens`` values, and ``tolist()`` of a tensor of data-dependent length cannot be traced (torch guards
    ``Eq(u, 0)`` in ``unbind``, https://github.com/pytorch/pytorch/issues/126685). The same padded chunks as one
    gather (:func:`chunk_and_pad_by_gather`, equal to the original for every length, hypothesis-tested). TODO
    (transformers): no upstream issue found for the helper itself.
    """
    return chunk_and_pad_by_gather


def audio_window_bounds(chunk_lengths: torch.Tensor, feature_lens: torch.Tensor, n_window_infer: int, n_window: int,
                        post_cnn_lengths: Callable[..., torch.Tensor]) -> torch.Tensor:
    """Qwen3-ASR's and Qwen3-Omni's ``get_audio_cu_seqlens`` without the Python list: the end of every attention
    window of every audio (windows of ``longest post-CNN chunk * n_window_infer // (2 * n_window)`` frames, each
    audio's last one shorter), after a 0. Each audio gets as many ends as there are chunks, more than its windows:
    the spare ends repeat the audio's end, so the boundaries are the original's with repeats, which split the packed
    frames into the same windows (a zero-length window holds no frame)."""
    lengths = post_cnn_lengths(feature_lens, n_window)  # post-CNN frames per audio
    window = post_cnn_lengths(chunk_lengths, n_window).max() * (n_window_infer // (n_window * 2))
    starts = lengths.cumsum(0) - lengths
    # an audio has at most as many windows as chunks (a window holds at least one whole chunk's frames)
    steps = torch.arange(1, chunk_lengths.shape[0] + 1, device=feature_lens.device)
    ends = starts[:, None] + torch.minimum(steps[None, :] * window, lengths[:, None])
    return F.pad(ends.reshape(-1), (1, 0)).to(torch.int32)


@register_patch("dynamo", *(f"transformers.models.{m}.modeling_{m}.get_audio_cu_seqlens"
                            for m in ("qwen3_asr", "qwen3_omni_moe")))
def _patch_audio_windows_without_repeated_lists(original):
    """Pattern: Qwen3-ASR / Qwen3-Omni audio towers build their attention windows' boundaries as a Python list,
    ``[window] * (length // window)`` per audio with ``window`` from ``.max().item()``: a list repeated by a
    data-dependent count ('Could not extract specialized integer from data-dependent expression'). The same
    boundaries with repeats as tensor ops (:func:`audio_window_bounds`); the towers' attention takes them through
    :mod:`engine.patches.model.packed_attention`, which masks by window. Boundaries the caller passes are kept.
    TODO (transformers): no upstream issue found for the helper."""
    post_cnn_lengths = original.__globals__["_get_feat_extract_output_lengths"]

    def get_audio_cu_seqlens(chunk_lengths, feature_lens, n_window_infer, n_window, kwargs=None):
        if kwargs is not None and (cu_seqlens := kwargs.pop("cu_seqlens", None)) is not None:
            return cu_seqlens
        return audio_window_bounds(chunk_lengths, feature_lens, n_window_infer, n_window, post_cnn_lengths)

    return get_audio_cu_seqlens


class _BatchSplitForMemoryAsOnePiece(ast.NodeTransformer):
    """``for <piece> in <batch>.split(<size>, dim=0):`` -> ``for <piece> in (<batch>,):``."""

    matched = 0

    def visit_For(self, node: ast.For) -> ast.AST:
        self.generic_visit(node)
        call = node.iter
        if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "split"
                and len(call.args) == 1 and [(k.arg, getattr(k.value, "value", None)) for k in call.keywords]
                == [("dim", 0)]):
            self.matched += 1
            node.iter = ast.Tuple(elts=[call.func.value], ctx=ast.Load())
        return node


@register_patch("dynamo", "transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe.Qwen3OmniMoeAudioEncoder.forward")
def _patch_conv_chunks_as_one_batch(original):
    """Pattern: Qwen3-Omni's audio tower runs its convolutions over the padded audio chunks in pieces of
    ``conv_chunksize`` to bound memory, ``for chunk in padded_feature.split(self.conv_chunksize, dim=0)``, and
    concatenates the pieces again. The chunk count is data-dependent (audio lengths), so the number of pieces is too
    ('Could not guard on data-dependent expression Eq(u1, 0)' in ``split``). Each chunk is convolved on its own, so
    the pieces are one batch: the loop runs once over all chunks (:class:`_BatchSplitForMemoryAsOnePiece`, the
    function recompiled from its source). TODO (transformers): no upstream issue found."""
    return recompiled(original, _BatchSplitForMemoryAsOnePiece())


#: models whose ``get_image_features`` split the per-sample ``pooler_output`` by sizes read from a tensor
_SPLIT_BY_TOLIST_MODELS = {"idefics2": "Idefics2Model", "idefics3": "Idefics3Model", "smolvlm": "SmolVLMModel",
                           "modernvbert": "ModernVBertModel", "ultravbert": "UltraVBertModel",
                           "granite_docling": "GraniteDoclingModel", "inkling2": "Inkling2Model",
                           "inkling2_loop": "Inkling2LoopModel", "lfm2_vl": "Lfm2VlModel",
                           "mistral3": "Mistral3Model", "mistral_large4": "MistralLarge4Model",
                           "lighton_ocr": "LightOnOcrModel", "hy_v4_vl": "HYV4VLModel"}


@register_patch("dynamo", *(f"transformers.models.{m}.modeling_{m}.{c}.get_image_features"
                            for m, c in _SPLIT_BY_TOLIST_MODELS.items()))
def _patch_split_by_tolist_as_ragged_rows(original):
    """Pattern: ``[f.reshape(-1, f.shape[-1]) for f in feats.split(counts.tolist())]``, the per-sample
    ``pooler_output`` (GraniteDocling, Inkling2: a ``split`` by a ``.tolist()``; Lfm2-VL: ``list(torch.split(rows,
    sizes))``; LightOnOCR: sizes from a list over ``image_sizes``' rows), which every caller ``torch.cat``s again:
    ``tolist()`` of a per-sample tensor, or a list over its rows, pins the batch
    (``Eq(batch, 2)``). Rewrite: that expression as one ragged value; the model concatenates the same rows, and every
    runner gives back eager's per-sample leaves. No upstream issue found; TODO (transformers): keep
    ``pooler_output`` unsplit, or split by a tensor of counts outside the traced forward."""
    return rewrite_split_by_tolist(original)


#: modules whose forward takes the batch size from ``len()`` of a batch-major tensor (``batch_size =
#: len(source_flatten)`` in the RT-DETR decoders' input preparation; DepthPro's per-scale patch counts
#: ``[len(i) for i in scaled_images]``, which ``split_with_sizes`` then takes)


def repeated_by_durations(features: torch.Tensor, durations: torch.Tensor) -> torch.Tensor:
    """Each row of ``features`` (batch, tokens, dim) repeated ``durations`` (batch, tokens) times along the tokens,
    right-padded with zeros to the longest sample, in float32: the per-sample ``repeat_interleave`` loop of a length
    regulator as one gather (each frame's token is the number of tokens that end at or before it)."""
    totals = durations.sum(1)
    frames = totals.max().item()
    torch._check(frames >= 0)
    ends = durations.cumsum(1)
    positions = torch.arange(frames, device=features.device)
    token = (ends[:, None, :] <= positions[None, :, None]).sum(-1).clamp(max=features.shape[1] - 1)
    gathered = features.gather(1, token[..., None].expand(-1, -1, features.shape[-1]))
    return torch.where((positions[None, :] < totals[:, None])[..., None], gathered, 0).float()


@register_patch("dynamo", "transformers.models.fastspeech2_conformer.modeling_fastspeech2_conformer.length_regulator")
def _patch_length_regulator_without_a_per_sample_loop(original):
    """Pattern: FastSpeech2's length regulator (modeling_fastspeech2_conformer.py:95-126) branches in Python on
    ``duration_labels.sum() == 0`` and repeats each sample's tokens by its durations in a loop over the batch
    (``repeat_interleave``), into a tensor sized by ``.max()`` of the durations. Rewrite: the all-zero fill as the same
    in-place write without the branch, and the repeats as one gather (:func:`repeated_by_durations`); the frame count
    stays data-dependent. TODO (transformers): no upstream issue found."""

    @functools.wraps(original)
    def length_regulator(encoded_embeddings, duration_labels, speaking_speed=1.0):
        if speaking_speed <= 0:
            raise ValueError("`speaking_speed` must be greater than 0.")
        if speaking_speed != 1.0:
            duration_labels = torch.round(duration_labels.float() * speaking_speed).long()
        silent = (duration_labels.sum() == 0) & duration_labels.sum(dim=1, keepdim=True).eq(0)
        duration_labels.copy_(torch.where(silent, 1, duration_labels))  # the original's in-place fill
        return repeated_by_durations(encoded_embeddings, duration_labels)

    return length_regulator
