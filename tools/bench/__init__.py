"""Benchmarks, each measured side by side with its peers and written to docs/benchmarks.md
(python -m tools.bench.<name>)."""
