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
from .models.decoder import KVCache
from .models.loader import LoadedModel

SLOT_FORMAT = "tandem-slot-1"
NO_MMPROJ = "Cannot restore media tokens without an mmproj"  # llama-server's words


class MediaRefused(TandemError):
    """The file holds an image and this server reads none: the slot is to be left empty."""


def identity(target: LoadedModel, cache: KVCache) -> dict:
    """What a file must match to be restored: the target and the cache's layout."""
    a = target.args
    return {"arch": a.arch, "n_layers": a.n_layers, "n_kv_heads": a.n_kv_heads,
            "head_dim": a.head_dim, "vocab": a.vocab_size,
            "dtype": f"{cache.k.dtype}/{cache.v.dtype}", "file": target.path.name}


def save(target: LoadedModel, cache: KVCache, slot: int, path: Path) -> tuple[int, int]:
    """Write the slot's cache to path; returns (tokens, bytes written)."""
    n = cache.length(slot)
    state = {"format": SLOT_FORMAT, "model": identity(target, cache),
             "tokens": list(cache.tokens[slot]),
             "k": cache.k[:, slot, :, :n].clone(), "v": cache.v[:, slot, :, :n].clone()}
    tmp = path.with_name(path.name + ".partial")
    torch.save(state, tmp)
    os.replace(tmp, path)
    return n, path.stat().st_size


def restore(target: LoadedModel, cache: KVCache, slot: int, path: Path, media: bool,
            most: int) -> tuple[int, int]:
    """Load a save() file into the slot (any slot of a server with the same target model);
    returns (tokens, bytes read). A later prompt that starts with those tokens reuses them, as
    a cached prompt. A file holding an image's positions needs a server that reads images
    (media); refused, the slot is left empty. most: the tokens a slot may hold."""
    try:
        state = torch.load(path, weights_only=True)
    except Exception as e:
        raise TandemError(f"{path.name}: not a slot file this server can read ({e})") from None
    if not isinstance(state, dict) or state.get("format") != SLOT_FORMAT:
        raise TandemError(f"{path.name}: not a Tandem slot file (format {SLOT_FORMAT})")
    mine = identity(target, cache)
    if state["model"] != mine:
        raise TandemError(f"{path.name} was saved with another model or cache layout "
                          f"({state['model']}), this server runs {mine}")
    tokens, k, v = state["tokens"], state["k"], state["v"]
    n = len(tokens)
    if not media and any(t < 0 for t in tokens):
        raise MediaRefused(f"{path.name}: {NO_MMPROJ} (the file holds an image; start the "
                          "server with --mmproj)")
    if n > most or k.shape[2] != n:
        raise TandemError(f"{path.name} holds {n} tokens; a slot here holds at most {most}")
    cache.k[:, slot, :, :n] = k
    cache.v[:, slot, :, :n] = v
    cache.tokens[slot] = list(tokens)
    cache.exact[slot] = None
    return n, path.stat().st_size
