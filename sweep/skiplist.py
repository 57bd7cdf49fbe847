"""Skiplists: YAML files of known failures, each entry with its cause and an upstream link or a TODO.

``skiplists/export_skip.yaml``         cases not run (the model is not exportable as it is)
``skiplists/onnx_disable_optimize.yaml`` ONNX cases run with ``optimize=False`` (an optimiser bug upstream)
``skiplists/generate_skip.yaml``       generation cases not run

Each file is a list of causes; an entry names one class, or several sharing the cause (a list, globs allowed)::

    - classes: [Qwen2VLModel, "Qwen2_5_VL*"]   # or: class: FooForCausalLM
      backends: [onnx, executorch]              # or [all] (the default)
      reason: data-dependent loop over image tiles
      link: https://github.com/huggingface/transformers/issues/12345   # or: todo: "<the change needed>"
      versions: {transformers: ">=5.24"}        # optional: the installed versions the cause is known at
      repro: repros/bucketize_int32.py          # optional: a standalone script showing the failure (sweep.repros)
      tracker: pytorch/executorch               # optional: where the bug belongs (the repro's upstream)

An entry with ``versions`` applies only where every named package is installed inside its range: a failure that
a release brings (or fixes) is listed for the versions that have it, so the same file serves the old and new pins
while both are supported (the version-ranged counterpart of ``register_patch(..., requires=...)``).

Validation stops the run with a message naming file and line: malformed YAML, a missing reason, neither link
nor todo, a link that is not a GitHub issue/PR URL, an unknown class or a glob matching no class (in an entry in
force: one out of force may name the classes of other releases), an unknown backend, a malformed version range, a
(class, backend) listed twice in one file by entries both in force.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import yaml

KINDS = ("export_skip", "onnx_disable_optimize", "generate_skip")
BACKENDS = ("eager", "dynamo", "onnx", "executorch")
#: a GitHub issue or pull request URL: an entry's ``link`` is one, and rows quote it in their skiplist reason
LINK_URL = r"https://github\.com/[\w.-]+/[\w.-]+/(?:issues|pull)/\d+"
LINK = re.compile(f"^{LINK_URL}$")
KEYS = {"class", "classes", "backends", "reason", "link", "todo", "versions", "repro", "tracker"}
TRACKER = re.compile(r"^[\w.-]+/[\w.-]+$")
GLOB = re.compile(r"[*?\[]")


class SkiplistError(ValueError):
    """A skiplist file is malformed; the message names file and line."""


@dataclass(frozen=True)
class SkipEntry:
    kind: str
    classes: tuple[str, ...]  # names and globs
    backends: tuple[str, ...]
    reason: str
    link: str | None
    todo: str | None
    file: str
    line: int
    versions: tuple[tuple[str, str], ...] = ()  # ((package, specifier), ...): where the cause is known
    in_force: bool = True  # the installed versions are inside every range of ``versions`` (checked at load)
    repro: str | None = None  # a script under the skiplists' folder (``repros/x.py``) that shows the failure
    tracker: str | None = None  # ``owner/name`` of the project the bug belongs to

    def applies(self, class_name: str, backend: str) -> bool:
        return (backend in self.backends and any(fnmatch.fnmatchcase(class_name, c) for c in self.classes)
                and self.in_force)

    @property
    def reference(self) -> str:
        return (self.link or f"TODO: {self.todo}") + (f"; repro: {self.repro}" if self.repro else "")

    @property
    def identity(self) -> str:
        """The entry by what it says, not where it sits: ``export_skip: Foo (+2) on onnx,executorch``. Stable when
        lines move and the same on every machine (a packaged skiplist has another path), so a row's fingerprint is."""
        label = self.classes[0] + (f" (+{len(self.classes) - 1})" if len(self.classes) > 1 else "")
        on = "" if set(self.backends) == set(BACKENDS) else f" on {','.join(self.backends)}"
        versions = "".join(f" {package}{spec}" for package, spec in self.versions)
        return f"{self.kind}: {label}{on}{versions}"

    def describe(self) -> str:
        return f"{self.reason} ({self.reference}) [{self.identity}]"


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


