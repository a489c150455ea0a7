"""The engine end to end on tiny float32 models: speculation never changes greedy output,
sampled output keeps the target's distribution, stop conditions and statistics."""

from __future__ import annotations

import random

import torch

import pytest

from tandem.config import EngineConfig, SamplingParams, SpecConfig
from tandem.engine import Engine, Request
from tandem.errors import TandemError


GREEDY = dict(temperature=0.0)


def engine(models, types: str, draft="same", n_parallel=1, **spec) -> Engine:
    target, same, other = models
    d = {"same": same, "other": other, None: None}[draft]
    cfg = SpecConfig(types=SpecConfig.parse_types(types), **spec)
    return Engine(target, d if "draft" in types else None,
                  EngineConfig(ctx_size=512, n_parallel=n_parallel), cfg)


def run(e: Engine, ids: list[int], **sp) -> list[int]:
    seq = e.generate(Request(list(ids), SamplingParams(**sp), cache_prompt=False))
    return seq.output


def random_prompts(n: int, vocab: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        base = [rng.randrange(vocab - 3) for _ in range(rng.randint(1, 12))]
        out.append(base * rng.randint(1, 3))  # repetition gives the n-gram proposer matches
    return out


@pytest.mark.parametrize("types,draft", [
    ("ngram-simple", None), ("draft-simple", "same"), ("draft-simple", "other"),
    ("ngram-simple,draft-simple", "other"), ("suffix", None), ("suffix,draft-simple", "other"),
])
def test_greedy_speculation_equals_target_alone(models, types, draft):
    base = engine(models, "none")
    spec = engine(models, types, draft, n_max=5, p_min=0.0, ngram_min=1, ngram_max=3)
    vocab = models[0].args.vocab_size
    drafted = accepted = 0
    kinds = {"ngram-simple": "ngram", "draft-simple": "draft", "suffix": "suffix"}
    seen = set()
    for ids in random_prompts(12, vocab, seed=len(types)):
        want = run(base, ids, n_predict=24, **GREEDY)
        seq = spec.generate(Request(ids, SamplingParams(n_predict=24, **GREEDY),
                                    cache_prompt=False))
        assert seq.output == want, (types, ids)
        drafted += seq.stats.n_drafted
        accepted += seq.stats.n_accepted
        # every accepted token names the proposer that drafted it (the page colours them);
        # accepted tokens after the end (EOS, n_predict) are counted but not part of the answer
        assert sum(o != "target" for o in seq.origins) <= seq.stats.n_accepted
        assert set(seq.origins) <= {"target", *(kinds[t] for t in types.split(","))}
        seen |= set(seq.origins)
    assert drafted > 0  # speculation really ran
    assert accepted == 0 or seen - {"target"}
    if draft == "same":
        assert accepted == drafted  # an identical draft is always right under greedy


@pytest.mark.parametrize("draft", ["same", "other"])
def test_statistics_add_up(models, draft):
    e = engine(models, "draft-simple", draft, n_max=4, p_min=0.0)
    seq = e.add(Request([5, 6, 7, 8], SamplingParams(n_predict=40, ignore_eos=True, **GREEDY)))
    iterations = 0
    while not seq.done:
        reading = seq.prefilling  # a step that reads the prompt yields no token
        e.step()
        iterations += not reading
    e.release(seq)
    s = seq.stats
    assert s.n_drafts > 0 and s.n_drafted >= s.n_accepted
    if draft == "same":  # always right under greedy: several tokens per iteration
        assert s.n_accepted == s.n_drafted > 0 and iterations < 40
    else:  # an unrelated model: mostly wrong
        assert s.n_drafted > s.n_accepted
    assert sum(s.accepted_per_pos) == s.n_accepted
    assert sum(s.drafted_per_pos) == s.n_drafted
    assert s.drafted_per_pos[0] == s.n_drafts
    # every iteration yields its accepted tokens + 1 (the target's own); drafts never run past
    # n_predict, so no iteration is cut short
    assert len(seq.output) == 40 == s.n_accepted + iterations
    # each token says who proposed it: the draft model's accepted tokens, the target's own
    assert sum(o == "draft" for o in seq.origins) == s.n_accepted
    assert set(seq.origins) <= {"draft", "target"}
    # and where its text ends: the answer is the tokens' texts in order
    assert len(seq.ends) == len(seq.output) and seq.ends[-1] == len(seq.text)
    assert "".join(seq.text[a:b] for a, b in zip([0, *seq.ends], seq.ends)) == seq.text
    t = seq.timings()
    assert t["draft_n"] == s.n_drafted and t["draft_n_accepted"] == s.n_accepted
    assert t["predicted_n"] == 40
    assert s.mean_acceptance_length == pytest.approx(1 + s.n_accepted / s.n_drafts)


def test_n_predict_eos_and_stop_word(models):
    e = engine(models, "ngram-simple", ngram_min=1)
    tok = models[0].tokenizer
    seq = e.generate(Request([5, 6, 7], SamplingParams(n_predict=7, **GREEDY)))
    assert len(seq.output) == 7 and seq.stop_type == "limit"
    text = tok.decode(seq.output)
    assert seq.text == text
    # a stop string cut from the greedy text stops there, and is not returned
    word = text[3:6]
    assert word
    seq2 = e.generate(Request([5, 6, 7], SamplingParams(n_predict=7, stop=[word], **GREEDY)))
    assert seq2.stop_type == "word" and seq2.stopping_word == word
    assert seq2.text == text[: text.find(word)]
    seq3 = e.generate(Request([5, 6, 7], SamplingParams(n_predict=0, **GREEDY)))
    assert seq3.output == [] and seq3.stop_type == "limit"


def test_eos_ends_generation_unless_ignored(models):
    e = engine(models, "none")
    tok = models[0].tokenizer
    eos = tok.eos_id
    assert eos in tok.eog_ids
    for ignore in (False, True):
        seq = e.add(Request([5, 6, 7], SamplingParams(n_predict=10, ignore_eos=ignore, **GREEDY)))
        seq.append([40, eos, 41], 2, "ngram", tok.eog_ids, e.cfg.ctx_size, e.cfg.context_shift)  # as if verification returned these three tokens
        e.release(seq)
        if ignore:
            assert seq.output == [40, eos, 41] and not seq.done
        else:
            assert seq.output == [40, eos] and seq.stop_type == "eos"
            assert seq.text == tok.decode([40])  # the EOS text is not part of the answer
            assert seq.origins == ["ngram", "ngram"]


def test_streamed_text_equals_final_content(models):
    e = engine(models, "ngram-simple", ngram_min=1)
    pieces: list[str] = []
    seq = e.generate(Request([9, 10, 11, 9, 10], SamplingParams(n_predict=30, **GREEDY)),
                     on_text=pieces.append)
    assert "".join(pieces) == seq.text


def test_seeded_sampling_repeats(models):
    e = engine(models, "draft-simple", "other", n_max=3, p_min=0.0)
    sp = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, n_predict=20, seed=1234)
    assert run(e, [5, 6, 7], **sp) == run(e, [5, 6, 7], **sp)
    assert run(e, [5, 6, 7], **sp) != run(e, [5, 6, 7], **{**sp, "seed": 99})


