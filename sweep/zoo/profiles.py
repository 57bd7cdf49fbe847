"""The shrink ladder's rungs: the target sizes of each :class:`Profile`.

:mod:`sweep.zoo.build` climbs :data:`PROFILES` until a model builds and runs, then :data:`BUDGET_PROFILES` while it
is over the parameter budget. Kept apart from the shrinker so that its rules and the config lessons can take a
profile without importing the pipeline.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Profile:
    """Target sizes for one rung of the shrink ladder."""

    name: str
    width: int = 32
    heads: int = 4
    layers: int = 2
    intermediate: int = 64
    vocab: int = 1024
    max_positions: int = 512
    image_grid: int = 4  # patches per side
    conv_image_size: int = 64  # image side for models without a patch size
    experts: int = 4
    top_k: int = 2
    low_rank: int = 16
    min_channel: int = 8
    audio_positions: int = 32
    window: int = 4
    keep_geometry: bool = False  # keep image/patch/window sizes and channel lists as the defaults have them


PROFILES: tuple[Profile, ...] = (
    Profile("tiny"),
    Profile("small", width=64, heads=4, intermediate=128, image_grid=8, conv_image_size=128, window=7,
            min_channel=16, audio_positions=64),
    Profile("geometry", width=64, heads=4, intermediate=128, keep_geometry=True),
)
# Tried when the profile that runs is over the parameter budget (conv stacks, codecs, big fixed heads).
BUDGET_PROFILES: tuple[Profile, ...] = (
    Profile("micro", width=16, heads=2, intermediate=32, vocab=256, max_positions=128, min_channel=4,
            experts=2, top_k=1, low_rank=8, image_grid=4, conv_image_size=32, audio_positions=16),
)
