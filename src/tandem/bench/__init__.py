"""Measurement: the comparison report for runs of scripts/speculative-benchmark.py.

The benchmark client itself is scripts/speculative-benchmark.py, standard library only, so that
it runs against llama-server or Tandem without installing Tandem.
"""