def test_a_seed_gives_the_same_sampled_text_with_a_draft_model(models):
    """The draft proposes its top token and the target draws its own sample at each row,
    kept while they match: a seed gives the target alone's text, as llama-server's
    test_with_and_without_draft asks, with drafts accepted (the identical draft) or not."""
    sp = dict(temperature=0.7, top_k=5, top_p=1.0, min_p=0.0, n_predict=24)
    base = engine(models, "none")
    vocab = models[0].args.vocab_size
    for draft in ("same", "other"):
        spec = engine(models, "draft-simple", draft, n_max=4, p_min=0.0)
        accepted = 0
        for seed, ids in enumerate(random_prompts(4, vocab, seed=21)):
            seq = spec.generate(Request(list(ids), SamplingParams(seed=seed, **sp),
                                        cache_prompt=False))
            assert seq.output == run(base, ids, seed=seed, **sp), (draft, seed)
            assert seq.stats.n_drafted > 0
            accepted += seq.stats.n_accepted
        assert draft == "other" or accepted > 0


@pytest.mark.parametrize("rejection,draft_vocab", [(False, 100), (True, 0), (True, 100)])
def test_sampled_distribution_unchanged_by_speculation(models, rejection, draft_vocab):
    """First three generated tokens, with and without a (different) draft: same distribution.

    Two-sample chi-square per position over tokens seen at least 10 times in total; with
    n = 700 runs per side a wrong acceptance rule (e.g. always accepting the draft) moves
    these distributions far beyond the 1e-3 level this test allows. draft_vocab 100: the draft
    proposes from a shortlist (with rejection it samples there: zero probability elsewhere),
    and that must not matter either. rejection: --spec-draft-rejection's rejection sampling.
    """
    from scipy.stats import chi2_contingency

    sp = dict(temperature=1.0, top_k=6, top_p=1.0, min_p=0.0, n_predict=3)
    base = engine(models, "none")
    spec = engine(models, "draft-simple", "other", n_max=3, p_min=0.0, draft_vocab=draft_vocab,
                  draft_rejection=rejection)
    n = 700
    outs = {}
    for name, e in (("base", base), ("spec", spec)):
        rows = []
        for i in range(n):
            rows.append(run(e, [5, 6, 7, 8], seed=i + (0 if name == "base" else 10**6), **sp))
        outs[name] = rows
    for pos in range(3):
        a = [r[pos] for r in outs["base"]]
        b = [r[pos] for r in outs["spec"]]
        keys = sorted({t for t in a + b if a.count(t) + b.count(t) >= 10})
        table = [[a.count(t) for t in keys], [b.count(t) for t in keys]]
        assert chi2_contingency(table).pvalue > 1e-3, (pos, table)


