"""The zoo's public entry: a tiny random model of any catalogued class, with sample inputs, or a named reason.

``build_case(name, seed=0)`` climbs the shrink ladder (:data:`sweep.zoo.profiles.PROFILES`): for each profile it
shrinks the config, builds the model, synthesises inputs and runs one eager forward; the first profile that
runs (and fits the parameter budget when one does) wins. When none runs, :class:`ZooError` carries the category
of the furthest stage any profile reached: ``config_error`` < ``init_error`` < ``forward_error``, or
``missing_dependency`` with the package named.

Bring your own model: ``build_case(name, config=...)`` takes a ``PreTrainedConfig``, a ``config.json`` path or a
model folder in place of the synthesised config (a folder with weights is loaded with its weights). It is used as
it is; where it does not build or run the inputs, the fields it leaves unset are completed as the catalog's configs
are (:mod:`sweep.zoo.completion`) and recorded in :attr:`Case.config_completed`.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import os
import time
from pathlib import Path
from typing import Any, Callable

import torch

from sweep.zoo import (catalog, completion, conditioning, implicit_default_lessons, init_lessons, input_lessons,
                       inputs, noise, overrides, repairs, ties)
from sweep.zoo.context import Hints, forward_parameters
from sweep.zoo.errors import CONFIG_ERROR, FORWARD_ERROR, INIT_ERROR, STAGE_ORDER, ZooError, as_missing_dependency
from sweep.zoo.profiles import BUDGET_PROFILES, PROFILES, Profile
from sweep.zoo.shrink import shrink_config

logger = logging.getLogger(__name__)

PARAMETER_BUDGET = 5_000_000
MISMATCH_RETRIES = 5
INIT_REPAIRS = 8  # config fixes learned from the model's own __init__ errors, one per rebuild

__all__ = ["Case", "ZooError", "build_case", "PARAMETER_BUDGET"]


@dataclasses.dataclass
class Case:
    """A built model, in eval mode, and inputs its eager forward accepts."""

    name: str
    model: torch.nn.Module
    inputs: dict[str, Any]
    model_type: str
    mappings: tuple[str, ...]
    num_parameters: int
    profile: str
    seconds: float
    source: str = "synthesised"  # or "config" / "pretrained" for a contributor's own model
    #: fields a contributor's config left unset that the build filled, by dotted path ({"pad_token_id": 0})
    config_completed: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def config(self):
        return self.model.config

    def summary(self) -> dict[str, Any]:
        return {"name": self.name, "model_type": self.model_type, "mappings": list(self.mappings),
                "num_parameters": self.num_parameters, "profile": self.profile, "seconds": round(self.seconds, 3),
                "source": self.source, "inputs": sorted(self.inputs),
                **({"config_completed": self.config_completed} if self.config_completed else {})}


def model_class(name: str) -> type:
    """The class, from the top-level namespace or, for a class it does not export, its model type's module."""
    import importlib

    import transformers

    try:
        return getattr(transformers, name)
    except ImportError as exc:
        raise as_missing_dependency(name, exc) from exc
    except AttributeError:
        record = catalog.record(name)
        packages = [t.replace("-", "_") for t in record.all_model_types]
        module_names = [f"transformers.models.{package}.modeling_{package}" for package in packages]
        config_class = getattr(transformers, record.config_class, None) if record.config_class else None
        if config_class is not None:  # a sub-config's type (voxtral_realtime_text) lives in its parent's modeling file
            module_names.append(config_class.__module__.replace(".configuration_", ".modeling_"))
        for module_name in module_names:
            try:
                module = importlib.import_module(module_name)
            except ImportError:
                continue
            if hasattr(module, name):
                return getattr(module, name)
        raise ZooError(name, INIT_ERROR, "transformers does not export this class") from None


def build_case(name: str, seed: int = 0, config: Any = None) -> Case:
    """A tiny random ``name`` model and its inputs; ``config`` brings your own config or model folder."""
    case = _smallest_running_case(name, seed, config)
    case.inputs = _with_rope_positions(case.model, case.inputs)  # once, on the case kept
    if config is None and not conditioning.well_conditioned(case.model, case.inputs):
        case = _well_conditioned_case(name, seed, case)
    return case


