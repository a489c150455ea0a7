"""Requests in slots, one packed target pass per step.

`submit` puts a request on the scheduler's waiting list, `start` (or `add`, both at once) gives
it a slot; its prompt (all but the last token) is then read in chunks by the steps, between the
other sequences' tokens. One step:

    plan = scheduler.plan(costs, lengths)         who runs, with how many rows (scheduler.py)
    drafts = [speculator.draft(budget, ...)]      each generating sequence's (speculator.py)
    logits = pack(plan, drafts).run(target)       all rows in one pass, unpadded, each row as if
                                                  alone (batch.py)
    res = verify(draft, logits)                   accepted + 1 tokens (recovered or bonus)
    cache.append(slot, [last, *accepted])         the rejected positions are never recorded
    speculator.accept(draft, n, tokens)           proposers roll back what the target rejected
"""

from __future__ import annotations

import dataclasses
import random
import time
from pathlib import Path

import torch

from .. import media as mediamod
from .. import slotfile
from ..config import EngineConfig, SpecConfig
from ..cpushare import CpuShare
from ..embedding import Embedder
from ..errors import TandemError
from ..grammar import Guide, bias_vector, constrain
from ..memory import available_memory
from ..models.eagle3 import Eagle3Head
from ..models.loader import LoadedModel
from ..sampling import make_generator, token_logprobs
from ..speculative.controller import AcceptanceTracker, CostModel
from ..speculative.proposer import Draft
from ..speculative.speculator import Speculation
from ..speculative.verify import verify, verify_synthetic
from .batch import pack
from .caches import SlotCaches
from .calibrate import PROMPT_MEASURE_ROWS, calibrate, calibrate_head
from .scheduler import Scheduler, StepPlan
from .sequence import Request, Sequence


