"""export-sweep engine."""