def _smallest_running_case(name: str, seed: int, config: Any) -> Case:
    record = catalog.record(name)
    cls = model_class(name)
    start = time.perf_counter()
    if config is not None:
        return _own_case(name, record, cls, config, seed, start)

    rules = overrides.for_class(name, record.model_type)
    failures: list[ZooError] = []
    over_budget: Case | None = None
    for profile in _ladder(rules):
        try:
            model, case_inputs = _untied_model_and_inputs(cls, profile, rules, seed, name)
        except ZooError as exc:
            if exc.category == "missing_dependency":
                raise
            failures.append(exc)
            continue
        case = _case_from_run(name, record, model, case_inputs, profile.name, start, "synthesised")
        if _fits_budget(case, rules):
            return case
        over_budget = over_budget if over_budget and over_budget.num_parameters <= case.num_parameters else case
        break
    if over_budget is not None:
        return _within_budget(name, record, cls, rules, seed, start, over_budget)
    raise max(failures, key=lambda e: STAGE_ORDER.index(e.category))


def _within_budget(name, record, cls, rules, seed, start, case: Case) -> Case:
    """Re-shrink harder while over the parameter budget; the smallest case that runs wins."""
    for profile in BUDGET_PROFILES:
        try:
            model, case_inputs = _untied_model_and_inputs(cls, profile, rules, seed, name)
        except ZooError:
            continue
        smaller = _case_from_run(name, record, model, case_inputs, profile.name, start, "synthesised")
        if smaller.num_parameters < case.num_parameters:
            case = smaller
    case.seconds = time.perf_counter() - start
    return case


def _well_conditioned_case(name: str, seed: int, case: Case) -> Case:
    """``case``, whose float32 eager is further from float64 eager than the sweep's tolerance
    (:mod:`sweep.zoo.conditioning`), or the class built at the first other profile, smallest first, that runs,
    fits the parameter budget and is well conditioned; failing that, the first well-conditioned one over the
    budget (a sample the comparison cannot judge is worth less than parameters over the budget)."""
    record = catalog.record(name)
    cls = model_class(name)
    rules = overrides.for_class(name, record.model_type)
    start = time.perf_counter()
    over_budget: Case | None = None
    for profile in _ladder(rules, (*BUDGET_PROFILES, *PROFILES)):
        if profile.name == case.profile:
            continue
        try:
            model, case_inputs = _untied_model_and_inputs(cls, profile, rules, seed, name)
        except ZooError:
            continue
        other = _case_from_run(name, record, model, case_inputs, profile.name, start, "synthesised")
        over = not _fits_budget(other, rules)
        if over and over_budget is not None:
            continue
        other.inputs = _with_rope_positions(model, other.inputs)
        if not conditioning.well_conditioned(model, other.inputs):
            continue
        if over:
            over_budget = other
            continue
        return _conditioned(other, case)
    return case if over_budget is None else _conditioned(over_budget, case)


def _conditioned(other: Case, case: Case) -> Case:
    logger.info("%s: float32 eager rounds past the tolerance at profile %s; built at %s (%d parameters)",
                case.name, case.profile, other.profile, other.num_parameters)
    other.seconds += case.seconds
    return other


def _ladder(rules: dict, profiles: tuple[Profile, ...] = PROFILES) -> list[Profile]:
    """``profiles`` in order, restricted to those an override names."""
    names = rules.get("profiles")
    return [p for p in profiles if names is None or p.name in names]


def _fits_budget(case: Case, rules: dict) -> bool:
    return case.num_parameters <= PARAMETER_BUDGET or bool(rules.get("over_budget"))


def _case_from_run(name, record, model, case_inputs, profile, start, source) -> Case:
    """The :class:`Case` of a model and the inputs it ran, timed from ``start``."""
    return Case(name=name, model=model, inputs=case_inputs, model_type=record.model_type,
                mappings=record.mappings, num_parameters=sum(p.numel() for p in model.parameters()),
                profile=profile, seconds=time.perf_counter() - start, source=source)


