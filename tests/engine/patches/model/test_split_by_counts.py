"""Per-sample splits by a ``.tolist()`` of counts, recompiled as one ragged value (engine.patches.model.split_by_counts)."""

from __future__ import annotations

import functools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.pytree import get_leaf_tensors
from engine.patches.model.split_by_counts import rewrite_split_by_tolist
from engine.stacked_rows import RaggedRows, expand_stacked_rows


def _decorated(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)

    return wrapper


class PerSampleImages(torch.nn.Module):
    """Idefics3's pattern: the real images of each sample (a zero image is padding), projected, split per sample
    by ``tolist()`` of the per-sample counts and concatenated again for the text model."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)

    @_decorated
    def get_image_features(self, pixel_values):
        batch, images = pixel_values.shape[:2]
        flat = pixel_values.view(batch * images, *pixel_values.shape[2:])
        real = (flat == 0.0).sum(dim=(-1, -2)) != flat.shape[1:].numel()
        per_sample = real.view(batch, images).sum(dim=1)
        features = self.proj(flat[real])
        return [f.reshape(-1, f.shape[-1]) for f in features.split(per_sample.tolist())]

    def forward(self, pixel_values):
        pooled = self.get_image_features(pixel_values)
        return {"merged": torch.cat(pooled, dim=0).sum(-1), "pooler_output": pooled}


class PerSampleTiles(torch.nn.Module):
    """GraniteDocling's pattern: ``sizes = (...).tolist()`` then ``torch.split(rows, sizes)``, twice (the first in
    Lfm2-VL's ``list(torch.split(...))``)."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)

    def get_image_features(self, tiles, tile_mask):
        tiles_per_sample = tile_mask.sum(-1)
        rows = self.proj(tiles[tile_mask]).flatten(0, 1)
        split_sizes = (tiles_per_sample * tiles.shape[2]).tolist()
        return list(torch.split(rows, split_sizes)), [torch.split(r, split_sizes) for r in (rows + 1, rows * 2)]

    def forward(self, tiles, tile_mask):
        pooled, deep = self.get_image_features(tiles, tile_mask)
        return {"merged": torch.cat(pooled, dim=0), "deep": [torch.cat(d, dim=0) for d in deep],
                "pooler_output": pooled, "deepstack": deep}


class PerImageSizes(torch.nn.Module):
    """LightOnOCR's pattern: the split sizes are a list over the rows of ``image_sizes`` (integer arithmetic of each
    image's height and width)."""

    ratio = 4

    def get_image_features(self, features, image_sizes):
        downsample_ratio = self.ratio
        split_sizes = [(height // downsample_ratio) * (width // downsample_ratio) for height, width in image_sizes]
        return torch.split(features, split_sizes)

    def forward(self, features, image_sizes):
        pooled = self.get_image_features(features, image_sizes)
        return {"merged": torch.cat(pooled, dim=0), "pooler_output": pooled}


class Rewritten(PerSampleImages):
    get_image_features = rewrite_split_by_tolist(PerSampleImages.get_image_features)


class RewrittenTiles(PerSampleTiles):
    get_image_features = rewrite_split_by_tolist(PerSampleTiles.get_image_features)


class RewrittenSizes(PerImageSizes):
    get_image_features = rewrite_split_by_tolist(PerImageSizes.get_image_features)


def _images(counts: list[int], slots: int, seed: int = 0) -> torch.Tensor:
    """One sample per count: ``count`` random images, then zero images up to ``slots``."""
    g = torch.Generator().manual_seed(seed)
    pixel_values = torch.zeros(len(counts), slots, 3, 4)
    for i, count in enumerate(counts):
        pixel_values[i, :count] = torch.rand(count, 3, 4, generator=g) + 0.1
    return pixel_values


def _tiles(counts: list[int], slots: int, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    mask = torch.arange(slots)[None, :] < torch.tensor(counts)[:, None]
    return {"tiles": torch.randn(len(counts), slots, 2, 4, generator=g), "tile_mask": mask}


def test_only_the_pattern_is_rewritten():
    assert Rewritten.get_image_features is not PerSampleImages.get_image_features
    assert rewrite_split_by_tolist(PerSampleImages.forward) is PerSampleImages.forward  # nothing to rewrite
    model = Rewritten().eval()
    pooled = model.get_image_features(_images([2, 1], 3))
    assert isinstance(pooled, RaggedRows) and len(pooled) == 1
    assert pooled.counts.tolist() == [6, 3]  # images x rows per image


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=1, max_size=4), st.integers(0, 2**16))
def test_the_ragged_value_reads_as_the_list_it_replaces(counts, seed):
    """Eager outputs of the rewritten function, named as the caller sees them, equal the original's for any
    per-sample image counts (zero included)."""
    original = PerSampleImages().eval()
    rewritten = Rewritten().eval()
    rewritten.load_state_dict(original.state_dict())
    pixel_values = _images(counts, 3, seed)
    with torch.no_grad():
        expected = get_leaf_tensors(original(pixel_values))
        got = get_leaf_tensors(rewritten(pixel_values))
    assert list(got) == list(expected)
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=0, atol=0)


