"""Unit tests of the input synthesiser's generic rules: fallback inputs by parameter name and annotation, and the
lessons learned from a model's own errors (which input the failing operation was handed)."""

from __future__ import annotations

import inspect

import torch
from transformers import PreTrainedConfig

from sweep import inputs
from sweep import modalities as m


class _Config(PreTrainedConfig):
    model_type = "zoo_test"

    def __init__(self, **kwargs):
        for key in ("hidden_size", "max_state_dim", "freq_size", "speaker_embedding_dim"):
            if key in kwargs:
                setattr(self, key, kwargs.pop(key))
        super().__init__(**kwargs)


def _ctx(model: torch.nn.Module, forward) -> m.Context:
    params = {k: p for k, p in inspect.signature(forward).parameters.items() if k != "self"}
    return m.Context(config=model.config, model=model, gen=torch.Generator().manual_seed(0), batch=2,
                     hints=inputs.Hints(), params=params)


class _Model(torch.nn.Module):
    def __init__(self, **config):
        super().__init__()
        self.config = _Config(**config)
        self.freq_emb = torch.nn.Embedding(getattr(self.config, "freq_size", 3), 4)


def test_required_parameters_are_filled_by_name_annotation_and_config():
    def forward(self, past_values: torch.Tensor, past_values_padding: torch.LongTensor, freq: torch.Tensor,
                state: torch.Tensor, inputs_embeds: torch.Tensor, marks: torch.LongTensor,
                question_type_ids: torch.LongTensor, num_options: torch.LongTensor, speaker_embeddings=None):
        ...

    model = _Model(hidden_size=24, max_state_dim=6, freq_size=3, speaker_embedding_dim=5)
    ctx = _ctx(model, forward)
    ctx.made["past_values"] = torch.randn(2, 16)
    out = m.fallback(ctx, ["past_values_padding", "freq", "state", "inputs_embeds", "marks", "question_type_ids",
                           "num_options", "speaker_embeddings"])
    assert out["past_values_padding"].shape == (2, 16) and not out["past_values_padding"].any()  # nothing padded
    assert out["freq"].shape == (2, 1) and int(out["freq"].max()) < 3  # indices into the freq_size table
    assert out["state"].shape == (2, 6)  # a vector of the named width (max_state_dim)
    assert out["speaker_embeddings"].shape == (2, 5)  # speaker_embedding_dim
    assert out["inputs_embeds"].shape == (2, m.SEQ, 24)  # a sequence of the model's width
    assert out["marks"].dtype == torch.long and 1 <= int(out["marks"].min()) and int(out["marks"].max()) < m.SEQ
    assert not out["question_type_ids"].any() and (out["num_options"] == 1).all()


def test_cutoffs_and_padding_masks_follow_the_input_they_describe():
    def forward(self, input_values, input_values_cutoffs=None, padding_mask=None):
        ...

    ctx = _ctx(_Model(), forward)
    ctx.made["input_values"] = torch.randn(2, 100)
    out = m.fallback(ctx, ["input_values_cutoffs", "padding_mask"])
    assert out["input_values_cutoffs"].tolist() == [[100], [100]]
    assert out["padding_mask"].shape == (2, 100)


def test_string_modalities_name_one_modality():
    class Audio(torch.nn.Module):
        input_modalities = "audio"

    assert m.model_modalities(Audio()) == ("audio",)


def _raise_inside(fn, *args):
    try:
        fn(*args)
    except Exception as exc:  # noqa: BLE001
        return exc
    raise AssertionError("no error")


def test_a_linear_teaches_the_width_of_the_input_it_was_handed():
    linear = torch.nn.Linear(12, 4)
    context = torch.randn(2, 8, 4)
    exc = _raise_inside(lambda x: linear(x), context)
    hints = inputs.Hints()
    assert inputs.refine_hints(hints, exc, {"context_hidden_states": context, "other": torch.randn(2, 8, 4)})
    assert hints.shapes == {"context_hidden_states": (2, 8, 12)}


def test_a_derived_width_scales_with_the_input():
    def subsample(features):  # the last dimension halves on the way to the Linear
        hidden = features[..., ::2]
        return torch.nn.functional.linear(hidden.reshape(2, -1), torch.randn(4, 64))

    features = torch.randn(2, 1, 64)
    exc = _raise_inside(subsample, features)
    hints = inputs.Hints()
    assert inputs.refine_hints(hints, exc, {"audio_mel": features})
    assert hints.shapes == {"audio_mel": (2, 1, 128)}


def test_a_conv_teaches_channels_and_a_signal_gets_samples():
    conv = torch.nn.Conv1d(1, 4, 3)
    hidden = torch.randn(2, 8, 32)
    exc = _raise_inside(lambda x: conv(x), hidden)
    hints = inputs.Hints()
    assert inputs.refine_hints(hints, exc, {"hidden_states": hidden})
    assert hints.shapes == {"hidden_states": (2, 1, m.WAVEFORM)}


def test_an_embedding_bounds_the_ids_it_was_handed_and_candidates_follow():
    table = torch.nn.Embedding(10, 4)
    ids = torch.arange(16).view(2, 8)
    exc = _raise_inside(lambda x: table(x), ids)
    hints = inputs.Hints()
    assert inputs.refine_hints(hints, exc, {"input_ids": ids})
    assert hints.bounds == {"input_ids": 10}
    learned = inputs._learned({"input_ids": ids}, hints, torch.Generator())
    assert int(learned["input_ids"].max()) < 10


def test_ids_plus_a_codebook_offset_table_get_a_codebook_axis():
    offsets = torch.arange(5)
    ids = torch.zeros(2, 8, dtype=torch.long)
    exc = _raise_inside(lambda x: x + offsets, ids)
    hints = inputs.Hints()
    assert inputs.refine_hints(hints, exc, {"input_ids": ids})
    assert hints.shapes == {"input_ids": (2, 8, 5)}


def test_an_optional_input_the_forward_dereferences_is_added():
    def forward(input_ids, padding_mask=None):
        return padding_mask.sum()

    params = dict(inspect.signature(forward).parameters)
    exc = _raise_inside(forward, torch.zeros(2, 3))
    hints = inputs.Hints()
    assert inputs.refine_hints(hints, exc, {"input_ids": torch.zeros(2, 3)}, params)
    assert hints.extra == ["padding_mask"]


def test_placeholders_per_row_are_read_from_the_feature_tensor_of_the_check():
    def check(input_ids, audio_features):
        n_audio_features = audio_features.shape[0]  # the check reports the batch, not the rows
        raise ValueError(f"Audio features and audio tokens do not match, tokens: 2, features: {n_audio_features}")

    exc = _raise_inside(check, torch.zeros(2, 9), torch.randn(2, 7, 32))
    hints = inputs.Hints(audio_tokens=1, text_width=32)
    assert inputs.refine_hints(hints, exc, {})
    assert hints.audio_tokens == 7
