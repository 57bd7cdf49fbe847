"""A case's fingerprint changes when anything its result depends on changes, and only then."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sweep import fingerprint as fp

SPEC = {"model": "BertModel", "backend": "onnx", "shapes": "dynamic", "atol": 1e-4, "rtol": 1e-4, "seed": 0}
SETTINGS = {"timeout": 600.0, "run_skipped": None}


def _changed(before: dict, after: dict) -> set[str]:
    return {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}


def test_same_case_same_fingerprint():
    assert fp.fingerprint_parts(dict(SPEC), dict(SETTINGS)) == fp.fingerprint_parts(dict(SPEC), dict(SETTINGS))


@pytest.mark.parametrize("change", [
    {"atol": 1e-3}, {"rtol": 1e-3}, {"shapes": "static"}, {"backend": "executorch"}, {"seed": 1},
    {"skiplist": "BertModel on onnx: a reason (https://github.com/x/y/issues/1)"}, {"onnx_disable_optimize": True},
])
def test_the_case_part_covers_the_spec(change):
    before = fp.fingerprint_parts(dict(SPEC), dict(SETTINGS))
    after = fp.fingerprint_parts({**SPEC, **change}, dict(SETTINGS))
    assert "case" in _changed(before, after)
    assert fp.fingerprint(before) != fp.fingerprint(after)


def test_the_case_part_covers_the_timeout_and_run_skipped():
    before = fp.fingerprint_parts(dict(SPEC), dict(SETTINGS))
    assert _changed(before, fp.fingerprint_parts(dict(SPEC), {**SETTINGS, "timeout": 60.0})) == {"case"}
    assert _changed(before, fp.fingerprint_parts(dict(SPEC), {**SETTINGS, "run_skipped": True})) == {"case"}


def test_the_versions_part_covers_every_pinned_package(monkeypatch):
    before = fp.fingerprint_parts(dict(SPEC), dict(SETTINGS))
    import engine.versions

    moved = {**engine.versions.installed_versions(), "onnxruntime": "9.9.9"}
    monkeypatch.setattr(engine.versions, "installed_versions", lambda: moved)
    fp.versions_digest.cache_clear()
    try:
        assert _changed(before, fp.fingerprint_parts(dict(SPEC), dict(SETTINGS))) == {"versions"}
    finally:
        fp.versions_digest.cache_clear()


def _tree(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def test_own_sources_cover_engine_and_sweep_code_and_data_not_prose(tmp_path):
    _tree(tmp_path, {"engine/a.py": "x = 1\n", "sweep/data/smoke.yaml": "- A\n", "sweep/zoo/README.md": "prose\n",
                     "sweep/zoo/data/overrides.yaml": "{}\n", "tests/t.py": "y = 1\n"})

    def digest():
        fp._file_digest.cache_clear()
        fp.own_sources_digest.cache_clear()
        return fp.own_sources_digest(tmp_path)

    first = digest()
    (tmp_path / "sweep/zoo/README.md").write_text("other prose\n")
    (tmp_path / "tests/t.py").write_text("y = 2\n")
    assert digest() == first
    (tmp_path / "sweep/data/smoke.yaml").write_text("- B\n")
    second = digest()
    assert second != first
    (tmp_path / "sweep/zoo/data/overrides.yaml").write_text("A: {}\n")  # the zoo subpackage's data counts too
    third = digest()
    assert third != second
    (tmp_path / "engine/new.py").write_text("")
    assert digest() != third
    fp.own_sources_digest.cache_clear()


PACKAGE = {
    "pkg/__init__.py": """
        from typing import TYPE_CHECKING
        if TYPE_CHECKING:
            from .models.bar import modeling_bar  # never run: a lazy package's listing
    """,
    "pkg/modeling_utils.py": """
        import os
        from .utils import helper

        def quantize():
            from .models.bar.modeling_bar import BarLayer  # an optional integration's lazy hook into one model
    """,
    "pkg/utils.py": "def helper(): pass\n",
    "pkg/loss.py": "LOSS = 1\n",
    "pkg/models/__init__.py": "",
    "pkg/models/foo/__init__.py": "",
    "pkg/models/foo/configuration_foo.py": "class FooConfig: pass\n",
    "pkg/models/foo/modeling_foo.py": """
        from ...modeling_utils import quantize
        from .configuration_foo import FooConfig

        def forward():
            from ... import loss  # a model's own lazy import runs when it runs
    """,
    "pkg/models/bar/__init__.py": "",
    "pkg/models/bar/modeling_bar.py": "from ...utils import helper\nclass BarLayer: pass\n",
}


def _closure(tmp_path, module="pkg.models.foo.modeling_foo"):
    fp.import_closure.cache_clear()
    return {str(p.relative_to(tmp_path)) for p in fp.import_closure(module, tmp_path, "pkg")}


def test_the_model_part_is_the_modules_import_closure(tmp_path):
    _tree(tmp_path, PACKAGE)
    assert _closure(tmp_path) == {
        "pkg/__init__.py", "pkg/modeling_utils.py", "pkg/utils.py", "pkg/loss.py", "pkg/models/__init__.py",
        "pkg/models/foo/__init__.py", "pkg/models/foo/configuration_foo.py", "pkg/models/foo/modeling_foo.py"}
    assert _closure(tmp_path, "pkg.models.bar.modeling_bar") >= {"pkg/models/bar/modeling_bar.py", "pkg/__init__.py"}
    assert "pkg/models/foo/modeling_foo.py" not in _closure(tmp_path, "pkg.models.bar.modeling_bar")


def test_touching_one_file_changes_the_digest_of_exactly_the_modules_that_import_it(tmp_path):
    _tree(tmp_path, PACKAGE)

    def digests():
        fp._file_digest.cache_clear()
        fp.import_closure.cache_clear()
        return {m: fp.closure_digest(m, tmp_path, "pkg") for m in ("pkg.models.foo.modeling_foo", "pkg.models.bar.modeling_bar")}

    first = digests()
    (tmp_path / "pkg/models/bar/modeling_bar.py").write_text("from ...utils import helper\nclass BarLayer: x = 2\n")
    second = digests()
    assert second["pkg.models.foo.modeling_foo"] == first["pkg.models.foo.modeling_foo"]
    assert second["pkg.models.bar.modeling_bar"] != first["pkg.models.bar.modeling_bar"]
    (tmp_path / "pkg/utils.py").write_text("def helper(): return 1\n")  # shared by both
    third = digests()
    assert all(third[m] != second[m] for m in third)
    fp._file_digest.cache_clear()


def test_transformers_classes_depend_on_their_own_modeling_file_only():
    import transformers

    root = fp._transformers_search_path()

    def files(cls):
        return {str(p.relative_to(root)) for p in fp.import_closure(f"transformers.{transformers._class_to_module[cls]}", root, "transformers")}

    bert, llama = files("BertModel"), files("LlamaModel")
    assert "transformers/models/bert/modeling_bert.py" in bert and "transformers/models/llama/modeling_llama.py" not in bert
    assert "transformers/models/llama/modeling_llama.py" in llama and "transformers/models/bert/modeling_bert.py" not in llama
    assert "transformers/modeling_utils.py" in bert & llama


def test_local_models_hash_their_config_or_module(tmp_path):
    _tree(tmp_path, {"my_models.py": "import helpers\n", "helpers.py": "A = 1\n", "cfg/config.json": '{"a": 1}'})
    module = {"model": "Mine", "model_module": "my_models", "module_path": str(tmp_path)}
    config = {"model": "BertModel@cfg", "config": str(tmp_path / "cfg"), "class": "BertModel"}

    def parts(spec):
        fp._file_digest.cache_clear()
        fp.import_closure.cache_clear()
        return fp.fingerprint_parts(dict(spec), dict(SETTINGS))

    before_module, before_config = parts(module), parts(config)
    assert "model" not in before_module and "model" in before_config
    (tmp_path / "helpers.py").write_text("A = 2\n")  # imported by the module: its result may change
    (tmp_path / "cfg/config.json").write_text('{"a": 2}')
    assert _changed(before_module, parts(module)) == {"local"}
    assert _changed(before_config, parts(config)) == {"local"}


def test_an_unplaceable_class_is_never_reusable():
    parts = fp.fingerprint_parts({**SPEC, "model": "NoSuchModelAnywhere"}, dict(SETTINGS))
    assert parts["model"].startswith("unknown") and not fp.reusable(parts)
    assert fp.reusable(fp.fingerprint_parts(dict(SPEC), dict(SETTINGS)))


def test_a_class_transformers_does_not_export_is_placed_where_the_zoo_finds_it():
    """VoxtralRealtimeTextModel is in an auto mapping but not in transformers' namespace: its part is its own
    modeling module's import closure, as for any class, so its rows are reusable."""
    import transformers

    assert not hasattr(transformers, "VoxtralRealtimeTextModel")
    module = "transformers.models.voxtral_realtime.modeling_voxtral_realtime"
    expected = fp.module_digest(module, "VoxtralRealtimeTextModel")
    assert fp.model_digest("VoxtralRealtimeTextModel") == expected


