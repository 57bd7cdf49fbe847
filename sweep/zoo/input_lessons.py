"""Lessons from a forward error about the inputs: the :class:`~sweep.zoo.context.Hints` the next candidates follow.

:func:`refine_hints` updates the hints from the first rule that teaches something: a KV cache the config cannot
build, an input the forward needs after all, a special token the message asks for, a model's own consistency check
(placeholder counts, frame multiples, image sizes), and the shape of the input the failing operation was handed.
False when nothing is learned; the caller then reports the error as it is. One lesson comes from a forward that ran:
:func:`placeholders_expanded_inside` (a model that still merges one placeholder per clip into its features itself,
the layout its processor no longer writes).
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import re
from typing import Any

import torch

from sweep.zoo.context import BATCH, SEQ, WAVEFORM, Context, Hints, forward_parameters, skipped
from sweep.zoo.fallback import can_make
from sweep.zoo.frames import (INDEX_OUT_OF_RANGE, culprit, failing_statements, features_per_row, model_frames,
                              raised_in_cache, statement_modality)

# -- forward, about the inputs: hints for the next round of candidates ---------------------------------------

# The models' own consistency checks, and what each one teaches.
_PLACEHOLDERS = re.compile(r"(image|audio|video)?\s*(?:features|embeddings)? and (?:\w+ )?tokens do not match\W*"
                           r"tokens:?\s*(\d+)\D{1,40}?features:?\s*(\d+)", re.IGNORECASE | re.DOTALL)
_MULTIPLE = re.compile(r"feature_length` to be a multiple of .{0,40}?\((\d+)\), but got (\d+)")
_PATCH_WIDTH = re.compile(r"pixel_values has patch width \d+ but the model expects (\d+)")
_VECTORS_FOR = re.compile(r"Got (\d+) feature vectors for \d+ placeholder tokens")
_PATCHES_FOR = re.compile(r"Got (\d+) image patches for \d+ image placeholder tokens")
_TOO_SMALL = re.compile(r"too small to be scaled with scaled_images_ratios=\[([\d.]+)[^\]]*\] when patch_size=(\d+)")
_POOL_TOO_SMALL = re.compile(r"Given input size: \([\dx]+\)\. Calculated output size: \(([\dx]+)\)\. Output size is "
                             r"too small")
_SAMPLES = re.compile(r"input_values`? length (\d+) is not a multiple of (\d+)")
_TILES = re.compile(r"split_with_sizes expects split_sizes to sum exactly to \d+ \(input tensor's size at dimension "
                    r"0\), but got split_sizes=\[(\d+)")
_NORM_SHAPE = re.compile(r"normalized_shape=\[(\d+)\], expected input with shape \[\*, \1\], but got input of "
                         r"size\s*\[([\d, ]+)\]")


def _round_up(got: int, multiple: int) -> int:
    return max(multiple, (got + multiple - 1) // multiple * multiple)


#: (check's message, hint it sets, the hint's value from the match), tried in order
_LEARNED_SIZES = (
    (_MULTIPLE, "frames", lambda m: _round_up(int(m.group(2)), int(m.group(1)))),
    (_PATCH_WIDTH, "patch_width", lambda m: int(m.group(1))),
    (_PATCHES_FOR, "image_tokens", lambda m: max(1, int(m.group(1)) // BATCH)),
    (_VECTORS_FOR, "image_tokens", lambda m: max(1, int(m.group(1)) // BATCH)),
    (_TOO_SMALL, "image_side", lambda m: int(math.ceil(int(m.group(2)) / float(m.group(1))))),
    (_SAMPLES, "samples", lambda m: _round_up(int(m.group(1)), int(m.group(2)))),
    (_TILES, "tiles", lambda m: int(m.group(1))),
    # a norm over the features of a (B, T, F) input names F
    (_NORM_SHAPE, "feature_dim", lambda m: int(m.group(1)) if len(_ints(m.group(2))) == 3 else None),
)


_SIZE_AT_LAST = re.compile(r"size of tensor a \((\d+)\) must match the size of tensor b \((\d+)\) at "
                           r"non-singleton dimension 2")
_MATMUL = re.compile(r"mat1 and mat2 shapes cannot be multiplied \((\d+)x(\d+) and (\d+)x(\d+)\)")


def refine_hints(hints: Hints, exc: BaseException, candidate: dict[str, Any] | None = None,
                 model: torch.nn.Module | None = None) -> bool:
    """Learn from a model's own errors what the inputs must look like; True when a hint changed.

    The first rule that teaches something wins: an error raised building the KV cache turns the cache off; with the
    model (its forward signature), inputs the forward needs after all (:func:`_needed_inputs`) and special tokens
    the message asks for; then checks keyed on the message (:func:`_refine_named`); then the input the failing
    operation was handed (:func:`_refine_by_culprit`).
    """
    candidate = candidate or {}
    if not hints.no_cache and raised_in_cache(exc):
        hints.no_cache = True  # a config the cache cannot read (BLT's layer count lives in its sub-configs)
        return True
    if model is not None and (_needed_inputs(hints, exc, candidate, forward_parameters(model))
                              or _named_tokens(hints, str(exc), model)):
        return True
    if _refine_named(hints, exc, candidate):
        return True
    return _refine_by_culprit(hints, exc, candidate)


_SCATTER = re.compile(r"shape mismatch: value tensor of shape \[(\d+), (?:\d+, )*(\d+)\] cannot be broadcast to "
                      r"indexing result of shape \[(\d+), \2\]")


_BOOL_MASK = re.compile(r"masked_fill_? only supports boolean masks")
#: integer masks models read as counts and convert themselves, which stay integers
_COUNTED_MASKS = ("attention_mask", "decoder_attention_mask")


def _boolean_masks(hints: Hints, candidate: dict[str, Any]) -> bool:
    """A mask the model fills with (or negates first, ``~mask`` of an int is not a mask) must be boolean: every
    0/1 integer ``*mask*`` input but the text attention masks is given as one (Gemma 3n's input_features_mask)."""
    names = tuple(k for k, v in candidate.items() if "mask" in k and k not in _COUNTED_MASKS
                  and isinstance(v, torch.Tensor) and not v.is_floating_point() and v.dtype != torch.bool
                  and bool(((v == 0) | (v == 1)).all()) and k not in hints.bool_masks)
    hints.bool_masks += names
    return bool(names)


def _refine_named(hints: Hints, exc: BaseException, candidate: dict[str, Any] | None) -> bool:
    """Rules keyed on the message alone (and the audio features' layout)."""
    message = str(exc)
    if _BOOL_MASK.search(message):
        return _boolean_masks(hints, candidate or {})
    found = _MATMUL.search(message)
    features = (candidate or {}).get("input_features")
    size = _SIZE_AT_LAST.search(message)
    if isinstance(features, torch.Tensor) and features.dim() == 3 and (found or size):
        got, wanted = (int(found.group(2)), int(found.group(3))) if found else (int(size.group(1)),
                                                                                 int(size.group(2)))
        # the audio features' last dimension feeds the first Linear (stacked frames): (B, T, wanted)
        if features.shape[-1] == got and got != wanted and hints.feature_dim != wanted:
            hints.feature_dim = wanted
            return True
    pixels = (candidate or {}).get("pixel_values")
    if found and isinstance(pixels, torch.Tensor) and pixels.dim() == 4 and pixels.shape[-1] == int(found.group(2)):
        # image rows fed straight to a Linear (Fuyu): the pixels are flattened patches of the Linear's width
        wanted = int(found.group(3))
        if wanted != pixels.shape[-1] and hints.patch_width != wanted:
            hints.patch_width = wanted
            return True
    found = _PLACEHOLDERS.search(message)
    if found:
        modality = (found.group(1) or statement_modality(exc) or "image").lower()
        tokens, features = int(found.group(2)), int(found.group(3))
        per_row = max(1, features // BATCH)
        field = "audio_tokens" if modality == "audio" else "image_tokens"
        width = hints.text_width
        if (getattr(hints, field) == per_row and tokens == features and width
                and features % (width * BATCH) == 0):
            # the count matched and the check still failed: "features" was the feature tensor's numel
            per_row = features // (width * BATCH)
        if getattr(hints, field) != per_row:
            setattr(hints, field, per_row)
            return True
        per_row = features_per_row(exc, modality)  # the check counted something else: read the feature tensor
        if per_row and getattr(hints, field) != per_row:
            setattr(hints, field, per_row)
            return True
        return False
    found = _SCATTER.search(message)
    if found and int(found.group(1)) != int(found.group(3)) and int(found.group(1)) % BATCH == 0:
        # `embeds[placeholder_mask] = features`: the features' rows are the placeholders, the statement names the
        # modality (Csm: audio codec frames)
        modality = statement_modality(exc)
        field = "audio_tokens" if modality == "audio" else "image_tokens"
        per_row = int(found.group(1)) // BATCH
        if modality and getattr(hints, field) != per_row:
            setattr(hints, field, per_row)
            return True
        return False
    found = _POOL_TOO_SMALL.search(message)
    pixels = (candidate or {}).get("pixel_values")
    if found and "0" in found.group(1).split("x")[1:] and isinstance(pixels, torch.Tensor) and pixels.dim() >= 4:
        # a pooling or conv window larger than what is left of the image after the stem: a larger image
        hints.image_side = 2 * max(pixels.shape[-2:])
        return True
    if _stacked_images(hints, message, candidate or {}):
        return True
    for pattern, field, value in _LEARNED_SIZES:
        found = pattern.search(message)
        learned = value(found) if found else None
        if learned is not None and getattr(hints, field) != learned:
            setattr(hints, field, learned)
            return True
    return False


# -- learning from the failing frames: which input the failing operation was handed --------------------------

_CONV_CHANNELS = re.compile(r"weight of size \[(\d+), (\d+), [\d, ]+\], expected input\[([\d, ]+)\] to have \d+ "
                            r"channels, but got (\d+) channels")
_SUFFIX = re.compile(r"shape suffix torch.Size\(\[(\d+), (\d+)\]\) does not match expected suffix .{0,60}?\((\d+), "
                     r"\2\)")
_KERNEL = re.compile(r"padded input size per channel: \((\d+)\)\. Kernel size: \((\d+)\)")
_CAT = re.compile(r"Sizes of tensors must match except in dimension \d+\. Expected size (\d+) but got size (\d+) "
                  r"for tensor number \d+ in the list")
_BROADCAST = re.compile(r"size of tensor a \((\d+)\) must match the size of tensor b \((\d+)\) at non-singleton "
                        r"dimension (\d+)")


def _set_shape(hints: Hints, name: str, shape: tuple[int, ...]) -> bool:
    if hints.shapes.get(name) == shape:
        return False
    hints.shapes[name] = shape
    return True


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def _refine_by_culprit(hints: Hints, exc: BaseException, candidate: dict[str, Any]) -> bool:
    """Shapes and index ranges learned from the failing operation and the input it was handed: the first rule of
    :data:`_CULPRIT_RULES` whose message matches decides."""
    message = str(exc)
    if INDEX_OUT_OF_RANGE in message:
        return _bound_ids(hints, exc, candidate)
    for pattern, rule in _CULPRIT_RULES:
        found = pattern.search(message)
        if found:
            return rule(hints, exc, candidate, found)
    return False


def _bound_ids(hints: Hints, exc: BaseException, candidate: dict[str, Any]) -> bool:
    """An embedding got ids past its table: keep that input's ids below its size."""
    inner = model_frames(exc, 1)
    weight = inner[0].f_locals.get("weight") if inner else None
    name, value = culprit(exc, candidate, depth=2)  # the ids the embedding itself was handed
    if name and isinstance(weight, torch.Tensor) and not value.is_floating_point():
        bound = int(weight.shape[0])
        if hints.bounds.get(name) != bound:
            hints.bounds[name] = bound
            return True
    return False


def _linear_width(hints: Hints, exc: BaseException, candidate: dict[str, Any], found: re.Match) -> bool:
    """The input's last dimension feeds a Linear; a derived width scales with it."""
    got, wanted = int(found.group(2)), int(found.group(3))
    name, value = culprit(exc, candidate)
    if name and value.is_floating_point() and value.dim() >= 2:
        last = value.shape[-1]
        new = wanted if last == got else (last * wanted // got if (last * wanted) % got == 0 else None)
        if new and new != last:
            return _set_shape(hints, name, (*value.shape[:-1], new))
    return False


def _conv_channels(hints: Hints, exc: BaseException, candidate: dict[str, Any], found: re.Match) -> bool:
    """A conv stack: the input's channels (dim 1) are the conv's input channels (one channel: a signal)."""
    shape = _ints(found.group(3))
    name, value = culprit(exc, candidate, shape=shape)
    if name is None and len(shape) == 3 and shape[0] == 1:  # a 2-D input the conv took for one unbatched sample
        name, value = culprit(exc, candidate, shape=shape[1:])
        if name and value.is_floating_point() and value.dim() == 2 and int(found.group(2)) == 1:
            return _set_shape(hints, name, (value.shape[0], 1, max(value.shape[1], WAVEFORM)))
        return False
    if name and value.is_floating_point() and value.dim() == 3:
        channels = int(found.group(2))
        steps = max(value.shape[2], WAVEFORM) if channels == 1 else value.shape[2]  # one channel: a signal
        return _set_shape(hints, name, (value.shape[0], channels, steps))
    return False


def _norm_width(hints: Hints, exc: BaseException, candidate: dict[str, Any], found: re.Match) -> bool:
    """A norm over the input's last dimension (or a derived one that scales with it)."""
    name, value = culprit(exc, candidate)
    if name and value.is_floating_point() and value.dim() >= 2:
        if found.re is _NORM_SHAPE:
            new = int(found.group(1))
            got = _ints(found.group(2))[-1]
        else:
            got, new = int(found.group(1)), int(found.group(3))
        last = value.shape[-1]
        if value.dim() == 2 and last == got == WAVEFORM:  # a waveform where hidden states are due (a bare
            return _set_shape(hints, name, (value.shape[0], SEQ, new))  # model without its prenets)
        new = new if last == got else (last * new // got if (last * new) % got == 0 else None)
        if new and new != last:
            return _set_shape(hints, name, (*value.shape[:-1], new))
    return False


def _longer_input(hints: Hints, exc: BaseException, candidate: dict[str, Any], found: re.Match) -> bool:
    """A strided conv stack ran out of time steps: a longer input (the outermost float input handed on)."""
    size, kernel = int(found.group(1)), int(found.group(2))
    name, value = culprit(exc, candidate, depth=64, floating=True)
    floats = [(k, v) for k, v in candidate.items() if isinstance(v, torch.Tensor) and v.is_floating_point()]
    if name is None and len(floats) == 1:  # reassigned on the way: the only float input
        name, value = floats[0]
    if name and value.dim() >= 2 and size < kernel:
        return _set_shape(hints, name, (*value.shape[:-1], value.shape[-1] * 4 * -(-kernel // size)))
    return False


def _matching_frames(hints: Hints, exc: BaseException, candidate: dict[str, Any], found: re.Match) -> bool:
    """Two branches concatenated along their features give different frame counts: inputs with the first branch's
    frames take the other's (Xcodec2: mel frames vs the waveform's frames after the hop)."""
    first, other = int(found.group(1)), int(found.group(2))
    changed = False
    for name, value in candidate.items():
        if isinstance(value, torch.Tensor) and first in value.shape[1:] and first != value.shape[0]:
            axis = list(value.shape[1:]).index(first) + 1
            changed |= _set_shape(hints, name, (*value.shape[:axis], other, *value.shape[axis + 1:]))
    return changed


def _codebook_axis(hints: Hints, exc: BaseException, candidate: dict[str, Any], found: re.Match) -> bool:
    """Ids plus a per-codebook offset table: the ids need a trailing codebook axis."""
    a, b = int(found.group(1)), int(found.group(2))
    name, value = culprit(exc, candidate)
    if name and not value.is_floating_point() and value.dim() == 2 and value.shape[-1] == a and a != b:
        return _set_shape(hints, name, (*value.shape, b))
    return False


#: (the failing operation's message, the rule that reads its culprit), tried in order after ids out of range
_CULPRIT_RULES = (
    (_MATMUL, _linear_width),
    (_CONV_CHANNELS, _conv_channels),
    (_NORM_SHAPE, _norm_width),
    (_SUFFIX, _norm_width),
    (_KERNEL, _longer_input),
    (_CAT, _matching_frames),
    (_BROADCAST, _codebook_axis),
)


# -- inputs the forward needs after all ----------------------------------------------------------------------

_WORD = re.compile(r"[A-Za-z_]\w*")


def _needed_inputs(hints: Hints, exc: BaseException, candidate: dict[str, Any],
                   params: dict[str, inspect.Parameter]) -> bool:
    """A forward parameter the candidate left out and the forward needs after all, added to ``hints.extra``:

    * one the error message names ("Both pixel_values and high_res_pixel_values should be specified",
      "set `global_attention_mask` manually", "`codebook_pixel_value` are required");
    * one that is None where the failing statement reads it, innermost frame first (a ``NoneType`` error on
      ``padding_mask.sum()``, ``self.mel_conv(input_features)``, ``self._resize_to_2d(bool_masked_pos)``).
    """
    message = str(exc)
    words = set(_WORD.findall(message))
    named = {p for p in params if "_" in p and (p in words or p[:-1] in words)}  # plural or singular
    if _add_extra(hints, named, candidate, params):
        return True
    if "None" not in message:
        return False
    for frame, _, statement in failing_statements(exc):
        read = set(_WORD.findall(statement))
        local = frame.f_locals
        if _add_extra(hints, {p for p in params if p in read and local.get(p) is None}, candidate, params):
            return True
    return False


def _add_extra(hints: Hints, names: set[str], candidate: dict[str, Any], params: dict[str, inspect.Parameter]) -> bool:
    """Adds the parameters among ``names`` the candidate lacks and a recipe or the fallback can make (targets, caches
    and alternatives to inputs we give stay out, except :data:`WHEN_NEEDED`)."""
    new = [p for p in params if p in names and p not in candidate and p not in hints.extra
           and not skipped(p, params, needed=True) and can_make(p, params[p])]
    if new:
        hints.extra = (*hints.extra, *new)
    return bool(new)


# "All samples in the batch must have at least one question token": one `question_token_id` per row.
_TOKEN_NEEDED = re.compile(r"at least one (\w+) token|(\w+) tokens? (?:is|are) (?:required|missing)", re.IGNORECASE)


def _named_tokens(hints: Hints, message: str, model: torch.nn.Module) -> bool:
    found = _TOKEN_NEEDED.search(message)
    if not found:
        return False
    word = (found.group(1) or found.group(2)).lower()
    ctx = Context(config=model.config, model=model, gen=torch.Generator(), batch=BATCH, hints=hints, params={})
    token = ctx.find(f"{word}_token_id", f"{word}_token_index")
    if not isinstance(token, int) or isinstance(token, bool) or token in hints.tokens:
        return False
    hints.tokens = (*hints.tokens, token)
    return True


# SegGPT stacks prompt and image along the height before patching: "Input image size (128*64) doesn't match model
# (64*64)" scales each image's sides by what the model wants over what it got.
_INPUT_SIZE = re.compile(r"Input image size \((\d+)\*(\d+)\) doesn't match model \((\d+)\*(\d+)\)")


def _stacked_images(hints: Hints, message: str, candidate: dict[str, Any]) -> bool:
    found = _INPUT_SIZE.search(message)
    pixels = candidate.get("pixel_values")
    if not found or not isinstance(pixels, torch.Tensor) or pixels.dim() < 3:
        return False
    got_h, got_w, want_h, want_w = (int(v) for v in found.groups())
    h, w = pixels.shape[-2:]
    size = (h * want_h // got_h, w * want_w // got_w)
    if min(size) < 1 or size == (h, w) or hints.image_hw == size:
        return False
    hints.image_hw = size
    return True


# -- forward that ran, about the inputs -------------------------------------------------------------------------


def placeholders_expanded_inside(model: torch.nn.Module, candidate: dict[str, Any], output: Any,
                                 hints: Hints) -> Hints | None:
    """The hints for processor-expanded audio placeholders, when the forward expanded them itself.

    A model with a legacy merge (Qwen2-Audio's ``_merge_input_ids_with_audio_features``, taken when no two audio
    placeholders are adjacent) takes one placeholder per clip and returns a sequence longer than ``input_ids``. Its
    processor writes one placeholder per feature, and under torch.export the model takes that path only
    (``is_torchdynamo_compiling()``), so a legacy-layout sample compares two different computations. ``extra`` more rows
    per sample than placeholders: the hints ask for ``placeholders + extra`` per row. None when the output is not
    longer, the rows differ, or the hints already set a count."""
    ids = candidate.get("input_ids")
    # the id the inputs' recipe writes the placeholders with (sweep.zoo.modalities.input_ids)
    ctx = Context(config=model.config, model=model, gen=torch.Generator(), batch=BATCH, hints=hints, params={})
    audio_id = ctx.find("audio_token_id", "audio_token_index")
    hidden = next((getattr(output, k) for k in ("last_hidden_state", "logits")
                   if isinstance(getattr(output, k, None), torch.Tensor)), None)
    if (hints.audio_tokens or not isinstance(ids, torch.Tensor) or ids.ndim != 2 or not isinstance(audio_id, int)
            or hidden is None):
        return None
    per_row = (ids == audio_id).sum(-1)
    extra = hidden.shape[1] - ids.shape[1] if hidden.ndim >= 2 and hidden.shape[0] == ids.shape[0] else 0
    if extra <= 0 or not bool((per_row == per_row[0]).all()) or int(per_row[0]) == 0:
        return None
    return dataclasses.replace(hints, audio_tokens=int(per_row[0]) + extra)