def test_draft_window_keeps_output_and_shortens_the_drafts_prompt(models):
    """--spec-draft-window: the draft processes only the prompt's last tokens (it then sees a
    shorter context than the target, so even an identical model is sometimes wrong); the
    output is still the target's, and the draft's cache holds exactly the sequence from the
    window's start on. A window longer than the prompt changes nothing."""
    base = engine(models, "none")
    spec = engine(models, "draft-simple", "same", n_max=4, p_min=0.0, draft_window=3)
    wide = engine(models, "draft-simple", "same", n_max=4, p_min=0.0, draft_window=1000)
    vocab = models[0].args.vocab_size
    for ids in random_prompts(6, vocab, seed=11):
        want = run(base, ids, n_predict=16, **GREEDY)
        sp = SamplingParams(n_predict=16, **GREEDY)
        seq = spec.generate(Request(list(ids), sp, cache_prompt=False))
        assert seq.output == want, ids
        assert seq.stats.n_drafted > 0
        start = max(0, len(ids) - 1 - 3)
        held = spec.draft_cache.tokens[seq.slot]
        assert held == seq.tokens[start:start + len(held)]
        assert len(held) <= 3 + len(seq.output)
        full = wide.generate(Request(list(ids), sp, cache_prompt=False))
        assert full.output == want and full.stats.n_accepted == full.stats.n_drafted > 0
    with pytest.raises(TandemError, match="spec-draft-window"):
        SpecConfig(types=["draft-simple"], draft_window=-1)


def test_draft_vocabulary_shortlist(models):
    """--spec-draft-vocab: the draft scores only the first N ids plus those the sequence used
    (exactly the full projection's values there), proposes only among them, and the output is
    still the target's."""
    from tandem.models.decoder import KVCache
    from tandem.speculative.draft import DraftModelProposer, Shortlist

    target, same, _ = models
    short = Shortlist(same.model.output, 100, same.args.vocab_size)
    short.add([5, 250, 250, 120, 299])
    assert short.ids.tolist() == list(range(100)) + [250, 120, 299]
    h = torch.randn(same.args.dim)
    full = same.model.output(h[None])[0]
    assert torch.allclose(short.logits(h), full[short.ids], atol=1e-5)

    base = engine(models, "none")
    spec = engine(models, "draft-simple", "same", n_max=4, p_min=0.0, draft_vocab=100)
    vocab = target.args.vocab_size
    for ids in random_prompts(6, vocab, seed=5):
        want = run(base, ids, n_predict=16, **GREEDY)
        p = DraftModelProposer(same.model, KVCache(same.args, 1, 128, same.dtype), 0,
                               SamplingParams(**GREEDY), None, 4, 0, 0.0, vocab=100)
        p.begin(list(ids))
        proposed = p.propose(4).ids
        seq = spec.generate(Request(list(ids), SamplingParams(n_predict=16, **GREEDY),
                                    cache_prompt=False))
        assert seq.output == want, ids
        assert seq.stats.n_drafted > 0
        allowed = set(range(100)) | set(ids)
        assert proposed and set(proposed) <= allowed


