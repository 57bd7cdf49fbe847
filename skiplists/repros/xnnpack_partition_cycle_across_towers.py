"""ExecuTorch's XNNPACK partitioner proposes a partition that fuse_as_graphmodule rejects as a dependency cycle.

Pattern: FlavaForPreTraining (a tiny config, no loss) runs its image and text encoders and joins their projections
with a cat into the multimodal encoder. One proposed partition holds the last MLP and projection of both towers and
the cat; an output of it reaches the cat again through other partitions (fused before it) and the view_copy /
expand_copy nodes left between them, so once those are fused the partition depends on itself:
torch/fx/passes/utils/fuser_utils.py fuse_as_graphmodule raises "Invalid partition, found dependency cycles".
Tracker: pytorch/executorch
"""

import sys

import torch
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import to_edge_transform_and_lower
from transformers import FlavaConfig, FlavaForPreTraining

layers = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64}
config = FlavaConfig(
    image_config={**layers, "image_size": 64, "patch_size": 16}, text_config={**layers, "vocab_size": 1024},
    multimodal_config=layers, image_codebook_config={"hidden_size": 32, "num_groups": 4, "num_blocks_per_group": 2,
                                                     "vocab_size": 1024, "image_size": 32},
    hidden_size=32, projection_dim=32)
torch.manual_seed(0)
model = FlavaForPreTraining(config).eval()
inputs = {"pixel_values": torch.randn(2, 3, 64, 64), "input_ids": torch.randint(0, 1024, (2, 8)),
          "attention_mask": torch.ones(2, 8, dtype=torch.long), "codebook_pixel_values": torch.randn(2, 3, 32, 32),
          "return_loss": False}
with torch.no_grad():
    program = torch.export.export(model, (), inputs, strict=False)
try:
    lowered = to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()]).to_executorch()
except AssertionError as e:
    if "found dependency cycles" in str(e):
        print(f"REPRODUCES: AssertionError: {e}", file=sys.stderr)
        raise SystemExit(10)
    raise
from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer  # noqa: E402
from torch.utils._pytree import tree_leaves  # noqa: E402

flat = [v for v in tree_leaves(program.example_inputs) if isinstance(v, torch.Tensor)]
got = _load_for_executorch_from_buffer(lowered.buffer).forward(flat)
with torch.no_grad():
    expected = [v for v in tree_leaves(model(**inputs)) if isinstance(v, torch.Tensor)]
for a, b in zip(got, expected, strict=True):
    torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
print("PASSES: lowers, and the .pte matches eager", file=sys.stderr)
