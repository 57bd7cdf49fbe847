"""M-RoPE positions computed before the graph: the model's own positions, its state untouched, and exportable."""

from __future__ import annotations

import pytest
import torch

from engine.patches.model.rope_positions import rope_position_ids, rope_positions_owner
from engine import with_rope_position_ids  # the public name

IMAGE = 5  # the image placeholder token id of the tiny model


def _tiny_qwen2_vl(head: bool = False):
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration, Qwen2VLModel

    config = Qwen2VLConfig(
        text_config={"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                     "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128,
                     "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1]}},
        vision_config={"depth": 1, "embed_dim": 32, "hidden_size": 32, "num_heads": 4, "mlp_ratio": 2, "patch_size": 4,
                       "spatial_merge_size": 2, "temporal_patch_size": 2, "in_channels": 3},
        image_token_id=IMAGE, video_token_id=6, vision_start_token_id=7, vision_end_token_id=8)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return (Qwen2VLForConditionalGeneration if head else Qwen2VLModel)(config).eval()


def _prompt(text_before: list[int], grids: list[tuple[int, int]], text_after: int = 3) -> dict:
    """One row per image: text, <vision_start>, the image's placeholders (grid / 2x2 merge), <vision_end>, text."""
    rows = [[9] * before + [7] + [IMAGE] * (h * w // 4) + [8] + [10] * text_after
            for before, (h, w) in zip(text_before, grids)]
    width = max(map(len, rows))
    ids = torch.tensor([[0] * (width - len(r)) + r for r in rows])  # left padding
    mask = (torch.arange(width) >= torch.tensor([width - len(r) for r in rows])[:, None]).long()
    types = (ids == IMAGE).long()
    grid_thw = torch.tensor([[1, h, w] for h, w in grids])
    pixels = torch.randn(int(grid_thw.prod(-1).sum()), 3 * 2 * 4 * 4)
    return {"input_ids": ids, "attention_mask": mask, "mm_token_type_ids": types, "image_grid_thw": grid_thw,
            "pixel_values": pixels}


def test_positions_are_the_models_own_and_its_state_is_left_as_it_was():
    model = _tiny_qwen2_vl()
    inputs = _prompt([2, 4], [(4, 4), (4, 4)])
    assert rope_positions_owner(model) is model
    model.rope_deltas = marker = torch.tensor([[123]])
    positions = rope_position_ids(model, inputs)
    assert model.rope_deltas is marker
    assert positions.shape == (3, 2, inputs["input_ids"].shape[1])
    model.rope_deltas = None
    with torch.no_grad():
        without = model(**inputs).last_hidden_state
        given = model(**with_rope_position_ids(model, inputs)).last_hidden_state
    assert torch.equal(without, given)


def test_inputs_are_unchanged_where_there_is_nothing_to_compute():
    model = _tiny_qwen2_vl()
    inputs = _prompt([2], [(4, 4)])
    assert with_rope_position_ids(model, {**inputs, "position_ids": None}).get("position_ids") is None
    assert rope_positions_owner(torch.nn.Linear(2, 2)) is None
    linear_inputs = {"input": torch.ones(1, 2)}
    assert with_rope_position_ids(torch.nn.Linear(2, 2), linear_inputs) is linear_inputs


def test_a_qwen2_vl_model_exports_with_its_positions_as_an_input():
    """Qwen2-VL's get_rope_index loops over ``groupby(enumerate(types.tolist()))``, which torch.export cannot trace;
    with the positions computed by the model and passed in, one program runs other prompts and images exactly."""
    from engine import DynamoExporter, ExportStageError
    from engine.compare import compare_leaves
    from engine.pytree import get_leaf_tensors
    from engine.runtime import run_exported

    model = _tiny_qwen2_vl()
    sample = _prompt([2, 4], [(4, 4), (4, 4)])
    with pytest.raises(ExportStageError, match="(?i)data.dependent"):
        DynamoExporter().export(model, sample, {"dynamic": True})
    program = DynamoExporter().export(model, with_rope_position_ids(model, sample), {"dynamic": True})
    for inputs in (sample, _prompt([1, 6], [(4, 8), (8, 4)])):  # the image count stays the traced one (the vision
        # tower unbinds grid_thw per image)
        inputs = with_rope_position_ids(model, inputs)
        with torch.no_grad():
            expected = get_leaf_tensors(model(**inputs))
        assert compare_leaves(expected, run_exported(program, inputs)).ok


def test_generation_positions_are_the_ones_generate_gives_its_prefill():
    from engine import generation_position_ids

    model = _tiny_qwen2_vl(head=True)
    inputs = _prompt([2, 4], [(4, 4), (4, 4)])
    seen = []
    model.register_forward_pre_hook(lambda m, args, kwargs: seen.append(kwargs.get("position_ids")), with_kwargs=True)
    with torch.no_grad():
        model.generate(**inputs, do_sample=False, max_new_tokens=1)
    model.model.rope_deltas = marker = torch.tensor([[123]])
    positions = generation_position_ids(model, inputs)
    assert model.model.rope_deltas is marker
    assert positions.shape == (4, 2, inputs["input_ids"].shape[1]) and torch.equal(positions, seen[0])
    assert generation_position_ids(torch.nn.Linear(2, 2), {"input_ids": inputs["input_ids"]}) is None


def test_generate_over_exported_steps_takes_the_host_computed_positions():
    """The prefill's M-RoPE positions are an input: without them engine.generate says what to pass; with the
    model's own, the exported steps give eager generate()'s greedy tokens."""
    from engine import AutoExporter, AutoExportConfig, InputError, generate, generation_position_ids

    model = _tiny_qwen2_vl(head=True)
    inputs = _prompt([2, 4], [(4, 4), (4, 4)])
    with torch.no_grad():
        expected = model.generate(**inputs, do_sample=False, num_beams=1, max_new_tokens=4)
    config = AutoExportConfig.from_dict({"export_format": "dynamo", "dynamic": True})
    components = AutoExporter.from_config(config).export_for_generation(model, inputs, config=config)
    with pytest.raises(InputError, match=r"position_ids=engine.generation_position_ids\(model, inputs\)"):
        generate(components, inputs, max_new_tokens=4)
    prompt = {**inputs, "position_ids": generation_position_ids(model, inputs)}
    assert torch.equal(generate(components, prompt, max_new_tokens=4), expected)