def _with_rope_positions(model: torch.nn.Module, case_inputs: dict[str, Any]) -> dict[str, Any]:
    """The inputs plus the M-RoPE ``position_ids`` the model computes in a loop torch.export cannot trace
    (:func:`engine.with_rope_position_ids`), as serving runtimes pass them; kept only where eager's outputs with them
    are bit-identical to eager's without, so the case tests the same computation."""
    from engine import with_rope_position_ids
    from engine.pytree import get_leaf_tensors

    try:
        with_positions = with_rope_position_ids(model, case_inputs)
    except Exception as exc:  # noqa: BLE001 - the model cannot derive them from these inputs: it computes its own
        logger.info("%s: no M-RoPE position_ids from these inputs (%s: %s)", type(model).__name__,
                    type(exc).__name__, exc)
        return case_inputs
    if with_positions is case_inputs:
        return case_inputs
    with torch.no_grad():
        without = get_leaf_tensors(model(**copy.deepcopy(case_inputs)))
        given = get_leaf_tensors(model(**copy.deepcopy(with_positions)))
    if without.keys() == given.keys() and all(torch.equal(without[k], given[k]) for k in without):
        return with_positions
    logger.warning("%s: eager differs with its own compute_3d_position_ids as position_ids; not passed",
                   type(model).__name__)
    return case_inputs


def _untied_model_and_inputs(cls: type, profile: Profile, rules: dict, seed: int, name: str):
    """``(model, inputs)`` from :func:`_model_and_running_inputs`, the model rebuilt wider where its top-k selections
    tie (:func:`_without_tied_selections`)."""
    model, case_inputs = _model_and_running_inputs(cls, profile, rules, seed, name)
    return _without_tied_selections(cls, model, case_inputs, seed), case_inputs


def _without_tied_selections(cls: type, model: torch.nn.Module, case_inputs: dict[str, Any], seed: int):
    """``model``, or where one of its eager top-k selections ties (:mod:`sweep.zoo.ties`) the same config built
    with the least wider initialisation (:data:`sweep.zoo.ties.WIDENINGS`) that runs these inputs, selects among
    distinct scores and stays well conditioned; ``model`` if none does."""
    if not ties.tied_selections(model, case_inputs):
        return model
    for factor in ties.WIDENINGS:
        config = copy.deepcopy(model.config)
        ties.widened(config, factor)
        try:
            torch.manual_seed(seed)
            rebuilt = cls(config).eval()
            ties.redraw_constant_matrices(rebuilt, getattr(config, "initializer_range", None) or 0.02 * factor, seed)
            if ties.tied_selections(rebuilt, case_inputs) or not conditioning.well_conditioned(rebuilt, case_inputs):
                continue
        except Exception as exc:  # noqa: BLE001 - the wider model does not run these inputs: keep the one that does
            logger.info("%s: rebuilt without tied selections, it fails: %s: %s", cls.__name__, type(exc).__name__, exc)
            return model
        logger.info("%s: its top-k selections tie; rebuilt with initializer_range x%g", cls.__name__, factor)
        return rebuilt
    return model


def _model_and_running_inputs(cls: type, profile: Profile, rules: dict, seed: int, name: str):
    """``(model, inputs)``: the model built (:func:`_built_model`) and the first inputs its forward runs; a forward
    error naming a default the modeling code assumes rebuilds it once with that default."""
    model = _built_model(cls, profile, rules, seed, name)
    try:
        return model, _first_running_inputs(model, seed, name)
    except ZooError as exc:
        implicit = None
        if exc.category == FORWARD_ERROR:
            for message in [exc.message, *getattr(exc, "all_errors", [])]:
                implicit = implicit or implicit_default_lessons.implicit_default_from_error(message)
            implicit = implicit or getattr(exc, "implicit", None)
        if implicit is None:
            raise
    model = _built_model(cls, profile, rules, seed, name, implicit)
    return model, _first_running_inputs(model, seed, name)


