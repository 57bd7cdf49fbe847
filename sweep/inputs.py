"""Sample inputs synthesised from a model's forward signature, its config and its modalities.

:func:`candidate_inputs` returns, in order of preference, the input dicts worth trying: most models have one;
families whose layout the config does not pin down (audio features as ``(B, mels, T)`` or ``(B, T, mels)``,
waveforms as ``(B, T)`` or ``(B, C, T)``) get one candidate per layout, and :mod:`sweep.zoo` keeps the first that
runs. Every dict is deterministic for a seed, has batch size :data:`BATCH`, and holds no labels.

Multimodal placeholders: the text gets ``Hints.image_tokens`` image tokens per row. The first guess comes from the
config; when the model's own check says ``tokens: X, features: Y`` the zoo retries with ``Y / BATCH``.
"""

from __future__ import annotations

import dataclasses
import math
import re
import inspect
from typing import Any

import torch

from sweep import modalities as m
from sweep.errors import failing_statements

BATCH = 2
SEQ = 8

# Forward parameters never synthesised: training targets, caches, and alternatives to the ids we do give.
NEVER = {"labels", "past_key_values", "inputs_embeds", "decoder_inputs_embeds", "use_cache", "output_attentions",
         "output_hidden_states", "return_dict", "cache_position", "head_mask", "decoder_head_mask",
         "cross_attn_head_mask", "position_ids", "decoder_position_ids", "kwargs", "return_loss",
         "encoder_outputs", "logits_to_keep", "num_logits_to_keep", "start_positions", "end_positions",
         "next_sentence_label", "mc_labels", "future_values", "mask_labels", "class_labels", "sentence_order_label",
         "output_router_logits", "interpolate_pos_encoding", "bool_masked_pos", "noise", "mm_encoder_outputs"}
# ... unless the forward requires them or the model's own error names them (masked pre-training heads).
WHEN_NEEDED = {"bool_masked_pos"}


@dataclasses.dataclass
class Hints:
    """What the zoo learned from earlier failed attempts."""

    image_tokens: int | None = None
    audio_tokens: int | None = None
    feature_dim: int | None = None  # last dimension input_features must have
    frames: int | None = None  # audio frames the model asked for (a multiple of its window)
    tiles: int | None = None  # image tiles per sample (any-resolution layouts: (B, tiles, C, H, W))
    text_len: int = SEQ
    samples: int | None = None  # waveform length the model asked for (a multiple of its hop)
    image_side: int | None = None  # image side the model asked for (multi-scale patching)
    image_hw: tuple[int, int] | None = None  # (height, width) per image, when images are stacked before patching
    patch_width: int | None = None  # pixels as flattened patches (num_patches, patch_width), as the model asked
    text_width: int | None = None  # hidden size of the text model (some checks count features as numel)
    shapes: dict[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)  # learned per input
    bounds: dict[str, int] = dataclasses.field(default_factory=dict)  # ids must stay below (an embedding's size)
    extra: tuple[str, ...] = ()  # optional forward parameters the forward turned out to need (see _add_extra)
    tokens: tuple[int, ...] = ()  # special tokens every row must hold ("at least one question token")
    no_cache: bool = False  # the forward failed building its KV cache: run it with use_cache=False


