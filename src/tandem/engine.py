"""Slots, the scheduler step, and per-request statistics.

`add` gives a request a slot; its prompt (all but the last token) is then read in chunks by the
steps, between the other sequences' tokens. One iteration (`step`):

    draft = speculator.draft(budget, batch)      each generating sequence's (speculator.py)
    logits = target([last, *draft], chunks)     all generating rows and waiting prompts' chunks
                                                 in one pass, unpadded, each row as if alone
    res = verify(draft, logits)                  accepted + 1 tokens (recovered or bonus)
    cache.append(slot, [last, *accepted])        the rejected positions are never recorded
    speculator.accept(draft, n, tokens)          proposers roll back what the target rejected
"""

from __future__ import annotations

import dataclasses
import logging
import math
import random
import time
from pathlib import Path

import torch

from . import embedding
from . import media as mediamod
from . import slotfile
from .config import EngineConfig, SpecConfig
from .cpushare import CpuShare
from .errors import TandemError
from .grammar import Guide, bias_vector, constrain
from .models.decoder import KVCache, MediaRows
from .models.loader import LoadedModel
from .sampling import make_generator, token_logprobs
from .memory import available_memory
from .promptcache import PromptCache
from .schedule import prompt_order
from .sequence import Request, Sequence
from .speculative.controller import AcceptanceTracker, CostModel
from .speculative.draft import draft_step_seconds
from .speculative.speculator import Speculation
from .speculative.verify import verify, verify_synthetic

log = logging.getLogger("tandem.engine")


# prompt rows beside generating rows take this many times the time those rows take alone
# (Engine._prompt_share): gaps at most 3x, prompts read at 2/3 speed
PROMPT_SHARE = 2.0
PROMPT_MEASURE_ROWS = 16  # a prompt-only pass this large measures the per-row prompt cost


