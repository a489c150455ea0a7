"""Tandem: speculative decoding engine and llama-server-compatible server for local LLMs."""

import os as _os

# OpenMP worker threads (PyTorch's and the native kernels', one shared libgomp) spin this many
# times waiting for the next parallel region before they sleep. libgomp's default here let them
# sleep between the hundreds of small matrix products of one token, and waking them cost more
# than the products themselves (timed on the default target's ffn_down with 2 threads). They
# spin on for a while (milliseconds) after the last product, then sleep. Read when libgomp
# loads, so this has to run before torch is imported; a value set by the user wins.
_os.environ.setdefault("GOMP_SPINCOUNT", "1000000")

__version__ = "0.1.0"
