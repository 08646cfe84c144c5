"""Benchmarks (not timed tests): `scripts/bench.sh <name>` or `python -m benchmarks.<name>`."""
