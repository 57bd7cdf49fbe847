"""What a failing traceback holds: each frame's failing statement, the frames that do work, the input handed on.

The lessons (:mod:`sweep.zoo.init_lessons`, :mod:`sweep.zoo.implicit_default_lessons`,
:mod:`sweep.zoo.input_lessons`) read these to tell which config field the failing code read, which candidate input
the failing operation was handed, and which modality a shared check was about.
"""

from __future__ import annotations

import linecache
from types import FrameType
from typing import Any

import torch

from sweep.zoo.context import BATCH

# module-call and decorator wrappers: frames there do no work of the model's own
WRAPPER_FILES = ("torch/nn/modules/module.py", "transformers/utils/generic.py",
                 "transformers/utils/output_capturing.py", "transformers/modeling_layers.py",
                 "transformers/utils/deprecation.py")
#: the message of an embedding handed ids past its table (its innermost frame holds the weight and the ids)
INDEX_OUT_OF_RANGE = "index out of range in self"


def failing_statements(exc: BaseException) -> list[tuple[FrameType, int, str]]:
    """Each frame of ``exc``'s traceback, innermost first, with the first line and the source of the statement that
    failed there (every line of a multi-line statement)."""
    out = []
    tb = exc.__traceback__
    while tb is not None:
        positions = next((p for i, p in enumerate(tb.tb_frame.f_code.co_positions()) if 2 * i == tb.tb_lasti), None)
        first, last = (positions[0], positions[1]) if positions and positions[0] else (tb.tb_lineno, tb.tb_lineno)
        first, last = first or tb.tb_lineno, last or first or tb.tb_lineno
        filename = tb.tb_frame.f_code.co_filename
        out.append((tb.tb_frame, first, "".join(linecache.getline(filename, n) for n in range(first, last + 1))))
        tb = tb.tb_next
    return out[::-1]


def model_frames(exc: BaseException, depth: int) -> list[Any]:
    """The innermost ``depth`` frames that do work (no module-call or decorator wrappers), innermost first."""
    frames = [f for f, _, _ in failing_statements(exc)
              if not f.f_code.co_filename.replace("\\", "/").endswith(WRAPPER_FILES)]
    return frames[:depth]


def culprit(exc: BaseException, candidate: dict[str, Any], depth: int = 4, shape: tuple[int, ...] | None = None,
             floating: bool = False):
    """The candidate input the failing operation was handed: the same tensor object in one of the innermost frames
    (with ``shape``: one whose leading dimensions the failing operation reports)."""
    tensors = {id(v): k for k, v in candidate.items() if isinstance(v, torch.Tensor) and (
        v.is_floating_point() or not floating)}
    for frame in model_frames(exc, depth):
        for value in frame.f_locals.values():
            if isinstance(value, torch.Tensor) and id(value) in tensors and (
                    shape is None or tuple(value.shape[:-1]) == shape[:-1]):  # the time axis may be padded
                return tensors[id(value)], value
    return None, None


def features_per_row(exc: BaseException, modality: str) -> int | None:
    """Placeholders per row from the ``<modality>_features`` tensor of the failing check: its rows of features."""
    for frame in model_frames(exc, 4):  # the check may be raised by helpers (torch._check_with)
        for key, value in frame.f_locals.items():
            if (modality in key and ("feature" in key or "embed" in key) and isinstance(value, torch.Tensor)
                    and value.dim() >= 2 and value.numel()):
                rows = value.numel() // value.shape[-1]
                return rows // BATCH if rows % BATCH == 0 else None
    return None


def raised_in_cache(exc: BaseException) -> bool:
    """Whether the error was raised while building or filling the KV cache (transformers' cache_utils)."""
    return any(f.f_code.co_filename.replace("\\", "/").endswith("transformers/cache_utils.py")
               for f, _, _ in failing_statements(exc))


def statement_modality(exc: BaseException) -> str | None:
    """The modality the innermost failing statement names (``audio_embeds``, ``image_features``, ...)."""
    for frame, _, text in failing_statements(exc):  # innermost first: the innermost statement that names one (a
        if frame.f_code.co_filename.replace("\\", "/").endswith(WRAPPER_FILES):  # shared check is called per
            continue  # modality)
        found = next((mod for mod in ("audio", "image", "video") if mod in text), None)
        if found:
            return found
    return None