def _class_list(item: dict, where: str) -> list[str]:
    if ("class" in item) == ("classes" in item):
        raise SkiplistError(f"{where}: give 'class' (one model class) or 'classes' (a list of names or globs)")
    names = [item["class"]] if "class" in item else item["classes"]
    if isinstance(names, str):
        names = [names]
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
        raise SkiplistError(f"{where}: 'classes' is a non-empty list of model class names or globs")
    return names


def _version_ranges(item: dict, where: str) -> tuple[tuple[str, str], ...]:
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    ranges = item.get("versions", {})
    if not isinstance(ranges, dict) or ("versions" in item and not ranges):
        raise SkiplistError(f"{where}: 'versions' maps package names to version ranges, "
                            f"e.g. {{transformers: \">=5.24\"}}; got {ranges!r}")
    for package, spec in ranges.items():
        try:
            SpecifierSet(str(spec))
        except InvalidSpecifier:
            raise SkiplistError(f"{where}: versions: {package}: {spec!r} is not a version range "
                                f"(PEP 440 specifiers such as \">=5.24\" or \"<1.32,>=1.30\")") from None
    return tuple(sorted((str(p).lower(), str(s)) for p, s in ranges.items()))


def load_skiplist(path: Path, kind: str, known_class: Callable[[str], bool],
                  all_classes: Callable[[], Iterable[str]] = tuple) -> list[SkipEntry]:
    """The entries of one file; ``all_classes()`` lists the names a glob may match (and overlap is checked on)."""
    from engine.versions import installed_in  # here, not at import: engine's package imports torch

    out: list[SkipEntry] = []
    claimed: dict[tuple[str, str], int] = {}
    for line, item in _entries(path):
        where = f"{path}:{line}"
        if not isinstance(item, dict):
            raise SkiplistError(f"{where}: an entry is a mapping with keys {sorted(KEYS)}, got {item!r}")
        unknown = set(item) - KEYS
        if unknown:
            raise SkiplistError(f"{where}: unknown key(s) {sorted(unknown)}; allowed: {sorted(KEYS)}")
        names = _class_list(item, where)
        label = names[0] if len(names) == 1 else f"{names[0]} (+{len(names) - 1})"
        versions = _version_ranges(item, where)
        in_force = installed_in(versions)  # out of force, a class may be one the installed transformers lacks
        matched: list[str] = []
        for name in names:
            if GLOB.search(name):
                hits = fnmatch.filter(all_classes(), name)
                if not hits and in_force:
                    raise SkiplistError(f"{where}: glob {name!r} matches no model class")
                matched += hits
            elif known_class(name):
                matched.append(name)
            elif in_force:
                raise SkiplistError(f"{where}: unknown model class {name!r}")
        reason = item.get("reason")
        if not isinstance(reason, str) or not reason.strip():
            raise SkiplistError(f"{where}: {label}: 'reason' is required")
        link, todo = item.get("link"), item.get("todo")
        if not link and not todo:
            raise SkiplistError(f"{where}: {label}: give 'link' (the upstream issue) or 'todo' (the model change needed)")
        if link and not LINK.match(str(link)):
            raise SkiplistError(f"{where}: {label}: link {link!r} is not a GitHub issue or pull request URL")
        repro, tracker = item.get("repro"), item.get("tracker")
        if repro is not None and not (isinstance(repro, str) and (path.parent / repro).is_file()):
            raise SkiplistError(f"{where}: {label}: repro {repro!r} is not a file beside the skiplists ({path.parent})")
        if tracker is not None and not TRACKER.match(str(tracker)):
            raise SkiplistError(f"{where}: {label}: tracker {tracker!r} is not a GitHub owner/name")
        backends = item.get("backends", ["all"])
        if isinstance(backends, str):
            backends = [backends]
        if not isinstance(backends, list) or not backends:
            raise SkiplistError(f"{where}: {label}: 'backends' is a list of {list(BACKENDS)} or [all]")
        if "all" in backends:
            backends = list(BACKENDS)
        bad = [b for b in backends if b not in BACKENDS]
        if bad:
            raise SkiplistError(f"{where}: {label}: unknown backend(s) {bad}; known: {list(BACKENDS)} or all")
        entry = SkipEntry(kind, tuple(names), tuple(backends), reason.strip(), link, todo, str(path), line, versions,
                          in_force, repro, tracker)
        if in_force:  # entries for other versions may list the same case with the cause found there
            for name in matched:
                for backend in backends:
                    if (name, backend) in claimed:
                        raise SkiplistError(f"{where}: {name} on {backend}: duplicate entry "
                                            f"(first at line {claimed[name, backend]})")
                    claimed[name, backend] = line
        out.append(entry)
    return out


