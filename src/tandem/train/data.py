"""What a head learns from: a corpus this machine holds, read by the target, its layer inputs
and its next-token distributions kept on disk (resumable), and the draft vocabulary.

The corpus is the Python standard library's own sources (with their docstrings): text every
machine with Python has, and none of any benchmark's prompts; optionally with the target's
own answers to prompts written from it (answers.py). Files and answers are shuffled by the
seed, each file opened by a comment naming it, joined into one token stream and cut into
sequences of `seq_len` tokens. Each sequence is read by the target from position 0 (a fresh cache), and
for every position kept:

    tokens     (N, L) int32     the sequence
    feats      (N, L, 3 td) f16 the target's inputs to the head's 3 layers (Transformer.
                                feature_layers / forward_packed(features=))
    top_ids    (N, L, k) int32  the target's k likeliest next tokens, best first
    top_logp   (N, L, k) f16    their log-probabilities (over the whole vocabulary)

A full distribution is 151,936 floats a position on the default target; its top 16 hold
nearly all the mass that matters for a greedy head. meta.json says what was captured and
how many sequences are done; a capture that stops resumes at the next sequence.
"""

from __future__ import annotations

import json
import os
import random
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..errors import TandemError
from ..models.decoder import KVCache

ARRAYS = ("tokens", "feats", "top_ids", "top_logp")


