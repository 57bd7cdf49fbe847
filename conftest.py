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


# ─── Slowest tests first ─────────────────────────────────────────────────────────────────────────
#: the unit tests that take ten seconds or more, slowest kinds first (measured with --durations=0). ./dev runs
#: xdist with --maxschedchunk=1, so each worker takes the next test when it finishes one: started first, the long
#: tests spread over both workers, and the last ones to start are short, so neither worker idles for minutes at
#: the end while the other finishes (the unit run took 1,419 s of wall time for 2,301 s of tests on two workers).
SLOW_FIRST = (
    "tests/engine/generation/test_loop.py::test_generation_matches_eager_greedy[[]*-executorch[]]",
    "tests/sweep/test_plugin.py::test_xdist_run_and_merged_shards_equal_a_serial_run",
    "tests/engine/test_exporter_executorch.py::test_dynamic_pte_matches_eager[[]*",
    "tests/engine/test_dim_bounds.py::test_real_limit_config_exports_and_runs_in_bounded_memory[[]*",
    "tests/engine/runtime/test_runner_contract.py::*",
    "tests/sweep/test_wheel.py::*",
    "tests/sweep/test_plugin.py::*",
    "tests/sweep/test_results.py::test_resume*",
    "tests/engine/generation/test_loop.py::test_generation_matches_eager_greedy[[]*-onnx[]]",
    "tests/engine/test_exporter_onnx.py::test_dynamic_export_runs_in_onnxruntime_at_another_shape[[]*",
    "tests/engine/test_exporter_onnx.py::test_type_promotion_without_reruns_writes_the_same_model[[]*",
    "tests/engine/generation/test_loop.py::test_generation_matches_eager_greedy[[]*",
)


def pytest_collection_modifyitems(config, items):
    import fnmatch

    def rank(item) -> int:
        return next((i for i, pattern in enumerate(SLOW_FIRST) if fnmatch.fnmatchcase(item.nodeid, pattern)), len(SLOW_FIRST))

    items.sort(key=rank)  # stable: the rest keep their order, and a sweep's own cases match no pattern
