"""Lessons from a forward error about the config: values the modeling code assumes when the config leaves them out.

:func:`implicit_default_from_error` reads them from the message (a sliding window, a projection width, multimodal
RoPE sections); :func:`config_lesson` from the failing frames (an embedding handed ids the model made itself). Both
return None when the error teaches nothing. The result goes to :func:`sweep.zoo.shrink.shrink_config` as implicit
defaults, which reads :data:`VOCAB_AT_LEAST` and :data:`PROJECTION_WIDTH` as keys.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from sweep.zoo.fields import proportional
from sweep.zoo.frames import INDEX_OUT_OF_RANGE, model_frames

# Qwen-VL style models split the rotary frequencies with `rope_parameters.get("mrope_section", [16, 24, 24])`: a
# default sized for head_dim 128. The forward error names the sections; they are added and rescaled.
_SPLIT_SECTIONS = re.compile(r"split_with_sizes expects split_sizes to sum exactly to (\d+) \(input tensor's size at "
                             r"dimension -1\).*?split_sizes=\[([\d, ]+)\]")


# Models that build a sliding-window mask even when no layer slides (Step3p7) need a window in the config.
_NO_WINDOW = re.compile(r"Could not find a `sliding_window` argument in the config, or it is not set")
IMPLICIT_WINDOW = 4
_SIMILARITY = re.compile(r"mat1 and mat2 shapes cannot be multiplied \((\d+)x(\d+) and (\d+)x\1\)")
#: key of an implicit value: (a vocabulary now, the ids it must hold)
VOCAB_AT_LEAST = "<vocab at least>"
#: key of an implicit value: (projection width now, the width the other embedding has)
PROJECTION_WIDTH = "<projection width>"


def implicit_default_from_error(message: str) -> dict | None:
    """A value the modeling code assumes when the config leaves it out, named by a forward error's message."""
    if _NO_WINDOW.search(message):
        return {"sliding_window": IMPLICIT_WINDOW}
    found = _SIMILARITY.search(message)
    if found and found.group(2) != found.group(3):
        # (B x P) @ (Q x B): two embeddings of the same batch compared (contrastive logits) whose widths differ: one
        # tower's width is derived (ALIGN's EfficientNet: last channels x width coefficient), so the projection
        # width, shrunk on its own, must be the other embedding's width
        return {PROJECTION_WIDTH: (int(found.group(2)), int(found.group(3)))}
    found = _SPLIT_SECTIONS.search(message)
    if not found:
        return None
    total, sections = int(found.group(1)), [int(v) for v in found.group(2).split(",")]
    return {"rope_parameters": {"mrope_section": proportional(sections, total)}}


def config_lesson(exc: BaseException, candidate: dict[str, Any]) -> dict | None:
    """A config value the model's own error asks for (an implicit default for :func:`sweep.zoo.shrink.shrink_config`).

    An embedding handed ids the model produced itself (none of the inputs) past its table: one sub-config decodes
    into a vocabulary another one embeds (CLVP's speech decoder argmax ids into the speech encoder), so the smaller
    vocabulary is raised to hold them.
    """
    if INDEX_OUT_OF_RANGE not in str(exc):
        return None
    inner = model_frames(exc, 1)
    if not inner:
        return None
    weight, ids = inner[0].f_locals.get("weight"), inner[0].f_locals.get("input")
    if not (isinstance(weight, torch.Tensor) and isinstance(ids, torch.Tensor)) or ids.is_floating_point():
        return None
    if not ids.numel() or any(v is ids for v in candidate.values()):
        return None  # the input's own ids: the bounds rule keeps them inside the table
    return {VOCAB_AT_LEAST: (int(weight.shape[0]), int(ids.max()) + 1)}