def test_the_version_of_transformers_counts_only_through_the_ranges_our_code_tests(monkeypatch, tmp_path):
    """A source tree at another version (5.25.0.dev0) hashes its sources in the model part; its version string
    changes the versions part only where a range written in our sources (a patch's requires) flips."""
    import engine.versions

    real = engine.versions.installed_versions()
    _tree(tmp_path, {"engine/p.py": 'register_patch("dynamo", "x.y", requires={"transformers": "<5.25"})\n',
                     "sweep/s.py": "x = 1\n"})

    def digest(version):
        monkeypatch.setattr(engine.versions, "installed_versions", lambda: {**real, "transformers": version})
        monkeypatch.setattr(engine.versions.md, "version", lambda name: version if name == "transformers" else real.get(name))
        fp.versions_digest.cache_clear()
        return fp.versions_digest(tmp_path)

    try:
        assert digest("5.24.0") == digest("5.24.1")  # no range flips: the same
        assert digest("5.24.0") != digest("5.25.0.dev0")  # "<5.25" no longer holds
    finally:
        fp.versions_digest.cache_clear()


def test_a_local_build_tag_is_not_a_version_change(monkeypatch):
    import engine.versions

    real = engine.versions.installed_versions()
    monkeypatch.setattr(engine.versions, "installed_versions", lambda: {**real, "torch": real["torch"] + "+cpu"})
    fp.versions_digest.cache_clear()
    try:
        cpu = fp.versions_digest()
        monkeypatch.setattr(engine.versions, "installed_versions", lambda: real)
        fp.versions_digest.cache_clear()
        assert fp.versions_digest() == cpu
    finally:
        fp.versions_digest.cache_clear()