def stdlib_files(seed: int) -> list[Path]:
    """The standard library's .py files (not site-packages), shuffled by seed."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(f for f in root.rglob("*.py")
                   if "site-packages" not in f.parts and "__pycache__" not in f.parts)
    random.Random(seed).shuffle(files)
    return files


def corpus_tokens(tokenizer, n_tokens: int, seed: int,
                  extra: list[list[int]] | None = None) -> np.ndarray:
    """n_tokens token ids: standard-library files, each opened by its name, and the documents
    `extra` (token ids: the target's own answers) shuffled in among them."""
    root = Path(sysconfig.get_paths()["stdlib"])
    docs = list(extra or [])
    have = sum(map(len, docs))
    for f in stdlib_files(seed):
        if have >= n_tokens:
            break
        try:
            text = f.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        docs.append(tokenizer.encode(f"# {f.relative_to(root)}\n{text}\n\n", add_special=False,
                                     parse_special=False))
        have += len(docs[-1])
    if have < n_tokens:
        raise TandemError(f"the standard library holds {have} tokens, fewer than the "
                          f"{n_tokens} asked for (--corpus-tokens)")
    random.Random(seed).shuffle(docs)
    return np.asarray([t for doc in docs for t in doc][:n_tokens], dtype=np.int32)


@dataclass
class Captured:
    """A capture directory's arrays (memory-mapped) and meta.json."""

    dir: Path
    meta: dict
    tokens: np.ndarray
    feats: np.ndarray
    top_ids: np.ndarray
    top_logp: np.ndarray

    @property
    def done(self) -> int:
        return int(self.meta["done"])

    @property
    def complete(self) -> bool:
        return self.done == self.meta["n_seqs"]

    def split(self, val_fraction: float = 0.05) -> tuple[list[int], list[int]]:
        """(train, validation) sequence indices: the last sequences (the last files of the
        shuffled order) are held out, at least one when there are two or more."""
        n = self.meta["n_seqs"]
        n_val = min(n - 1, max(1, round(n * val_fraction))) if n > 1 else 0
        return list(range(n - n_val)), list(range(n - n_val, n))

    def batch(self, idx: list[int]) -> dict[str, torch.Tensor]:
        """Sequences idx as tensors: tokens (B, L) long, feats (B, L, 3 td) float32, top_ids
        (B, L, k) long, top_logp (B, L, k) float32."""
        return {"tokens": torch.from_numpy(self.tokens[idx].astype(np.int64)),
                "feats": torch.from_numpy(self.feats[idx].astype(np.float32)),
                "top_ids": torch.from_numpy(self.top_ids[idx].astype(np.int64)),
                "top_logp": torch.from_numpy(self.top_logp[idx].astype(np.float32))}


def _write_meta(d: Path, meta: dict) -> None:
    tmp = d / "meta.json.tmp"
    tmp.write_text(json.dumps(meta, indent=1))
    os.replace(tmp, d / "meta.json")


def open_capture(d: Path, want: dict | None = None) -> Captured | None:
    """The capture in d, or None when there is none. want: the settings it must have been
    made with (a TandemError names the first that differs)."""
    if not (d / "meta.json").is_file():
        return None
    meta = json.loads((d / "meta.json").read_text())
    for k, v in (want or {}).items():
        if meta.get(k) != v:
            raise TandemError(f"{d} holds a capture made with {k}={meta.get(k)!r}, not {v!r}; "
                              f"use another --out or the same settings")
    arrays = {a: np.load(d / f"{a}.npy", mmap_mode="r+") for a in ARRAYS}
    return Captured(d, meta, **arrays)


def _create(d: Path, meta: dict, seqs: np.ndarray, width: int, k: int) -> Captured:
    d.mkdir(parents=True, exist_ok=True)
    n, L = seqs.shape
    shapes = {"tokens": ((n, L), np.int32), "feats": ((n, L, width), np.float16),
              "top_ids": ((n, L, k), np.int32), "top_logp": ((n, L, k), np.float16)}
    arrays = {a: np.lib.format.open_memmap(d / f"{a}.npy", mode="w+", dtype=dt, shape=s)
              for a, (s, dt) in shapes.items()}
    arrays["tokens"][:] = seqs
    arrays["tokens"].flush()
    _write_meta(d, meta)
    return Captured(d, meta, **arrays)


def capture(target, d: Path, *, n_tokens: int, seq_len: int, layers: list[int], topk: int,
            seed: int, chunk: int = 128, progress: bool = True,
            answers: list[list[int]] | None = None) -> Captured:
    """Read the corpus (with `answers`, the target's own, among it) with the target (a
    LoadedModel) into d, resuming what is there."""
    want = {"target": str(target.path), "target_bytes": _size(target.path),
            "layers": list(layers), "seq_len": seq_len, "topk": topk,
            "corpus_tokens": n_tokens, "seed": seed, "answers": len(answers or [])}
    cap = open_capture(d, want)
    if cap is None:
        stream = corpus_tokens(target.tokenizer, n_tokens, seed, answers)
        n = len(stream) // seq_len
        if n < 2:
            raise TandemError(f"--corpus-tokens {n_tokens} makes {n} sequence(s) of "
                              f"--seq-len {seq_len}; at least 2 are needed (one held out)")
        seqs = stream[: n * seq_len].reshape(n, seq_len)
        meta = {**want, "n_seqs": n, "done": 0, "seconds": 0.0,
                "dim": target.args.dim, "vocab_size": target.args.vocab_size,
                "corpus": "python stdlib sources and the target's answers, shuffled"}
        cap = _create(d, meta, seqs, len(layers) * target.args.dim, topk)
    if cap.complete:
        return cap
    model = target.model
    model.feature_layers = tuple(layers)
    cache = KVCache(target.args, 1, seq_len, torch.float32)
    bar = _bar(cap.meta["n_seqs"] * seq_len, cap.done * seq_len, "capture", progress)
    t0, seconds = time.perf_counter(), cap.meta["seconds"]
    for s in range(cap.done, cap.meta["n_seqs"]):
        _read_sequence(model, cache, cap, s, chunk)
        for a in ARRAYS[1:]:
            getattr(cap, a).flush()
        cap.meta.update(done=s + 1, seconds=seconds + time.perf_counter() - t0)
        _write_meta(d, cap.meta)
        bar.update(seq_len)
    bar.close()
    return cap


def _read_sequence(model, cache: KVCache, cap: Captured, s: int, chunk: int) -> None:
    """One sequence through the target from position 0, `chunk` rows a pass."""
    ids = cap.tokens[s].tolist()
    L, k = len(ids), cap.meta["topk"]
    feats = torch.empty(L, cap.feats.shape[-1], dtype=torch.float32)
    for a in range(0, L, chunk):
        b = min(L, a + chunk)
        logits = model.forward_packed(ids[a:b], cache, [0] * (b - a), list(range(a, b)),
                                      list(range(b - a)), features=feats[a:b])
        top, where = logits.topk(k, dim=-1)
        logp = top - torch.logsumexp(logits, dim=-1, keepdim=True)
        cap.top_ids[s, a:b] = where.numpy().astype(np.int32)
        cap.top_logp[s, a:b] = logp.numpy().astype(np.float16)
    big = float(feats.abs().max())
    if not np.isfinite(big) or big > 65000.0:  # beyond float16
        raise TandemError(f"the target's layer inputs reach {big:g} in sequence {s}, past "
                          f"float16's range; capture other layers (--layers)")
    cap.feats[s] = feats.numpy().astype(np.float16)


def choose_vocabulary(cap: Captured, train: list[int], n: int, vocab_size: int) -> np.ndarray:
    """The n target ids the draft vocabulary holds, ascending: the target's most frequent
    greedy choices over the training sequences (as EAGLE-3 chooses), then the corpus's most
    frequent tokens, then the lowest ids, until there are n."""
    if not 0 < n <= vocab_size:
        raise TandemError(f"--draft-vocab must be 1 .. {vocab_size} (the target's vocabulary), "
                          f"got {n}")
    greedy = np.bincount(cap.top_ids[train, :, 0].reshape(-1), minlength=vocab_size)
    seen = np.bincount(cap.tokens[train].reshape(-1), minlength=vocab_size)
    # greedy counts first, corpus counts break ties, then the lower id
    order = np.lexsort((np.arange(vocab_size), -seen, -greedy))
    return np.sort(order[:n]).astype(np.int64)


def _size(path: Path) -> int:
    p = Path(path)
    return p.stat().st_size if p.is_file() else sum(f.stat().st_size for f in p.rglob("*")
                                                     if f.is_file())


def _bar(total: int, initial: int, desc: str, on: bool, unit: str = "tok"):
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, unit=unit, desc=desc, disable=not on,
                dynamic_ncols=True)
