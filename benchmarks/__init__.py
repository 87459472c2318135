"""Benchmarks, run by hand: `python -m benchmarks.NAME`; each prints a table."""
