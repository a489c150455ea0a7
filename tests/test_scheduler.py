"""The scheduler step: prompts read in chunks between the running streams' tokens, under a
token budget per pass, and every output the same as the request run alone."""

from __future__ import annotations

import random

import pytest
import torch
from gguf import GGMLQuantizationType as QT

from tandem import kernels
from tandem.config import EngineConfig, Numerics, SamplingParams, SpecConfig
from tandem.engine import Engine, Request
from tandem.models.loader import load_model
from tandem.speculative.controller import Controller, CostModel

from . import tiny


@pytest.fixture(scope="module")
def native_model(tmp_path_factory):
    """A tiny qwen2 with Q8_0 weights: every layer through the native kernels (one C call per
    pass, the path the default models take)."""
    if not kernels.available():
        pytest.skip(f"native kernels unavailable: {kernels.unavailable_reason()}")
    d = tmp_path_factory.mktemp("sched")
    path = tiny.write_gguf(tiny.hf_model("qwen2", seed=3), d / "t.gguf", "qwen2", qtype=QT.Q8_0)
    return load_model(path, Numerics(weights="native", activations="int16"), max_len=600)


@pytest.fixture(scope="module", params=["native", "pytorch"])
def target(request, native_model, models):
    """The same scheduler over both forward paths: the native layers (rows of every slot in
    one C call) and the PyTorch layers (float32 GGUF: one pass per slot's run of rows)."""
    return native_model if request.param == "native" else models[0]


def _engine(model, n_parallel: int, batch: int, types: str = "none") -> Engine:
    return Engine(model, None, EngineConfig(ctx_size=512, n_parallel=n_parallel, batch_size=batch),
                  SpecConfig(types=SpecConfig.parse_types(types)))