class Engine:
    def __init__(self, target: LoadedModel, draft: LoadedModel | None, cfg: EngineConfig,
                 spec: SpecConfig, vision=None) -> None:
        """draft: a draft model, an EAGLE-3 head (models/eagle3.py) or None; vision: the
        target's image encoder (models/vision.py, --mmproj), or None."""
        self.head = draft if isinstance(draft, Eagle3Head) else None
        draft = None if self.head is not None else draft
        spec = spec.resolved(self.head is not None or draft is not None, self.head is not None)
        if cfg.n_threads > 0:  # PyTorch's own operations (the kernels are told per model)
            torch.set_num_threads(cfg.n_threads)
        self.target, self.draft, self.spec, self.vision = target, draft, spec, vision
        self.tok = target.tokenizer
        # room for the largest verification batch beyond the context: [last, *draft]
        self.max_k = spec.spare_positions
        self.caches = SlotCaches(target, draft, cfg, cfg.max_len(spec),
                                 cfg.cache_ram_bytes(available_memory()[0]), self.head)
        self.cache, self.draft_cache = self.caches.target, self.caches.draft
        self.prompt_cache = self.caches.prompt  # (--cache-ram)
        self.scheduler = Scheduler(cfg, self.max_k, target.model.full_speed_rows)
        self._calibrated = False
        # end-of-generation ids, masked out of the target's rows when a request ignores EOS
        self._eog = sorted(i for i in self.tok.eog_ids if i < target.args.vocab_size)
        # what every sequence's speculation shares: pass costs, the draft model, the pool
        self.speculation = Speculation(draft, self.draft_cache, cfg.prefill_chunk,
                                       spec.suffix_pool, shared_catch_up=4 * cfg.batch_size,
                                       head=self.head, head_cache=self.caches.head,
                                       eog=tuple(self._eog))
        self.embedder = Embedder(target, self.cache)
        # threads per pass: fewer while other processes keep CPUs busy (cpushare.py)
        self._idle_since_step = True
        self.cpu = CpuShare(max(m.model.threads for m in (target, draft) if m), cfg.threads_fixed)

    @property
    def cfg(self) -> EngineConfig:
        return self.scheduler.cfg

    @cfg.setter
    def cfg(self, cfg: EngineConfig) -> None:
        self.scheduler.cfg = cfg

    @property
    def has_draft(self) -> tuple[bool, bool]:
        """(a draft model or head is loaded, it is an EAGLE-3 head): SpecConfig.resolved's."""
        return self.draft is not None or self.head is not None, self.head is not None

    @property
    def slots(self) -> list[Sequence | None]:
        return self.scheduler.slots

    @property
    def costs(self) -> CostModel:
        """Measured seconds per target pass by rows and per draft token (this machine)."""
        return self.speculation.costs

    @property
    def draft_history(self) -> AcceptanceTracker:
        """The draft model's acceptance over every request so far."""
        return self.speculation.draft_history

    # -- embeddings and slot files (llama-server's /slots/{id}?action=save|restore|erase) ---

    def embed(self, ids: list[int], pooling: str) -> torch.Tensor:
        """The target's final-normed hidden states for `ids`, pooled (embedding.py)."""
        return self.embedder.embed(ids, pooling, self.cfg)

    def save_slot(self, slot: int, path: Path) -> tuple[int, int]:
        """Write what an idle slot's target cache holds to `path` (slotfile.py); returns
        (tokens, bytes written)."""
        self._idle(slot)
        return slotfile.save(self.target, self.cache, slot, path)

    def restore_slot(self, slot: int, path: Path) -> tuple[int, int]:
        """Load a save_slot file into an idle slot (a file holding an image's positions needs
        `vision`; refused, the slot is left empty). Returns (tokens, bytes read). The draft
        keeps only what agrees with the restored tokens; it catches up by itself."""
        self._idle(slot)
        try:
            n, size = slotfile.restore(self.target, self.cache, slot, path,
                                       self.vision is not None,
                                       most=self.cache.max_len - self.max_k - 2)
        except slotfile.MediaRefused:
            self.erase_slot(slot)
            raise
        if self.draft_cache is not None:
            tokens = self.cache.tokens[slot]
            self.draft_cache.truncate(slot, self.draft_cache.common_prefix(slot, tokens))
        return n, size

    def erase_slot(self, slot: int) -> int:
        """Forget what an idle slot's caches hold; returns how many tokens it held."""
        self._idle(slot)
        n = self.cache.length(slot)
        self.caches.forget(slot, 0)
        return n

    def _idle(self, slot: int) -> None:
        if not 0 <= slot < len(self.slots):
            raise TandemError(f"slot {slot} does not exist; this server has slots "
                              f"0..{len(self.slots) - 1}")
        if self.slots[slot] is not None:
            raise TandemError(f"slot {slot} is processing a request; try again when it is idle")

    # -- requests -------------------------------------------------------------------------

    def free_slot(self, id_slot: int = -1) -> int | None:
        return self.scheduler.free_slot(id_slot)

    def submit(self, req: Request) -> Sequence:
        """Check a request and put it on the waiting list; its sequence (slot -1 until
        `next_admissible` gives it one)."""
        seq = self._sequence(req)
        self.scheduler.waiting.append(seq)
        return seq

    def next_admissible(self) -> Sequence | None:
        """The next waiting sequence a free slot can take (the scheduler's choice), off the
        waiting list with its slot; `start` it."""
        return self.scheduler.next_admissible(self.cache.common_prefix)

    def add(self, req: Request) -> Sequence:
        """Put a request in a free slot at once and start it (no waiting list)."""
        seq = self._sequence(req)
        slot = self.free_slot(req.id_slot)
        if slot is None:
            raise TandemError("no free slot")
        seq.slot = slot
        self.start(seq)
        return seq

    def _sequence(self, req: Request) -> Sequence:
        ids = req.prompt_ids
        if not ids:
            raise TandemError("the prompt is empty; give at least one token")
        if len(ids) >= self.cfg.ctx_size:
            raise TandemError(
                f"the prompt has {len(ids)} tokens but the context holds {self.cfg.ctx_size}; "
                "shorten the prompt or raise --ctx-size")
        n_vocab = self.target.args.vocab_size
        bad = [t for t in ids if t >= n_vocab or (t < 0 and not req.media)]
        if bad:
            raise TandemError(f"token id {bad[0]} is outside the vocabulary "
                              f"(0..{n_vocab - 1})")
        if req.media:
            try:
                mediamod.check_media(ids, req.media, self.target.args.dim)
            except ValueError as e:
                raise TandemError(f"the prompt's images: {e}") from None
        if req.id_slot >= 0:
            self.free_slot(req.id_slot)  # (one that does not exist fails now)
        spec = self.spec if req.spec is None else req.spec.resolved(*self.has_draft)
        if req.media and spec.uses_draft:  # the draft model and the head read no images
            spec = dataclasses.replace(spec, types=[
                t for t in spec.types if t not in ("draft-simple", "draft-eagle3")] or ["none"])
        gen = make_generator(req.sampling.seed)
        seed = gen.initial_seed()
        seq = Sequence(req, -1, spec, None, gen, seed, self.tok.incremental(), list(ids),
                       len(ids), synth=random.Random(seed) if spec.synth else None)
        if req.grammar is not None:
            seq.guide = Guide(self.tok, n_vocab, req.grammar)
        seq.bias = bias_vector(req.logit_bias, n_vocab)
        return seq

    def start(self, seq: Sequence) -> None:
        """Start seq in its slot (seq.slot, free): what the slot and the host prompt cache
        hold of its prompt is reused, the rest is read by the steps. A request for no tokens
        ends here without holding the slot."""
        seq.t_start = time.perf_counter()
        if seq.req.sampling.n_predict == 0:
            seq.stop_type = "limit"
            return
        slot, ids = seq.slot, seq.tokens
        self.slots[slot] = seq
        try:
            idle = [i for i, s in enumerate(self.slots) if s is None]
            keep = self.caches.reuse(slot, seq.req, idle, self.cfg.cache_idle_slots)
            seq.prefill_at = keep
            seq.n_prompt_processed = len(ids) - keep
            seq.speculator = self.speculation.start(seq.spec, slot, seq.req.sampling, seq.gen,
                                                    list(ids), seq.stats, seq.guide,
                                                    prompt_read=seq.n_prompt_processed)
            # the controllers (auto) and the scheduler (several slots) need pass costs
            if (not self._calibrated and len(self.costs.verify) < 2
                    and (seq.spec.adaptive or self.cfg.n_parallel > 1)):
                self.calibrate(slot)  # in the free area after what the slot keeps
        except BaseException:
            self.slots[slot] = None
            raise

    def calibrate(self, slot: int) -> None:
        """Time passes of a verification's rows (at least one per slot), a prompt chunk and a
        draft step after the slot's tokens (calibrate.py)."""
        n = max(min(self.max_k, self.spec.max_k) + 1, self.cfg.n_parallel)
        if calibrate(self.costs, self.target, self.cache, slot, n, self.draft, self.draft_cache,
                     self.spec.draft_vocab):
            self._calibrated = True
            if self.head is not None:
                calibrate_head(self.costs, self.head, self.caches.head, slot)

    def release(self, seq: Sequence) -> None:
        if not seq.waiting and self.slots[seq.slot] is seq:
            self.slots[seq.slot] = None
            if seq.speculator is not None:
                seq.speculator.end(finished=seq.stop_type in ("eos", "word", "limit"))

    def cancel(self, seq: Sequence) -> None:
        if not seq.done:
            seq.stop_type = "cancel"
        self.scheduler.drop(seq)
        self.release(seq)

    def active(self) -> list[Sequence]:
        return self.scheduler.active()

    # -- the step -------------------------------------------------------------------------

    def step(self) -> list[Sequence]:
        """One pass over the rows of every active sequence: the scheduler's plan, the drafts,
        one packed target pass, then each generating sequence verified and advanced. Each row
        is computed as it would be alone, so the outputs do not depend on what shares the
        pass. Returns the active sequences."""
        seqs = self.active()
        if not seqs:
            return []
        self._threads()
        plan = self._plan(seqs)
        if plan.empty:  # every request failed for room (--kv-unified)
            return seqs
        drafts = self._drafts(plan)
        logits, t_fwd = self._pass(plan, drafts)
        self._postprocess(plan, drafts, logits, t_fwd)
        # every sequence done: the engine waits (for their release, for the next request)
        self._idle_since_step = all(s.done for s in seqs)
        return seqs

    def _plan(self, seqs: list[Sequence]) -> StepPlan:
        """The scheduler's plan, after a full context moved on (--context-shift) and before
        it, room made in the shared pool (--kv-unified: idle slots' tokens to the host prompt
        cache, then the requests the full pool cannot carry fail, Scheduler._fit_pool)."""
        for s in seqs:
            if not s.prefilling and self.cfg.context_shift and len(s.tokens) >= self.cfg.ctx_size:
                self._shift(s)
        plan = self.scheduler.plan(self.costs, self.caches.lengths())
        if plan.evict:
            self.caches.evict([i for i, s in enumerate(self.slots) if s is None])
        for victim, why in plan.fail:
            victim.n_new = 0
            victim.finish("error", why)
            self.release(victim)
            self.caches.forget(victim.slot, 0)
        return plan

    def _pass(self, plan: StepPlan, drafts: list[Draft]) -> tuple[torch.Tensor | None, float]:
        """The one target pass (batch.py): the logits of the generating rows and its seconds,
        recorded as the controllers' cost of a pass by its rows (or a prompt row's cost); the
        prompt chunks it read are then in the cache."""
        batch = pack(plan.gen, drafts, plan.chunks, self.cache)
        feats = None
        if self.head is not None:  # every row's features, for the sequences' heads
            # the target's layers to copy, set per pass: another engine may share the target
            self.target.model.feature_layers = self.head.target_layers
            feats = torch.empty(len(batch.tokens), len(self.head.target_layers) *
                                self.target.args.dim)
        t0 = time.perf_counter()
        logits = batch.run(self.target.model, self.cache, feats)
        t_fwd = time.perf_counter() - t0
        if feats is not None:
            self._hand_features(plan, drafts, batch, feats)
        if plan.gen and not plan.chunks:
            self.costs.record_verify(len(batch.tokens), t_fwd)
        elif plan.chunks and not plan.gen and len(batch.tokens) >= PROMPT_MEASURE_ROWS:
            self.costs.record_prompt(len(batch.tokens), t_fwd)
        for c in plan.chunks:
            self.cache.append(c.seq.slot, c.seq.tokens[c.start: c.end])
            c.seq.prefill_at = c.end
        return logits, t_fwd

    def _hand_features(self, plan: StepPlan, drafts: list[Draft], batch, feats) -> None:
        """Each sequence's rows of the pass (its verification rows, its prompt chunk) to its
        speculation: what an EAGLE-3 head reads."""
        at = 0
        for s, d in zip(plan.gen, drafts):
            s.speculator.hidden(batch.positions[at], feats[at: at + len(d.ids) + 1])
            at += len(d.ids) + 1
        for c in plan.chunks:
            n = c.end - c.start
            if c.seq.speculator is not None:
                c.seq.speculator.hidden(c.start, feats[at: at + n])
            at += n

    def _postprocess(self, plan: StepPlan, drafts: list[Draft], logits: torch.Tensor | None,
                     t_fwd: float) -> None:
        """Each generating sequence's rows verified and settled (`_settle`), in pass order."""
        at = 0
        for s, d in zip(plan.gen, drafts):
            self._settle(s, d, logits[at: at + len(d.ids) + 1], t_fwd / len(plan.gen))
            at += len(d.ids) + 1
        for s in plan.filling:
            s.n_new = 0

    def _threads(self) -> None:
        if self._idle_since_step:  # the first pass after an idle spell
            self.cpu.resume()
            self._idle_since_step = False
        self.cpu.apply()

    def _drafts(self, plan: StepPlan) -> list[Draft]:
        """Each generating sequence's draft, its controller weighing its rows against the
        rest of the pass (the other sequences' rows, decided or at least one each, and the
        prompt rows), all within the plan's draft room."""
        drafts, room = [], plan.draft_room
        others = len(plan.gen) + plan.prompt_rows
        for s, budget, left in zip(plan.gen, plan.budgets, plan.remaining):
            others -= 1
            d = s.speculator.draft(min(budget, room), left, batch=(others, len(plan.gen) - 1))
            if s.req.media and any(t < 0 for t in d.ids):  # an image's ids are never drafted
                d = d.cut(next(i for i, t in enumerate(d.ids) if t < 0))
            room -= len(d.ids)
            others += 1 + len(d.ids)
            drafts.append(d)
        return drafts

    def _settle(self, s: Sequence, d: Draft, rows: torch.Tensor, t_share: float) -> None:
        """Verify s's draft against its rows of the pass, keep what the target agrees with
        (cache, proposers, output), and what the request asked to see of it."""
        t1 = time.perf_counter()
        eog = self._eog if s.req.sampling.ignore_eos else ()
        mine = constrain(rows, d.ids, s.guide, s.bias, eog)
        res = (verify(d.ids, d.probs, mine, s.req.sampling, s.gen) if s.synth is None else
               verify_synthetic(d.ids, mine, s.req.sampling, s.gen, s.spec.synth_probs,
                                s.synth, self.tok.eog_ids))
        self.cache.append(s.slot, [s.tokens[-1], *d.ids[: res.n_accepted]])
        s.speculator.accept(d, res.n_accepted, res.tokens)
        s.stats.t_verify += t_share + time.perf_counter() - t1
        s.append(res.tokens, res.n_accepted, d.source, self.tok.eog_ids, self.cfg.ctx_size,
                 self.cfg.context_shift)
        if s.guide is not None:
            s.guide.advance(s.output[len(s.output) - s.n_new:])
            if s.guide.failed and not s.done:  # cannot happen with masked rows; if it
                s.finish("eos")  # did, nothing could follow
        if s.req.n_probs > 0 and s.n_new:
            s.logprobs.extend(token_logprobs(mine[: s.n_new], s.output[-s.n_new:],
                                             s.req.n_probs,
                                             s.req.sampling if s.req.post_sampling else None))

    def pool_held(self) -> int:
        """Tokens every slot's cache holds (idle slots' cached prompts included)."""
        return sum(self.caches.lengths())

    def _shift(self, seq: Sequence) -> None:
        """llama-server's context shift, on a full context: keep the first n_keep tokens (-1:
        the prompt; at most the context less 4), drop n_discard of those after them (0: half),
        move the rest down (KVCache.shift), and go on generating; the answer is truncated."""
        n = self.cache.length(seq.slot)  # every token but the last
        keep = min(seq.n_prompt if seq.req.n_keep < 0 else seq.req.n_keep, self.cfg.ctx_size - 4)
        discard = max(1, min(seq.req.n_discard or (n - keep) // 2, n - keep - 1))
        self.cache.shift(seq.slot, keep, discard)
        del seq.tokens[keep: keep + discard]
        if seq.speculator is not None:
            seq.speculator.shift(keep, discard)
        seq.truncated = True

    # -- one request start to end -----------------------------------------------------------

    def generate(self, req: Request, on_text=None) -> Sequence:
        """Run one request to the end; on_text(str) gets the streamed text as it is safe."""
        seq = self.add(req)
        try:
            while not seq.done:
                self.step()
                if on_text is not None:
                    piece = seq.take_text()
                    if piece:
                        on_text(piece)
        finally:
            self.release(seq)
        if on_text is not None:
            piece = seq.take_text()
            if piece:
                on_text(piece)
        return seq
