"""export-sweep's pytest plugin and the tiny-model zoo it sweeps over.

``sweep`` imports ``engine``; ``engine`` never imports ``sweep``.
"""
