"""Shrinking a timm tower that a config names (an ``architecture`` plus its ``model_args``: ``TimmWrapperConfig``,
``Gemma3nVisionConfig``).

FastVLM, PE video, PerceptionLM, EdgeTAM and Gemma 3n take their vision tower from timm by name, and ``model_args`` is passed
to ``timm.create_model``: the zoo's width rules shrink the transformers config around the tower while the tower is
built at its published width (FastVLM's projector then takes 32 features and gets 3072; PE video's ViT asserts its
336-pixel input). timm builds every architecture as ``build_model_with_cfg(ModelClass, variant, pretrained,
**kwargs)``; the zoo records those keyword arguments (the architecture's own depths and widths) and overrides the
ones it knows by name (:data:`_INT_RULES`, :data:`_TUPLE_RULES`): stage depths to one block, widths to the
profile's, heads to two, the image side and patch to the zoo's image, and a decoded ``block_args`` table (the
EfficientNet/MobileNet family, where the architecture is that table) to one block of each type per stage
(:func:`_shrunk_block_args`). Feature channels are read from towers built
on the meta device (no weights), so parent configs that list the tower's channels follow the new ones (the
shrinker's channel maps).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib
import inspect
from typing import Any

from sweep.zoo.profiles import Profile

#: builder keyword -> what it becomes, for int values (``w``: the profile's width)
_INT_RULES = {
    "embed_dim": lambda p: p.width, "depth": lambda p: 1, "num_heads": lambda p: 2, "attn_pool_num_heads": lambda p: 2,
    "stem_width": lambda p: p.width // 2, "base_width": lambda p: p.width,
    "msfa_output_resolution": lambda p: p.image_grid,  # MobileNetV5's tokens per image side, as the zoo's patch grid
}
#: builder keyword -> what each entry of a tuple value becomes (stage depths, stage widths)
_TUPLE_RULES = {
    "layers": lambda p: 1, "depths": lambda p: 1, "depth": lambda p: 1,
    "embed_dims": lambda p: p.width, "embed_dim": lambda p: p.width, "dims": lambda p: p.width,
    "channels": lambda p: p.width, "widths": lambda p: p.width,
}


class _Captured(Exception):
    def __init__(self, model_cls: type, kwargs: dict):
        super().__init__(model_cls.__name__)
        self.model_cls, self.kwargs = model_cls, kwargs


@functools.cache
def builder_kwargs(architecture: str) -> dict[str, Any]:
    """The keyword arguments timm's entry point for ``architecture`` builds its model class with, over the class's
    own defaults (ResNet's stage ``channels`` are a default, not an argument of ``resnet50``)."""
    import timm
    from timm.models import _builder

    def capture(model_cls, variant, pretrained, **kwargs):
        raise _Captured(model_cls, kwargs)

    module = importlib.import_module(timm.models.model_entrypoint(timm.models.get_arch_name(architecture)).__module__)
    with _swapped(module, "build_model_with_cfg", capture), _swapped(_builder, "build_model_with_cfg", capture):
        try:
            timm.create_model(architecture, pretrained=False)
        except _Captured as captured:
            defaults = {name: p.default for name, p in inspect.signature(captured.model_cls).parameters.items()
                        if p.default is not inspect.Parameter.empty}
            return {**defaults, **captured.kwargs}
    return {}


@contextlib.contextmanager
def _swapped(owner, name: str, value):
    original = getattr(owner, name, None)
    if original is None:
        yield
        return
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, original)


def shrunk_model_args(architecture: str, profile: Profile, given: dict[str, Any] | None = None) -> dict[str, Any]:
    """``given`` plus the builder's depth/width/head/image arguments set to the profile's sizes."""
    built = builder_kwargs(architecture)
    args = dict(given or {})
    for key, value in built.items():
        if isinstance(value, bool):
            continue
        if isinstance(value, int) and key in _INT_RULES:
            args[key] = _INT_RULES[key](profile)
        elif isinstance(value, (tuple, list)) and value and all(isinstance(v, int) for v in value) \
                and key in _TUPLE_RULES:
            args[key] = tuple(_TUPLE_RULES[key](profile) for _ in value)
    if _is_block_table(built.get("block_args")):
        args["block_args"] = _shrunk_block_args(built["block_args"], profile)
    if isinstance(built.get("patch_size"), int):  # a ViT: the zoo's image side in its patch grid
        side = profile.conv_image_size
        args.update(img_size=side, patch_size=side // profile.image_grid)
        if "ref_feat_shape" in built:
            args["ref_feat_shape"] = (profile.image_grid, profile.image_grid)
    return args


def _is_block_table(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and bool(value) and all(
        isinstance(stage, (list, tuple)) and stage and all(isinstance(b, dict) and "block_type" in b for b in stage)
        for stage in value)


def _shrunk_block_args(stages: list[list[dict]], profile: Profile) -> list[list[dict]]:
    """Per stage: its first block (which carries the stride), the first block of each other type, and its last
    block when that is of another type than the last one kept (a MobileNetV5 stage ends on a conv block, whose
    channels timm reads as the stage's feature channels); widths to the profile's, attention to two heads."""
    shrunk = []
    for stage in stages:
        kept: list[dict] = []
        for i, block in enumerate(stage):
            kind = block["block_type"]  # (the first block is always of a new type, so kept[-1] exists after it)
            if kind not in {k["block_type"] for k in kept} or (i == len(stage) - 1 and kind != kept[-1]["block_type"]):
                kept.append(dict(block))
        for block in kept:
            block["out_chs"] = profile.width
            if "num_heads" in block:
                block.update(num_heads=2, **{k: profile.width // 2 for k in ("key_dim", "value_dim") if k in block})
        shrunk.append(kept)
    return shrunk


def feature_channels(architecture: str, model_args: dict[str, Any] | None = None) -> list[int]:
    """The channels of the tower's feature maps (``features_only``) or its pooled width, built on the meta device."""
    import timm
    import torch

    model_args = dict(model_args or {})
    key = (architecture, repr(sorted(model_args.items())))
    if key not in _CHANNELS:
        with torch.device("meta"):  # a copy: timm's block builder pops keys from a block_args table's dicts
            model = timm.create_model(architecture, pretrained=False, **copy.deepcopy(model_args))
        info = getattr(model, "feature_info", None)
        if info is not None and hasattr(info, "channels") and model_args.get("features_only"):
            _CHANNELS[key] = list(info.channels())
        else:
            _CHANNELS[key] = [int(model.num_features)]
    return list(_CHANNELS[key])


_CHANNELS: dict[tuple[str, str], list[int]] = {}
