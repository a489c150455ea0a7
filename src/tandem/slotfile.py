"""llama-server's slot files (/slots/{id}?action=save|restore): what an idle slot's target
cache holds (its token ids, keys and values) with the model's identity, in one torch.save
file written atomically. An image's positions travel as their negative ids (media.py) with
their keys and values: a later prompt with the same image reuses them; a server that reads no
images refuses such a file, as llama-server does without an mmproj. The draft's cache is not
saved: it catches up on the restored tokens by itself."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from .errors import TandemError

SLOT_FORMAT = "tandem-slot-1"
NO_MMPROJ = "Cannot restore media tokens without an mmproj"  # llama-server's words


def identity(engine) -> dict:
    """What a file must match to be restored: the target and the cache's layout."""
    a = engine.target.args
    return {"arch": a.arch, "n_layers": a.n_layers, "n_kv_heads": a.n_kv_heads,
            "head_dim": a.head_dim, "vocab": a.vocab_size,
            "dtype": f"{engine.cache.k.dtype}/{engine.cache.v.dtype}",
            "file": engine.target.path.name}


def save(engine, slot: int, path: Path) -> tuple[int, int]:
    """Write the slot's cache to path; returns (tokens, bytes written)."""
    cache = engine.cache
    n = cache.length(slot)
    state = {"format": SLOT_FORMAT, "model": identity(engine), "tokens": list(cache.tokens[slot]),
             "k": cache.k[:, slot, :, :n].clone(), "v": cache.v[:, slot, :, :n].clone()}
    tmp = path.with_name(path.name + ".partial")
    torch.save(state, tmp)
    os.replace(tmp, path)
    return n, path.stat().st_size


def restore(engine, slot: int, path: Path, media: bool) -> tuple[int, int]:
    """Load a save() file into the slot (any slot of a server with the same target model);
    returns (tokens, bytes read). A later prompt that starts with those tokens reuses them, as
    a cached prompt. A file holding an image's positions needs a server that reads images
    (media); refused, the slot is left empty."""
    try:
        state = torch.load(path, weights_only=True)
    except Exception as e:
        raise TandemError(f"{path.name}: not a slot file this server can read ({e})") from None
    if not isinstance(state, dict) or state.get("format") != SLOT_FORMAT:
        raise TandemError(f"{path.name}: not a Tandem slot file (format {SLOT_FORMAT})")
    if state["model"] != identity(engine):
        raise TandemError(f"{path.name} was saved with another model or cache layout "
                          f"({state['model']}), this server runs {identity(engine)}")
    tokens, k, v = state["tokens"], state["k"], state["v"]
    n = len(tokens)
    if not media and any(t < 0 for t in tokens):
        engine.erase_slot(slot)
        raise TandemError(f"{path.name}: {NO_MMPROJ} (the file holds an image; start the "
                          "server with --mmproj)")
    if n >= engine.cache.max_len - engine.max_k - 1 or k.shape[2] != n:
        raise TandemError(f"{path.name} holds {n} tokens; a slot here holds at most "
                          f"{engine.cfg.ctx_size - 1}")
    cache = engine.cache
    cache.k[:, slot, :, :n] = k
    cache.v[:, slot, :, :n] = v
    cache.tokens[slot] = list(tokens)
    cache.exact[slot] = None
    if engine.draft_cache is not None:  # keep what the draft holds only where it agrees
        engine.draft_cache.truncate(slot, engine.draft_cache.common_prefix(slot, tokens))
    return n, path.stat().st_size
