"""Greedy generation through exported steps, against eager ``generate``: the check of patches that touch decoding."""

import torch


def greedy_through_exported_steps(model, inputs, new_tokens=6):
    import copy

    from engine import AutoExporter, generate

    components = AutoExporter.export_for_generation(model, inputs, {"dynamic": True})
    other = {k: v.flip(0) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}  # other rows
    with torch.no_grad():
        expected = model.generate(**copy.deepcopy(other), do_sample=False, max_new_tokens=new_tokens)
    return components, generate(components, other, max_new_tokens=new_tokens), expected
