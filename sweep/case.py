"""One sweep case, run inside an isolated child process: build, eager, export, save, load, run, compare.

``run_case(spec, progress)`` returns a plain dict (a result row without the bookkeeping fields). Before each
stage it calls ``progress(stage)`` so that the parent knows where a crash or a hang happened.

Statuses: ``pass``; ``discrepancy`` (ran, some leaf outside the tolerance); ``fail`` (with the stage);
``skip``; ``timeout`` and ``crash`` are decided by the parent (:mod:`sweep.isolation`).
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import inspect
import tempfile
import sys
import time
import traceback
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from sweep import shared_build

STAGES = ("build", "eager", "export", "save", "load", "run", "compare")
EXPORT_FORMATS = {"dynamo": "dynamo", "onnx": "onnx", "executorch": "executorch"}
GENERATE = "generate"  # the shapes label of a generation case
GENERATE_TOKENS = 8
#: ExecuTorch plans memory for every dynamic dim's upper bound; at a model's own limits (Gemma3: 4094 tokens)
#: one tiny case planned 7.5 GB and spent 24 s allocating it at load. The sweep runs a sequence at its traced
#: length and shorter, so it bounds sequence dims at 8 x a text sample's length (``ExecutorchConfig.max_seq_len``).
EXECUTORCH_MAX_SEQ_LEN = 64
#: torch's generator is set to this seed before each eager run and each run of an artifact (:func:`same_draws`)
RUN_SEED = 0


class StageClock:
    """Seconds per stage; ``enter`` also tells the parent which stage is running."""

    def __init__(self, progress: Callable[[str], None]):
        self.progress = progress
        self.stage = "build"
        self.seconds: dict[str, float] = {}
        self._started: float | None = None

    def enter(self, stage: str) -> None:
        self.stop()
        self.stage, self._started = stage, time.perf_counter()
        self.progress(stage)

    def stop(self) -> None:
        if self._started is not None:
            elapsed = time.perf_counter() - self._started
            self.seconds[self.stage] = round(self.seconds.get(self.stage, 0.0) + elapsed, 4)
            self._started = None


def second_shape(inputs: dict[str, Any], drop_tokens: int = 2) -> dict[str, Any]:
    """The sample inputs at another batch size (rows 0, 1, 0) and, for text-only inputs, a shorter sequence.

    Reindexing rows keeps every per-sample constraint of the synthesised inputs (placeholder tokens, image
    counts per sample); the sequence is only shortened when no image/audio/video tensor could depend on it.
    """
    ids = inputs.get("input_ids")
    batch = next((v.shape[0] for v in inputs.values() if isinstance(v, torch.Tensor) and v.ndim), None)
    text_only = all(not k.startswith(("pixel", "input_features", "input_values", "image", "video", "audio")) for k in inputs)
    seq = ids.shape[1] if isinstance(ids, torch.Tensor) and ids.ndim == 2 and text_only else None
    rows = torch.tensor([0, 1, 0]) if batch == 2 else None
    out = {}
    for key, value in inputs.items():
        if isinstance(value, torch.Tensor) and value.ndim:
            if rows is not None and key == "position_ids" and value.ndim == 3 and value.shape[1] == batch:
                value = value.index_select(1, rows)  # M-RoPE positions, (sections, batch, seq): per row
            elif rows is not None and value.shape[0] == batch:
                value = value.index_select(0, rows)
            if seq is not None and seq > drop_tokens + 2 and value.ndim >= 2 and value.shape[1] == seq:
                value = value[:, : seq - drop_tokens].clone()
        out[key] = value
    return out


@contextlib.contextmanager
def same_draws():
    """torch's generator at :data:`RUN_SEED` for one run, restored after it: a model that samples at inference
    (SpeechT5's prenet dropout, VibeVoice's latent noise) draws the same numbers in eager and in a program that runs
    its random ops on torch's generator (a ``.pt2``); ONNX and ExecuTorch runtimes draw their own."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(RUN_SEED)
        yield


def _eager(model: torch.nn.Module, inputs: dict[str, Any]) -> dict[str, torch.Tensor]:
    from engine import get_leaf_tensors

    with torch.no_grad(), same_draws():
        return {k: v.detach().clone() for k, v in get_leaf_tensors(model(**copy.deepcopy(inputs))).items()}