class Engine:
    def __init__(self, target: LoadedModel, draft: LoadedModel | None, cfg: EngineConfig,
                 spec: SpecConfig, vision=None) -> None:
        """vision: the target's image encoder (models/vision.py, --mmproj), or None."""
        spec = spec.resolved(has_draft=draft is not None)  # draft-simple needs a draft
        if cfg.n_threads > 0:  # PyTorch's own operations (the kernels are told per model)
            torch.set_num_threads(cfg.n_threads)
        self.target, self.draft, self.cfg, self.spec = target, draft, cfg, spec
        self.vision = vision
        self.tok = target.tokenizer
        # room for the largest verification batch beyond the context: [last, *draft]
        self.max_k = spec.spare_positions
        max_len = cfg.max_len(spec)
        # with --kv-unified each slot may reach the whole context but together they hold at
        # most ctx_size tokens (`_fit_pool`): the memory is given as positions are written
        lazy = cfg.pool is not None
        self.cache = KVCache.of_types(target.args, cfg.n_parallel, max_len,
                                      cfg.cache_types("target"), lazy=lazy)
        self.draft_cache = None
        if draft is not None:
            self.draft_cache = KVCache.of_types(draft.args, cfg.n_parallel, max_len,
                                                cfg.cache_types("draft"), lazy=lazy)
        self.slots: list[Sequence | None] = [None] * cfg.n_parallel
        # what slots held before other prompts took them (--cache-ram)
        limit = cfg.cache_ram_bytes(available_memory()[0])
        self.prompt_cache = PromptCache(limit) if limit != 0 else None
        self._calibrated = False
        # end-of-generation ids, masked out of the target's rows when a request ignores EOS
        self._eog = sorted(i for i in self.tok.eog_ids if i < target.args.vocab_size)
        # what every sequence's speculation shares: pass costs, the draft model, the pool
        self.speculation = Speculation(draft, self.draft_cache, cfg.prefill_chunk,
                                       spec.suffix_pool, shared_catch_up=4 * cfg.batch_size)
        # threads per pass: fewer while other processes keep CPUs busy (cpushare.py)
        self._idle_since_step = True
        self.cpu = CpuShare(max(m.model.threads for m in (target, draft) if m), cfg.threads_fixed)

    @property
    def costs(self) -> CostModel:
        """Measured seconds per target pass by rows and per draft token (this machine)."""
        return self.speculation.costs

    @property
    def draft_history(self) -> AcceptanceTracker:
        """The draft model's acceptance over every request so far."""
        return self.speculation.draft_history

    # -- embeddings -----------------------------------------------------------------------

    def embed(self, ids: list[int], pooling: str) -> torch.Tensor:
        """The target's final-normed hidden states for `ids`, pooled (embedding.py)."""
        return embedding.embed(self, ids, pooling)

    # -- slot files (llama-server's /slots/{id}?action=save|restore|erase) -----------------

    def save_slot(self, slot: int, path: Path) -> tuple[int, int]:
        """Write what an idle slot's target cache holds to `path` (slotfile.py); returns
        (tokens, bytes written)."""
        self._idle(slot)
        return slotfile.save(self, slot, path)

    def restore_slot(self, slot: int, path: Path) -> tuple[int, int]:
        """Load a save_slot file into an idle slot (slotfile.py; a file holding an image's
        positions needs `vision`). Returns (tokens, bytes read)."""
        self._idle(slot)
        return slotfile.restore(self, slot, path, self.vision is not None)

    def erase_slot(self, slot: int) -> int:
        """Forget what an idle slot's caches hold; returns how many tokens it held."""
        self._idle(slot)
        n = self.cache.length(slot)
        self._forget(slot, 0)
        return n

    def _cache_idle_slots(self, started: int) -> None:
        """--cache-idle-slots, as llama-server's: a request started in slot `started`, so
        every idle slot's cached tokens go to the host prompt cache, and with --kv-unified the
        slot is cleared, its room given to the shared context (a later prompt that starts the
        same way is read back from host memory). The debug lines carry llama-server's markers
        of the same events, which its test suite reads."""
        for i, s in enumerate(self.slots):
            if i == started or s is not None or not self.cache.length(i):
                continue
            if self.prompt_cache.keep(self.cache, i, 0):
                log.debug("slot %d: saved its %d idle tokens to the prompt cache "
                          "__TEST_TAG_CACHE_IDLE_SLOT__", i, self.cache.length(i))
            if self.cfg.pool is not None:
                self._forget(i, 0)

    def _forget(self, slot: int, keep: int, draft_keep: int | None = 0) -> None:
        """Keep the first `keep` tokens of the slot's cache (and `draft_keep` of the draft's;
        None: leave the draft's as it is); with --kv-unified the memory of the rest is given
        back (KVCache.drop), as the pool counts only what the slots hold."""
        caches = [(self.cache, keep)]
        if self.draft_cache is not None and draft_keep is not None:
            caches.append((self.draft_cache, min(draft_keep, self.draft_cache.length(slot))))
        for cache, n in caches:
            if self.cfg.pool is not None:
                cache.drop(slot, n)
            else:
                cache.truncate(slot, n)

    def _idle(self, slot: int) -> None:
        if not 0 <= slot < len(self.slots):
            raise TandemError(f"slot {slot} does not exist; this server has slots "
                              f"0..{len(self.slots) - 1}")
        if self.slots[slot] is not None:
            raise TandemError(f"slot {slot} is processing a request; try again when it is idle")

    # -- requests -------------------------------------------------------------------------

    def free_slot(self, id_slot: int = -1) -> int | None:
        if id_slot >= 0:
            if id_slot >= len(self.slots):
                raise TandemError(f"id_slot {id_slot} out of range (0..{len(self.slots) - 1})")
            return id_slot if self.slots[id_slot] is None else None
        free = [i for i, s in enumerate(self.slots) if s is None]
        return free[0] if free else None

    def add(self, req: Request) -> Sequence:
        """Put a request in a free slot and process its prompt (all but the last token)."""
        ids = req.prompt_ids
        if not ids:
            raise TandemError("the prompt is empty; give at least one token")
        if len(ids) >= self.cfg.ctx_size:
            raise TandemError(
                f"the prompt has {len(ids)} tokens but the context holds {self.cfg.ctx_size}; "
                "shorten the prompt or raise --ctx-size"
            )
        bad = [t for t in ids if t >= self.target.args.vocab_size or (t < 0 and not req.media)]
        if bad:
            raise TandemError(f"token id {bad[0]} is outside the vocabulary "
                              f"(0..{self.target.args.vocab_size - 1})")
        if req.media:
            try:
                mediamod.check_media(ids, req.media, self.target.args.dim)
            except ValueError as e:
                raise TandemError(f"the prompt's images: {e}") from None
        slot = self.free_slot(req.id_slot)
        if slot is None:
            raise TandemError("no free slot")
        spec = self.spec if req.spec is None else req.spec.resolved(self.draft is not None)
        if req.media and "draft-simple" in spec.types:  # the draft model reads no images
            spec = dataclasses.replace(
                spec, types=[t for t in spec.types if t != "draft-simple"] or ["none"])
        gen = make_generator(req.sampling.seed)
        seed = gen.initial_seed()
        seq = Sequence(req, slot, spec, None, gen, seed, self.tok.incremental(), list(ids),
                       len(ids), synth=random.Random(seed) if spec.synth else None)
        seq.t_start = time.perf_counter()
        n_vocab = self.target.args.vocab_size
        if req.grammar is not None:
            seq.guide = Guide(self.tok, n_vocab, req.grammar)
        seq.bias = bias_vector(req.logit_bias, n_vocab)
        if req.sampling.n_predict == 0:
            seq.stop_type = "limit"
            return seq
        self.slots[slot] = seq
        try:
            keep = self.cache.common_prefix(slot, ids[:-1]) if req.cache_prompt else 0
            keep = mediamod.reuse_limit(req.media, keep)
            if self.prompt_cache is not None:
                self.prompt_cache.keep(self.cache, slot, keep)
                if req.cache_prompt:
                    own, keep = keep, self.prompt_cache.restore(self.cache, slot, ids[:-1], keep)
                    keep = mediamod.reuse_limit(req.media, keep)
                    if keep > own:
                        log.debug("slot %d: updating prompt cache: %d prompt tokens read "
                                  "back from host memory (%d were in the slot)", slot, keep, own)
                if self.cfg.cache_idle_slots:
                    self._cache_idle_slots(slot)
            draft_keep = None  # the draft proposer cuts its cache to the prompt itself
            if self.cfg.pool is not None and self.draft_cache is not None:
                draft_keep = self.draft_cache.common_prefix(slot, ids[:-1])  # (and memory)
            self._forget(slot, keep, draft_keep)
            seq.prefill_at = keep
            seq.n_prompt_processed = len(ids) - keep
            seq.speculator = self.speculation.start(spec, slot, req.sampling, gen, list(ids),
                                                    seq.stats, seq.guide,
                                                    prompt_read=seq.n_prompt_processed)
            # the controllers (auto) and the scheduler (several slots) need pass costs
            if (not self._calibrated and len(self.costs.verify) < 2
                    and (spec.adaptive or self.cfg.n_parallel > 1)):
                self.calibrate(slot)  # in the free area after what the slot keeps
        except BaseException:
            self.slots[slot] = None
            raise
        return seq

    def calibrate(self, slot: int) -> None:
        """Time target passes of up to max_k+1 rows (at least one per slot), a prompt chunk and a
        draft step in a free cache area after the slot's own tokens, so the controllers and the
        scheduler have costs before their first choice. Two rounds
        over every row count, keeping each one's faster time: a slow spell of this shared
        machine during one pass would otherwise bend the cost curve the controller starts
        from."""
        base = self.cache.length(slot)
        # a verification pass, or one row for every slot generating at once
        n = max(min(self.max_k, self.spec.max_k) + 1, self.cfg.n_parallel)
        if base + n + 1 >= self.cache.max_len:
            return
        self._calibrated = True
        best: dict[int, float] = {}
        # every row count up to 9, then every fourth (costs in between are interpolated)
        counts = sorted({*range(1, min(n, 9) + 1), *range(13, n, 4), n})
        for _ in range(2):
            for rows in counts:
                t0 = time.perf_counter()
                self.target.model(torch.zeros(1, rows, dtype=torch.long), self.cache, [slot],
                                  [base])
                best[rows] = min(best.get(rows, math.inf), time.perf_counter() - t0)
        for rows, seconds in best.items():
            self.costs.record_verify(rows, seconds)
        rows = min(2 * PROMPT_MEASURE_ROWS, self.cache.max_len - base - 1)
        if rows >= PROMPT_MEASURE_ROWS:  # a prompt chunk's cost per row (no logits)
            t0 = time.perf_counter()
            self.target.model(torch.zeros(1, rows, dtype=torch.long), self.cache, [slot], [base],
                              logits="none")
            self.costs.record_prompt(rows, time.perf_counter() - t0)
        if self.draft is not None:
            at = self.draft_cache.length(slot)
            step = draft_step_seconds(self.draft.model, self.draft_cache, slot, at,
                                      self.spec.draft_vocab)
            self.costs.record_draft(1, step)
            self.costs.draft_step = step
            rows = min(32, self.draft_cache.max_len - at - 1)
            if rows > 0:  # the draft reading a prompt chunk, per token
                t0 = time.perf_counter()
                self.draft.model(torch.zeros(1, rows, dtype=torch.long), self.draft_cache,
                                 [slot], [at], logits="none")
                self.costs.record_draft_prefill(rows, time.perf_counter() - t0)

    def release(self, seq: Sequence) -> None:
        if self.slots[seq.slot] is seq:
            self.slots[seq.slot] = None
            if seq.speculator is not None:
                seq.speculator.end(finished=seq.stop_type in ("eos", "word", "limit"))

    def cancel(self, seq: Sequence) -> None:
        if not seq.done:
            seq.stop_type = "cancel"
        self.release(seq)

    # -- the step -------------------------------------------------------------------------

    def active(self) -> list[Sequence]:
        return [s for s in self.slots if s is not None and not s.done]

    def _budget(self, seq: Sequence) -> int:
        """How many tokens one more iteration may draft for seq."""
        left = self.cfg.ctx_size - len(seq.tokens)
        n = seq.req.sampling.n_predict
        if n >= 0:
            left = min(left, n - len(seq.output))
        return max(0, min(left - 1, self.max_k, len(seq.spec.synth or ()) or self.max_k))

    def _remaining(self, seq: Sequence) -> int:
        """Tokens seq may still generate (n_predict, else the context left)."""
        n = seq.req.sampling.n_predict
        return n - len(seq.output) if n >= 0 else self.cfg.ctx_size - len(seq.tokens)

    def step(self) -> list[Sequence]:
        """One scheduler step: one target pass over the rows of every active sequence, unpadded.

        Generating sequences come first, each with its row [last, *draft]; then prompt chunks of
        the sequences still reading their prompts, least slack first (schedule.py). While any
        generates, a waiting prompt gets a chunk that takes about twice the time of the rows
        (`_prompt_share`), within `batch_size` rows in all, and those rows carry no draft; so a
        new prompt costs the running streams passes three times as long while it is read, not
        a silence as long as the prompt. With no sequence generating, a prompt goes in chunks
        of batch_size (llama-server's -b). Each row is computed as it would be alone, so the
        outputs do not depend on what shares the pass. Returns the active sequences."""
        seqs = self.active()
        if not seqs:
            return []
        if self._idle_since_step:  # the first pass after an idle spell
            self.cpu.resume()
            self._idle_since_step = False
        self.cpu.apply()
        gen = [s for s in seqs if not s.prefilling]
        for s in gen:
            if self.cfg.context_shift and len(s.tokens) >= self.cfg.ctx_size:
                self._shift(s)
        filling = prompt_order([s for s in seqs if s.prefilling], self.costs.prompt_token)
        waiting = sum(s.n_prompt - 1 - s.prefill_at for s in filling)
        limit = self.cfg.batch_size
        if not gen:  # the first prompt alone: it starts generating as soon as it is read
            first = filling[0].n_prompt - 1 - filling[0].prefill_at
            prompt_rows, draft_room = min(first, limit), 0
        elif filling:  # no drafts: the prompt's chunk takes their time (see _prompt_share)
            prompt_rows = min(waiting, self._prompt_share(len(gen), limit - len(gen)))
            draft_room = 0
        else:  # nothing waits: each draft is bounded by its own budget and controller
            prompt_rows, draft_room = 0, self.max_k * len(gen)
        if self.cfg.pool is not None:  # --kv-unified: what this pass adds must fit the pool
            gen, filling, prompt_rows, draft_room = self._fit_pool(gen, filling, prompt_rows,
                                                                   draft_room)
            if not gen and not filling:
                return seqs
        # drafts: each sequence's controller weighs its rows against the rest of the pass
        # (the other sequences' rows, decided or at least one each, and the prompt rows)
        drafts = []
        others = len(gen) + prompt_rows
        for s in gen:
            others -= 1
            d = s.speculator.draft(min(self._budget(s), draft_room), self._remaining(s),
                                   batch=(others, len(gen) - 1))
            if s.req.media and any(t < 0 for t in d.ids):  # an image's ids are never drafted
                d = d.cut(next(i for i, t in enumerate(d.ids) if t < 0))
            draft_room -= len(d.ids)
            others += 1 + len(d.ids)
            drafts.append(d)
        tokens, slots, pos, want = [], [], [], []
        for s, d in zip(gen, drafts):
            start = self.cache.length(s.slot)
            row = [s.tokens[-1], *d.ids]
            want.extend(range(len(tokens), len(tokens) + len(row)))
            tokens.extend(row)
            slots.extend([s.slot] * len(row))
            pos.extend(range(start, start + len(row)))
        chunks = []
        left = prompt_rows
        media = MediaRows([], [], [])
        for s in filling:
            if left <= 0:
                break
            end = min(s.n_prompt - 1, s.prefill_at + left)
            end = mediamod.chunk_end(s.req.media, s.prefill_at, end)
            part = s.tokens[s.prefill_at: end]
            for m in s.req.media:  # the chunk's image rows: their vectors, the image's end
                lo, hi = max(m.start, s.prefill_at), min(m.end, end)
                if lo < hi:
                    media.rows.extend(range(len(tokens) + lo - s.prefill_at,
                                            len(tokens) + hi - s.prefill_at))
                    media.vectors.append(m.vectors[lo - m.start: hi - m.start])
                    media.ends.extend([m.end] * (hi - lo))
            tokens.extend(part)
            slots.extend([s.slot] * len(part))
            pos.extend(range(s.prefill_at, s.prefill_at + len(part)))
            chunks.append((s, part))
            left -= len(part)
        t0 = time.perf_counter()
        if media.rows:
            media.vectors = torch.cat(media.vectors)
        logits = self.target.model.forward_packed(tokens, self.cache, slots, pos, want,
                                                  media if media.rows else None)
        t_fwd = time.perf_counter() - t0
        if gen and not chunks:  # the controllers' cost of a pass by its rows (all with logits)
            self.costs.record_verify(len(tokens), t_fwd)
        elif chunks and not gen and len(tokens) >= PROMPT_MEASURE_ROWS:
            self.costs.record_prompt(len(tokens), t_fwd)
        for s, part in chunks:
            self.cache.append(s.slot, part)
            s.prefill_at += len(part)
        at = 0
        for s, d in zip(gen, drafts):
            t1 = time.perf_counter()
            k = len(d.ids)
            eog = self._eog if s.req.sampling.ignore_eos else ()
            mine = constrain(logits[at: at + k + 1], d.ids, s.guide, s.bias, eog)
            at += k + 1
            res = (verify(d.ids, d.probs, mine, s.req.sampling, s.gen) if s.synth is None else
                   verify_synthetic(d.ids, mine, s.req.sampling, s.gen, s.spec.synth_probs,
                                    s.synth, self.tok.eog_ids))
            self.cache.append(s.slot, [s.tokens[-1], *d.ids[: res.n_accepted]])
            s.speculator.accept(d, res.n_accepted, res.tokens)
            s.stats.t_verify += t_fwd / len(gen) + time.perf_counter() - t1
            self._append(s, res.tokens, res.n_accepted, d.source)
            if s.guide is not None:
                s.guide.advance(s.output[len(s.output) - s.n_new:])
                if s.guide.failed and not s.done:  # cannot happen with masked rows; if it
                    self._finish(s, "eos")  # did, nothing could follow
            if s.req.n_probs > 0 and s.n_new:
                s.logprobs.extend(token_logprobs(mine[: s.n_new], s.output[-s.n_new:],
                                            s.req.n_probs,
                                            s.req.sampling if s.req.post_sampling else None))
        for s in filling:
            s.n_new = 0
        # every sequence done: the engine waits (for their release, for the next request)
        self._idle_since_step = all(s.done for s in seqs)
        return seqs

    def pool_held(self) -> int:
        """Tokens every slot's cache holds (idle slots' cached prompts included)."""
        return sum(self.cache.length(i) for i in range(self.cfg.n_parallel))

    def _fit_pool(self, gen: list[Sequence], filling: list[Sequence], prompt_rows: int,
                  draft_room: int) -> tuple[list[Sequence], list[Sequence], int, int]:
        """--kv-unified: the slots share ctx_size positions. A pass adds at least one token per
        generating sequence, its prompt rows, and at most its drafted tokens. When that does
        not fit, idle slots' cached tokens go first; then drafts and prompt rows shrink to
        what fits (a prompt waits for room); then, while the generating rows alone do not fit
        (or nothing could move), the newest request fails with the context size exceeded, as
        llama-server's requests do when its unified cache is full."""
        pool = self.cfg.pool
        while True:
            free = pool - self.pool_held()
            if free < len(gen) + prompt_rows + draft_room:
                for i, s in enumerate(self.slots):
                    if s is None and self.cache.length(i):
                        if self.prompt_cache is not None:
                            self.prompt_cache.keep(self.cache, i, 0)
                        self._forget(i, 0)
                free = pool - self.pool_held()
            room = free - len(gen)
            if room >= 0 and (gen or min(prompt_rows, room) > 0):
                prompt_rows = min(prompt_rows, room)
                return gen, filling, prompt_rows, min(draft_room, room - prompt_rows)
            victim = max(gen + filling, key=lambda q: q.t_start)
            victim.stop_type, victim.n_new = "error", 0
            victim.error = (f"the context size has been exceeded: with --kv-unified the "
                            f"{self.cfg.n_parallel} slots share {pool} tokens and hold "
                            f"{pool - free}; this request held "
                            f"{self.cache.length(victim.slot)}")
            victim.text += victim.detok.flush()
            self.release(victim)
            self._forget(victim.slot, 0)
            gen = [q for q in gen if q is not victim]
            filling = [q for q in filling if q is not victim]
            if not gen and not filling:
                return gen, filling, 0, 0
            if not gen:  # the first waiting prompt alone
                first = filling[0]
                prompt_rows = min(first.n_prompt - 1 - first.prefill_at, self.cfg.batch_size)
            draft_room = 0

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

    def _finish(self, seq: Sequence, why: str) -> None:
        seq.stop_type = why
        seq.text += seq.detok.flush()

    def _prompt_share(self, rows: int, room: int) -> int:
        """How many prompt rows go into a pass next to `rows` generating rows: as many as take
        PROMPT_SHARE (2) times what those rows take by themselves (measured costs), at most
        `room` (the --batch-size left), at least 1. The running streams' gaps then grow at most
        (1 + 2) = 3 times while the prompt is read, and the prompt reads at 2/3 of its speed
        alone (time to first token at most 1.5 times). On a CPU a prompt row costs about as
        much in a shared pass as alone, so no split does better on both; and a drafted row in
        such a pass would lengthen it without reading the prompt, so the generating rows carry
        no draft until the prompt is read. A pass holds at least the model's full-speed rows
        (the prompt kernel's 16): with fewer, every row costs more. Unmeasured costs: that
        floor alone."""
        room = max(1, room)
        floor = self.target.model.full_speed_rows - rows
        t_gen, t_row = self.costs.verify_time(rows), self.costs.prompt_token
        if t_gen is None or not t_row:  # unmeasured: the smallest chunk that reads at speed
            return max(1, min(room, floor))
        return max(1, min(room, max(int(PROMPT_SHARE * t_gen / t_row), floor)))

    def _append(self, seq: Sequence, new: list[int], n_from_draft: int, source: str = "") -> None:
        sp = seq.req.sampling
        # with a grammar, an EOG token comes only where the grammar allows nothing else: its end
        eog = () if sp.ignore_eos and seq.guide is None else self.tok.eog_ids
        seq.n_new = 0
        if not seq.output and new:  # the first token ends the prompt's time
            seq.t_gen_start = time.perf_counter()
            seq.t_prompt_ms = 1e3 * (seq.t_gen_start - seq.t_start)
        for j, t in enumerate(new):
            seq.tokens.append(t)
            seq.output.append(t)
            seq.origins.append(source if j < n_from_draft else "target")
            seq.n_new += 1
            seq.text += "" if t in eog else seq.detok.push(t)
            seq.ends.append(len(seq.text))
            if t in eog:
                seq.stop_type = "eos"
                break
            if sp.stop and self._check_stop(seq):
                break
            if sp.n_predict >= 0 and len(seq.output) >= sp.n_predict:
                seq.stop_type = "limit"
                break
            if len(seq.tokens) >= self.cfg.ctx_size and not self.cfg.context_shift:
                seq.stop_type = "limit"
                break
        if seq.done:
            if seq.stop_type != "word":
                seq.text += seq.detok.flush()
                if sp.stop:
                    self._check_stop(seq)
        seq.t_gen_ms = 1e3 * (time.perf_counter() - seq.t_gen_start)

    def _check_stop(self, seq: Sequence) -> bool:
        text = seq.text
        for s in seq.req.sampling.stop:
            i = text.find(s, max(0, seq.emitted - len(s)))
            if i >= 0:
                seq.text = text[:i]
                seq.stop_type = "word"
                seq.stopping_word = s
                return True
        return False

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
