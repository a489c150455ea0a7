"""The host-memory prompt cache (--cache-ram): a slot's tokens kept in RAM when another prompt
takes the slot, and loaded back for a later prompt that starts the same way, with the same
answer as reading the prompt again."""

from __future__ import annotations

import argparse
import random

import pytest
import torch
from gguf import GGMLQuantizationType as QT

from tandem import flags, kernels
from tandem.config import EngineConfig, Numerics, SamplingParams, SpecConfig
from tandem.engine import Engine, Request
from tandem.errors import TandemError
from tandem.promptcache import PromptCache

from . import tiny


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    if not kernels.available():
        pytest.skip(f"native kernels unavailable: {kernels.unavailable_reason()}")
    d = tmp_path_factory.mktemp("pcache")
    path = tiny.write_gguf(tiny.hf_model("qwen2", seed=11), d / "t.gguf", "qwen2", qtype=QT.Q8_0)
    return load(path)


def load(path):
    from tandem.models.loader import load_model
    return load_model(path, Numerics(weights="native", activations="int16"), max_len=600)


def _engine(model, cache_ram: int | None, n_parallel: int = 1, types: str = "none") -> Engine:
    return Engine(model, None, EngineConfig(ctx_size=256, n_parallel=n_parallel, batch_size=32,
                                            cache_ram=cache_ram),
                  SpecConfig(types=SpecConfig.parse_types(types)))


def _prompt(seed: int, n: int, vocab: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(vocab - 3) for _ in range(n)]


def _ask(e: Engine, ids: list[int], n: int = 12):
    seq = e.generate(Request(list(ids), SamplingParams(temperature=0.0, n_predict=n,
                                                       ignore_eos=True)))
    return seq.output, seq.n_prompt_processed


@pytest.mark.parametrize("types", ["none", "ngram-simple"])
def test_a_conversation_that_comes_back_reads_only_what_is_new(model, types):
    """Two conversations alternate in one slot. Without the cache each turn re-reads its whole
    prompt; with it, the first conversation's second turn reads only its new tokens, and every
    answer is the one a fresh engine gives."""
    vocab = model.args.vocab_size
    a, b = _prompt(1, 80, vocab), _prompt(2, 70, vocab)
    cached, plain = _engine(model, None, types=types), _engine(model, 0, types=types)
    assert cached.prompt_cache is not None and plain.prompt_cache is None
    out_a, n = _ask(cached, a)
    assert n == 80 and _ask(plain, a) == (out_a, 80)
    out_b, n = _ask(cached, b)
    assert n == 70  # b shares nothing with a: a goes to the host cache
    assert len(cached.prompt_cache) == 1
    a2 = a + out_a + _prompt(3, 9, vocab)  # the next turn of a's conversation
    out_a2, n = _ask(cached, a2)
    assert n == 10  # only the new turn's tokens and the answer's last (never read yet)
    fresh = _engine(model, 0, types=types)
    assert _ask(fresh, a2) == (out_a2, len(a2))
    # b went to the host cache in turn, and comes back whole
    out_b2, n = _ask(cached, b)
    assert (out_b2, n) == (out_b, 1)


def test_the_cache_keeps_the_most_recent_entries_within_its_bytes():
    def kv(n):
        return torch.full((2, 1, n, 4), float(n)), torch.full((2, 1, n, 4), -float(n))
    per_token = 2 * 2 * 1 * 4 * 4  # K and V, 2 layers, 1 head, head_dim 4, float32
    pc = PromptCache(limit=per_token * 50)
    assert pc.save(list(range(20)), *kv(20))
    assert pc.save(list(range(100, 120)), *kv(20))
    assert not pc.save(list(range(200, 260)), *kv(60))  # larger than the whole limit
    pc.best(list(range(20)))
    assert pc.save(list(range(300, 320)), *kv(20))  # 60 tokens: the oldest goes
    assert list(pc.entries) == [tuple(range(100, 120)), tuple(range(300, 320))]
    assert pc.nbytes == per_token * 40
    # an entry that holds another one and more replaces it; a prefix of one is not kept
    assert pc.save(list(range(100, 125)), *kv(25))
    assert tuple(range(100, 120)) not in pc.entries
    assert not pc.save(list(range(100, 110)), *kv(10))
    n, e = pc.best([100, 101, 102, 7])
    assert n == 3 and e.tokens == tuple(range(100, 125)) and float(e.k[0, 0, 0, 0]) == 25
    pc.take(e)
    assert len(pc) == 1 and pc.best([100])[1] is None