def _config(spec: dict[str, Any]) -> dict[str, Any]:
    """The export config of a case; no node stack traces (the sweep never reads them, and they cost up to a third
    of a trace: :class:`engine.DynamoConfig`)."""
    config: dict[str, Any] = {"export_format": EXPORT_FORMATS[spec["backend"]], "dynamic": spec["shapes"] == "dynamic",
                              "stack_traces": False}
    if spec["backend"] == "onnx":
        config["optimize"] = not spec.get("onnx_disable_optimize", False)
    if spec["backend"] == "executorch":
        config["max_seq_len"] = EXECUTORCH_MAX_SEQ_LEN
    return config


def generation_config(spec: dict[str, Any], length: int | None = None) -> dict[str, Any]:
    """The export config of a generation case: the export cases' backend settings (the ONNX optimiser switch of
    ``onnx_disable_optimize.yaml``), always with dynamic shapes. On ExecuTorch, ``max_seq_len`` is the ``length``
    the generation reaches (prompt plus new tokens: eager generate()'s output, plus the positions the prefill caches
    before the prompt: GIT's image tokens), as an ExecuTorch LLM export states its context length, not the export
    cases' bound: the cache grows past the prompt, and without it the memory budget may lower the cache's bound
    below what the generation needs (Aria's 131-token image prompt got 138 where the last step needs 139)."""
    config = {**_config(spec), "dynamic": True}
    config.pop("max_seq_len", None)
    if spec["backend"] == "executorch" and length is not None:
        config["max_seq_len"] = max(int(length), 2)
    return config


def _save_and_load(backend: str, artifact: Any, workdir: Path, enter: Callable[[str], None]) -> Any:
    """Write the artifact to disk and return what the runtime loads it from (a path, or a loaded program)."""
    from engine.artifacts import SUFFIX, load_artifact, save_artifact

    path = workdir / f"model{SUFFIX[backend]}"
    enter("save")
    save_artifact(artifact, path)
    enter("load")
    return load_artifact(path)


def _generate_reads_the_start_token(model: torch.nn.Module) -> bool:
    """Whether the model's class has a ``generate()`` of its own (not transformers' shared one, which reads the
    start token for encoder-decoders only) that reads the decoder start token."""
    from sweep.zoo.generation_prompt import own_generate

    own = own_generate(model)
    if own is None:
        return False
    try:
        return "_decoder_start_token_tensor" in inspect.getsource(own)
    except (OSError, TypeError):
        return False


def _set_decoder_start_token(model: torch.nn.Module, result: dict[str, Any]) -> None:
    """Hub checkpoints ship a ``generation_config.json`` naming the decoder start token; a model built from a
    config has none, and an encoder-decoder's ``generate()`` then refuses to start. Use the pad token (T5's
    convention), else the bos token, and record the choice in the row. A decoder-only model whose own
    ``generate()`` reads the start token (MusicGen's decoder offsets its codebooks by it: ``build_delay_pattern_mask``
    multiplies by ``None`` otherwise) gets the pad token too (MusicGen's checkpoints start from it); the bos token
    stands in for it only in an encoder-decoder (transformers' fallback)."""
    generation_config = getattr(model, "generation_config", None)
    config = getattr(model, "config", None)
    encoder_decoder = getattr(config, "is_encoder_decoder", False)
    if generation_config is None or not (encoder_decoder or _generate_reads_the_start_token(model)):
        return
    if generation_config.decoder_start_token_id is not None or (encoder_decoder and generation_config.bos_token_id is not None):
        return
    decoder = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    start = next((t for t in (getattr(decoder, "pad_token_id", None), getattr(config, "pad_token_id", None)) if t is not None), 0)
    generation_config.decoder_start_token_id = start
    result["note"] = f"no decoder start token configured: used {start} (the pad token, T5's convention)"


def _cached_positions_before_the_prompt(model: torch.nn.Module, inputs: dict[str, Any]) -> int:
    """How many more positions a decoder's prefill caches than the prompt has ids: the image tokens GIT prepends to
    the text. 0 for an encoder-decoder (its decoder starts from the start token), a cache holding the prompt only,
    or a forward that cannot run on the prompt alone or returns no cache (generate() then says what it needs)."""
    ids = inputs.get("input_ids")
    if ids is None or getattr(getattr(model, "config", None), "is_encoder_decoder", False):
        return 0
    try:
        with torch.no_grad():
            cache = getattr(model(**copy.deepcopy(inputs), use_cache=True), "past_key_values", None)
        cached = int(cache.get_seq_length()) if cache is not None else 0
    except Exception:  # only a bound hint: the prompt-plus-tokens length stands
        return 0
    return max(0, cached - ids.shape[-1])


