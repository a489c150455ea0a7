"""Fixtures shared by several test modules (test modules never import each other; plain
helpers live in tiny.py and bench_helpers.py)."""

from __future__ import annotations

import sys
from functools import lru_cache

import pytest
import torch

from tandem.config import Numerics
from tandem.models.loader import load_model

from . import tiny

# The tiny models are far too small for threads to help, and on a busy 2-core machine
# spinning worker threads make them many times slower.
torch.set_num_threads(1)


# ---- models ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(target, draft, other): a tiny qwen2 target, a draft with the same weights (its guesses
    are always right under greedy) and an unrelated draft (often rejected)."""
    d = tmp_path_factory.mktemp("engine")
    f32 = Numerics(dtype="float32")
    target = load_model(tiny.write_gguf(tiny.hf_model("qwen2", seed=3), d / "t.gguf", "qwen2"),
                        f32, max_len=600)
    draft = load_model(tiny.write_gguf(tiny.hf_model("qwen2", seed=3), d / "d.gguf", "qwen2"),
                       f32, max_len=600)
    other = load_model(tiny.write_gguf(tiny.hf_model("qwen2", seed=9), d / "o.gguf", "qwen2"),
                       f32, max_len=600)
    return target, draft, other


@pytest.fixture(scope="session")
def real_gguf():
    """open(name): a named real model's GGUFFile, opened once per test session (parsing the
    metadata of a 150k-token vocabulary takes over ten seconds)."""
    from tandem.models.gguf_file import GGUFFile
    from tandem.registry import pull

    @lru_cache(maxsize=None)
    def open_(name: str):
        return GGUFFile(pull(name, quiet=True))

    return open_


# ---- measurement (test_compare.py, test_bench_run.py) ----------------------------------------


@pytest.fixture
def no_matplotlib(monkeypatch):
    """matplotlib as if not installed (it is the optional extra tandem[plot]): importing it, or
    any of its modules already imported, raises ImportError."""
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
