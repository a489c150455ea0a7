"""A model checked before any kernel reads it: every hyperparameter the decoder uses in range
and consistent, every tensor it reads present with the shape those hyperparameters give, no
block beyond the block count, and a tokenizer whose ids all have a row in the embedding.

The kernels read weights in place and trust their shapes, so a file whose header disagrees
with itself is refused here, with the tensor or key named, what was expected and what the file
has (ModelFileError: exit 2 for the CLI; `tandem serve` does not start). The GGUF reader
(gguf_file.py) has already checked that each tensor lies inside the file, is aligned and
overlaps no other.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from ..errors import ModelFileError
from .args import ModelArgs

# (least, most) of each integer hyperparameter; far beyond any model of this family, small
# enough that nothing sized from them (rope tables, caches, scratch) can overflow
RANGES = {
    "dim": (1, 1 << 16), "n_layers": (1, 1024), "n_heads": (1, 1024), "n_kv_heads": (1, 1024),
    "ffn_dim": (1, 1 << 20), "vocab_size": (1, 1 << 22), "head_dim": (2, 1024),
    "max_seq_len": (1, 1 << 24),
}


@dataclass(frozen=True, slots=True)
class Keys:
    """How the file names each hyperparameter (for the messages)."""

    dim: str
    n_layers: str
    n_heads: str
    n_kv_heads: str
    ffn_dim: str
    vocab_size: str
    head_dim: str
    max_seq_len: str
    norm_eps: str
    rope_theta: str
    block: str  # a tensor name's block prefix, as a regex with one group: the block number


def gguf_keys(arch: str) -> Keys:
    k = f"{arch}."
    return Keys(dim=k + "embedding_length", n_layers=k + "block_count",
                n_heads=k + "attention.head_count", n_kv_heads=k + "attention.head_count_kv",
                ffn_dim=k + "feed_forward_length", vocab_size="vocabulary size",
                head_dim=k + "attention.key_length", max_seq_len=k + "context_length",
                norm_eps=k + "attention.layer_norm_rms_epsilon", rope_theta=k + "rope.freq_base",
                block=r"blk\.(\d+)\.")


HF_KEYS = Keys(dim="hidden_size", n_layers="num_hidden_layers", n_heads="num_attention_heads",
               n_kv_heads="num_key_value_heads", ffn_dim="intermediate_size",
               vocab_size="vocab_size", head_dim="head_dim", max_seq_len="max_position_embeddings",
               norm_eps="rms_norm_eps", rope_theta="rope_theta", block=r"model\.layers\.(\d+)\.")


def check_args(args: ModelArgs, keys: Keys, where: str) -> None:
    """Every hyperparameter in range, the head counts dividing, head_dim even (rope turns
    pairs), eps and rope base finite and positive."""
    for field, (lo, hi) in RANGES.items():
        value = getattr(args, field)
        if type(value) is not int or not lo <= value <= hi:
            raise ModelFileError(f"{where}: {getattr(keys, field)} is {value!r}; expected an "
                                 f"integer from {lo} to {hi}")
    if args.n_heads % args.n_kv_heads:
        raise ModelFileError(
            f"{where}: {keys.n_heads} ({args.n_heads}) is not a multiple of {keys.n_kv_heads} "
            f"({args.n_kv_heads}): each key/value head must serve the same number of heads")
    if args.head_dim % 2:
        raise ModelFileError(f"{where}: {keys.head_dim} is {args.head_dim}; rope needs an even "
                             "head dimension")
    if not (isinstance(args.norm_eps, float) and math.isfinite(args.norm_eps)
            and 0 < args.norm_eps < 1):
        raise ModelFileError(f"{where}: {keys.norm_eps} is {args.norm_eps!r}; expected a "
                             "number between 0 and 1")
    if not (isinstance(args.rope_theta, float) and math.isfinite(args.rope_theta)
            and args.rope_theta > 0):
        raise ModelFileError(f"{where}: {keys.rope_theta} is {args.rope_theta!r}; expected a "
                             "positive number")
    if not (math.isfinite(args.rope_scale) and args.rope_scale > 0):
        raise ModelFileError(f"{where}: the rope scaling factor is {args.rope_scale!r}; "
                             "expected a positive number")
    if not (isinstance(args.sliding_window, int) and 0 <= args.sliding_window <= 1 << 24):
        raise ModelFileError(f"{where}: the sliding window is {args.sliding_window!r}; expected "
                             "an integer from 0 to 16777216")
    if args.swa_layers and len(args.swa_layers) != args.n_layers:
        raise ModelFileError(f"{where}: the sliding-window pattern names {len(args.swa_layers)} "
                             f"layers; {keys.n_layers} is {args.n_layers}")


def expected(args: ModelArgs, keys: Keys) -> dict[str, tuple[tuple[int, ...], str]]:
    """Each weight role's shape (rows, columns) and why, from the hyperparameters."""
    d, f, v = args.dim, args.ffn_dim, args.vocab_size
    q, kv = args.n_heads * args.head_dim, args.n_kv_heads * args.head_dim
    dim = f"{keys.dim} {d}"
    heads = f"{keys.n_heads} {args.n_heads} x head dimension {args.head_dim}"
    kv_heads = f"{keys.n_kv_heads} {args.n_kv_heads} x head dimension {args.head_dim}"
    ffn = f"{keys.ffn_dim} {f}"
    vocab = f"{keys.vocab_size} {v} rows, {dim} columns"
    return {
        "embed": ((v, d), vocab), "output": ((v, d), vocab),
        "norm": ((d,), dim), "attn_norm": ((d,), dim), "ffn_norm": ((d,), dim),
        "wq": ((q, d), f"{heads} rows, {dim} columns"),
        "wk": ((kv, d), f"{kv_heads} rows, {dim} columns"),
        "wv": ((kv, d), f"{kv_heads} rows, {dim} columns"),
        "wo": ((d, q), f"{dim} rows, {heads} columns"),
        "w_gate": ((f, d), f"{ffn} rows, {dim} columns"),
        "w_up": ((f, d), f"{ffn} rows, {dim} columns"),
        "w_down": ((d, f), f"{dim} rows, {ffn} columns"),
        "post_attn_norm": ((d,), dim), "post_ffn_norm": ((d,), dim),
        "q_norm": ((args.head_dim,), f"head dimension {args.head_dim}"),
        "k_norm": ((args.head_dim,), f"head dimension {args.head_dim}"),
        "wq.bias": ((q,), heads), "wk.bias": ((kv,), kv_heads), "wv.bias": ((kv,), kv_heads),
    }