def forward_parameters(model: torch.nn.Module) -> dict[str, inspect.Parameter]:
    params = inspect.signature(model.forward).parameters
    return {k: p for k, p in params.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


def _required(params: dict[str, inspect.Parameter]) -> set[str]:
    return {k for k, p in params.items() if p.default is inspect.Parameter.empty}


def _skipped(name: str, params: dict[str, inspect.Parameter], needed: bool = False) -> bool:
    """Whether a parameter stays unfilled: in NEVER or a training target (``*_labels``), unless it is WHEN_NEEDED
    and required or named as ``needed``. (A required parameter is always filled, by the fallback when no recipe
    makes it.)"""
    never = name in NEVER or name.endswith(("labels", "label"))
    return never and not (name in WHEN_NEEDED and (needed or name in _required(params)))


def candidate_inputs(model: torch.nn.Module, seed: int = 0, hints: Hints | None = None) -> list[dict[str, Any]]:
    """Input dicts to try, best first."""
    hints = hints or Hints()
    config = model.config
    params = forward_parameters(model)
    wanted = list(dict.fromkeys(_wanted(model, params) + [n for n in hints.extra if n in params]))
    gen = torch.Generator().manual_seed(seed)
    ctx = m.Context(config=config, model=model, gen=gen, batch=BATCH, hints=hints, params=params)
    if hints.text_width is None:
        try:  # the width of inputs_embeds
            hints.text_width = int(model.get_input_embeddings().weight.shape[-1])
        except Exception:  # noqa: BLE001 - models without a token embedding
            hints.text_width = None

    base: dict[str, Any] = {}
    for name in sorted(wanted, key=_priority):
        recipe = m.recipe_for(name, ctx)
        if recipe is None:
            continue
        value = recipe(ctx)
        if value is not None:
            base[name] = value
    for name, value in ctx.made.items():  # companions a recipe made on the way (image_grid_thw)
        if name in params and name not in base and name not in NEVER and not (
                "inputs" in base and name in GENERIC_ALTERNATIVES):  # Perceiver: `inputs` or the named input
            base[name] = value
    if "inputs" in base:  # Perceiver: `inputs` replaces the named inputs
        for name in GENERIC_ALTERNATIVES:
            base.pop(name, None)
    if hints.no_cache and "use_cache" in params:
        base["use_cache"] = False
    # required parameters (even those never synthesised otherwise) and optional ones the forward turned out to
    # need (hints.extra), by name, annotation and config
    missing = [n for n in [*_required(params), *hints.extra] if n in params and n not in base]
    fallen = m.fallback(ctx, list(dict.fromkeys(missing))) if missing else {}
    base.update(fallen)
    variants = [base]
    variants += [{**base, **update} for update in m.alternative_layouts(ctx, base)]
    for name, value in fallen.items():  # a sequence of unknown layout: also channels first (conv stacks)
        if value.is_floating_point() and value.dim() == 3 and name not in hints.shapes:
            variants.append({**base, name: value.transpose(1, 2).contiguous()})
    return [_learned(v, hints, gen) for v in variants]


def _learned(candidate: dict[str, Any], hints: Hints, gen: torch.Generator) -> dict[str, Any]:
    """Shapes and index bounds the model's own errors taught, applied to one candidate."""
    out = dict(candidate)
    for name, shape in hints.shapes.items():
        value = out.get(name)
        if isinstance(value, torch.Tensor) and tuple(value.shape) != shape:
            if value.is_floating_point():
                out[name] = torch.randn(*shape, generator=gen)
            elif value.numel() and bool((value == value.flatten()[0]).all()):  # a constant (a mask of ones)
                out[name] = torch.full(shape, int(value.flatten()[0]), dtype=value.dtype)
            else:
                top = max(1, int(value.max()) + 1) if value.numel() else 1
                out[name] = torch.randint(0, hints.bounds.get(name, top), shape, generator=gen)
    for name, bound in hints.bounds.items():
        value = out.get(name)
        if isinstance(value, torch.Tensor) and not value.is_floating_point() and value.numel() and int(
                value.max()) >= bound:
            out[name] = value % bound
    return out


GENERIC_ALTERNATIVES = ("input_ids", "pixel_values", "input_values")

# Inputs whose shapes others depend on come first (the image grid decides how many placeholder ids the text has).
FIRST = ("pixel_values", "hidden_states", "inputs", "input_features", "input_values", "past_values", "input_ids", "decoder_input_ids")


def _priority(name: str) -> int:
    return FIRST.index(name) if name in FIRST else len(FIRST)


def _wanted(model: torch.nn.Module, params: dict[str, inspect.Parameter]) -> list[str]:
    """Forward parameters to fill: the main input, required ones, and those the modalities call for."""
    config = model.config
    main = model.main_input_name
    names = [n for n in (main if isinstance(main, (list, tuple)) else [main]) if n in params]
    names += [n for n in params if n in _required(params)]
    modalities = set(m.model_modalities(model))
    for modality in ("vision", "audio"):  # a tower the config leaves out takes no inputs (text-only defaults)
        if f"{modality}_config" in getattr(type(config), "sub_configs", {}) and getattr(
                config, f"{modality}_config", None) is None:
            modalities.discard("image" if modality == "vision" else "audio")
    if ("text" in modalities and modalities & {"image", "video"} and "input_ids" in params
            and "input_ids" not in names):
        names.append("input_ids")  # image-first models that read text too (Kosmos-2, InstructBLIP-Video)
    for name in params:
        if name in ("mm_token_type_ids", "pixel_attention_mask", "target_sizes", "image_merge_sizes") and (
                "pixel_values" in names):
            names.append(name)
        if name in m.WITH_FEATURES and "input_features" in names:
            names.append(name)
        if name in m.ALWAYS_WITH_IDS and "input_ids" in names:
            names.append(name)
        if name in m.MODALITY_INPUTS.get("image", ()) and "image" in modalities:
            names.append(name)
        if name in m.MODALITY_INPUTS.get("audio", ()) and "audio" in modalities and not any(
                a in names for a in m.MODALITY_INPUTS["audio"]):
            names.append(name)
    if getattr(config, "is_encoder_decoder", False) and "decoder_input_ids" in params:
        names.append("decoder_input_ids")
        if "decoder_attention_mask" in params:
            names.append("decoder_attention_mask")
    if m.needs_time_series(params):
        names += [n for n in m.TIME_SERIES_INPUTS if n in params]
    if all(n in params for n in m.TRAJECTORY_INPUTS):
        names += list(m.TRAJECTORY_INPUTS)
    out = []
    for n in names:
        if n not in out and not _skipped(n, params):
            out.append(n)
    return out


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


def _raised_in_cache(exc: BaseException) -> bool:
    """Whether the error was raised while building or filling the KV cache (transformers' cache_utils)."""
    return any(f.f_code.co_filename.replace("\\", "/").endswith("transformers/cache_utils.py")
               for f, _, _ in failing_statements(exc))


def refine_hints(hints: Hints, exc: BaseException, candidate: dict[str, Any] | None = None,
                 model: torch.nn.Module | None = None) -> bool:
    """Learn from a model's own errors what the inputs must look like; True when a hint changed.

    The first rule that teaches something wins: an error raised building the KV cache turns the cache off; with the
    model (its forward signature), inputs the forward needs after all (:func:`_needed_inputs`) and special tokens
    the message asks for; then checks keyed on the message (:func:`_refine_named`); then the input the failing
    operation was handed (:func:`_refine_by_culprit`).
    """
    candidate = candidate or {}
    if not hints.no_cache and _raised_in_cache(exc):
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


def _statement_modality(exc: BaseException) -> str | None:
    """The modality the innermost failing statement names (``audio_embeds``, ``image_features``, ...)."""
    for frame, _, text in failing_statements(exc):  # innermost first: the innermost statement that names one (a
        if frame.f_code.co_filename.replace("\\", "/").endswith(_WRAPPER_FILES):  # shared check is called per
            continue  # modality)
        found = next((mod for mod in ("audio", "image", "video") if mod in text), None)
        if found:
            return found
    return None


def _refine_named(hints: Hints, exc: BaseException, candidate: dict[str, Any] | None) -> bool:
    """Rules keyed on the message alone (and the audio features' layout)."""
    message = str(exc)
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
        modality = (found.group(1) or _statement_modality(exc) or "image").lower()
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
        per_row = _features_per_row(exc, modality)  # the check counted something else: read the feature tensor
        if per_row and getattr(hints, field) != per_row:
            setattr(hints, field, per_row)
            return True
        return False
    found = _SCATTER.search(message)
    if found and int(found.group(1)) != int(found.group(3)) and int(found.group(1)) % BATCH == 0:
        # `embeds[placeholder_mask] = features`: the features' rows are the placeholders, the statement names the
        # modality (Csm: audio codec frames)
        modality = _statement_modality(exc)
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

_WRAPPER_FILES = ("torch/nn/modules/module.py", "transformers/utils/generic.py", "transformers/utils/output_capturing.py",
                  "transformers/modeling_layers.py", "transformers/utils/deprecation.py")
_INDEX_RANGE = "index out of range in self"
_CONV_CHANNELS = re.compile(r"weight of size \[(\d+), (\d+), [\d, ]+\], expected input\[([\d, ]+)\] to have \d+ "
                            r"channels, but got (\d+) channels")
_SUFFIX = re.compile(r"shape suffix torch.Size\(\[(\d+), (\d+)\]\) does not match expected suffix .{0,60}?\((\d+), "
                     r"\2\)")
_KERNEL = re.compile(r"padded input size per channel: \((\d+)\)\. Kernel size: \((\d+)\)")
_CAT = re.compile(r"Sizes of tensors must match except in dimension \d+\. Expected size (\d+) but got size (\d+) "
                  r"for tensor number \d+ in the list")
_BROADCAST = re.compile(r"size of tensor a \((\d+)\) must match the size of tensor b \((\d+)\) at non-singleton "
                        r"dimension (\d+)")


def _model_frames(exc: BaseException, depth: int) -> list[Any]:
    """The innermost ``depth`` frames that do work (no module-call or decorator wrappers), innermost first."""
    frames = [f for f, _, _ in failing_statements(exc)
              if not f.f_code.co_filename.replace("\\", "/").endswith(_WRAPPER_FILES)]
    return frames[:depth]


def _culprit(exc: BaseException, candidate: dict[str, Any], depth: int = 4, shape: tuple[int, ...] | None = None,
             floating: bool = False):
    """The candidate input the failing operation was handed: the same tensor object in one of the innermost frames
    (with ``shape``: one whose leading dimensions the failing operation reports)."""
    tensors = {id(v): k for k, v in candidate.items() if isinstance(v, torch.Tensor) and (
        v.is_floating_point() or not floating)}
    for frame in _model_frames(exc, depth):
        for value in frame.f_locals.values():
            if isinstance(value, torch.Tensor) and id(value) in tensors and (
                    shape is None or tuple(value.shape[:-1]) == shape[:-1]):  # the time axis may be padded
                return tensors[id(value)], value
    return None, None


def _features_per_row(exc: BaseException, modality: str) -> int | None:
    """Placeholders per row from the ``<modality>_features`` tensor of the failing check: its rows of features."""
    for frame in _model_frames(exc, 4):  # the check may be raised by helpers (torch._check_with)
        for key, value in frame.f_locals.items():
            if (modality in key and ("feature" in key or "embed" in key) and isinstance(value, torch.Tensor)
                    and value.dim() >= 2 and value.numel()):
                rows = value.numel() // value.shape[-1]
                return rows // BATCH if rows % BATCH == 0 else None
    return None


def _set_shape(hints: Hints, name: str, shape: tuple[int, ...]) -> bool:
    if hints.shapes.get(name) == shape:
        return False
    hints.shapes[name] = shape
    return True


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def _refine_by_culprit(hints: Hints, exc: BaseException, candidate: dict[str, Any]) -> bool:
    """Shapes and index ranges learned from the failing operation and the input it was handed."""
    message = str(exc)
    if _INDEX_RANGE in message:  # an embedding got ids past its table: keep that input's ids below its size
        inner = _model_frames(exc, 1)
        weight = inner[0].f_locals.get("weight") if inner else None
        name, value = _culprit(exc, candidate, depth=2)  # the ids the embedding itself was handed
        if name and isinstance(weight, torch.Tensor) and not value.is_floating_point():
            bound = int(weight.shape[0])
            if hints.bounds.get(name) != bound:
                hints.bounds[name] = bound
                return True
        return False
    found = _MATMUL.search(message)
    if found:  # the input's last dimension feeds a Linear; a derived width scales with it
        got, wanted = int(found.group(2)), int(found.group(3))
        name, value = _culprit(exc, candidate)
        if name and value.is_floating_point() and value.dim() >= 2:
            last = value.shape[-1]
            new = wanted if last == got else (last * wanted // got if (last * wanted) % got == 0 else None)
            if new and new != last:
                return _set_shape(hints, name, (*value.shape[:-1], new))
        return False
    found = _CONV_CHANNELS.search(message)
    if found:  # a conv stack: the input's channels (dim 1) are the conv's input channels
        shape = _ints(found.group(3))
        name, value = _culprit(exc, candidate, shape=shape)
        if name is None and len(shape) == 3 and shape[0] == 1:  # a 2-D input the conv took for one unbatched sample
            name, value = _culprit(exc, candidate, shape=shape[1:])
            if name and value.is_floating_point() and value.dim() == 2 and int(found.group(2)) == 1:
                return _set_shape(hints, name, (value.shape[0], 1, max(value.shape[1], m.WAVEFORM)))
            return False
        if name and value.is_floating_point() and value.dim() == 3:
            channels = int(found.group(2))
            steps = max(value.shape[2], m.WAVEFORM) if channels == 1 else value.shape[2]  # one channel: a signal
            return _set_shape(hints, name, (value.shape[0], channels, steps))
        return False
    found = _NORM_SHAPE.search(message) or _SUFFIX.search(message)
    if found:  # a norm over the input's last dimension (or a derived one that scales with it)
        name, value = _culprit(exc, candidate)
        if name and value.is_floating_point() and value.dim() >= 2:
            if found.re is _NORM_SHAPE:
                new = int(found.group(1))
                got = _ints(found.group(2))[-1]
            else:
                got, new = int(found.group(1)), int(found.group(3))
            last = value.shape[-1]
            if value.dim() == 2 and last == got == m.WAVEFORM:  # a waveform where hidden states are due (a bare
                return _set_shape(hints, name, (value.shape[0], m.SEQ, new))  # model without its prenets)
            new = new if last == got else (last * new // got if (last * new) % got == 0 else None)
            if new and new != last:
                return _set_shape(hints, name, (*value.shape[:-1], new))
        return False
    found = _KERNEL.search(message)
    if found:  # a strided conv stack ran out of time steps: a longer input (the outermost float input handed on)
        size, kernel = int(found.group(1)), int(found.group(2))
        name, value = _culprit(exc, candidate, depth=64, floating=True)
        floats = [(k, v) for k, v in candidate.items() if isinstance(v, torch.Tensor) and v.is_floating_point()]
        if name is None and len(floats) == 1:  # reassigned on the way: the only float input
            name, value = floats[0]
        if name and value.dim() >= 2 and size < kernel:
            return _set_shape(hints, name, (*value.shape[:-1], value.shape[-1] * 4 * -(-kernel // size)))
        return False
    found = _CAT.search(message)
    if found:  # two branches concatenated along their features give different frame counts: inputs with the
        # first branch's frames take the other's (Xcodec2: mel frames vs the waveform's frames after the hop)
        first, other = int(found.group(1)), int(found.group(2))
        changed = False
        for name, value in candidate.items():
            if isinstance(value, torch.Tensor) and first in value.shape[1:] and first != value.shape[0]:
                axis = list(value.shape[1:]).index(first) + 1
                changed |= _set_shape(hints, name, (*value.shape[:axis], other, *value.shape[axis + 1:]))
        return changed
    found = _BROADCAST.search(message)
    if found:  # ids plus a per-codebook offset table: the ids need a trailing codebook axis
        a, b = int(found.group(1)), int(found.group(2))
        name, value = _culprit(exc, candidate)
        if name and not value.is_floating_point() and value.dim() == 2 and value.shape[-1] == a and a != b:
            return _set_shape(hints, name, (*value.shape, b))
        return False
    return False


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
           and not _skipped(p, params, needed=True) and m.can_make(p, params[p])]
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
    ctx = m.Context(config=model.config, model=model, gen=torch.Generator(), batch=BATCH, hints=hints, params={})
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


def config_lesson(exc: BaseException, candidate: dict[str, Any]) -> dict | None:
    """A config value the model's own error asks for (an implicit default for :func:`sweep.shrink.shrink_config`).

    An embedding handed ids the model produced itself (none of the inputs) past its table: one sub-config decodes
    into a vocabulary another one embeds (CLVP's speech decoder argmax ids into the speech encoder), so the smaller
    vocabulary is raised to hold them.
    """
    if _INDEX_RANGE not in str(exc):
        return None
    inner = _model_frames(exc, 1)
    if not inner:
        return None
    weight, ids = inner[0].f_locals.get("weight"), inner[0].f_locals.get("input")
    if not (isinstance(weight, torch.Tensor) and isinstance(ids, torch.Tensor)) or ids.is_floating_point():
        return None
    if not ids.numel() or any(v is ids for v in candidate.values()):
        return None  # the input's own ids: the bounds rule keeps them inside the table
    from sweep.shrink import VOCAB_AT_LEAST

    return {VOCAB_AT_LEAST: (int(weight.shape[0]), int(ids.max()) + 1)}
