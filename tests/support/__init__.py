"""Helpers the tests share, by what they are; the fixtures built on them are in tests/conftest.py.

The benchmarks use some of them too (bench/support.py imports them from here): one definition each.
"""