def _run_generation(spec: dict[str, Any], case: Any, enter: Callable[[str], None], result: dict[str, Any]) -> None:
    """Greedy tokens of ``engine.generate`` over the exported components against eager ``generate``."""
    from engine import AutoExporter, AutoExportConfig, generate, generation_position_ids

    from sweep.zoo.generation_prompt import generation_prompt

    _set_decoder_start_token(case.model, result)  # before the prompt: trying a prompt layout runs generate()
    inputs = generation_prompt(case.model, case.inputs, spec.get("seed", 0))
    enter("eager")
    with torch.no_grad():
        # one sequence per prompt, stated: a generate() of the model's own (MusicGen's) reads the unset default raw
        expected = case.model.generate(**copy.deepcopy(inputs), do_sample=False, num_beams=1, num_return_sequences=1,
                                       max_new_tokens=GENERATE_TOKENS)
    enter("export")
    length = expected.shape[-1]
    if spec["backend"] == "executorch":  # the context the cache bound must hold
        length += _cached_positions_before_the_prompt(case.model, inputs)
    config = AutoExportConfig.from_dict(generation_config(spec, length=length))
    components = AutoExporter.from_config(config).export_for_generation(case.model, inputs, config=config)
    result["components"] = sorted(components)
    enter("run")
    positions = generation_position_ids(case.model, inputs)  # host work, where the model computes its own
    prompt = inputs if positions is None else {**inputs, "position_ids": positions}
    got = generate(components, prompt, config=config, max_new_tokens=GENERATE_TOKENS)
    enter("compare")
    result["tokens"] = {"expected": expected.tolist(), "got": got.tolist()}
    if got.shape != expected.shape or not torch.equal(got, expected):
        if got.shape == expected.shape:
            row, position = (got != expected).nonzero()[0].tolist()
            where = f"first at row {row}, position {position}"
        else:
            where = f"shapes {tuple(got.shape)} vs {tuple(expected.shape)}"
        result.update(status="discrepancy", stage="compare",
                      error=f"generated tokens differ from eager greedy generate ({where})")


@dataclass
class LocalCase:
    """A model from a ``--model-module``: ``SWEEP_MODELS[name](seed) -> (model, inputs)``."""

    model: torch.nn.Module
    inputs: dict[str, Any]
    model_type: str = "local"
    mappings: tuple[str, ...] = ()

    @property
    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())


def _stand_in_exporter(path: str) -> Callable[[torch.nn.Module, dict, dict], Any]:
    """``"module:function"``: an exporter measured by the same harness instead of the engine (the peer
    comparison in ``bench/peer_sweep.py``); it takes ``(model, inputs, config_dict)`` and returns an artifact
    :func:`engine.run_exported` runs, or a plain function ``inputs -> model outputs`` that runs its own."""
    module, _, function = path.partition(":")
    return getattr(importlib.import_module(module), function)


def _build(spec: dict[str, Any]):
    if spec.get("model_module"):
        if spec.get("module_path") and spec["module_path"] not in sys.path:
            sys.path.insert(0, spec["module_path"])
        model, inputs = importlib.import_module(spec["model_module"]).SWEEP_MODELS[spec["model"]](spec.get("seed", 0))
        return LocalCase(model.eval(), inputs)
    from sweep.zoo.build import build_case

    if spec.get("config"):  # --config PATH: the user's config, as it is, with synthesised inputs
        return build_case(spec["class"], seed=spec.get("seed", 0), config=spec["config"])
    return build_case(spec["model"], seed=spec.get("seed", 0))