@dataclass
class Skiplists:
    entries: dict[str, list[SkipEntry]]

    def find(self, kind: str, class_name: str, backend: str) -> SkipEntry | None:
        return next((e for e in self.entries.get(kind, []) if e.applies(class_name, backend)), None)

    def all(self) -> Iterable[SkipEntry]:
        for kind in KINDS:
            yield from self.entries.get(kind, [])


def load_skiplists(directory: Path, known_class: Callable[[str], bool],
                   all_classes: Callable[[], Iterable[str]] = tuple) -> Skiplists:
    """Load and validate every skiplist in ``directory``; a missing file is an empty list."""
    entries = {}
    for kind in KINDS:
        path = directory / f"{kind}.yaml"
        entries[kind] = load_skiplist(path, kind, known_class, all_classes) if path.is_file() else []
    return Skiplists(entries)


# ─── Coverage and drafts ─────────────────────────────────────────────────────────────────────────

def listed(row: dict, skiplists: Skiplists) -> SkipEntry | None:
    """The entry that explains a row's failure: export_skip (generate_skip for a generation case), or for an ONNX
    case onnx_disable_optimize (the case runs with the optimiser off instead)."""
    kind = "generate_skip" if row.get("shapes") == "generate" else "export_skip"
    entry = skiplists.find(kind, row["model"], row["backend"])
    if entry is None and row["backend"] == "onnx":
        entry = skiplists.find("onnx_disable_optimize", row["model"], "onnx")
    return entry


def unlisted(rows: Iterable[dict], skiplists: Skiplists) -> list[dict]:
    """The rows that do not pass and that no skiplist entry explains (pass ``latest_rows``: one per case)."""
    from sweep.matrix import NOT_PASSING

    return [r for r in rows if r["status"] in NOT_PASSING and listed(r, skiplists) is None]


def draft(rows: Iterable[dict]) -> str:
    """YAML entries for ``rows`` (unlisted failures), one per error category and set of backends, with ``todo:``
    placeholders: the reasons and links are a person's work, after reading the errors."""
    from sweep.categories import categorize

    by_category: dict[str, dict[str, set[str]]] = {}
    for row in rows:
        by_category.setdefault(categorize(row) or row["status"], {}).setdefault(row["model"], set()).add(row["backend"])
    blocks = []
    for category, classes in sorted(by_category.items(), key=lambda item: (-len(item[1]), item[0])):
        by_backends: dict[tuple[str, ...], list[str]] = {}
        for name, backends in classes.items():
            by_backends.setdefault(tuple(b for b in BACKENDS if b in backends), []).append(name)
        for backends, names in sorted(by_backends.items(), key=lambda item: -len(item[1])):
            blocks.append("\n".join([
                f"# {category} ({len(names)} classes)",
                f"- classes: [{', '.join(sorted(names))}]",
                f"  backends: [{', '.join(backends)}]",
                f"  reason: {yaml.safe_dump('TODO: the cause, as understood: ' + category, width=10**6, allow_unicode=True).strip()}",
                '  todo: "TODO: the change needed, or replace this line with link: <the upstream issue>"',
            ]))
    return "\n\n".join(blocks) + ("\n" if blocks else "")