def _prompt(rng: random.Random, n: int, vocab: int) -> list[int]:
    base = [rng.randrange(vocab - 3) for _ in range(rng.randint(3, 9))]
    return (base * (n // len(base) + 1))[:n]


def test_running_streams_keep_producing_while_a_long_prompt_is_read(target):
    e = _engine(target, n_parallel=3, batch=8)
    vocab = target.args.vocab_size
    rng = random.Random(1)
    sp = SamplingParams(temperature=0.0, n_predict=200, ignore_eos=True)
    a = e.add(Request(_prompt(rng, 6, vocab), sp))
    b = e.add(Request(_prompt(rng, 9, vocab), sp))
    while a.prefilling or b.prefilling:
        e.step()
    long_prompt = _prompt(rng, 300, vocab)
    c = e.add(Request(long_prompt, SamplingParams(temperature=0.0, n_predict=4)))
    reading_steps = 0
    while c.prefilling:
        before = c.prefill_at
        e.step()
        reading_steps += 1
        # both streams got a token in every pass that read a piece of the new prompt ...
        assert a.n_new >= 1 and b.n_new >= 1
        # ... and the pass held at most the budget: their two rows and a prompt chunk
        assert 1 <= c.prefill_at - before <= 8 - 2
    assert reading_steps >= 299 // 6
    assert c.n_prompt_processed == 300 and c.t_prompt_ms == 0  # its time runs to a token
    while not c.done:
        e.step()
    assert len(c.output) == 4 and c.t_prompt_ms > 0
    alone = _engine(target, n_parallel=1, batch=8).generate(
        Request(long_prompt, SamplingParams(temperature=0.0, n_predict=4)))
    assert c.output == alone.output


@pytest.mark.parametrize("batch,chunks", [(512, [399]), (64, [64, 128, 192, 256, 320, 384, 399])])
def test_a_prompt_alone_goes_in_batch_size_chunks(target, batch, chunks):
    """With no stream to protect, a prompt is read --batch-size tokens per pass, as
    llama-server's -b (512 by default: the whole of this one at once)."""
    e = _engine(target, n_parallel=2, batch=batch)
    rng = random.Random(2)
    seq = e.add(Request(_prompt(rng, 400, target.args.vocab_size),
                        SamplingParams(temperature=0.0, n_predict=2)))
    seen = []
    while seq.prefilling:
        e.step()
        seen.append(seq.prefill_at)
    assert seen == chunks  # all but the prompt's last token, which the first step reads


def _run_schedule(model, reqs: list[Request], arrivals: list[int], batch: int,
                  n_parallel: int, types: str) -> list:
    """Run the requests, request i added at step arrivals[i] (or as soon as a slot is free)."""
    e = _engine(model, n_parallel, batch, types)
    order = sorted(range(len(reqs)), key=lambda i: arrivals[i])
    seqs: dict[int, object] = {}
    step = 0
    while len(seqs) < len(reqs) or any(not s.done for s in seqs.values()):
        for i in order:
            if i not in seqs and arrivals[i] <= step and e.free_slot() is not None:
                r = reqs[i]
                seqs[i] = e.add(Request(list(r.prompt_ids), r.sampling, n_probs=r.n_probs))
        e.step()
        for s in seqs.values():
            if s.done:
                e.release(s)
        step += 1
        assert step < 5000
    return [seqs[i] for i in range(len(reqs))]


@pytest.mark.parametrize("types", ["none", "suffix"])
def test_outputs_do_not_depend_on_what_shares_the_pass(native_model, types):
    """Each request's tokens and log-probabilities, bit for bit, are those of the request run
    alone, whatever arrives when and whatever the budget: greedy and seeded sampling (without
    speculation the random draws are one per token, so they line up too)."""
    model = native_model
    vocab = model.args.vocab_size
    rng = random.Random(7)
    reqs = []
    for i in range(5):
        sampled = types == "none" and i % 2 == 1
        sp = SamplingParams(temperature=0.8 if sampled else 0.0, seed=100 + i,
                            n_predict=rng.randint(5, 30), ignore_eos=True)
        reqs.append(Request(_prompt(rng, rng.randint(2, 160), vocab), sp, n_probs=3))
    alone = _run_schedule(model, reqs, [0] * len(reqs), batch=16, n_parallel=1, types=types)
    for trial in range(4):
        arrivals = [rng.randint(0, 40) for _ in reqs]
        batch = rng.choice([2, 3, 5, 8, 16, 64])
        got = _run_schedule(model, reqs, arrivals, batch, n_parallel=3, types=types)
        for want, seq in zip(alone, got):
            assert seq.output == want.output, (trial, arrivals, batch)
            assert [(p.id, p.logprob, p.top) for p in seq.logprobs] == \
                   [(p.id, p.logprob, p.top) for p in want.logprobs], (trial, arrivals, batch)


def test_greedy_outputs_match_across_interleavings_on_the_pytorch_path(models):
    """The PyTorch layers (no native kernels): the same greedy tokens with any interleaving."""
    model = models[0]
    rng = random.Random(3)
    reqs = [Request(_prompt(rng, rng.randint(2, 120), model.args.vocab_size),
                    SamplingParams(temperature=0.0, n_predict=rng.randint(4, 20), ignore_eos=True))
            for _ in range(4)]
    alone = _run_schedule(model, reqs, [0] * 4, batch=16, n_parallel=1, types="suffix")
    for trial in range(3):
        arrivals = [rng.randint(0, 20) for _ in reqs]
        got = _run_schedule(model, reqs, arrivals, rng.choice([3, 8, 32]), 3, "suffix")
        assert [s.output for s in got] == [s.output for s in alone], (trial, arrivals)


def _linear_costs(fixed: float, per_row: float, rows: int = 64) -> CostModel:
    c = CostModel(alpha=0.0)
    for r in range(1, rows + 1):  # memory-bound up to 8 rows, then compute-bound
        c.record_verify(r, max(fixed, per_row * r))
    return c


def test_a_draft_is_cut_by_what_its_rows_cost_in_the_shared_pass():
    """The controller weighs a draft by the whole pass's tokens per second: next to a prompt
    chunk (rows that yield no token) drafted rows are cheap, while in a compute-bound pass of
    generating sequences a row costs about what it yields and k falls to 0."""
    costs = _linear_costs(0.08, 0.01)
    conf = [0.7] * 6
    alone = Controller(costs, n_max=6).cut(conf)
    assert alone == 6  # up to 8 rows cost as much as one: verify them all
    # 24 prompt rows in the pass: the pass is compute-bound, and drafted rows still pay
    assert Controller(costs, n_max=6).cut(conf, rows=24, tokens=0) >= 3
    # 30 other generating sequences, one row each: a row yields ~1 token; 0.7 does not pay
    assert Controller(costs, n_max=6).cut(conf, rows=30, tokens=30) == 0
    assert Controller(costs, n_max=6).choose(0.0, rows=30, tokens=30) == 0


def test_a_prompt_chunk_beside_running_streams_takes_twice_their_time(target):
    """The chunk of a waiting prompt is sized from measured costs: about twice the time the
    generating rows take by themselves (so their gaps grow at most 3x and the prompt reads at
    2/3 of its speed alone), within --batch-size."""
    e = _engine(target, n_parallel=3, batch=512)
    e.costs.alpha = 0.0  # frozen costs: the passes of this test do not move them
    for rows in range(1, 40):
        e.costs.record_verify(rows, 0.05 + 0.01 * rows)
    e.costs.prompt_token = 0.01
    rng = random.Random(5)
    vocab = target.args.vocab_size
    sp = SamplingParams(temperature=0.0, n_predict=100, ignore_eos=True)
    streams = [e.add(Request(_prompt(rng, 5, vocab), sp)) for _ in range(2)]
    while any(s.prefilling for s in streams):
        e.step()
    c = e.add(Request(_prompt(rng, 300, vocab), SamplingParams(temperature=0.0, n_predict=2)))
    e.step()
    assert c.prefill_at == int(2 * 0.07 / 0.01)  # two generating rows: 70 ms -> 14 prompt rows
    e.costs.prompt_token = 0.001  # cheaper prompt rows: more of them in the same time ...
    before = c.prefill_at
    e.step()
    assert c.prefill_at - before == 140
    e.cfg.batch_size = 50  # ... up to what --batch-size leaves beside the generating rows
    before = c.prefill_at
    e.step()
    assert c.prefill_at - before == 48


def test_without_measured_costs_a_chunk_is_the_smallest_that_reads_at_speed(target):
    e = _engine(target, n_parallel=1, batch=512)  # one slot, no speculation: nothing timed
    assert not e.costs.verify and e.costs.prompt_token is None
    assert e.scheduler.prompt_share(2, 500, e.costs) == max(1, target.model.full_speed_rows - 2)
    # several slots: the first request times the passes the scheduler needs, even without
    # speculation (one row per slot, and a prompt chunk)
    e = _engine(target, n_parallel=3, batch=512)
    e.add(Request([5, 6, 7], SamplingParams(temperature=0.0, n_predict=2)))
    assert {1, 2, 3} <= set(e.costs.verify) and e.costs.prompt_token > 0


def test_prompt_order_is_least_slack_first():
    """Prompts that arrive together: the shortest is read first (SRPT), ties by arrival; a
    prompt that has waited about as long as the difference of remaining reading times moves
    ahead of a newer, shorter one, so a stream of short prompts cannot hold a long one back."""
    from types import SimpleNamespace as W

    from tandem.engine.scheduler import prompt_order

    long_, short = W(n_prompt=301, prefill_at=0, t_start=10.0), W(n_prompt=21, prefill_at=0,
                                                                    t_start=10.001)
    assert prompt_order([long_, short], 0.01, now=10.01) == [short, long_]
    # 300 rows left at 10 ms against 20: 2.8 s apart; after 3 s of waiting the long one leads
    newer = W(n_prompt=21, prefill_at=0, t_start=13.0)
    assert prompt_order([long_, newer], 0.01, now=13.0) == [long_, newer]
    earlier = W(n_prompt=21, prefill_at=0, t_start=12.5)  # after 2.5 s it still waits
    assert prompt_order([long_, earlier], 0.01, now=12.5) == [earlier, long_]
    # what is already read counts: a long prompt nearly done goes first
    nearly = W(n_prompt=301, prefill_at=295, t_start=10.0)
    assert prompt_order([short, nearly], 0.01, now=10.01) == [nearly, short]
    twin = W(n_prompt=21, prefill_at=0, t_start=10.002)
    assert prompt_order([twin, short], None, now=10.01) == [short, twin]  # unmeasured: a guess


def test_a_short_prompt_is_not_kept_waiting_behind_a_long_one(target):
    """A long prompt and a short one added together: the short one is read first, alone in
    its pass (with room for both, a pass of both would keep it waiting for the long one's
    rows), and starts generating while the long one is still read; both answers equal their
    runs alone."""
    e = _engine(target, n_parallel=2, batch=512)
    rng = random.Random(5)
    vocab = target.args.vocab_size
    sp = SamplingParams(temperature=0.0, n_predict=6, ignore_eos=True)
    long_prompt, short_prompt = _prompt(rng, 300, vocab), _prompt(rng, 12, vocab)
    a = e.add(Request(long_prompt, sp))
    b = e.add(Request(short_prompt, sp))
    e.step()
    assert not b.prefilling and a.prefill_at == 0  # the short prompt took the first pass
    while a.prefilling:
        e.step()
    assert len(b.output) >= 1  # it generated while the long prompt was read
    while not (a.done and b.done):
        e.step()
    for seq, prompt in ((a, long_prompt), (b, short_prompt)):
        alone = _engine(target, n_parallel=1, batch=32).generate(Request(prompt, sp))
        assert seq.output == alone.output


# -- the Scheduler alone: its plan from sequences, costs and cache lengths, no engine ---------

def _seq(slot: int, t_start: float, n_prompt: int = 10, read: int | None = None,
         id_slot: int = -1):
    """A stand-in for engine.Sequence with what the scheduler reads of it."""
    from types import SimpleNamespace as S

    read = n_prompt - 1 if read is None else read  # all but the last token: generating
    return S(slot=slot, t_start=t_start, n_prompt=n_prompt, prefill_at=read, done=False,
             prefilling=read < n_prompt - 1, tokens=list(range(n_prompt)), output=[],
             spec=S(synth=None), req=S(id_slot=id_slot, cache_prompt=True, media=[],
                                       prompt_ids=list(range(n_prompt)),
                                       sampling=S(n_predict=-1)))


def test_a_request_for_a_busy_slot_waits_without_holding_back_the_others():
    from tandem.engine import Scheduler

    s = Scheduler(EngineConfig(ctx_size=512, n_parallel=2), max_k=4, full_speed_rows=16)
    s.slots[1] = _seq(1, 0.0)
    mine, anyone, later = _seq(-1, 1.0, id_slot=1), _seq(-1, 2.0), _seq(-1, 3.0)
    s.waiting.extend([mine, anyone, later])
    held = {0: 0, 1: 0}
    first = s.next_admissible(lambda i, ids: held[i])
    assert first is anyone and anyone.slot == 0 and list(s.waiting) == [mine, later]
    s.slots[0] = anyone
    assert s.next_admissible(lambda i, ids: held[i]) is None  # no slot: first come, first served


def test_a_full_shared_pool_evicts_idle_slots_then_fails_the_newest_request():
    """--kv-unified, 3 slots sharing 64 positions: slot 2 is idle with 5 cached tokens, the
    two generating sequences hold 30 and 27. Evicting the idle tokens makes room for a row
    each and 5 drafted tokens (not the 8 they could draft); when the two hold all 64, the
    newest request fails and the older one goes on."""
    from tandem.engine import Scheduler

    s = Scheduler(EngineConfig(ctx_size=64, n_parallel=3, kv_unified=True), max_k=4,
                  full_speed_rows=16)
    old, new = _seq(0, 1.0), _seq(1, 2.0)
    s.slots[0], s.slots[1] = old, new
    costs = CostModel()
    plan = s.plan(costs, [30, 27, 5])
    assert plan.evict and plan.gen == [old, new] and plan.fail == []
    assert plan.draft_room == 64 - 57 - 2 == 5
    plan = s.plan(costs, [33, 31, 0])
    assert [v for v, _ in plan.fail] == [new] and plan.gen == [old]
    assert "the context size has been exceeded" in plan.fail[0][1]
