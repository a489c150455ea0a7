"""The slots' caches: the target's and the draft's KV caches (one row per slot) and the host
prompt cache (--cache-ram), with what happens to them when a request starts or a slot is
given up. Rollback is a length (KVCache.truncate); with --kv-unified the memory of dropped
positions is given back (KVCache.drop), as the shared pool counts only what slots hold."""

from __future__ import annotations

import logging

from .. import media as mediamod
from ..config import EngineConfig
from ..models.decoder import KVCache
from ..models.loader import LoadedModel
from ..promptcache import PromptCache
from .sequence import Request

log = logging.getLogger("tandem.engine")


class SlotCaches:
    def __init__(self, target: LoadedModel, draft: LoadedModel | None, cfg: EngineConfig,
                 max_len: int, prompt_limit: int | None, head=None) -> None:
        """prompt_limit: the host prompt cache's bytes (0: none; None: no limit); head: an
        EAGLE-3 head (models/eagle3.py), whose cache its proposer manages."""
        # with --kv-unified each slot may reach the whole context but together they hold at
        # most ctx_size tokens (Scheduler._fit_pool): the memory is given as positions are
        # written
        self.unified = cfg.pool is not None
        self.target = KVCache.of_types(target.args, cfg.n_parallel, max_len,
                                       cfg.cache_types("target"), lazy=self.unified)
        self.draft = None
        if draft is not None:
            self.draft = KVCache.of_types(draft.args, cfg.n_parallel, max_len,
                                          cfg.cache_types("draft"), lazy=self.unified)
        self.head = None if head is None else head.cache(cfg.n_parallel, max_len,
                                                                cfg.cache_types("draft"))
        self.prompt = PromptCache(prompt_limit) if prompt_limit != 0 else None

    def lengths(self) -> list[int]:
        """Tokens each slot's target cache holds (idle slots' cached prompts included)."""
        return [self.target.length(i) for i in range(len(self.target.tokens))]

    def forget(self, slot: int, keep: int, draft_keep: int | None = 0) -> None:
        """Keep the first `keep` tokens of the slot's cache (and `draft_keep` of the draft's;
        None: leave the draft's as it is)."""
        caches = [(self.target, keep)]
        if self.draft is not None and draft_keep is not None:
            caches.append((self.draft, min(draft_keep, self.draft.length(slot))))
        for cache, n in caches:
            if self.unified:
                cache.drop(slot, n)
            else:
                cache.truncate(slot, n)

    def evict(self, slots: list[int]) -> None:
        """Idle slots' cached tokens go to the host prompt cache; the slots are cleared."""
        for i in slots:
            if self.target.length(i):
                if self.prompt is not None:
                    self.prompt.keep(self.target, i, 0)
                self.forget(i, 0)

    def reuse(self, slot: int, req: Request, idle: list[int], cache_idle: bool) -> int:
        """A request starts in `slot`: the prompt tokens its caches already hold (from the
        slot, or read back from the host prompt cache when that holds more), the rest of the
        slot forgotten. With cache_idle (--cache-idle-slots) every idle slot's tokens go to
        the host cache first, and with --kv-unified the slot is cleared, its room given to the
        shared context. The debug lines carry llama-server's markers of the same events,
        which its test suite reads."""
        ids = req.prompt_ids
        keep = self.target.common_prefix(slot, ids[:-1]) if req.cache_prompt else 0
        keep = mediamod.reuse_limit(req.media, keep)
        if self.prompt is not None:
            self.prompt.keep(self.target, slot, keep)
            if req.cache_prompt:
                own, keep = keep, self.prompt.restore(self.target, slot, ids[:-1], keep)
                keep = mediamod.reuse_limit(req.media, keep)
                if keep > own:
                    log.debug("slot %d: updating prompt cache: %d prompt tokens read "
                              "back from host memory (%d were in the slot)", slot, keep, own)
            if cache_idle:
                self._cache_idle(idle)
        draft_keep = None  # the draft proposer cuts its cache to the prompt itself
        if self.unified and self.draft is not None:
            draft_keep = self.draft.common_prefix(slot, ids[:-1])  # (and memory)
        self.forget(slot, keep, draft_keep)
        return keep

    def _cache_idle(self, idle: list[int]) -> None:
        for i in idle:
            if not self.target.length(i):
                continue
            if self.prompt.keep(self.target, i, 0):
                log.debug("slot %d: saved its %d idle tokens to the prompt cache "
                          "__TEST_TAG_CACHE_IDLE_SLOT__", i, self.target.length(i))
            if self.unified:
                self.forget(i, 0)