@settings(max_examples=20, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=1, max_size=4), st.integers(0, 2**16))
def test_split_sizes_by_name_read_as_the_lists_they_replace(counts, seed):
    original = PerSampleTiles().eval()
    rewritten = RewrittenTiles().eval()
    rewritten.load_state_dict(original.state_dict())
    inputs = _tiles(counts, 3, seed)
    with torch.no_grad():
        expected = get_leaf_tensors(original(**inputs))
        got = get_leaf_tensors(rewritten(**inputs))
    assert list(got) == list(expected)
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=0, atol=0)


@settings(max_examples=20, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 13), st.integers(0, 13)), min_size=1, max_size=4))
def test_split_sizes_from_each_row_read_as_the_lists_they_replace(sizes):
    """A list over ``image_sizes``' rows is the same arithmetic on its columns: the ragged value reads as the split."""
    assert RewrittenSizes.get_image_features is not PerImageSizes.get_image_features
    image_sizes = torch.tensor(sizes)
    features = torch.randn(int(((image_sizes // 4).prod(-1)).sum()), 3)
    expected = get_leaf_tensors(PerImageSizes()(features, image_sizes))
    got = get_leaf_tensors(RewrittenSizes()(features, image_sizes))
    assert list(got) == list(expected)
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=0, atol=0)


def test_ragged_leaves_expand_to_items():
    rows, counts = torch.arange(10.0).view(5, 2), torch.tensor([3, 0, 2])
    expanded = expand_stacked_rows({"a": torch.zeros(1), "x.pooler_output.*": rows, "x.pooler_output.*rows": counts})
    assert list(expanded) == ["a", "x.pooler_output.0", "x.pooler_output.1", "x.pooler_output.2"]
    assert torch.equal(expanded["x.pooler_output.2"], rows[3:])
    assert expanded["x.pooler_output.1"].shape == (0, 2)


@pytest.mark.parametrize("backend", ["dynamo", "onnx", "executorch"])
def test_a_per_sample_split_runs_any_batch(backend, tmp_path):
    """With the ``.tolist()`` split the traced batch is fixed (torch.export pins it); rewritten, one program
    returns eager's per-sample leaves for another batch and other image counts."""
    from engine import AutoExporter
    from engine.artifacts import SUFFIX, load_artifact, save_artifact
    from engine.compare import compare_leaves
    from engine.runtime import run_exported

    config = {"export_format": backend, "dynamic": True}
    original = PerSampleTiles().eval()
    if backend == "dynamo":
        with pytest.raises(Exception):  # the list's length is the traced batch
            artifact = AutoExporter.export(original, _tiles([2, 1], 3), config)
            run_exported(artifact, _tiles([1, 3, 2], 3))
    model = RewrittenTiles().eval()
    model.load_state_dict(original.state_dict())
    path = tmp_path / f"model{SUFFIX[backend]}"
    save_artifact(AutoExporter.export(model, _tiles([2, 1], 3), config), path)
    artifact = load_artifact(path)
    for counts in ([2, 1], [1, 3, 2]):
        with torch.no_grad():
            expected = get_leaf_tensors(original(**_tiles(counts, 3, 1)))
        got = run_exported(artifact, _tiles(counts, 3, 1))
        assert list(got) == list(expected)
        assert compare_leaves(expected, got).ok


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=4), st.integers(1, 6), st.integers(0, 2**16))
def test_audio_chunks_padded_by_gather_equal_the_split(lengths, n_window, seed):
    """Qwen-Omni's ``chunk_and_pad_features`` (split by ``tolist()`` and ``pad_sequence``) and the gather that
    replaces it give the same padded chunks and chunk lengths for any audio lengths and window."""
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import chunk_and_pad_features

    from engine.patches.model.split_by_counts import chunk_and_pad_by_gather

    feature_lens = torch.tensor(lengths)
    features = torch.randn(3, int(feature_lens.sum()), generator=torch.Generator().manual_seed(seed))
    expected = chunk_and_pad_features(features, feature_lens, n_window)
    got = chunk_and_pad_by_gather(features, feature_lens, n_window)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


class _Applied(torch.nn.Module):
    """``fn(first, second, *rest)`` as a module, the form the exporters take."""

    def __init__(self, fn, *rest):
        super().__init__()
        self.fn, self.rest = fn, rest

    def forward(self, first, second):
        return self.fn(first, second, *self.rest)


def test_audio_chunks_padded_by_gather_export_for_any_lengths():
    """The split by ``tolist()`` of a tensor of data-dependent length cannot be traced (``Eq(u, 0)``); the gather
    exports once and pads other audio lengths as the original does."""
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import chunk_and_pad_features

    from engine import DynamoExporter, run_exported
    from engine.patches.model.split_by_counts import chunk_and_pad_by_gather

    def sample(lengths):  # the features and the audio lengths
        lens = torch.tensor(lengths)
        return {"first": torch.randn(3, int(lens.sum())), "second": lens}

    with pytest.raises(Exception):
        DynamoExporter().export(_Applied(chunk_and_pad_features, 4), sample([11, 5]), {"dynamic": True})
    program = DynamoExporter().export(_Applied(chunk_and_pad_by_gather, 4), sample([11, 5]), {"dynamic": True})
    for lengths in ([11, 5], [3, 20, 8]):
        inputs = sample(lengths)
        expected = chunk_and_pad_features(inputs["first"], inputs["second"], 4)
        got = list(run_exported(program, inputs).values())
        for a, b in zip(got, expected):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def _windows(bounds: torch.Tensor, frames: int) -> list[int]:
    """The window of each of ``frames`` packed frames, numbered from 0 in order of their first frame: the
    partition the bounds make (what a mask of equal windows sees), whatever their repeats."""
    ends = bounds[1:].tolist()
    counts = [sum(1 for end in ends if end <= frame) for frame in range(frames)]
    return [sorted(set(counts)).index(c) for c in counts]


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(0, 420), min_size=1, max_size=3), n_window=st.sampled_from([4, 13, 50]),
       ratio=st.integers(1, 4), padded=st.booleans())
