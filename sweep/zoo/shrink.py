"""The generic config shrinker: a model type's default config, made tiny while staying self-consistent.

:func:`shrink_config` runs the pipeline; the per-node rules live in :mod:`sweep.zoo.shrink_rules`, the field
vocabularies in :mod:`sweep.zoo.fields`, the ladder of target sizes in :mod:`sweep.zoo.profiles`, and what a
validation or forward error teaches in :mod:`sweep.zoo.validation_lessons` and
:mod:`sweep.zoo.implicit_default_lessons`. This module holds the steps that look at the whole tree (token ids,
image geometry shared by sub-configs, widths one config sums from its towers).
"""

from __future__ import annotations

import logging
import math

from sweep.zoo import implicit_default_lessons, timm_towers, validation_lessons
from sweep.zoo.config_tree import Node, build_config, raw_tree
from sweep.zoo.fields import (CHANNEL_LISTS, LAYER_COUNTS, LAYER_INDEX_FIELDS, PRIMARY_WIDTHS, int_list, is_int,
                              is_token_field, is_vocab, is_width_name, primary_width, tree_widths)
from sweep.zoo.profiles import PROFILES, Profile
from sweep.zoo.shrink_rules import shrink_node

logger = logging.getLogger(__name__)

MAX_REPAIRS = 6  # config validation errors repaired (validation_lessons.repair_config) before one is the config_error


def shrink_config(config_class: type, profile: Profile = PROFILES[0], overrides: dict | None = None,
                  base=None, implicit_defaults: dict | None = None):
    """A tiny, validated instance of ``config_class`` (or of ``base``'s class, starting from ``base``).

    The default config (or ``base``) is read back as raw constructor arguments (:mod:`sweep.zoo.config_tree`) so that
    ``__post_init__`` re-derives ``head_dim``, ``layer_types``, ...; each node is shrunk by
    :data:`sweep.zoo.shrink_rules.RULES`, the values that depend on widths, patches and the image side follow, implicit
    defaults, ``sweep/zoo/data/overrides.yaml`` and timm towers apply, and the config is built through its classes'
    validation, repairing the tree on an error (:func:`sweep.zoo.validation_lessons.repair_config`). The steps are
    listed at the top of the body.
    """
    # Steps, in order:
    # 1. Raw tree: the default config (or ``base``) as raw constructor arguments.
    # 2. Measure what later steps compare against: every primary width, the special token id map (ids outside the new
    #    vocab onto its top, the same old id to the same new id everywhere), patches per image, the image side, and
    #    widths that sum a config's own width and its towers'.
    # 3. Rules: each node shrunk by ``sweep.zoo.shrink_rules.RULES``.
    # 4. Tower width sums are summed again from the shrunk widths.
    # 5. Image token counts (and tables keyed by patches per image) scale with the patches per image.
    # 6. Channel maps: lists naming a sub-config's channels (a detector's backbone stages) take its new channels.
    # 7. Pinpoints: any-resolution tilings scale with the image side.
    # 8. Placeholder ids a multimodal config leaves None get reserved ids; an image-token ``vocabulary_map`` the
    #    checkpoints would ship (Chameleon, Emu3) is written for a small codebook.
    # 9. Tower layer indices in a config without layers are clamped into its vision tower.
    # 10. Implicit defaults: values the modeling code assumes when the config leaves them out (learned from a forward
    #     error, ``sweep.zoo.implicit_default_lessons.implicit_default_from_error``), applied after the generic
    #     rescaling, with vocabularies raised and projection widths matched as they ask.
    # 11. Overrides: the per-model overrides of ``sweep/zoo/data/overrides.yaml``.
    # 11b. timm towers a config names (an ``architecture`` with ``model_args``) shrink through those ``model_args``
    #      (``sweep.zoo.timm_towers``), after the overrides (which may name the architecture); the config's
    #      ``hidden_size`` becomes the tower's width and lists of its feature channels follow the new ones.
    # 12. Build: sub-configs first, through the config classes' own validation; an equality, layer-index or
    #     required-value message repairs the tree and builds again (``sweep.zoo.validation_lessons.repair_config``).
    root = raw_tree(base, from_defaults=False) if base is not None else raw_tree(default_config(config_class))
    widths = tree_widths(root)
    token_map = token_id_map(root, profile.vocab)
    old_patches = image_patches(root)
    old_side = image_side(root)
    old_sums = _tower_width_sums(root)
    for node in root.walk():
        shrink_node(node, profile, widths, token_map)
    _follow_tower_width_sums(old_sums)
    _scale_image_token_counts(root, old_patches, image_patches(root))
    _follow_channel_maps(root)
    _scale_pinpoints(root, old_side, image_side(root))
    fill_unset_placeholder_ids(root, profile, token_map)
    _fill_image_vocabulary_maps(root)
    _clamp_tower_layer_indices(root)
    _apply_implicit_defaults(root, implicit_defaults or {})
    if overrides:
        root.apply(overrides)
    _shrink_timm_towers(root, profile)
    return build_with_repairs(root)


