"""Repository-wide test setup: no hub access, quiet transformers, one thread per test process.

The sweep plugin itself is registered through the ``pytest11`` entry point (``sweep.plugin``), so it works
the same here and in any project that installs export-sweep.
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests build tiny models locally; a hub call is a bug
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("OMP_NUM_THREADS", "1")  # xdist workers share two cores

import torch  # noqa: E402

torch.set_num_threads(1)
