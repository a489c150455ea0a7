"""--context-shift (llama-server's): a full context drops tokens and generation goes on.

KVCache.shift moves the later positions down and turns their keys back by the number dropped;
the engine shifts where llama-server does (the context full), keeps the request's n_keep
tokens, and speculation still gives the target's own greedy text across shifts."""

from __future__ import annotations

import pytest
import torch

from tandem.config import EngineConfig, Numerics, SamplingParams, SpecConfig
from tandem.engine import Engine, Request
from tandem.models.decoder import KVCache
from tandem.models.loader import load_model

from . import tiny

GREEDY = dict(temperature=0.0, ignore_eos=True)


# RoPE on halves / on adjacent pairs; gemma3 with layer 0 sliding (its own rope base) or full
# (the model's base, linearly scaled)
@pytest.mark.parametrize("arch", ["qwen2", "llama", "gemma3", "gemma3-full"])
def test_shift_turns_the_keys_to_their_new_positions(tmp_path, arch):
    """Layer 0's keys and values depend on a token and its position alone, so after dropping
    positions keep .. keep + discard - 1 they must be what reading the shortened sequence
    computes: values exactly (moved), keys up to float32 rounding (turned); the positions
    before `keep` are untouched, and a later request reuses no more than those."""
    arch, _, full = arch.partition("-")
    over = dict(layer_types=["full_attention", "sliding_attention", "sliding_attention"]) if full else {}
    m = load_model(tiny.write_gguf(tiny.hf_model(arch, seed=4, **over), tmp_path / "m.gguf", arch),
                   Numerics(dtype="float32"), max_len=128)
    assert m.args.layer_rope(0) == ((1e6, 2.0) if full else (1e4, 1.0) if arch == "gemma3"
                                    else (m.args.rope_theta, 1.0))
    ids = [(7 * i + 3) % (m.args.vocab_size - 4) for i in range(40)]
    keep, discard = 5, 13
    cache = KVCache(m.args, 2, 128, torch.float32)
    m.model(torch.tensor([ids]), cache, [0], [0], logits="none")
    cache.append(0, ids)
    before = cache.k[:, 0, :, :keep].clone()
    moved = cache.k[:, 0, :, keep + discard: len(ids)].clone()
    cache.shift(0, keep, discard)
    short = ids[:keep] + ids[keep + discard:]
    assert cache.tokens[0] == short
    m.model(torch.tensor([short]), cache, [1], [0], logits="none")
    n = len(short)
    assert torch.equal(cache.k[:, 0, :, :keep], before)
    assert torch.equal(cache.v[0, 0, :, :n], cache.v[0, 1, :, :n])
    k0, k1 = cache.k[0, 0, :, :n], cache.k[0, 1, :, :n]
    assert torch.allclose(k0, k1, rtol=1e-5, atol=1e-5 * k1.abs().max().item())
    # the keys were turned, not only moved (a turn the wrong way fails the closeness above)
    assert not torch.allclose(cache.k[:, 0, :, keep: n], moved, atol=1e-3)
    assert cache.common_prefix(0, short) == keep
    cache.truncate(0, 3)
    assert cache.exact[0] is None and cache.common_prefix(0, short) == 3


def _engine(models, types: str, ctx: int, draft: str = "same", **spec) -> Engine:
    target, same, other = models
    d = {"same": same, "other": other}[draft] if "draft" in types else None
    return Engine(target, d, EngineConfig(ctx_size=ctx, context_shift=True),
                  SpecConfig(types=SpecConfig.parse_types(types), **spec))


def test_generation_goes_on_past_a_full_context(models):
    """Without the shift a generation stops at the full context; with it, it goes on to
    n_predict, the context never holds more than ctx tokens, and the answer says truncated."""
    prompt = list(range(3, 23))
    stop = Engine(models[0], None, EngineConfig(ctx_size=40), SpecConfig(types=[]))
    seq = stop.generate(Request(prompt, SamplingParams(n_predict=70, **GREEDY)))
    assert len(seq.output) == 20 and seq.stop_type == "limit" and not seq.truncated
    e = _engine(models, "none", 40)
    seq = e.generate(Request(prompt, SamplingParams(n_predict=70, **GREEDY)))
    assert len(seq.output) == 70 and seq.stop_type == "limit" and seq.truncated
    assert len(seq.tokens) <= 40 and e.cache.length(0) < 40
    # n_keep = -1 keeps the prompt through every shift
    seq = e.generate(Request(prompt, SamplingParams(n_predict=70, **GREEDY), n_keep=-1))
    assert seq.tokens[:20] == prompt and len(seq.output) == 70
    # n_keep = 4, n_discard = 2: each shift drops exactly two tokens after the first four
    seq = e.generate(Request(prompt, SamplingParams(n_predict=30, **GREEDY), n_keep=4,
                             n_discard=2))
    tail = seq.tokens[4:]
    assert seq.tokens[:4] == prompt[:4] and (prompt + seq.output)[-len(tail):] == tail
    assert len(seq.output) == 30 and seq.truncated


@pytest.mark.parametrize("types,draft", [("draft-simple", "same"), ("draft-simple", "other"),
                                         ("suffix,draft-simple", "other"), ("ngram-simple", "same")])
def test_greedy_speculation_equals_target_alone_across_shifts(models, types, draft):
    """Shifts happen at the same tokens with and without drafts (a draft never reaches past
    the full context), so the turned keys are the same and so is the greedy text; the draft
    model's cache is shifted as the target's."""
    base = _engine(models, "none", 48)
    spec = _engine(models, types, 48, draft, n_max=5, p_min=0.0, ngram_min=1, ngram_max=3)
    drafted = accepted = 0
    for prompt in ([5, 6, 7, 8] * 6, list(range(30, 50)), [9, 9, 10, 11, 9, 9, 10]):
        for keep in (0, -1):
            req = dict(sampling=SamplingParams(n_predict=90, **GREEDY), n_keep=keep,
                       cache_prompt=False)
            want = base.generate(Request(list(prompt), **req))
            got = spec.generate(Request(list(prompt), **req))
            assert got.output == want.output and got.truncated and want.truncated
            drafted += got.stats.n_drafted
            accepted += got.stats.n_accepted
    assert drafted > 0
    if types == "draft-simple" and draft == "same":
        # the target's own weights: every draft is right only if its cache was shifted as
        # the target's (a stale one proposes from the wrong context)
        assert accepted == drafted, (accepted, drafted)
