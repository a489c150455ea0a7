"""Tandem: speculative decoding engine and llama-server-compatible server for local LLMs."""

import os as _os

# OpenMP worker threads (PyTorch's and the native kernels', one shared libgomp) spin this many
# times waiting for the next parallel region before they sleep. libgomp's default here let them
# sleep between the ~200 small matrix products of one token, and waking them cost more than
# the products (measured, 2 threads: layer 3's ffn_down, Q4_K 8960 -> 1536, 0.79 ms with the
# default, 0.42 ms with GOMP_SPINCOUNT=3000000). They spin on for a while (milliseconds) after
# the last product, then sleep. Read when libgomp loads, so this
# has to run before torch is imported; a value set by the user wins.
_os.environ.setdefault("GOMP_SPINCOUNT", "1000000")

__version__ = "0.1.0"
