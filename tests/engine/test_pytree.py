"""Leaf naming, and flatten/unflatten round-trips for every Cache and cache-layer class in transformers."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import pytest
import torch
import torch.utils._pytree as pytree
import transformers
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import DynamicCache, EncoderDecoderCache, cache_utils
from transformers.modeling_outputs import CausalLMOutputWithPast

from engine.pytree import get_leaf_tensors, map_structure, register_pytree_nodes


def _import_modeling_modules_defining_caches() -> None:
    """Cache subclasses defined in modeling files exist only once imported: import those modules."""
    models = Path(transformers.__file__).parent / "models"
    pattern = re.compile(r"^class \w+\((?:\w+, )*\w*(?:Cache|Layer)\b", re.M)
    for info in pkgutil.iter_modules([str(models)]):
        for path in (models / info.name).glob("modeling_*.py"):
            if pattern.search(path.read_text(errors="ignore")) and "cache_utils" in path.read_text(errors="ignore"):
                try:
                    importlib.import_module(f"transformers.models.{info.name}.{path.stem}")
                except Exception:  # an optional dependency missing: its classes cannot exist here
                    pass


def _subclasses(base):
    out, stack = [], [base]
    while stack:
        for sub in stack.pop().__subclasses__():
            if sub not in out:
                out.append(sub)
                stack.append(sub)
    return out


_import_modeling_modules_defining_caches()
register_pytree_nodes()
LAYER_CLASSES = sorted(
    {
        c
        for base in (cache_utils.CacheLayerMixin, cache_utils.LinearAttentionCacheLayerMixin)
        for c in [base, *_subclasses(base)]
        if not inspect.isabstract(c)
    }
    | {cache_utils.DummyLayer},
    key=lambda c: c.__qualname__,
)
CACHE_CLASSES = sorted([cache_utils.Cache, *_subclasses(cache_utils.Cache)], key=lambda c: c.__qualname__)


def test_discovery_found_the_known_classes():
    names = {c.__name__ for c in CACHE_CLASSES}
    assert {"DynamicCache", "StaticCache", "EncoderDecoderCache", "QuantizedCache"} <= names
    assert {"DynamicLayer", "StaticSlidingWindowLayer", "LinearAttentionLayer", "DummyLayer"} <= {c.__name__ for c in LAYER_CLASSES}


# ─── Building instances generically ────────────────────────────────────────────────────────────

_INIT_VALUES = {"sliding_window": 4, "max_cache_len": 8, "number_of_states": 2}


def _make_layer(cls, draw_tensor):
    """A layer of ``cls`` with every tensor slot its class defines filled."""
    params = inspect.signature(cls.__init__).parameters
    kwargs = {n: _INIT_VALUES[n] for n in params if n in _INIT_VALUES}
    try:
        layer = cls(**kwargs)
    except Exception:  # layers that need a quantisation backend etc.: build the bare object
        layer = cls.__new__(cls)
        cache_utils.CacheLayerMixin.__init__(layer)
    for name, value in list(vars(layer).items()):
        if name in ("keys", "values") or isinstance(value, torch.Tensor):
            setattr(layer, name, draw_tensor())
        elif name in ("conv_states", "recurrent_states"):
            setattr(layer, name, {i: draw_tensor() for i in value})
    return layer


def _make_cache(cls, layers):
    if issubclass(cls, EncoderDecoderCache):
        # its __init__ queries the sub-caches' lengths: give it plain attention layers (the drawn layer
        # classes are exercised by every other cache class)
        def plain():
            return _make_cache(DynamicCache, [_make_layer(cache_utils.DynamicLayer, lambda: torch.zeros(1, 1, 2, 1)) for _ in layers])

        return cls(plain(), plain())
    cache = cls.__new__(cls)  # subclasses' own __init__ want configs/backends; the structure is Cache's
    cache_utils.Cache.__init__(cache, layers=layers)
    return cache


def _same(a, b):
    assert type(a) is type(b)
    la, lb = get_leaf_tensors(a), get_leaf_tensors(b)
    assert list(la) == list(lb)
    assert all(la[k] is lb[k] for k in la)


shapes = st.tuples(st.integers(1, 3), st.integers(1, 4), st.integers(0, 5), st.integers(1, 8))


@pytest.mark.parametrize("cache_cls", CACHE_CLASSES, ids=lambda c: c.__name__)
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), shape=shapes, n_layers=st.integers(1, 4))
def test_cache_round_trip(cache_cls, data, shape, n_layers):
    layer_classes = data.draw(st.lists(st.sampled_from(LAYER_CLASSES), min_size=n_layers, max_size=n_layers))
    cache = _make_cache(cache_cls, [_make_layer(c, lambda: torch.randn(*shape)) for c in layer_classes])
    register_pytree_nodes(cache)

    leaves, spec = pytree.tree_flatten(cache)
    rebuilt = pytree.tree_unflatten(leaves, spec)
    _same(cache, rebuilt)
    # same leaves in the same order as the dotted names
    assert [t for t in leaves if isinstance(t, torch.Tensor)] == list(get_leaf_tensors(cache).values())
    # the spec survives serialisation (artifacts store their in/out treespecs)
    assert pytree.treespec_loads(pytree.treespec_dumps(spec)) == spec
    # static state is restored, not shared
    for before, after in zip(cache.layers if hasattr(cache, "layers") else [], getattr(rebuilt, "layers", [])):
        statics = {k: v for k, v in vars(before).items() if not isinstance(v, (torch.Tensor, dict))}
        assert statics == {k: v for k, v in vars(after).items() if k in statics}
    # key paths are real attribute paths (torch.export guards read inputs through them)
    for path, leaf in pytree.tree_flatten_with_path(cache)[0]:
        assert eval("cache" + pytree.keystr(path)) is leaf


def test_leaf_names_of_nested_outputs():
    cache = DynamicCache()
    cache.update(torch.zeros(1, 2, 3, 4), torch.ones(1, 2, 3, 4), layer_idx=0)

    @dataclasses.dataclass
    class Extra:
        scores: torch.Tensor
        label: str = "x"

    out = {
        "main": CausalLMOutputWithPast(logits=torch.zeros(2), cache=cache),  # (transformers 5.24 renamed the field)
        "list": [torch.zeros(1), (torch.zeros(1), None)],
        "extra": Extra(torch.zeros(3)),
    }
    assert list(get_leaf_tensors(out)) == [
        "main.logits",
        "main.cache.0.keys",
        "main.cache.0.values",
        "list.0",
        "list.1.0",
        "extra.scores",
    ]
    assert list(get_leaf_tensors(torch.zeros(1))) == [""]


def test_encoder_decoder_cache_names():
    self_attn, cross = DynamicCache(), DynamicCache()
    self_attn.update(torch.zeros(1, 1, 2, 2), torch.zeros(1, 1, 2, 2), 0)
    cross.update(torch.zeros(1, 1, 5, 2), torch.zeros(1, 1, 5, 2), 0)
    names = list(get_leaf_tensors({"past_key_values": EncoderDecoderCache(self_attn, cross)}))
    assert names == [
        "past_key_values.self_attention_cache.0.keys",
        "past_key_values.self_attention_cache.0.values",
        "past_key_values.cross_attention_cache.0.keys",
        "past_key_values.cross_attention_cache.0.values",
    ]


@settings(max_examples=30, deadline=None)
@given(st.recursive(
    st.builds(torch.randn, st.integers(0, 3)),
    lambda kids: st.one_of(
        st.lists(kids, max_size=3),
        st.tuples(kids, kids),
        st.dictionaries(st.text("abc", min_size=1, max_size=2), kids, max_size=3),
    ),
    max_leaves=8,
))
def test_map_structure_keeps_names_and_maps_every_leaf(tree):
    mapped = map_structure(tree, lambda t: t + 1)
    before, after = get_leaf_tensors(tree), get_leaf_tensors(mapped)
    assert list(before) == list(after)
    assert all(torch.equal(before[k] + 1, after[k]) for k in before)


def test_standalone_caches_are_registered_and_round_trip():
    """Caches transformers keeps outside its Cache hierarchy (plain classes named ``*Cache``/``*CacheLayer`` in a
    modeling module) are flattened by the same reflection: registered, named, and rebuilt with their state."""
    from transformers.models.reformer.modeling_reformer import ReformerDynamicCache
    from transformers.models.voxtral_realtime.modeling_voxtral_realtime import (
        VoxtralRealtimeConv1dCacheLayer,
        VoxtralRealtimeConv1dPaddingCache,
    )

    from engine.pytree import is_standalone_cache_class

    register_pytree_nodes()
    for cls in (ReformerDynamicCache, VoxtralRealtimeConv1dPaddingCache, VoxtralRealtimeConv1dCacheLayer):
        assert cls in pytree.SUPPORTED_NODES, cls
    assert not is_standalone_cache_class(CausalLMOutputWithPast) and not is_standalone_cache_class(torch.nn.Linear)

    reformer = ReformerDynamicCache()
    reformer.update(torch.randn(2, 3), torch.randn(2, 3, 4), layer_idx=0)
    reformer.update(torch.randn(2, 5), torch.randn(2, 5, 4), layer_idx=1)
    padding = VoxtralRealtimeConv1dPaddingCache()
    padding.update(torch.randn(2, 3, 6), "conv1", type("Conv", (), {"left_pad": 2, "in_channels": 3})())
    for cache in (reformer, padding):
        leaves, spec = pytree.tree_flatten(cache)
        _same(cache, pytree.tree_unflatten(leaves, spec))
        assert pytree.treespec_loads(pytree.treespec_dumps(spec)) == spec
    assert list(get_leaf_tensors(reformer)) == ["buckets_cache.0", "buckets_cache.1", "states_cache.0", "states_cache.1"]
    assert list(get_leaf_tensors(padding)) == ["layers.conv1.cache"]
    assert pytree.tree_unflatten(*pytree.tree_flatten(reformer))._seen_tokens == 3


def test_a_standalone_cache_output_exports():
    """Unregistered, torch.export rejects the returned cache ("Found <class ...> in output, which is not a known
    type"); registered, the program returns its tensors under the eager names, for another batch too."""
    from transformers.models.reformer.modeling_reformer import ReformerDynamicCache

    from engine import DynamoExporter, run_exported

    class ReturnsCache(torch.nn.Module):
        def forward(self, x):
            cache = ReformerDynamicCache()
            cache.update((x.sum(-1) > 0).long(), x * 2, layer_idx=0)
            return {"out": x + 1, "cache": cache}

    model = ReturnsCache().eval()
    program = DynamoExporter().export(model, {"x": torch.randn(2, 3, 4)}, {"dynamic": True})
    other = {"x": torch.randn(3, 5, 4)}
    got, expected = run_exported(program, other), get_leaf_tensors(model(**other))
    assert list(got) == list(expected) == ["out", "cache.buckets_cache.0", "cache.states_cache.0"]
    assert all(torch.equal(got[k], expected[k]) for k in expected)


def test_a_cache_layer_with_symbolic_counts_in_a_dict_exports():
    """A cache layer returned with a count dict that follows the input length (DeepSeek-V4's ``entry_count``) exports:
    the spec keeps the count as None; deep-copying it copied fake tensors ("Cannot access data pointer")."""
    from types import SimpleNamespace

    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4HCACache

    from engine import DynamoExporter, run_exported

    class ReturnsLayer(torch.nn.Module):
        def forward(self, x):
            layer = DeepseekV4HCACache(SimpleNamespace(sliding_window=4, compress_rates={"heavily_compressed_attention": 2}))
            layer.update(x, x)
            layer.entry_count["compressor"] += x.shape[-2] // 2
            return {"out": x + 1, "cache": layer}

    program = DynamoExporter().export(ReturnsLayer().eval(), {"x": torch.randn(2, 1, 6, 4)}, {"dynamic": True})
    other = {"x": torch.randn(3, 1, 7, 4)}
    got, expected = run_exported(program, other), get_leaf_tensors(ReturnsLayer()(**other))
    assert list(got) == list(expected) and all(torch.equal(got[k], expected[k]) for k in expected)


@settings(max_examples=40, deadline=None)
@given(st.permutations(["last_hidden_state", "pooler_output", "hidden_states", "attentions"]), st.integers(1, 4))
def test_model_outputs_in_field_order_survive_an_unflatten_round_trip(order, count):
    """Fields set in any insertion order: in declaration order, flatten(unflatten(flatten(x))) is flatten(x), which
    transformers' own unflatten does not give for the insertion order; names and values are kept."""
    from transformers.modeling_outputs import BaseModelOutputWithPooling

    from engine.pytree import in_field_order

    output = BaseModelOutputWithPooling()
    for i, name in enumerate(order[:count]):
        output[name] = torch.full((1,), float(i))

    def round_trips(tree) -> bool:
        leaves, spec = pytree.tree_flatten(tree)
        return all(a is b for a, b in zip(pytree.tree_flatten(pytree.tree_unflatten(leaves, spec))[0], leaves))

    declared = [f for f in BaseModelOutputWithPooling.__dataclass_fields__ if f in output]
    assert round_trips(output) == (list(output.keys()) == declared)  # the bug: only declaration order survives
    ordered = in_field_order((output, [output]))
    assert round_trips(ordered)
    assert list(ordered[0].keys()) == declared and list(ordered[1][0].keys()) == declared
    assert all(ordered[0][k] is output[k] for k in output) and len(ordered[0]) == len(output)
