"""Tandem: speculative decoding engine and llama-server-compatible server for local LLMs."""

import os as _os

# OpenMP worker threads (PyTorch's and the native kernels', one shared libgomp) spin this many
# times waiting for the next parallel region before they sleep. libgomp's default here let them
# sleep between the ~200 small matrix products of one token, and waking them cost more than
# the products (measured: a 1536x8960 Q4_K product 0.72 ms -> 0.46 ms with 2 threads). About
# 20 ms of spinning after the last product, then they sleep. Read when libgomp loads, so this
# has to run before torch is imported; a value set by the user wins.
_os.environ.setdefault("GOMP_SPINCOUNT", "1000000")

__version__ = "0.1.0"