def default_config(config_class: type):
    """The config class's default instance; a default its own validator rejects (Gemma 4 assistant's text config
    keeps per-layer inputs the assistant forbids) is built unvalidated: the shrunk tree is repaired on rebuild."""
    try:
        return config_class()
    except Exception:  # noqa: BLE001 - re-raised when the class has no unvalidated constructor
        unvalidated = getattr(config_class.__init__, "__wrapped__", None)
        if unvalidated is None:
            raise
        config = config_class.__new__(config_class)
        unvalidated(config)
        return config


def build_with_repairs(root: Node):
    """The built config; a validation error that :func:`sweep.zoo.validation_lessons.repair_config` answers
    rebuilds it."""
    last: Exception | None = None
    for _ in range(MAX_REPAIRS + 1):
        try:
            return build_config(root)
        except Exception as exc:  # noqa: BLE001 - parsed by the lessons; re-raised when none applies
            last = exc
            if not validation_lessons.repair_config(root, str(exc)):
                raise
    raise last  # type: ignore[misc]


# -- token ids -------------------------------------------------------------------------------------------------


def token_id_map(root: Node, vocab: int) -> dict[int, int]:
    """Old id -> new id for every special token id outside the new vocab, top of the vocab down."""
    ids = set()
    for node in root.walk():
        for key, value in node.args.items():
            if not is_token_field(key, node.cls):
                continue
            values = value if isinstance(value, (list, tuple)) else [value]
            ids.update(v for v in values if is_int(v) and v >= vocab)
    return {old: vocab - 1 - i for i, old in enumerate(sorted(ids))}


# -- steps over the whole tree ---------------------------------------------------------------------------------


def _tower_width_sums(root: Node) -> list[tuple[Node, str, list[Node]]]:
    """Width fields whose default is the node's width plus its sub-configs' widths (a codec's fused semantic and
    acoustic features: Xcodec2's ``quantization_dim`` = ``hidden_size`` + ``semantic_model_config.hidden_size``)."""
    out = []
    for node in root.walk():
        own, towers = primary_width(node), [c for c in node.children.values() if primary_width(c)]
        if not own or not towers:
            continue
        total = own + sum(primary_width(c) for c in towers)
        for key, value in node.args.items():
            if key not in PRIMARY_WIDTHS and is_width_name(key) and is_int(value) and value == total:
                out.append((node, key, towers))
    return out


def _follow_tower_width_sums(sums: list[tuple[Node, str, list[Node]]]) -> None:
    for node, key, towers in sums:
        node.args[key] = primary_width(node) + sum(primary_width(c) for c in towers)


# Tokens per image: as many as patches (PaliGemma) or fewer after pooling (Gemma3): the ratio is kept.
IMAGE_TOKEN_COUNTS = ("mm_tokens_per_image", "image_seq_length", "num_image_tokens", "image_token_count",
                      "tokens_per_image", "num_image_embeds", "latent_query_num")


