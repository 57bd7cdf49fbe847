"""Skiplists: YAML files of known failures, each entry with its reason and an upstream link or a TODO.

``skiplists/export_skip.yaml``         cases not run (the model is not exportable as it is)
``skiplists/onnx_disable_optimize.yaml`` ONNX cases run with ``optimize=False`` (an optimiser bug upstream)
``skiplists/generate_skip.yaml``       generation cases not run

Each file is a list of entries::

    - class: FooForCausalLM
      backends: [onnx, executorch]      # or [all]
      reason: data-dependent loop over image tiles
      link: https://github.com/huggingface/transformers/issues/12345   # or: todo: "<the model change needed>"

Validation stops the run with a message naming file and line: malformed YAML, a missing reason, neither link
nor todo, a link that is not a GitHub issue/PR URL, an unknown class or backend, a duplicate entry.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import yaml

KINDS = ("export_skip", "onnx_disable_optimize", "generate_skip")
BACKENDS = ("eager", "dynamo", "onnx", "executorch")
LINK = re.compile(r"^https://github\.com/[\w.-]+/[\w.-]+/(issues|pull)/\d+$")
KEYS = {"class", "backends", "reason", "link", "todo"}


class SkiplistError(ValueError):
    """A skiplist file is malformed; the message names file and line."""


@dataclass(frozen=True)
class SkipEntry:
    kind: str
    class_name: str
    backends: tuple[str, ...]
    reason: str
    link: str | None
    todo: str | None
    file: str
    line: int

    def applies(self, class_name: str, backend: str) -> bool:
        return self.class_name == class_name and backend in self.backends

    @property
    def reference(self) -> str:
        return self.link or f"TODO: {self.todo}"

    def describe(self) -> str:
        return f"{self.reason} ({self.reference}) [{self.file}:{self.line}]"


def _entries(path: Path) -> list[tuple[int, dict]]:
    text = path.read_text()
    try:
        root = yaml.compose(text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = mark.line + 1 if mark else 0
        raise SkiplistError(f"{path}:{line}: malformed YAML: {getattr(e, 'problem', e)}") from e
    if data is None:
        return []
    if not isinstance(data, list) or root is None or not isinstance(root, yaml.SequenceNode):
        raise SkiplistError(f"{path}:1: a skiplist is a YAML list of entries, got {type(data).__name__}")
    return [(node.start_mark.line + 1, item) for node, item in zip(root.value, data)]


def load_skiplist(path: Path, kind: str, known_class: Callable[[str], bool]) -> list[SkipEntry]:
    out: list[SkipEntry] = []
    seen: dict[str, int] = {}
    for line, item in _entries(path):
        where = f"{path}:{line}"
        if not isinstance(item, dict):
            raise SkiplistError(f"{where}: an entry is a mapping with keys {sorted(KEYS)}, got {item!r}")
        unknown = set(item) - KEYS
        if unknown:
            raise SkiplistError(f"{where}: unknown key(s) {sorted(unknown)}; allowed: {sorted(KEYS)}")
        name = item.get("class")
        if not isinstance(name, str) or not name:
            raise SkiplistError(f"{where}: 'class' (a model class name) is required")
        if not known_class(name):
            raise SkiplistError(f"{where}: unknown model class {name!r}")
        reason = item.get("reason")
        if not isinstance(reason, str) or not reason.strip():
            raise SkiplistError(f"{where}: {name}: 'reason' is required")
        link, todo = item.get("link"), item.get("todo")
        if not link and not todo:
            raise SkiplistError(f"{where}: {name}: give 'link' (the upstream issue) or 'todo' (the model change needed)")
        if link and not LINK.match(str(link)):
            raise SkiplistError(f"{where}: {name}: link {link!r} is not a GitHub issue or pull request URL")
        backends = item.get("backends", ["all"])
        if isinstance(backends, str):
            backends = [backends]
        if not isinstance(backends, list) or not backends:
            raise SkiplistError(f"{where}: {name}: 'backends' is a list of {list(BACKENDS)} or [all]")
        if "all" in backends:
            backends = list(BACKENDS)
        bad = [b for b in backends if b not in BACKENDS]
        if bad:
            raise SkiplistError(f"{where}: {name}: unknown backend(s) {bad}; known: {list(BACKENDS)} or all")
        if name in seen:
            raise SkiplistError(f"{where}: {name}: duplicate entry (first at line {seen[name]})")
        seen[name] = line
        out.append(SkipEntry(kind, name, tuple(backends), reason.strip(), link, todo, str(path), line))
    return out


@dataclass
class Skiplists:
    entries: dict[str, list[SkipEntry]]

    def find(self, kind: str, class_name: str, backend: str) -> SkipEntry | None:
        return next((e for e in self.entries.get(kind, []) if e.applies(class_name, backend)), None)

    def all(self) -> Iterable[SkipEntry]:
        for kind in KINDS:
            yield from self.entries.get(kind, [])


def load_skiplists(directory: Path, known_class: Callable[[str], bool]) -> Skiplists:
    """Load and validate every skiplist in ``directory``; a missing file is an empty list."""
    entries = {}
    for kind in KINDS:
        path = directory / f"{kind}.yaml"
        entries[kind] = load_skiplist(path, kind, known_class) if path.is_file() else []
    return Skiplists(entries)
