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


# ---- kernels -----------------------------------------------------------------------------------


@pytest.fixture(params=["avx512", "avx512-simde"])
def kernel_build(request) -> str:
    """An AVX-512 build of the kernels, to hold against the AVX2 build: native where the CPU
    has AVX-512 VNNI, and over SIMDe (Debian libsimde-dev, which .ci/run installs) on any
    x86-64. A build that should load here and does not is a failure, not a skip."""
    from pathlib import Path

    from tandem import kernels

    build = request.param
    if kernels.unavailable_reason("avx2") is not None:
        pytest.skip(f"native kernels unavailable: {kernels.unavailable_reason('avx2')}")
    if kernels.unavailable_reason(build) is None:
        return build
    cpu = kernels._cpu_flags()
    if build == "avx512" and not all(f in cpu for f in kernels.VARIANTS["avx512"][1]):
        pytest.skip("this CPU has no AVX-512 VNNI (the avx512-simde build runs that code)")
    if build == "avx512-simde" and not Path("/usr/include/simde/x86/avx512.h").exists():
        pytest.skip("SIMDe headers missing (Debian libsimde-dev; .ci/run installs them)")
    pytest.fail(f"build {build} is unavailable: {kernels.unavailable_reason(build)}")


# ---- measurement (test_compare.py, test_bench_run.py) ----------------------------------------


@pytest.fixture
def no_matplotlib(monkeypatch):
    """matplotlib as if not installed (it is the optional extra tandem[plot]): importing it, or
    any of its modules already imported, raises ImportError."""
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