def test_auto_reads_the_prompt_into_the_draft_only_when_it_pays(models):
    """auto starts the draft lazily: it reads the prompt only when the measured costs say the
    rest of the generation will pay that back (n_predict tokens to go times the time the draft
    saves per token, against the prompt's length times the draft's per-token prompt cost)."""
    base = engine(models, "none")
    rng = random.Random(4)
    ids = [rng.randrange(models[0].args.vocab_size - 3) for _ in range(40)]
    want = run(base, ids, n_predict=12, **GREEDY)

    target, same, _ = models
    e = Engine(target, same, EngineConfig(ctx_size=512),
               SpecConfig(types=["auto"], n_max=4, p_min=0.0))
    # frozen costs (alpha 0: measurements do not move them) under which drafting pays well
    e.costs.alpha = 0.0
    for rows, t in ((1, 0.1), (2, 0.11), (3, 0.12), (4, 0.13), (5, 0.14)):
        e.costs.record_verify(rows, t)
    e.costs.record_draft(1, 0.001)
    e.costs.record_prompt(1, 0.02)  # the target reads a prompt row in a fifth of a pass
    e.costs.record_draft_prefill(16, 16.0)  # 40 s to read the prompt: 12 tokens cannot repay it
    for _ in range(3):  # (three answers of 12 tokens: what the next one is expected to be)
        seq = e.generate(Request(list(ids), SamplingParams(n_predict=12, **GREEDY),
                                 cache_prompt=False))
        assert seq.output == want
        assert e.draft_cache.length(seq.slot) == 0  # the draft never read anything

    e.costs.draft_prefill_token = 1e-6  # now cheap: reading the prompt pays at once
    seq = e.generate(Request(list(ids), SamplingParams(n_predict=12, **GREEDY),
                             cache_prompt=False))
    assert seq.output == want
    assert e.draft_cache.length(seq.slot) >= len(ids) - 1
    assert seq.stats.n_drafted > 0


def test_ignore_eos_masks_every_end_of_generation_token(models, monkeypatch):
    """As llama-server (a -inf logit bias on each EOG id): a request that ignores EOS never
    gets one, even where the model puts nearly all its mass on it; without it, EOS ends."""
    e = engine(models, "none")
    eog = sorted(models[0].tokenizer.eog_ids)
    model = e.target.model
    real = model.forward_packed

    def eos_loving(*args, **kw):
        out = real(*args, **kw)
        if out is not None:
            out = out.clone()
            out[:, eog[0]] += 1e4
        return out

    monkeypatch.setattr(model, "forward_packed", eos_loving)
    kept = e.generate(Request([5, 6, 7], SamplingParams(n_predict=6, ignore_eos=True, **GREEDY)))
    assert len(kept.output) == 6 and not set(kept.output) & set(eog)
    ended = e.generate(Request([5, 6, 7], SamplingParams(n_predict=6, **GREEDY)))
    assert ended.output == [eog[0]] and ended.stop_type == "eos"


def test_a_seed_gives_the_same_sampled_text_with_free_speculation(models):
    """n-gram and suffix drafts are verified by drawing the target's own token row by row, one
    number per emitted token: the same seed gives the same sampled text as the target alone
    (llama-server's guarantee), while the drafts are accepted where they match."""
    prompt = [9, 10, 11, 12, 9, 10, 11, 12, 9, 10, 11, 12, 9, 10]  # repetition: drafts happen
    sp = dict(temperature=0.9, top_k=0, top_p=1.0, min_p=0.0, n_predict=40, ignore_eos=True)
    for seed in (1, 2, 3):
        alone = run(engine(models, "none"), prompt, seed=seed, **sp)
        for types in ("ngram-simple", "suffix"):
            e = engine(models, types, ngram_min=1)
            seq = e.generate(Request(list(prompt), SamplingParams(seed=seed, **sp),
                                     cache_prompt=False))
            assert seq.output == alone, (types, seed)
            assert seq.stats.n_drafted > 0
        assert alone != run(engine(models, "none"), prompt, seed=seed + 10, **sp)


def test_each_request_after_an_idle_spell_starts_a_new_thread_window(models):
    """The engine tells its CpuShare when it starts working after every sequence was done, once
    per idle spell, not per pass: what other processes did while it waited is not counted
    (cpushare.py). Two sequences overlapping make one busy spell."""
    e = engine(models, "none", n_parallel=2)
    calls = []
    e.cpu.resume = lambda: calls.append(len(e.active()))
    run(e, [1, 2, 3], n_predict=4)
    run(e, [4, 5, 6], n_predict=4)
    assert calls == [1, 1]
    a = e.add(Request([1, 2, 3], SamplingParams(temperature=0.0, n_predict=6)))
    e.step()
    b = e.add(Request([7, 8], SamplingParams(temperature=0.0, n_predict=6)))
    while not (a.done and b.done):
        e.step()
    e.release(a)
    e.release(b)
    assert calls == [1, 1, 1]