def test_audio_window_bounds_split_the_frames_as_the_list(lengths, n_window, ratio, padded):
    """Qwen3-ASR's ``get_audio_cu_seqlens`` (a Python list repeated by ``.item()`` counts) and the tensor bounds
    that replace it split the packed post-CNN frames into the same windows, for chunk lists with every audio
    padded to the longest (Qwen3-ASR) or holding only its own chunks (Qwen3-Omni)."""
    from transformers.models.qwen3_asr.modeling_qwen3_asr import (_get_feat_extract_output_lengths,
                                                                  get_audio_cu_seqlens)

    from engine.patches.model.split_by_counts import audio_window_bounds

    chunk = 2 * n_window
    count = max(-(-max(lengths) // chunk), 1) if padded else None
    chunks = []
    for length in lengths:
        own = [chunk] * (length // chunk) + ([length % chunk] if length % chunk else [])
        chunks += own + [0] * (count - len(own)) if padded else own
    chunk_lengths, feature_lens = torch.tensor(chunks, dtype=torch.long), torch.tensor(lengths)
    if not chunks or _get_feat_extract_output_lengths(chunk_lengths, n_window).max() == 0:
        return  # no frame at all: the original divides by a window of 0
    expected = get_audio_cu_seqlens(chunk_lengths, feature_lens, ratio * chunk, n_window)
    got = audio_window_bounds(chunk_lengths, feature_lens, ratio * chunk, n_window, _get_feat_extract_output_lengths)
    frames = int(expected[-1])
    assert int(got.max()) == frames
    assert _windows(got, frames) == _windows(expected, frames)


def test_audio_window_bounds_export_for_any_lengths():
    """The list repeated by ``.item()`` counts cannot be traced; the tensor bounds export once and split other audio
    lengths into the original's windows."""
    from transformers.models.qwen3_asr.modeling_qwen3_asr import (_get_feat_extract_output_lengths,
                                                                  get_audio_cu_seqlens)

    from engine import DynamoExporter, run_exported
    from engine.patches.model.split_by_counts import audio_window_bounds

    def sample(lengths):  # the chunk lengths (chunks of 8 frames, each audio padded to the longest), the audio lengths
        count = -(-max(lengths) // 8)
        chunks = [min(max(length - 8 * i, 0), 8) for length in lengths for i in range(count)]
        return {"first": torch.tensor(chunks), "second": torch.tensor(lengths)}

    with pytest.raises(Exception):
        DynamoExporter().export(_Applied(get_audio_cu_seqlens, 16, 4), sample([30, 12]), {"dynamic": True})
    bounds = _Applied(audio_window_bounds, 16, 4, _get_feat_extract_output_lengths)
    program = DynamoExporter().export(bounds, sample([30, 12]), {"dynamic": True})
    for lengths in ([30, 12], [5, 41, 17]):
        inputs = sample(lengths)
        expected = get_audio_cu_seqlens(inputs["first"], inputs["second"], 16, 4)
        (got,) = run_exported(program, inputs).values()
        frames = int(expected[-1])
        assert _windows(got, frames) == _windows(expected, frames)


class _ConvInPieces(torch.nn.Module):
    """Qwen3-Omni's audio tower: the chunks (as many as the data says) convolved in pieces of 2 to bound memory."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv1d(1, 3, 3, padding=1)

    def forward(self, frames, keep):
        chunks = frames[keep.nonzero().squeeze(-1)].unsqueeze(1)  # a data-dependent number of chunks
        pieces = []
        for piece in chunks.split(2, dim=0):
            pieces.append(self.conv(piece))
        return torch.cat(pieces, dim=0)


def test_conv_pieces_of_a_data_sized_batch_export_as_one_batch():
    """The number of pieces of a data-sized batch cannot be traced; the loop over the whole batch once exports and
    computes the pieces' numbers for other chunk counts."""
    from engine import DynamoExporter, run_exported
    from engine.patches.model.split_by_counts import _BatchSplitForMemoryAsOnePiece
    from engine.patches.source_rewrite import recompiled

    def sample(keep):
        return {"frames": torch.randn(len(keep), 6), "keep": torch.tensor(keep)}

    with pytest.raises(Exception):
        DynamoExporter().export(_ConvInPieces(), sample([1, 0, 1, 1, 1]), {"dynamic": True})
    module = _ConvInPieces()
    eager = module.forward
    module.forward = recompiled(_ConvInPieces.forward, _BatchSplitForMemoryAsOnePiece()).__get__(module)
    program = DynamoExporter().export(module, sample([1, 0, 1, 1, 1]), {"dynamic": True})
    for keep in ([1, 0, 1, 1, 1], [0, 1, 1, 0, 1, 1, 1, 1]):
        inputs = sample(keep)
        (got,) = run_exported(program, inputs).values()
        torch.testing.assert_close(got, eager(**inputs))


@settings(max_examples=25, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), min_size=3, max_size=3), min_size=1, max_size=3), st.booleans())
def test_length_regulation_equals_the_per_sample_loop(durations, silence):
    """FastSpeech2's length regulator, for any durations (all-zero rows, and a batch of all zeros, included); the
    original's in-place fill of the durations happens too."""
    from transformers.models.fastspeech2_conformer import modeling_fastspeech2_conformer as fs

    from engine.patches.model.split_by_counts import _patch_length_regulator_without_a_per_sample_loop

    regulate = _patch_length_regulator_without_a_per_sample_loop(fs.length_regulator)
    durations = torch.tensor(durations) * (0 if silence else 1)
    features = torch.randn(durations.shape[0], 3, 4)
    expected_durations, got_durations = durations.clone(), durations.clone()
    expected = fs.length_regulator(features, expected_durations)
    torch.testing.assert_close(regulate(features, got_durations), expected, rtol=0, atol=0)
    assert torch.equal(got_durations, expected_durations)
