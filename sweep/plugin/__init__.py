"""pytest plugin: one test case per (model class, backend, shapes), each run isolated, each a result row.

    pytest --backend=onnx,executorch --models='Llama*,@my_models.txt' -n 16

With a sweep option (``--backend``, ``--models``, ``--model-module``, ``--config``, ``--generate``) or case ids as
arguments (``BertModel-onnx-dynamic``, or the node id pytest printed for one), and no path arguments, ``pytest``
collects the sweep itself (:mod:`sweep.test_export`), from any folder, whatever the folder's own ``testpaths``;
explicit paths keep their meaning (``pytest tests --backend=...`` runs ``tests``), and ``pytest --pyargs sweep``
still works. Without a sweep option the plugin stays out of the way of other suites.

The hooks are grouped by pytest phase, one module each:

- :mod:`~sweep.plugin.options`: the command line, and the settings a run reads;
- :mod:`~sweep.plugin.collection`: the cases, ``--shard``/``--resume``/case ids, the run's record;
- :mod:`~sweep.plugin.running`: the ``sweep_run`` fixture (isolation, reuse, the row, the outcome);
- :mod:`~sweep.plugin.reporting`: progress, the summary, the matrices.
"""

from sweep.plugin.collection import (pytest_collection_modifyitems, pytest_configure, pytest_configure_node,
                                     pytest_generate_tests)
from sweep.plugin.options import BACKENDS, SHAPES, STATUSES, pytest_addoption
from sweep.plugin.reporting import (pytest_collection_finish, pytest_report_teststatus, pytest_runtest_logreport,
                                    pytest_sessionfinish, pytest_terminal_summary, pytest_unconfigure,
                                    pytest_xdist_node_collection_finished)
from sweep.plugin.running import failure_summary, sweep_case, sweep_run

__all__ = ["BACKENDS", "SHAPES", "STATUSES", "failure_summary", "pytest_addoption", "pytest_collection_finish",
           "pytest_collection_modifyitems", "pytest_configure", "pytest_configure_node", "pytest_generate_tests",
           "pytest_report_teststatus", "pytest_runtest_logreport", "pytest_sessionfinish", "pytest_terminal_summary",
           "pytest_unconfigure", "pytest_xdist_node_collection_finished", "sweep_case", "sweep_run"]
