"""--kv-unified: every slot may use the whole context while the slots together hold at most
ctx-size tokens; idle slots' cached prompts make room first, and a request that still does not
fit fails with llama-server's 'context size has been exceeded'."""

from __future__ import annotations

import ctypes
import mmap
import random

import pytest
import torch
from gguf import GGMLQuantizationType as QT

from tandem import kernels
from tandem.config import EngineConfig, Numerics, SamplingParams, SpecConfig
from tandem.engine import Engine, Request
from tandem.errors import TandemError
from tandem.models.decoder import KVCache
from tandem.models.loader import load_model

from . import tiny


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    if not kernels.available():
        pytest.skip(f"native kernels unavailable: {kernels.unavailable_reason()}")
    d = tmp_path_factory.mktemp("kvu")
    path = tiny.write_gguf(tiny.hf_model("qwen2", seed=5), d / "t.gguf", "qwen2", qtype=QT.Q8_0)
    return load_model(path, Numerics(weights="native", activations="int16"), max_len=600)


def _engine(model, ctx: int, n_parallel: int, unified: bool, types: str = "none") -> Engine:
    return Engine(model, None, EngineConfig(ctx_size=ctx, n_parallel=n_parallel, batch_size=16,
                                            kv_unified=unified),
                  SpecConfig(types=SpecConfig.parse_types(types)))