def test_the_limit_follows_llama_servers_flag():
    p = argparse.ArgumentParser()
    flags.add_model_args(p, parallel=True)
    mib = 1 << 20
    assert flags.engine_config(p.parse_args(["--cache-ram", "64"])).cache_ram_bytes(0) == 64 * mib
    assert flags.engine_config(p.parse_args(["-cram", "-1"])).cache_ram_bytes(0) is None
    assert flags.engine_config(p.parse_args(["-cram", "0"])).cache_ram_bytes(1 << 40) == 0
    default = flags.engine_config(p.parse_args([]))
    assert default.cache_ram_bytes(1 << 40) == 8192 * mib  # llama-server's default
    assert default.cache_ram_bytes(4 << 30) == 1 << 30  # at most a quarter of what is free
    with pytest.raises(TandemError, match="cache-ram must be -1"):
        flags.engine_config(p.parse_args(["--cache-ram", "-5"]))


def test_kv_unified_keeps_an_idle_slots_prompt_in_host_memory(model):
    """Under --kv-unified an idle slot's cached prompt is dropped to make room; with the host
    cache it is kept there and comes back for the next request that starts with it."""
    vocab = model.args.vocab_size
    e = Engine(model, None, EngineConfig(ctx_size=128, n_parallel=2, batch_size=32,
                                         kv_unified=True, cache_ram=None),
               SpecConfig(types=SpecConfig.parse_types("none")))
    a = _prompt(4, 70, vocab)
    first = e.generate(Request(list(a), SamplingParams(temperature=0.0, n_predict=4),
                               id_slot=0))
    other = e.generate(Request(_prompt(5, 60, vocab),
                               SamplingParams(temperature=0.0, n_predict=30, ignore_eos=True),
                               id_slot=1))
    assert not other.error and e.cache.length(0) == 0  # slot 0 made room
    again = e.generate(Request(list(a), SamplingParams(temperature=0.0, n_predict=4),
                               id_slot=0))
    assert again.n_prompt_processed == 1 and again.output == first.output


def test_cache_types_follow_llama_servers_flags(model):
    p = argparse.ArgumentParser()
    flags.add_model_args(p, parallel=True)
    default = flags.engine_config(p.parse_args([]))
    e = Engine(model, None, default, SpecConfig(types=SpecConfig.parse_types("none")))
    assert (e.cache.k.dtype, e.cache.v.dtype) == (torch.float16, torch.float16)  # llama-server's
    cfg = flags.engine_config(p.parse_args(["-ctk", "f32", "--cache-type-v", "f16",
                                            "-ctkd", "f32"]))
    assert cfg.cache_types("target") == ("f32", "f16")
    assert cfg.cache_types("draft") == ("f32", "f16")
    e32 = Engine(model, None, EngineConfig(ctx_size=256, cache_type_k="f32", cache_type_v="f32"),
                 SpecConfig(types=SpecConfig.parse_types("none")))
    assert (e32.cache.k.dtype, e32.cache.v.dtype) == (torch.float32, torch.float32)
    ids = _prompt(5, 40, model.args.vocab_size)
    out16, _ = _ask(e, ids)
    out32, _ = _ask(e32, ids)
    # halves hold the keys to ~3 decimal digits: the tiny model's greedy text is unchanged
    assert out16 == out32
    assert e.cache.nbytes * 2 == Engine(model, None, EngineConfig(
        ctx_size=default.ctx_size, cache_type_k="f32", cache_type_v="f32"),
        SpecConfig(types=SpecConfig.parse_types("none"))).cache.nbytes
    with pytest.raises(SystemExit):  # not a type the kernels hold
        p.parse_args(["-ctk", "q8_0"])