def _built_model(cls: type, profile: Profile, rules: dict, seed: int, name: str,
                 implicit: dict | None = None) -> torch.nn.Module:
    """The model in eval mode, its config shrunk to ``profile``; an ``__init__`` error that names what the default
    lacks rebuilds with it (:func:`sweep.zoo.init_lessons.learn_from_init_error`)."""
    learned: dict = {}
    for attempt in range(INIT_REPAIRS + 1):
        config_overrides = repairs.merge(rules.get("config") or {}, learned)
        try:
            config = shrink_config(cls.config_class, profile, config_overrides or None, implicit_defaults=implicit)
        except ImportError as exc:
            raise as_missing_dependency(name, exc) from exc
        except Exception as exc:  # noqa: BLE001 - any failure of the config class's own validation is the reason
            raise ZooError(name, CONFIG_ERROR, f"[{profile.name}] {type(exc).__name__}: {exc}") from exc
        try:
            torch.manual_seed(seed)
            with _init_warnings() as warned:
                model = cls(config)
        except ImportError as exc:
            raise as_missing_dependency(name, exc) from exc
        except Exception as exc:  # noqa: BLE001
            fix = init_lessons.learn_from_init_error(exc, config, profile) if attempt < INIT_REPAIRS else None
            if _teaches(learned, fix):
                learned = repairs.merge(learned, fix)
                continue
            raise ZooError(name, INIT_ERROR, f"[{profile.name}] {type(exc).__name__}: {exc}") from exc
        # the class built but warned that it needs a flag: build it again with the flag
        fix = next(filter(None, (init_lessons.required_flag(message, config) for message in warned)), None)
        if attempt < INIT_REPAIRS and _teaches(learned, fix):
            learned = repairs.merge(learned, fix)
            continue
        return model.eval()
    raise AssertionError("unreachable")


def _teaches(learned: dict, fix: dict | None) -> bool:
    """Whether ``fix`` adds something to the overrides ``learned`` so far (a rebuild would differ)."""
    return bool(fix) and repairs.merge(learned, fix) != learned


@contextlib.contextmanager
def _init_warnings():
    """The messages transformers logs at WARNING while a model is built (a head class names a flag it needs)."""
    messages: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())

    handler = Collect(logging.WARNING)
    logger = logging.getLogger("transformers")
    level = logger.level
    disabled = logging.root.manager.disable
    logger.addHandler(handler)
    # neither TRANSFORMERS_VERBOSITY=error nor logging.disable() may change the models the zoo builds
    if level > logging.WARNING:
        logger.setLevel(logging.WARNING)
    if disabled >= logging.WARNING:
        logging.disable(logging.INFO)
    try:
        yield messages
    finally:
        logging.disable(disabled)
        logger.setLevel(level)
        logger.removeHandler(handler)


def _first_running_inputs(model: torch.nn.Module, seed: int, name: str) -> dict[str, Any]:
    """The first candidate inputs whose eager forward runs; the model's own errors refine the next round.

    Every candidate of a round is tried before the first lesson learned from their errors is applied, so a new
    lesson never hides a layout that already runs.
    """
    hints = Hints(extra=tuple(overrides.for_class(name, getattr(model.config, "model_type", "")).get("inputs", ())))
    errors: list[str] = []
    implicit: dict | None = None  # a config value the model's own errors asked for (rebuilt once with it)
    for _ in range(MISMATCH_RETRIES + 1):
        refined: Hints | None = None
        for candidate in inputs.candidate_inputs(model, seed, hints):
            try:
                if "noise" in forward_parameters(model) and "noise" not in candidate:
                    return _with_caller_noise(model, candidate, seed)
                with torch.no_grad():
                    output = model(**candidate)
                return _processor_layout(model, seed, candidate, output, hints)
            except ImportError as exc:
                raise as_missing_dependency(name, exc) from exc
            except Exception as exc:  # noqa: BLE001 - the first error is reported if no candidate runs
                errors.append(f"{type(exc).__name__}: {exc}")
                implicit = implicit or implicit_default_lessons.config_lesson(exc, candidate)
                if refined is None:
                    trial = copy.deepcopy(hints)
                    if input_lessons.refine_hints(trial, exc, candidate, model):
                        refined = trial
                del exc
        if refined is None:
            break
        hints = refined
    error = ZooError(name, FORWARD_ERROR, errors[0] if errors else "no inputs synthesised")
    error.all_errors = errors  # every candidate's error: a later layout may name an implicit default
    error.implicit = implicit
    raise error