def _prompt(seed: int, n: int, vocab: int) -> list[int]:
    rng = random.Random(seed)
    base = [rng.randrange(vocab - 3) for _ in range(rng.randint(3, 7))]
    return (base * (n // len(base) + 1))[:n]


def _greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, n_predict=n, ignore_eos=True)


def _run(e: Engine, reqs: list[Request]) -> list:
    seqs = [e.add(r) for r in reqs]
    while any(not s.done for s in seqs):
        e.step()
    for s in seqs:
        e.release(s)
    return seqs


def test_engine_config_keeps_the_whole_context_for_every_slot():
    import argparse

    from tandem import flags
    p = argparse.ArgumentParser()
    flags.add_model_args(p, parallel=True)
    split = flags.engine_config(p.parse_args(["-c", "256", "-np", "4"]))
    shared = flags.engine_config(p.parse_args(["-c", "256", "-np", "4", "--kv-unified"]))
    assert (split.ctx_size, split.pool) == (64, None)
    assert (shared.ctx_size, shared.pool) == (256, 256)


@pytest.mark.parametrize("types", ["none", "ngram-simple"])
def test_one_request_may_use_more_than_its_share(model, types):
    """4 slots over 64 tokens: 16 each when split; unified, one request reads 10 and writes
    45, the same tokens as on an engine of one 64-token slot (speculation on or off)."""
    vocab = model.args.vocab_size
    req = lambda: Request(_prompt(1, 10, vocab), _greedy(45))  # noqa: E731
    alone = _run(_engine(model, 64, 1, False, types), [req()])[0]
    shared = _run(_engine(model, 64, 4, True, types), [req()])[0]
    assert shared.stop_type == "limit" and len(shared.output) == 45
    assert shared.output == alone.output
    with pytest.raises(TandemError, match="context holds 16"):
        _engine(model, 16, 4, False, types).add(Request(_prompt(1, 20, vocab), _greedy(4)))


def test_requests_that_fit_together_all_finish_unchanged(model):
    vocab = model.args.vocab_size
    reqs = lambda: [Request(_prompt(s, 8, vocab), _greedy(n))  # noqa: E731
                    for s, n in ((2, 40), (3, 20), (4, 40))]  # 3 * 8 + 100 = 124 <= 128
    shared = _run(_engine(model, 128, 3, True), reqs())
    for s, r in zip(shared, reqs()):
        alone = _run(_engine(model, 128, 1, False), [r])[0]
        assert s.stop_type == "limit" and not s.error
        assert s.output == alone.output


def test_the_newest_request_fails_when_the_pool_is_full(model):
    """Two requests of 8 + 50 tokens in a 96-token pool: they cannot both finish. The newer
    fails with llama-server's message; the older finishes with the text it has alone."""
    vocab = model.args.vocab_size
    e = _engine(model, 96, 2, True)
    first, second = (Request(_prompt(s, 8, vocab), _greedy(50)) for s in (6, 7))
    a = e.add(first)
    b = e.add(second)
    while not (a.done and b.done):
        e.step()
    assert a.stop_type == "limit" and len(a.output) == 50 and not a.error
    assert b.stop_type == "error"
    assert "context size has been exceeded" in b.error
    assert e.slots[b.slot] is None and e.cache.length(b.slot) == 0  # its room was given back
    alone = _run(_engine(model, 96, 1, False), [Request(_prompt(6, 8, vocab), _greedy(50))])[0]
    assert a.output == alone.output
    e.release(a)
    # the pool serves on: a request that fits now finishes
    c = _run(e, [Request(_prompt(8, 8, vocab), _greedy(30))])[0]
    assert c.stop_type == "limit" and len(c.output) == 30


def test_idle_slots_cached_prompts_make_room_first(model):
    vocab = model.args.vocab_size
    e = _engine(model, 96, 2, True)
    a = _run(e, [Request(_prompt(9, 40, vocab), _greedy(10), id_slot=0)])[0]
    assert e.cache.length(a.slot) == 49  # kept for a later request with the same prefix
    b = _run(e, [Request(_prompt(10, 30, vocab), _greedy(40), id_slot=1)])[0]
    assert b.stop_type == "limit" and len(b.output) == 40 and not b.error
    assert e.cache.length(0) == 0  # slot 0's idle cache was dropped for slot 1's tokens
    assert e.pool_held() <= 96


def _resident(t: torch.Tensor) -> float:
    """The share of the whole pages inside t's memory (contiguous) that are resident (mincore):
    a measure of this tensor alone, whatever else the process allocates or frees meanwhile."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p)
    page = mmap.PAGESIZE
    start = -(-t.data_ptr() // page) * page
    end = (t.data_ptr() + t.nbytes) // page * page
    n = (end - start) // page
    vec = ctypes.create_string_buffer(n)
    assert libc.mincore(start, end - start, vec) == 0, ctypes.get_errno()
    return sum(b & 1 for b in vec.raw) / n


def test_a_lazy_cache_takes_memory_as_it_is_written_and_gives_it_back(model):
    """Nothing of a lazy cache is resident until written; writing slot 0 makes its pages
    resident and leaves slot 1's alone; dropping the slot gives them back (and its positions
    read as zeros)."""
    args = model.args
    # each of K and V 48 MiB
    max_len = (48 << 20) // (2 * args.n_layers * args.n_kv_heads * args.head_dim * 4)
    cache = KVCache(args, 2, max_len, torch.float32, lazy=True)
    # residency page by page: where transparent huge pages are always on, a write would make a
    # whole 2 MiB resident, across the border between one slot's run and the next
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    for t in (cache.k, cache.v):
        assert libc.madvise(t.data_ptr(), t.nbytes, 15) == 0, ctypes.get_errno()  # NOHUGEPAGE
    runs = [t[layer, slot, head] for t in (cache.k, cache.v) for layer in range(args.n_layers)
            for slot in (0, 1) for head in range(args.n_kv_heads)]
    assert max(_resident(r) for r in runs) < 0.05
    cache.k[:, 0].fill_(1.0)
    cache.v[:, 0].fill_(1.0)
    cache.append(0, list(range(max_len)))
    slot0 = [r for i, r in enumerate(runs) if (i // args.n_kv_heads) % 2 == 0]
    slot1 = [r for i, r in enumerate(runs) if (i // args.n_kv_heads) % 2 == 1]
    assert min(_resident(r) for r in slot0) > 0.95
    assert max(_resident(r) for r in slot1) < 0.05
    cache.drop(0)
    assert cache.length(0) == 0
    assert max(_resident(r) for r in slot0) < 0.05
    assert not cache.k[0, 0, 0, 64:-64].any()  # (the pages inside the run: zeros)