def run_case(spec: dict[str, Any], progress: Callable[[str], None] = lambda stage: None) -> dict[str, Any]:
    """Run one case; ``spec`` has model, backend, shapes, atol, rtol, seed (and onnx_disable_optimize).

    One function over 80 lines on purpose: the stages (build, eager, export, save/load, run, compare) share one
    ``try`` so that whatever a stage raises is reported with the stage the clock is in, and read top to bottom in
    the order a case runs them; each stage's work is already a helper (``_build``, ``_eager``, ``_save_and_load``).
    """
    from engine import AutoExporter, AutoExportConfig, ExportStageError, get_leaf_tensors, run_exported
    from engine.compare import compare_leaves
    from sweep.zoo.errors import ZooError

    clock = StageClock(progress)
    enter = clock.enter
    result: dict[str, Any] = {"status": "pass", "stage": None, "seconds": clock.seconds}

    shared = Path(spec["shared_build"]) if spec.get("shared_build") else None
    claimed = False
    try:
        enter("build")
        # with several backends, one case per class builds and runs eager; the others load what it stored
        payload, claimed = shared_build.claim_or_load(shared) if shared else (None, False)
        case = payload["case"] if payload else _build(spec)
        result.update(model_type=case.model_type, mappings=list(case.mappings), num_parameters=case.num_parameters)
        if getattr(case, "config_completed", None):  # what a contributor's config left unset and the build filled
            result["config_completed"] = case.config_completed
        if spec["shapes"] == GENERATE:
            _run_generation(spec, case, enter, result)
            return result
        second = spec["shapes"] == "dynamic" and spec["backend"] != "eager"
        if payload:
            shapes, expected = payload["shapes"], payload["expected"]
            result.update(payload["notes"], shared_build="loaded")
        else:
            enter("eager")
            # a case building for the other backends also runs the second shape they compare
            shapes, expected = _eager_shapes(case, second or (claimed and spec.get("shared_second", False)), result)
            if claimed:
                notes = {k: result[k] for k in ("second_shape",) if k in result}
                stored = shared_build.store(shared, {"case": case, "shapes": shapes, "expected": expected, "notes": notes})
                result["shared_build"] = "stored" if stored else "not stored: the case cannot be pickled"
                claimed = False
        if not second:  # this case compares the traced sample only
            shapes = shapes[:1]
            result.pop("second_shape", None)
        if spec["backend"] == "eager":
            return result

        enter("export")
        if spec.get("exporter"):
            artifact = _stand_in_exporter(spec["exporter"])(case.model, dict(case.inputs), _config(spec))
        else:
            config = AutoExportConfig.from_dict(_config(spec))
            artifact = AutoExporter.from_config(config).export(case.model, case.inputs, config=config)

        with tempfile.TemporaryDirectory(prefix="sweep-") as tmp:
            # a stand-in exporter's artifact runs in memory (its own pytree registrations need not serialise)
            loaded = artifact if spec.get("exporter") else _save_and_load(spec["backend"], artifact, Path(tmp), enter)
            diffs, worst = {}, None
            for label, inputs in shapes:
                enter("run")
                with same_draws():
                    if isinstance(loaded, types.FunctionType):  # a stand-in exporter's own runtime
                        got = get_leaf_tensors(loaded(dict(inputs)))
                    else:
                        got = run_exported(loaded, inputs)
                enter("compare")
                comparison = compare_leaves(expected[label], got, atol=spec["atol"], rtol=spec["rtol"])
                for leaf in comparison.leaves:
                    diffs[f"{label}:{leaf.name}"] = {"max_abs": leaf.max_abs, "max_rel": leaf.max_rel, "ok": leaf.ok,
                                                     **({"problem": leaf.problem} if leaf.problem else {})}
                if not comparison.ok and worst is None:
                    worst = f"{label} shape: {comparison}"
            result["diffs"] = diffs
            result["shapes_run"] = [label for label, _ in shapes]
            if worst:
                result.update(status="discrepancy", stage="compare", error=worst[:2000])
    except ZooError as e:
        result.update(status="fail", stage="build", error_type=e.category, error=str(e)[:2000], package=e.package)
    except Exception as e:
        failed = e.stage if isinstance(e, ExportStageError) and e.stage in STAGES else clock.stage
        cause = e.__cause__ if isinstance(e, ExportStageError) and e.__cause__ else e
        result.update(
            status="fail",
            stage=failed,
            error_type=type(cause).__name__,
            error=f"{type(cause).__name__}: {cause}"[:2000],
            traceback="".join(traceback.format_exception(cause))[-4000:],
        )
    finally:
        clock.stop()
        if claimed:  # it failed before storing: the class's other cases build it themselves
            shared_build.give_up(shared)
    return result


def _eager_shapes(case: Any, second: bool, result: dict[str, Any]) -> tuple[list[tuple[str, dict]], dict[str, dict]]:
    """The shapes a case compares (the traced sample, and the second shape when ``second``) and eager's outputs
    at each; a second shape eager rejects falls back to batch only, or is dropped with a note in ``result``."""
    shapes = [("traced", case.inputs)]
    if second:
        shapes.append(("second", second_shape(case.inputs)))
    expected = {}
    for label, inputs in shapes:
        try:
            expected[label] = _eager(case.model, inputs)
        except Exception as e:  # the second shape is ours, not the model's: fall back to batch only
            if label == "traced":
                raise
            fallback = second_shape(case.inputs, drop_tokens=0)
            try:
                expected[label] = _eager(case.model, fallback)
                shapes[1] = ("second", fallback)
            except Exception:
                shapes.pop()
                result["second_shape"] = f"not run: eager rejects it ({type(e).__name__}: {str(e)[:200]})"
    return shapes, expected
