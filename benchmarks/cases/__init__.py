"""Benchmark cases beyond bench.py's own: one module per op family, each with ``rows(timer, copy_gb_s, tk)``."""