def image_patches(root: Node) -> int | None:
    """Patches per image of the first config in the tree with an image size and a patch size."""
    for node in root.walk():
        image, patch = node.args.get("image_size"), node.args.get("patch_size")
        image = max(image) if int_list(image) else image
        patch = patch[0] if int_list(patch) else patch
        if is_int(image) and is_int(patch) and patch > 0:
            return (image // patch) ** 2
    return None


def image_side(root: Node) -> int | None:
    for node in root.walk():
        image = node.args.get("image_size")
        image = max(image) if int_list(image) else image
        if is_int(image):
            return image
    return None


def _scale_pinpoints(root: Node, old: int | None, new: int | None) -> None:
    """Any-resolution tilings (``image_grid_pinpoints``) scale with the image side."""
    if not old or not new or old == new:
        return
    for node in root.walk():
        points = node.args.get("image_grid_pinpoints") or node.derived_patterns.get("image_grid_pinpoints")
        if isinstance(points, (list, tuple)) and points and all(int_list(p) for p in points):
            node.args["image_grid_pinpoints"] = [[v * new // old for v in p] for p in points]


def _scale_image_token_counts(root: Node, old: int | None, new: int | None) -> None:
    if not old or not new:
        return
    for node in root.walk():  # tables keyed by patches per image (Aria's patch_to_query_dict)
        for key, table in list(node.args.items()):
            keys = [int(k) for k in table] if isinstance(table, dict) and table and all(
                str(k).isdigit() for k in table) else []
            if keys:  # keyed by the default geometry's patch count, else the smallest entry is the default one
                ref = old if old in keys else min(keys)
                node.args[key] = {max(1, int(k) * new // ref): v for k, v in table.items()}
    if old == new:
        return
    for node in root.walk():
        for key in IMAGE_TOKEN_COUNTS:
            value = node.args.get(key)
            if not is_int(value) or value <= 0:
                continue
            scaled = min(new, max(1, round(value * new / old)))
            if math.isqrt(value) ** 2 == value:  # square token grids stay square and tile the patch grid
                side = math.isqrt(new)
                scaled = max(d for d in range(1, side + 1) if side % d == 0 and d * d <= scaled) ** 2
            node.args[key] = scaled


def _clamp_tower_layer_indices(root: Node) -> None:
    """Layer indices in a config without layers of its own (VipLLaVA's ``vision_feature_layers``) index its
    vision tower's layers: they are clamped into the shrunk tower (repeats are fine, features are concatenated)."""
    for node in root.walk():
        if any(is_int(node.args.get(k)) for k in LAYER_COUNTS):
            continue
        towers = [node.children["vision_config"]] if "vision_config" in node.children else list(node.children.values())
        layers = next((t.args[k] for t in towers for k in LAYER_COUNTS if is_int(t.args.get(k))), None)
        if not layers:
            continue
        for key in LAYER_INDEX_FIELDS:
            value = node.args.get(key)
            values = list(value) if isinstance(value, (list, tuple)) else [value]
            if not values or not all(is_int(v) for v in values):
                continue
            new = [max(v, -layers) if v < 0 else min(v, layers - 1) for v in values]
            node.args[key] = type(value)(new) if isinstance(value, (list, tuple)) else new[0]


PLACEHOLDER_FIELDS = ("image_token_index", "image_token_id", "video_token_index", "audio_token_id")


def _vocab_sizes(root: Node) -> list[int]:
    return [n.args["vocab_size"] for n in root.walk() if is_int(n.args.get("vocab_size"))]


def fill_unset_placeholder_ids(root: Node, profile: Profile, token_map: dict[int, int]) -> None:
    """A multimodal config whose image placeholder id defaults to None (BLIP-2) gets a reserved id."""
    vocabs = _vocab_sizes(root)
    if not vocabs or not root.children:
        return
    for i, key in enumerate(PLACEHOLDER_FIELDS):
        if key in root.fields and root.args.get(key) is None:
            root.args[key] = min(min(vocabs), profile.vocab) - 2 - i - len(token_map)


#: the names image-token vocabularies give their VQ codes (``vocabulary_map`` keys), by the config class that
#: reads them: Chameleon ``IMGIMG<digits as letters A-J>Z``, Emu3 ``<|visual token 000123|>``
_IMAGE_TOKEN_NAMES = {
    "ChameleonConfig": lambda i: "IMGIMG" + "".join(chr(ord("A") + int(d)) for d in str(i)) + "Z",
    "Emu3Config": lambda i: f"<|visual token {i:06d}|>",
}
#: VQ codebook size given to a tiny model whose image vocabulary the zoo writes
IMAGE_CODES = 64


def _fill_image_vocabulary_maps(root: Node) -> None:
    """A config that maps VQ image codes to text tokens through ``vocabulary_map`` (checkpoints ship it; the default
    is None, and ``__init__`` fails on ``None.get``) gets one: its codebook's codes (cut to :data:`IMAGE_CODES`) as the
    top text ids below the placeholder ids, ``<image>`` as its image placeholder id, and Emu3's end-of-line token."""
    name = _IMAGE_TOKEN_NAMES.get(root.cls.__name__)
    if name is None or root.args.get("vocabulary_map") is not None:
        return
    vq = next((c for c in root.children.values() if "VQ" in c.cls.__name__), None)
    vocabs = _vocab_sizes(root)
    if vq is None or not vocabs:
        return
    codes_key = next((k for k in ("num_embeddings", "codebook_size") if is_int(vq.args.get(k))), None)
    if codes_key is None:
        return
    vq.args[codes_key] = codes = min(vq.args[codes_key], IMAGE_CODES)
    top = min(vocabs) - 1
    image = root.args.get("image_token_id")
    if not is_int(image):
        image = top
        if "image_token_id" in root.fields:
            root.args["image_token_id"] = image
    first = min(image, top - 1) - 1 - codes  # below <image> and the end-of-line token
    mapping = {"<image>": image, "<|extra_200|>": top - 1}
    mapping.update({name(i): first + i for i in range(codes)})
    root.args["vocabulary_map"] = mapping


def _follow_channel_maps(root: Node, only: list[Node] | None = None) -> None:
    """Channel lists naming a sub-config's channels (all values known to its map) take the mapped values; with
    ``only``, the maps of those sub-configs alone (a list already mapped must not be mapped twice)."""
    for node in root.walk():
        for child in node.children.values():
            mapping = getattr(child, "channel_map", None) or {}
            if not mapping or (only is not None and not any(child is o for o in only)):
                continue
            for key, value in list(node.args.items()):
                if is_int(value) and value in mapping and "feat" in key and any(
                        w in key for w in ("dim", "channel")):  # one backbone stage's channels (x4_feat_dim)
                    node.args[key] = mapping[value]
                    continue
                if key in CHANNEL_LISTS or key in node.width_lists or not int_list(value) or not all(
                        v in mapping for v in value):
                    continue
                if any(w in key.lower() for w in ("channel", "hidden", "dim", "size")):
                    node.args[key] = type(value)(mapping[v] for v in value)


def _shrink_timm_towers(root: Node, profile: Profile) -> None:
    shrunk: list[Node] = []
    for node in root.walk():
        architecture = node.args.get("architecture")
        if not isinstance(architecture, str) or "model_args" not in node.fields:
            continue  # a timm tower by name: TimmWrapperConfig, Gemma3nVisionConfig
        given = dict(node.args.get("model_args") or {})
        try:
            args = timm_towers.shrunk_model_args(architecture, profile, given)
            old, new = timm_towers.feature_channels(architecture, given), timm_towers.feature_channels(architecture, args)
        except Exception as exc:  # noqa: BLE001 - timm missing or an architecture its builder does not take so: as it is
            logger.info("timm tower %s not shrunk: %s: %s", architecture, type(exc).__name__, exc)
            continue
        node.args["model_args"] = args
        if "hidden_size" in node.args and not args.get("features_only"):
            node.args["hidden_size"] = new[-1]
        if len(old) == len(new):
            node.channel_map = dict(zip(old, new))
            shrunk.append(node)
    _follow_channel_maps(root, only=shrunk)


def _apply_implicit_defaults(root: Node, implicit_defaults: dict) -> None:
    """Exact values the modeling code asked for, after the generic rescaling
    (see :mod:`sweep.zoo.implicit_default_lessons`)."""
    for node in root.walk():
        for key, value in implicit_defaults.items():
            if key in node.fields and isinstance(value, dict) and (node.args.get(key) or "rope" in key):
                node.args[key] = {**(node.args.get(key) or {}), **value}
            elif key in node.fields and not isinstance(value, dict) and node.args.get(key) is None:
                node.args[key] = value  # a scalar the modeling code reads unconditionally (sliding_window)
        _raise_vocab(root, node, *implicit_defaults.get(implicit_default_lessons.VOCAB_AT_LEAST, (None, None)))
        got, wanted = implicit_defaults.get(implicit_default_lessons.PROJECTION_WIDTH, (None, None))
        for key, value in list(node.args.items()):  # a projection width the other tower's embedding must meet
            if got and "proj" in key and is_width_name(key) and value == got:
                node.args[key] = wanted


def _raise_vocab(root: Node, node: Node, small: int | None, need: int | None) -> None:
    """Vocabularies of ``small`` entries become the smallest vocabulary of the tree that holds ``need`` ids."""
    if not small:
        return
    sizes = [v for n in root.walk() for k, v in n.args.items() if is_vocab(k) and is_int(v) and v >= need]
    for key, value in list(node.args.items()):
        if is_vocab(key) and value == small:
            node.args[key] = min(sizes, default=need)
