"""PI0ForConditionalGeneration has no generate(): a flow-matching action model, not a GenerationMixin.

Pattern: `class PI0ForConditionalGeneration(PI0PreTrainedModel):` (modeling_pi0.py:220 at transformers 5.24.0)
decodes with `sample_actions` (modeling_pi0.py:325), a loop of num_inference_steps denoising steps, and inherits no
GenerationMixin, so a generation case that calls `model.generate(...)` fails before any step (the cause is the
sweep's selection of the case; engine.generation.decompose._require_generate rejects it by the same test).
Error: AttributeError "type object 'PI0ForConditionalGeneration' has no attribute 'generate'".
Not an upstream bug (PI0 is not a generative model; the sweep's case selection is the cause)
"""

import sys

from transformers import GenerationMixin
from transformers.models.pi0.modeling_pi0 import PI0ForConditionalGeneration

try:
    generate = PI0ForConditionalGeneration.generate
except AttributeError as e:
    if "has no attribute 'generate'" in str(e) and not issubclass(PI0ForConditionalGeneration, GenerationMixin) \
            and callable(getattr(PI0ForConditionalGeneration, "sample_actions", None)):
        print(f"reproduced: AttributeError: {e} (it decodes with sample_actions)", file=sys.stderr)
        raise SystemExit(10)
    raise
print(f"passes now: PI0ForConditionalGeneration has generate() ({generate.__qualname__})", file=sys.stderr)