def _processor_layout(model: torch.nn.Module, seed: int, candidate: dict[str, Any], output: Any,
                      hints: Hints) -> dict[str, Any]:
    """``candidate``, or the inputs with the placeholders expanded as the processor writes them when the forward
    expanded them itself (:func:`sweep.zoo.input_lessons.placeholders_expanded_inside`) and the expanded inputs run
    with an output as long as their text."""
    expanded = input_lessons.placeholders_expanded_inside(model, candidate, output, hints)
    others = inputs.candidate_inputs(model, seed, expanded) if expanded is not None else []
    if not others:
        return candidate
    try:
        with torch.no_grad():
            again = model(**others[0])
    except Exception:  # noqa: BLE001 - the legacy layout ran: keep it
        return candidate
    still_expanded_inside = input_lessons.placeholders_expanded_inside(model, others[0], again, Hints())
    return others[0] if still_expanded_inside is None else candidate


def _with_caller_noise(model: torch.nn.Module, candidate: dict[str, Any], seed: int) -> dict[str, Any]:
    """``candidate`` (whose forward must run) plus the ``noise`` its forward would otherwise draw itself, when it
    drew exactly one tensor and draws nothing once given it (:mod:`sweep.zoo.noise`)."""
    value = noise.noise_for(noise.run_recording_draws(model, candidate), seed)
    if value is None:
        return candidate
    given = {**candidate, "noise": value}
    try:
        still_drawn = noise.run_recording_draws(model, given)
    except Exception as exc:  # noqa: BLE001 - the forward rejects it: compare as it was
        logger.debug("%s: the forward rejects noise of shape %s: %s", type(model).__name__, tuple(value.shape), exc)
        return candidate
    return candidate if still_drawn else given


# -- bring your own model -------------------------------------------------------------------------------------


def _own_case(name: str, record, cls: type, config: Any, seed: int, start: float) -> Case:
    """The contributor's model, built from its config as it is; where that does not build or run the sweep's
    inputs, built again with the fields the config leaves unset completed as the catalog's configs are
    (:func:`sweep.zoo.completion.build_completed`), what was filled recorded in :attr:`Case.config_completed`.
    Where nothing is completed, or the completed config fails too, the error is the config's as it is."""
    own, build, source = _own_config(cls, config)
    completed: dict[str, Any] = {}
    try:
        torch.manual_seed(seed)
        model = build(own).eval()
        case_inputs = _first_running_inputs(model, seed, name)
    except Exception as as_given:
        missing = isinstance(as_given, ZooError) and as_given.category == "missing_dependency"
        if missing or isinstance(as_given, ImportError):
            raise
        try:
            model, completed = completion.build_completed(build, own, seed)
            case_inputs = _first_running_inputs(model, seed, name) if completed else {}
        except Exception as exc:  # noqa: BLE001 - the config as it is is what the contributor reads about
            logger.info("%s: fails with its config completed too: %s: %s", name, type(exc).__name__, exc)
            completed = {}
        if not completed:
            raise
    case = _case_from_run(name, record, model, case_inputs, "own", start, source)
    case.config_completed = completed
    return case


def _own_config(cls: type, config: Any) -> tuple[Any, Callable[[Any], torch.nn.Module], str]:
    """The contributor's config, how the model is built from it, and the source: ``config`` (a config object or a
    ``config.json``: random init) or ``pretrained`` (a folder with weights, loaded with them; read as the class's own
    config class, as ``from_pretrained`` reads it, so that a completed one can be passed in its place)."""
    from transformers import AutoConfig, PreTrainedConfig

    if isinstance(config, PreTrainedConfig):
        return config, cls, "config"
    path = Path(os.fspath(config))
    folder = path if path.is_dir() else path.parent
    if not (path.is_dir() and any(folder.glob("*.safetensors")) or any(folder.glob("pytorch_model*.bin"))):
        return AutoConfig.from_pretrained(folder if path.is_dir() else path, local_files_only=True), cls, "config"
    own = cls.config_class.from_pretrained(folder, local_files_only=True)

    def load(given: Any) -> torch.nn.Module:
        return cls.from_pretrained(folder, local_files_only=True, **({"config": given} if given is not own else {}))

    return own, load, "pretrained"
