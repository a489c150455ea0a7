"""Images in a prompt: where they sit and what the model reads there.

An image is a block of positions in the prompt whose inputs are the vision projector's vectors
instead of token embeddings (models/vision.py makes them). Each of its positions carries a
negative id derived from the image's bytes (`media_ids`), so the KV cache's token lists, the
prompt cache and slot files tell one image from another as they tell tokens apart: a prompt
with the same image reuses its cached positions, another image does not. No token id is
negative, so nothing mistakes them for text; the engine never samples or drafts them.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from dataclasses import dataclass
from functools import lru_cache

import torch

ID_SPAN = 1 << 20  # positions one image may take (its ids are consecutive)


@lru_cache(maxsize=1)
def marker() -> str:
    """The text that marks an image's place: LLAMA_MEDIA_MARKER, else a random one per process
    (as llama-server: text a user types cannot pose as an image; GET /props tells it)."""
    return os.environ.get("LLAMA_MEDIA_MARKER") or f"<__media_{secrets.token_hex(8)}__>"


def prompt_text(tok, ids: list[int]) -> str:
    """A prompt's text as a response shows it: each image's positions as one media marker."""
    out, run, in_image = [], [], False
    for t in ids:
        if t < 0:
            if not in_image:
                out.append(tok.decode(run) + marker())
                run = []
            in_image = True
        else:
            run.append(t)
            in_image = False
    return "".join(out) + tok.decode(run)


def media_ids(data: bytes, n: int) -> list[int]:
    """The n ids of an image's positions: negative, consecutive, from its bytes' SHA-256."""
    if not 0 < n <= ID_SPAN:
        raise ValueError(f"an image takes 1 to {ID_SPAN} positions, not {n}")
    base = int.from_bytes(hashlib.sha256(data).digest()[:5], "big")  # 40 bits
    return [-(1 + base * ID_SPAN + j) for j in range(n)]


@dataclass(slots=True)
class Media:
    """One image of a prompt: positions start .. start + len(vectors) - 1 of prompt_ids (which
    hold its `media_ids`), read as the rows of `vectors` ((n, dim) float32). Its positions see
    each other (Gemma 3's image tokens attend both ways within the image)."""

    start: int
    vectors: torch.Tensor

    @property
    def end(self) -> int:
        return self.start + self.vectors.shape[0]


class Prompt(list):
    """A prompt's token ids (a list, as every prompt is) that also carries its images; the
    server's prompt forms make it, the Request takes `media` from it."""

    def __init__(self, ids: list[int], media: list[Media]) -> None:
        super().__init__(ids)
        self.media = media


def check_media(ids: list[int], media: list[Media], dim: int) -> None:
    """The negative ids of a prompt are exactly its images' positions, in order, inside the
    prompt and before its last token, each image's vectors as wide as the model."""
    at = 0
    covered = set()
    for m in media:
        if m.start < at or m.end > len(ids) - 1:
            raise ValueError(f"an image at positions {m.start}..{m.end - 1} overlaps another "
                             f"or is not followed by text (prompt of {len(ids)} tokens)")
        if m.vectors.dim() != 2 or m.vectors.shape[1] != dim:
            raise ValueError(f"an image's vectors are {tuple(m.vectors.shape)}; the model "
                             f"reads rows of {dim}")
        if any(t >= 0 for t in ids[m.start: m.end]):
            raise ValueError(f"positions {m.start}..{m.end - 1} hold token ids, not an image's")
        covered.update(range(m.start, m.end))
        at = m.end
    stray = [i for i, t in enumerate(ids) if t < 0 and i not in covered]
    if stray:
        raise ValueError(f"position {stray[0]} holds an image id but no image is given there")


def chunk_end(media: list[Media], start: int, end: int) -> int:
    """Where a prompt chunk from `start` that would stop at `end` stops: never inside an image
    (its rows must be read in one pass, to see each other): before the image when the chunk
    starts earlier, else after it (a chunk may then exceed its share)."""
    for m in media:
        if m.start < end < m.end:
            return m.start if m.start > start else m.end
    return end


def reuse_limit(media: list[Media], keep: int) -> int:
    """How many cached prompt positions a request may reuse: never part of an image (a cut
    image would be read again from its middle, without its first rows)."""
    for m in media:
        if m.start < keep < m.end:
            return m.start
    return keep