def check_tensors(args: ModelArgs, shapes: dict[str, tuple[int, ...]], names: dict[str, str],
                  keys: Keys, where: str) -> None:
    """Every tensor the decoder reads (names: role -> the file's name, {i} for the block, the
    linear roles without ".weight") present with its expected shape; no tensor of a block at
    or beyond the block count."""
    want = expected(args, keys)
    linear = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down", "output")

    def check(role: str, name: str, required: bool = True) -> None:
        shape = shapes.get(name)
        if shape is None:
            if required:
                raise ModelFileError(f"{where}: missing tensor {name!r}")
            return
        (rows_cols, why) = want[role]
        if tuple(shape) != rows_cols:
            raise ModelFileError(
                f"{where}: tensor {name!r} has shape {list(shape)}, expected "
                f"{list(rows_cols)} ({why})")

    for role in ("embed", "norm"):
        check(role, names[role])
    if not args.tie_embeddings:
        check("output", names["output"] + ".weight")
    for i in range(args.n_layers):
        for role in ("attn_norm", "ffn_norm"):
            check(role, names[role].format(i=i))
        for role in ("q_norm", "k_norm"):
            check(role, names[role].format(i=i), required=args.qk_norm)
        if args.post_norms:
            for role in ("post_attn_norm", "post_ffn_norm"):
                check(role, names[role].format(i=i))
        for role in linear[:-1]:
            base = names[role].format(i=i)
            check(role, base + ".weight")
            if role in ("wq", "wk", "wv"):
                check(role + ".bias", base + ".bias", required=args.qkv_bias)
    block = re.compile(keys.block)
    for name in shapes:
        hit = block.match(name)
        if hit and int(hit.group(1)) >= args.n_layers:
            raise ModelFileError(
                f"{where}: tensor {name!r} belongs to block {hit.group(1)}, but {keys.n_layers} "
                f"is {args.n_layers} (blocks 0 to {args.n_layers - 1})")


def check_vocabulary(n_tokens: int, args: ModelArgs, embed: str, where: str) -> None:
    """Every token id the tokenizer can produce has a row in the embedding (and the output)."""
    if n_tokens > args.vocab_size:
        raise ModelFileError(
            f"{where}: the tokenizer has {n_tokens} tokens but {embed!r} has {args.vocab_size} "
            f"rows: ids {args.vocab_size} to {n_tokens - 1} would have no embedding")
