"""Benchmarks. Not tests: run them by hand, e.g. ``.venv/bin/python bench/recovery.py``."""
