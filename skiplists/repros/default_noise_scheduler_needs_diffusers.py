"""VibeVoice generation cannot build its default noise scheduler without diffusers, which the sweep environment lacks.

Pattern: VibeVoiceGenerationMixin._prepare_generation_config calls `self._build_default_noise_scheduler(generation_config)`
when generate() is given no noise_scheduler (generation_vibevoice.py:129-131 at transformers 5.24.0), and that
builds `diffusers.DPMSolverMultistepScheduler` (generation_vibevoice.py:157-181; the entry cites 162): `if not
is_diffusers_available(): raise ImportError(...)`. Not a bug: an optional dependency this environment does not install.
Error: ImportError 'The default VibeVoice noise scheduler (`DPMSolverMultistepScheduler`) requires `diffusers`'.
Not an upstream bug (an environment choice)
"""

import sys

from transformers import GenerationConfig
from transformers.models.vibevoice.generation_vibevoice import VibeVoiceGenerationMixin

try:
    scheduler = VibeVoiceGenerationMixin._build_default_noise_scheduler(GenerationConfig())
except ImportError as e:
    if "requires `diffusers`" in str(e):
        print(f"reproduced: ImportError: {str(e).splitlines()[0]}", file=sys.stderr)
        raise SystemExit(10)
    raise
assert all(hasattr(scheduler, a) for a in ("set_timesteps", "step", "timesteps")), type(scheduler)
print(f"passes now: the default noise scheduler is a {type(scheduler).__name__}", file=sys.stderr)
