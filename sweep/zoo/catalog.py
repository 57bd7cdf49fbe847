"""The catalog: every model class named in transformers' auto mappings.

Each class appears once, with the model type whose config class is the class's own ``config_class``
(``LlamaForCausalLM`` is listed under both ``llama`` and ``internlm3``; its config class decides) and every
``MODEL_*_MAPPING_NAMES`` dict it appears in. Top-level ``PreTrainedModel`` classes that no mapping lists are
enumerated separately (:func:`unlisted_classes`): they are not swept by default but can be named explicitly.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect

MAPPING_MODULE = "transformers.models.auto.modeling_auto"
CONFIG_MODULE = "transformers.models.auto.configuration_auto"


@dataclasses.dataclass(frozen=True)
class ClassRecord:
    """One model class: its name, its model type, its config class and the task mappings that list it."""

    name: str
    model_type: str
    config_class: str
    mappings: tuple[str, ...]
    all_model_types: tuple[str, ...]

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def mapping_label(dict_name: str) -> str:
    """``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` -> ``causal_lm``; ``MODEL_MAPPING_NAMES`` -> ``base``."""
    core = dict_name.removesuffix("MAPPING_NAMES").removeprefix("MODEL_").strip("_").removeprefix("FOR_")
    return core.lower() or "base"


@functools.cache
def _mapping_dicts() -> dict[str, dict]:
    """Every ``MODEL_*_MAPPING_NAMES`` dict, read from the module's source when each is a literal (0.02 s; importing
    the module costs every controller and xdist worker seconds of transformers' lazy import machinery)."""
    static = _literal_mapping_dicts()
    if static is not None:
        return static
    module = importlib.import_module(MAPPING_MODULE)
    names = sorted(n for n in dir(module) if n.startswith("MODEL_") and n.endswith("_MAPPING_NAMES"))
    return {mapping_label(n): getattr(module, n) for n in names}


def _literal_mapping_dicts() -> dict[str, dict] | None:
    """The mapping dicts as ``OrderedDict([...literal...])`` statements of ``modeling_auto.py``, or None when one is
    not a literal (then the module is imported)."""
    import ast
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("transformers")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(spec.submodule_search_locations[0], *MAPPING_MODULE.split(".")[1:]).with_suffix(".py")
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError, ValueError):
        return None
    found, by_name = {}, {}
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            continue
        name = node.targets[0].id
        if not (name.startswith("MODEL_") and name.endswith("_MAPPING_NAMES")):
            continue
        value = node.value
        if not (isinstance(value, ast.Call) and getattr(value.func, "id", None) == "OrderedDict" and len(value.args) == 1
                and not value.keywords):
            return None
        entries = _literal_entries(value.args[0], by_name)
        if entries is None:
            return None
        by_name[name] = found[mapping_label(name)] = dict(entries)
    return dict(sorted(found.items())) or None


def _literal_entries(node, by_name: dict[str, dict]) -> list | None:
    """``[("llama", "LlamaModel"), ...]``, where an element may also be ``*list(<an earlier mapping>.items())``."""
    import ast

    if not isinstance(node, ast.List):
        return None
    entries: list = []
    for element in node.elts:
        if isinstance(element, ast.Starred):
            call = element.value  # list(NAME.items())
            inner = call.args[0] if isinstance(call, ast.Call) and len(call.args) == 1 else None
            if not (isinstance(inner, ast.Call) and isinstance(inner.func, ast.Attribute) and inner.func.attr == "items"
                    and isinstance(inner.func.value, ast.Name) and inner.func.value.id in by_name):
                return None
            entries += list(by_name[inner.func.value.id].items())
            continue
        try:
            entries.append(ast.literal_eval(element))
        except ValueError:
            return None
    return entries


def mapping_labels() -> list[str]:
    return sorted(_mapping_dicts())


def _config_class_name(model_type: str) -> str | None:
    names = importlib.import_module(CONFIG_MODULE).CONFIG_MAPPING_NAMES
    return names.get(model_type)


def _own_config(class_name: str) -> tuple[str | None, str | None]:
    """The model type and name of the ``config_class`` the model class declares (None when unimportable)."""
    import transformers

    try:
        cls = getattr(transformers, class_name)
    except Exception:  # noqa: BLE001 - a class whose import needs a missing package is still catalogued
        return None, None
    config_class = getattr(cls, "config_class", None)
    return getattr(config_class, "model_type", None), getattr(config_class, "__name__", None)


def _listed():
    """``(mapping label, model type, class name)`` for every entry of every ``MODEL_*_MAPPING_NAMES`` dict."""
    for label, mapping in _mapping_dicts().items():
        for model_type, names in mapping.items():
            for name in names if isinstance(names, (list, tuple)) else (names,):
                yield label, model_type, name


@functools.cache
def catalog() -> dict[str, ClassRecord]:
    """Class name -> record, for every class in every ``MODEL_*_MAPPING_NAMES`` dict."""
    types_of: dict[str, set[str]] = {}
    for _, model_type, name in _listed():
        types_of.setdefault(name, set()).add(model_type)
    records = {}
    for name, listed_types in types_of.items():
        types = sorted(listed_types)
        model_type = types[0]
        if len(types) > 1:
            own_type, own_config = _own_config(name)
            matching = [t for t in types if own_config is not None and _config_class_name(t) == own_config]
            if own_type in matching:
                model_type = own_type
            elif matching:
                model_type = matching[0]
        records[name] = ClassRecord(
            name=name,
            model_type=model_type,
            config_class=_config_class_name(model_type) or "",
            mappings=mappings_of(name),
            all_model_types=tuple(types),
        )
    return dict(sorted(records.items()))


def all_classes() -> list[str]:
    """Sorted names of every catalogued class, read from the mapping dicts alone: :func:`catalog` imports the
    model module of each class listed under several model types to tell its own (about 4 s), which selecting
    and collecting cases (every controller and xdist worker, ``--collect-only``, a mistyped ``--models``) never
    needs."""
    return list(_class_names())


@functools.cache
def _class_names() -> tuple[str, ...]:
    return tuple(sorted({name for _, _, name in _listed()}))


def record(name: str) -> ClassRecord:
    """The record for a catalogued class, or one synthesised from the class itself for an unlisted class."""
    records = catalog()
    if name in records:
        return records[name]
    import transformers

    cls = getattr(transformers, name)  # AttributeError names the unknown class
    config_class = getattr(cls, "config_class", None)
    model_type = getattr(config_class, "model_type", "") or ""
    return ClassRecord(
        name=name,
        model_type=model_type,
        config_class=getattr(config_class, "__name__", ""),
        mappings=(),
        all_model_types=(model_type,) if model_type else (),
    )


def classes_of_type(model_type: str) -> list[str]:
    """Sorted names of the classes the mapping dicts list under ``model_type`` (what ``--config`` sweeps)."""
    return sorted({name for _, listed_type, name in _listed() if listed_type == model_type})


def mappings_of(name: str) -> tuple[str, ...]:
    """The labels of the mappings that list a class (none for an unlisted class), from the mapping dicts alone:
    ``record(name).mappings`` without :func:`catalog`'s imports (``--generate`` asks it for every selected class
    in every controller and xdist worker)."""
    return _mappings_by_class().get(name, ())


@functools.cache
def _mappings_by_class() -> dict[str, tuple[str, ...]]:
    grouped: dict[str, set[str]] = {}
    for label, _, name in _listed():
        grouped.setdefault(name, set()).add(label)
    return {name: tuple(sorted(labels)) for name, labels in grouped.items()}


def classes_by_mapping() -> dict[str, list[str]]:
    """Mapping label -> sorted class names, from the mapping dicts alone (as :func:`all_classes`)."""
    grouped: dict[str, set[str]] = {label: set() for label in mapping_labels()}
    for label, _, name in _listed():
        grouped[label].add(name)
    return {label: sorted(names) for label, names in grouped.items()}


@functools.cache
def unlisted_classes() -> dict[str, list[str]]:
    """Top-level ``PreTrainedModel`` subclasses in no mapping, split into ``concrete`` and ``abstract``.

    Abstract means a ``*PreTrainedModel`` base (``base_model_prefix`` holder with no forward of its own).
    """
    import transformers
    from transformers import PreTrainedModel

    listed = set(all_classes())
    concrete, abstract = [], []
    for name in sorted(n for n in dir(transformers) if n[:1].isupper()):
        if name in listed:
            continue
        try:
            obj = getattr(transformers, name)
        except Exception:  # noqa: BLE001 - unimportable (missing package): not a candidate we can list
            continue
        if not (inspect.isclass(obj) and issubclass(obj, PreTrainedModel)) or obj is PreTrainedModel:
            continue
        has_own_forward = any("forward" in vars(k) for k in obj.__mro__ if k is not PreTrainedModel
                              and issubclass(k, PreTrainedModel))
        if name.endswith("PreTrainedModel") or not has_own_forward:
            abstract.append(name)
        else:
            concrete.append(name)
    return {"concrete": concrete, "abstract": abstract}


def main(argv: list[str] | None = None) -> None:
    """``python -m sweep.zoo.catalog [--unlisted]``: counts by mapping, or the unlisted top-level classes."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--unlisted", action="store_true", help="list PreTrainedModel classes in no mapping")
    args = parser.parse_args(argv)
    if args.unlisted:
        unlisted = unlisted_classes()
        print(f"{len(unlisted['concrete'])} concrete and {len(unlisted['abstract'])} abstract top-level "
              "PreTrainedModel classes are in no auto mapping; concrete ones can be named explicitly:")
        for name in unlisted["concrete"]:
            print(f"  {name}")
        return
    print(f"{len(catalog())} classes in {len(mapping_labels())} mappings")
    for label, names in classes_by_mapping().items():
        print(f"  {label:40s} {len(names)}")


if __name__ == "__main__":
    main()