REGISTRY = """\
    from collections import OrderedDict
    from typing import TYPE_CHECKING

    if TYPE_CHECKING:
        from .llama import *
        from .bert import *

    NAMES = OrderedDict(
        [
            ("llama", "LlamaConfig"),
            ("bert", "BertConfig"),
            ("t5", "T5Config"),
            ("gpt2", "GPT2Config"),
            ("clip", "CLIPConfig"),
            ("vit", "ViTConfig"),
            ("opt", "OPTConfig"),
            ("bart", "BartConfig"),
        ]
    )
    SMALL = ["llama", "bert"]


    def lookup(name):
        return NAMES[name]
    """
KNOWN = frozenset({"llama", "bert", "t5", "gpt2", "clip", "vit", "opt", "bart", "new_model", "NewConfig"})


@pytest.fixture
def registry(tmp_path, monkeypatch):
    from sweep import shared_tables

    monkeypatch.setattr(shared_tables, "known_names", lambda search_path: KNOWN)
    path = tmp_path / "mappings.py"

    def digest(text, own):
        shared_tables.split_file.cache_clear()
        shared_tables._by_name.cache_clear()
        path.write_text(textwrap.dedent(text))
        return shared_tables.file_digest_for(path, tmp_path, frozenset(own), whole=fp._digest(text))

    return digest


def test_a_new_models_registry_entries_leave_other_classes_alone(registry):
    llama = {"llama", "LlamaConfig"}
    before = registry(REGISTRY, llama)
    new_model = REGISTRY.replace('    ("llama", "LlamaConfig"),', '    ("llama", "LlamaConfig"),\n            ("new_model", "NewConfig"),')
    new_model = new_model.replace("from .llama import *", "from .llama import *\n        from .new_model import *")
    assert registry(new_model, llama) == before  # the new model's entries (and TYPE_CHECKING lines) do not count
    assert registry(new_model, {"new_model", "NewConfig"}) != registry(REGISTRY, {"new_model", "NewConfig"})
    assert registry(REGISTRY.replace('"LlamaConfig"', '"LlamaCfg"'), llama) != before  # its own entry does
    assert registry(REGISTRY.replace("return NAMES[name]", "return NAMES.get(name)"), llama) != before  # code does
    assert registry(REGISTRY.replace('SMALL = ["llama", "bert"]', 'SMALL = ["bert"]'), llama) != before  # a constant
    # a dev tree's version bump in the package __init__ (counted by the versions part, through the ranges we test)
    versioned = registry(REGISTRY + '__version__ = "5.24.0"\n', llama)
    assert registry(REGISTRY + '__version__ = "5.25.0.dev0"\n', llama) == versioned


@given(st.lists(st.sampled_from(sorted(KNOWN - {"llama"})), min_size=8, max_size=20), st.sampled_from(sorted(KNOWN - {"llama"})))
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])  # the fixture clears its caches per call
def test_entries_not_naming_a_class_never_change_its_digest(registry, others, added):
    """Property: in a registry table, adding any entry that names none of the class's names leaves its digest."""
    table = ",\n".join(f'    ("{name}", "X")' for name in ["llama", *others])
    text = f"NAMES = dict([\n{table}\n])\n"
    grown = text.replace('    ("llama", "X")', f'    ("llama", "X"),\n    ("{added}", "Y")')
    assert registry(grown, {"llama"}) == registry(text, {"llama"})
