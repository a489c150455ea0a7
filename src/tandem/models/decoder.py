"""One decoder for the llama/qwen2/qwen3/gemma3 family; differences are ModelArgs fields.

The forward pass takes a batch of rows, each row a slot of the KV cache with its own start
position, and returns logits for every input position: verification needs all k+1 rows.
"""

from __future__ import annotations

import ctypes
import mmap
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import kernels
from ..config import Numerics
from .args import ModelArgs
from .linear import WIDE_MIN_ROWS


_PAGE = mmap.PAGESIZE
_MADV_DONTNEED = 4
_libc = None


def _release_pages(addr: int, nbytes: int) -> None:
    """madvise(MADV_DONTNEED) on the whole pages inside [addr, addr + nbytes) (Linux; a no-op
    where the call is not there)."""
    global _libc
    start = -(-addr // _PAGE) * _PAGE
    end = (addr + nbytes) // _PAGE * _PAGE
    if end <= start:
        return
    if _libc is None:
        try:
            _libc = ctypes.CDLL(None, use_errno=True)
            _libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        except (OSError, AttributeError):
            _libc = False
    if _libc:
        _libc.madvise(start, end - start, _MADV_DONTNEED)


def _fresh_zeros(shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
    """A tensor on a private anonymous mapping of its own: the system gives its pages only
    when they are first written (reads before that see zeros), whatever the allocator would do
    with a block of that size (glibc serves blocks under its mmap threshold from a heap that
    may be resident, and writes a header on the first page of the blocks it maps)."""
    n = max(1, torch.Size(shape).numel()) * torch.empty((), dtype=dtype).element_size()
    buf = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | getattr(mmap, "MAP_ANONYMOUS", 0x20))
    # torch.frombuffer holds the mapping for as long as the tensor lives
    return torch.frombuffer(buf, dtype=dtype, count=torch.Size(shape).numel()).view(shape)


class KVCache:
    """One preallocated tensor per K and V; rollback is setting a slot's length.

    k, v: (n_layers, n_slots, n_kv_heads, max_len, head_dim). `tokens[slot]` are the ids whose
    keys and values the slot holds, in order (host integers), so a later request can reuse a
    common prefix and a proposer knows what its model has not seen yet.
    """

    def __init__(self, args: ModelArgs, n_slots: int, max_len: int, dtype: torch.dtype,
                 device: str | torch.device = "cpu", lazy: bool = False,
                 v_dtype: torch.dtype | None = None) -> None:
        """dtype: how keys are held (float16: --cache-type-k f16), v_dtype values' (default:
        dtype); the layers compute attention in their own dtype on what is held. lazy: leave
        the memory unwritten (a mapping of its own, `_fresh_zeros`), so the system gives a
        slot's pages only as its positions are written, and `drop` gives them back: a shared
        pool of positions (--kv-unified) then holds about the memory of the tokens its slots
        hold, not n_slots times the context."""
        shape = (args.n_layers, n_slots, args.n_kv_heads, max_len, args.head_dim)
        make = torch.zeros
        if lazy and torch.device(device).type == "cpu":
            make = lambda shape, dtype, device: _fresh_zeros(shape, dtype)  # noqa: E731
        self.k = make(shape, dtype=dtype, device=device)
        self.v = make(shape, dtype=v_dtype or dtype, device=device)
        self.max_len = max_len
        self.tokens: list[list[int]] = [[] for _ in range(n_slots)]
        # each layer's (rope base, linear scale): gemma3's sliding layers turn by another base
        self.rope = (args.head_dim, [args.layer_rope(i) for i in range(args.n_layers)],
                     args.rope_interleaved)
        # per slot after a context shift (`shift`): how many leading positions still hold what
        # reading those tokens computes; a later request reuses no more than that
        self.exact: list[int | None] = [None] * n_slots

    @classmethod
    def of_types(cls, args: ModelArgs, n_slots: int, max_len: int, types: tuple[str, str],
                 lazy: bool = False) -> "KVCache":
        """A cache by --cache-type-k / -v names (choices.CACHE_TYPES): f16 halves, f32 float32."""
        k, v = (torch.float16 if t == "f16" else torch.float32 for t in types)
        return cls(args, n_slots, max_len, k, lazy=lazy, v_dtype=v)

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def length(self, slot: int) -> int:
        return len(self.tokens[slot])

    def truncate(self, slot: int, length: int) -> None:
        del self.tokens[slot][length:]
        if self.exact[slot] is not None and length <= self.exact[slot]:
            self.exact[slot] = None

    def drop(self, slot: int, keep: int = 0) -> None:
        """Keep the slot's first `keep` tokens and give the memory of its other positions back
        to the system (their whole pages, madvise DONTNEED: read again they are zeros, written
        again they are given anew)."""
        self.truncate(slot, keep)
        if keep == 0:
            self.exact[slot] = None
        for t in (self.k, self.v):
            if t.device.type != "cpu":
                continue
            for layer in t[:, slot]:  # (kv heads, max_len, head_dim)
                for head in layer:  # positions contiguous
                    rest = head[keep:]
                    _release_pages(rest.data_ptr(), rest.nbytes)

    def append(self, slot: int, ids: list[int]) -> None:
        """Record that ids were just written at the slot's end."""
        self.tokens[slot].extend(ids)

    def common_prefix(self, slot: int, ids: list[int]) -> int:
        held = self.tokens[slot]
        n = 0
        for a, b in zip(held, ids):
            if a != b:
                break
            n += 1
        return n if self.exact[slot] is None else min(n, self.exact[slot])

    def shift(self, slot: int, keep: int, discard: int) -> None:
        """llama-server's context shift: positions keep .. keep + discard - 1 of the slot are
        dropped and the ones after them move down by `discard`. Values move as they are; keys
        are rotated back by `discard` positions (RoPE turns each pair of a key by position *
        frequency, so a turn by -discard gives the key of the position it moves to), in
        float64. The moved keys are then close to, not bit for bit, what reading the shortened
        sequence would compute, and everything after them depends on them: a later request
        reuses at most the first `keep` positions (`exact`)."""
        n = self.length(slot)
        if discard <= 0 or keep + discard > n:
            raise ValueError(f"cannot shift {discard} positions after {keep} of {n}")
        dim, ropes, interleaved = self.rope
        half = dim // 2
        for layer, (theta, scale) in enumerate(ropes):
            ang = -discard / scale / theta ** (torch.arange(0, half, dtype=torch.float64) / half)
            cos, sin = ang.cos(), ang.sin()
            k = self.k[layer, slot, :, keep + discard: n].double()  # (kv heads, moved, dim)
            if interleaved:
                x1, x2 = k[..., 0::2], k[..., 1::2]
                k = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
            else:
                x1, x2 = k.chunk(2, dim=-1)
                k = torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
            self.k[layer, slot, :, keep: n - discard] = k.to(self.k.dtype)
        self.v[:, slot, :, keep: n - discard] = self.v[:, slot, :, keep + discard: n].clone()
        del self.tokens[slot][keep: keep + discard]
        self.exact[slot] = min(keep, self.exact[slot] if self.exact[slot] is not None else keep)


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rope_tables(args: ModelArgs, max_len: int, theta: float | None = None,
                scale: float = 1.0) -> tuple[Tensor, Tensor]:
    """cos, sin: (max_len, head_dim // 2) in float32, for rope base theta (default the
    model's) and linear scale `scale` (position p turns as p / scale)."""
    half = args.head_dim // 2
    theta = args.rope_theta if theta is None else theta
    inv = 1.0 / (theta ** (torch.arange(0, half, dtype=torch.float64) / half))
    ang = (torch.arange(max_len, dtype=torch.float64) / scale)[:, None] * inv[None, :]
    return ang.cos().float(), ang.sin().float()


def gelu_tanh(x: Tensor) -> Tensor:
    return F.gelu(x, approximate="tanh")


ACTIVATIONS = {"silu": F.silu, "gelu_tanh": gelu_tanh}


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool) -> Tensor:
    """x: (B, T, H, D); cos, sin: (B, T, D/2). Neox rotates halves, GPT-J adjacent pairs."""
    x = x.float()
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]
    if interleaved:
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


class Block(nn.Module):
    def __init__(self, args: ModelArgs, w: dict[str, nn.Module | Tensor]) -> None:
        super().__init__()
        self.args = args
        self.attn_norm = w["attn_norm"]
        self.ffn_norm = w["ffn_norm"]
        self.wq, self.wk, self.wv, self.wo = w["wq"], w["wk"], w["wv"], w["wo"]
        self.w_gate, self.w_up, self.w_down = w["w_gate"], w["w_up"], w["w_down"]
        self.q_norm, self.k_norm = w.get("q_norm"), w.get("k_norm")  # qwen3, gemma3
        # gemma3's norms of the attention's and the FFN's outputs, else None
        self.post_attn_norm, self.post_ffn_norm = w.get("post_attn_norm"), w.get("post_ffn_norm")
        self.act = ACTIVATIONS[args.act]

    def forward(self, x: Tensor, layer: int, cache: KVCache, ctx: "StepContext") -> Tensor:
        a = self.args
        B, T, _ = x.shape
        how = dict(wide=ctx.wide, rowwise=ctx.rowwise)  # the pass's GEMM path (linear.py)
        h = rms_norm(x, self.attn_norm, a.norm_eps).to(ctx.dtype)
        q = self.wq(h, **how).view(B, T, a.n_heads, a.head_dim)
        k = self.wk(h, **how).view(B, T, a.n_kv_heads, a.head_dim)
        v = self.wv(h, **how).view(B, T, a.n_kv_heads, a.head_dim)
        if self.q_norm is not None:  # qwen3: each head normed before rope
            q = rms_norm(q, self.q_norm, a.norm_eps).to(q.dtype)
            k = rms_norm(k, self.k_norm, a.norm_eps).to(k.dtype)
        cos, sin = ctx.rope[ctx.model_rope_of[layer]]
        window = a.window(layer)
        q = apply_rope(q, cos, sin, a.rope_interleaved)
        k = apply_rope(k, cos, sin, a.rope_interleaved)
        kc, vc = cache.k[layer], cache.v[layer]  # (S, Hkv, max_len, D)
        # advanced indices (B, T) around a slice: the assigned value is (B, T, Hkv, D); the
        # cache rounds to its own dtype, and attention reads what it holds in q's
        kc[ctx.slot_idx, :, ctx.pos] = k.to(kc.dtype)
        vc[ctx.slot_idx, :, ctx.pos] = v.to(vc.dtype)
        qt = q.transpose(1, 2)  # (B, H, T, D)
        if ctx.rowwise:
            o = attend_rowwise(qt, kc, vc, ctx, a.attn_scale, window)
        elif T == 1 and ctx.single_slot is not None:  # one-token decode
            o = attend_row(qt[0, :, 0], kc[ctx.single_slot], vc[ctx.single_slot], ctx.kv_len,
                           a.attn_scale, window, ctx.starts[0]).view(1, a.n_heads, 1, a.head_dim)
        else:
            if ctx.single_slot is not None:
                keys = kc[ctx.single_slot, :, : ctx.kv_len].unsqueeze(0)  # (1, Hkv, L, D)
                vals = vc[ctx.single_slot, :, : ctx.kv_len].unsqueeze(0)
            else:
                keys = kc[ctx.slots_t, :, : ctx.kv_len]  # (B, Hkv, L, D)
                vals = vc[ctx.slots_t, :, : ctx.kv_len]
            o = F.scaled_dot_product_attention(qt, keys.to(qt.dtype), vals.to(qt.dtype),
                                               attn_mask=ctx.mask_of(window), enable_gqa=True,
                                               scale=a.attn_scale)
        o = o.transpose(1, 2).reshape(B, T, a.n_heads * a.head_dim).to(ctx.dtype)
        o = self.wo(o, **how).float()
        if self.post_attn_norm is not None:
            o = rms_norm(o, self.post_attn_norm, a.norm_eps)
        x = x + o
        h = rms_norm(x, self.ffn_norm, a.norm_eps).to(ctx.dtype)
        f = self.w_down(self.act(self.w_gate(h, **how)) * self.w_up(h, **how), **how).float()
        if self.post_ffn_norm is not None:
            f = rms_norm(f, self.post_ffn_norm, a.norm_eps)
        return x + f


def attend_row(q: Tensor, kc: Tensor, vc: Tensor, n: int, scale: float | None = None,
               window: int = 0, pos: int | None = None) -> Tensor:
    """One query row over the first n cached positions (window > 0: from the row's position
    `pos` (default n - 1) back `window` - 1): q (H, D); kc, vc (Hkv, max_len, D). scale: the
    scores' (default D ** -0.5). n beyond pos + 1: an image's row sees the whole image.

    Three small batched products (grouped heads share their key/value head) instead of
    scaled_dot_product_attention, whose CPU kernel's fixed cost per call outweighs one query's
    work. The same function computes every decode and verification row, so both give the same
    bits.
    """
    hkv, d = kc.shape[0], kc.shape[-1]
    pos = n - 1 if pos is None else pos
    lo = max(0, pos + 1 - window) if window > 0 else 0
    qg = q.reshape(hkv, -1, d)  # (Hkv, group, D): query heads h*group .. of kv head h
    keys, vals = kc[:, lo:n].to(q.dtype), vc[:, lo:n].to(q.dtype)  # as held, in q's dtype
    scale = d ** -0.5 if scale is None else scale
    scores = torch.matmul(qg, keys.transpose(1, 2)) * scale  # (Hkv, group, n - lo)
    return torch.matmul(torch.softmax(scores, dim=-1), vals).reshape(-1, d)  # (H, D)


def attend_rowwise(q: Tensor, kc: Tensor, vc: Tensor, ctx: "StepContext",
                   scale: float | None = None, window: int = 0) -> Tensor:
    """Attention one query row at a time, each over exactly its own prefix, unmasked.

    q: (B, H, T, D); kc, vc: (S, Hkv, max_len, D) -> (B, H, T, D). Every row is then computed
    by the same call, with the same shapes, as a one-token decode step at that position, so
    verifying k drafted tokens (or several slots at once) gives bit-for-bit the logits that
    decoding them one by one would: a batched masked attention differs in the last bits, and
    that was enough to flip a near-tie and change a greedy answer.
    """
    o = torch.empty_like(q)
    for b, (slot, start) in enumerate(zip(ctx.slots, ctx.starts)):
        for t in range(q.shape[2]):
            end = start + t + 1 if ctx.ends is None else ctx.ends[b][t]
            o[b, :, t] = attend_row(q[b, :, t], kc[slot], vc[slot], end, scale, window,
                                    start + t)
    return o


@dataclass(slots=True)
class MediaRows:
    """The rows of a packed pass that are an image's: row indices, their input vectors
    (len(rows), dim) float32 (the projector's output, not scaled as token embeddings are) and
    per row the position its attention stops before (the image's end: its rows see each
    other, as Gemma 3's image tokens do)."""

    rows: list[int]
    vectors: Tensor
    ends: list[int]


class StepContext:
    """Positions, mask, rope rows and the GEMM path (linear.py: wide, rowwise) shared by every
    layer of one forward pass."""

    def __init__(self, model: "Transformer", slots: list[int], starts: list[int], T: int,
                 rowwise: bool = False, wide: bool = False,
                 ends: list[list[int]] | None = None) -> None:
        """ends: per row (B lists of T) the position its attention stops before, where some
        row sees past its own (an image's rows see the whole image); None: causal."""
        dev = model.cos.device
        self.slots, self.starts, self.ends = slots, starts, ends
        self.rowwise = rowwise and (len(slots) > 1 or T > 1)
        self.wide = wide
        self.dtype = model.dtype
        self.slots_t = torch.tensor(slots, device=dev)
        starts_t = torch.tensor(starts, device=dev)
        self.pos = starts_t[:, None] + torch.arange(T, device=dev)[None, :]  # (B, T)
        self.slot_idx = self.slots_t[:, None].expand_as(self.pos)
        self.kv_len = max(starts) + T
        if ends is not None:
            self.kv_len = max(self.kv_len, max(max(e) for e in ends))
        self.single_slot = slots[0] if len(slots) == 1 else None
        # each rope table's rows at these positions, (B, T, D/2); a layer's is rope[of[layer]]
        self.rope = [(c[self.pos], s[self.pos]) for c, s in model.rope_sets]
        self.model_rope_of = model.rope_of
        self._masks: dict[int, Tensor | None] = {}
        if self.rowwise or (len(slots) == 1 and T == 1):
            self.mask = None  # one query sees every cached position (rowwise: no mask needed)
        else:
            keys = torch.arange(self.kv_len, device=dev)
            last = self.pos if ends is None else torch.tensor(ends, device=dev) - 1
            self.mask = (keys[None, None, :] <= last[:, :, None])[:, None]  # (B,1,T,L)
        self._masks[0] = self.mask

    def mask_of(self, window: int) -> Tensor | None:
        """The batched attention's mask for a layer that sees the last `window` positions
        (0: the causal mask)."""
        if window not in self._masks:
            keys = torch.arange(self.kv_len, device=self.pos.device)
            near = keys[None, None, :] > self.pos[:, :, None] - window  # (B, T, L)
            self._masks[window] = (near[:, None] if self.mask is None else self.mask & near[:, None])
        return self._masks[window]


class Transformer(nn.Module):
    def __init__(self, args: ModelArgs, tok_embeddings: Tensor, blocks: list[Block],
                 norm: Tensor, output: nn.Module, max_len: int, dtype: torch.dtype,
                 numerics: Numerics | None = None) -> None:
        super().__init__()
        self.args = args
        self.dtype = dtype  # activations entering the linears
        self.numerics = Numerics() if numerics is None else numerics
        self.threads = self.numerics.thread_count  # the native layers' OpenMP team
        self.tok_embeddings = tok_embeddings  # (V, dim)
        self.layers = nn.ModuleList(blocks)
        self.norm = norm
        self.output = output
        self.cos, self.sin = rope_tables(args, max_len, args.rope_theta, args.rope_scale)
        # every distinct (base, scale) of the layers' ropes, and which one each layer turns by
        full = (args.rope_theta, args.rope_scale)
        kinds = [full] + sorted({args.layer_rope(i) for i in range(args.n_layers)} - {full})
        self.rope_sets = [(self.cos, self.sin) if i == 0 else rope_tables(args, max_len, *r)
                          for i, r in enumerate(kinds)]
        self.rope_of = [kinds.index(args.layer_rope(i)) for i in range(args.n_layers)]
        self._native = False  # not built yet (see native_layers)
        # the layers whose inputs a pass hands an EAGLE-3 head when asked (`features=`);
        # n_layers: the final pre-norm output
        self.feature_layers: tuple[int, ...] = ()

    @torch.inference_mode()
    def forward(self, tokens: Tensor, cache: KVCache, slots: list[int],
                starts: list[int], logits: str = "all", x: Tensor | None = None,
                ends: list[list[int]] | None = None,
                features: Tensor | None = None) -> Tensor | None:
        """tokens: (B, T) long, row b written at slot slots[b] from position starts[b].

        logits: "all" -> (B, T, V) float32 (verification needs every row); "last" -> (B, V);
        "hidden" -> (B, dim), the last position's final-normed hidden state;
        "hidden_all" -> (B, T, dim), every position's (embeddings);
        "none" -> None (prefill only fills the cache: the vocabulary projection is the
        largest matmul of a prefill chunk). The caller records what the cache now holds.
        x: the rows' input vectors (B, T, dim) instead of the tokens' embeddings (an image's
        rows); ends: per row where its attention stops (StepContext; None: causal).
        features: a float32 (B, T, len(feature_layers) * dim) tensor filled with every row's
        inputs to the layers `feature_layers` (what an EAGLE-3 head reads).
        """
        B, T = tokens.shape
        x = self.embed(tokens) if x is None else x.float()  # (B, T, dim)
        native = self.native_layers(cache)
        wide = logits == "none" and B * T >= WIDE_MIN_ROWS  # see linear.py
        if native is not None:  # every layer in one C call (kernels/forward.c)
            rows = [s for s in slots for _ in range(T)]
            pos = [st + t for st in starts for t in range(T)]
            caps = self.feature_layers if features is not None else ()
            x = native.forward(x.reshape(B * T, -1), cache.k, cache.v, rows, pos,
                               threads=self.threads,
                               ends=None if ends is None else [e for r in ends for e in r],
                               capture=caps, features=None if not caps else
                               features.view(B * T, -1)).view(B, T, -1)
            self._final_feature(x, features)
            if logits == "none":
                return None
        else:
            # decode and verification rows must not depend on the batch around them: rowwise
            ctx = StepContext(self, slots, starts, T, rowwise=logits == "all", wide=wide,
                              ends=ends)
            for i, layer in enumerate(self.layers):
                if features is not None:
                    self._put_feature(features, i, x)
                x = layer(x, i, cache, ctx)
            self._final_feature(x, features)
            if logits == "none":
                return None
        if logits in ("last", "hidden"):
            x = x[:, -1]
        x = rms_norm(x, self.norm, self.args.norm_eps).to(self.dtype)
        if logits in ("hidden", "hidden_all"):  # the caller projects (or pools) them itself
            return x.float()
        return self.output(x, rowwise=logits == "all" and B * T > 1).float()

    @torch.inference_mode()
    def forward_packed(self, tokens: list[int], cache: KVCache, slots: list[int],
                       positions: list[int], want: list[int],
                       media: "MediaRows | None" = None,
                       features: Tensor | None = None) -> Tensor | None:
        """Rows of several slots and lengths in one pass, unpadded: row m is the token
        tokens[m] at position positions[m] of cache slot slots[m] (a slot's rows consecutive
        and in order). Returns the logits of the rows `want` (ascending), (len(want), V) float32,
        or None when want is empty. The engine's scheduler step mixes decode and verification
        rows with prompt chunks this way; each row is computed as it would be alone (the
        native layers in one C call; otherwise one pass per slot's run of rows).
        media: the rows that are an image's (their vectors, unscaled, and their attention's
        end: the whole image, which is in this pass or the cache). features: a float32
        (M, len(feature_layers) * dim) tensor that receives every row's inputs to the layers
        `feature_layers` (an EAGLE-3 head's; the id n_layers: the final pre-norm output)."""
        assert want == sorted(want), want
        native = self.native_layers(cache)
        x = self.embed(torch.tensor([max(t, 0) for t in tokens]))  # (M, dim)
        ends = None
        if media is not None:
            x[media.rows] = media.vectors.float()
            ends = [p + 1 for p in positions]
            for m, e in zip(media.rows, media.ends):
                ends[m] = e
        if native is not None:
            caps = self.feature_layers if features is not None else ()
            x = native.forward(x, cache.k, cache.v, slots, positions, threads=self.threads,
                               ends=ends, capture=caps, features=features if caps else None)
            self._final_feature(x, features)
            if not want:
                return None
            x = rms_norm(x[want], self.norm, self.args.norm_eps).to(self.dtype)
            return self.output(x, rowwise=len(want) > 1).float()
        out, m, n = [], 0, len(tokens)
        while m < n:  # the per-layer path: one pass per run of consecutive positions
            e = m + 1
            while e < n and slots[e] == slots[m] and positions[e] == positions[e - 1] + 1:
                e += 1
            mine = [w - m for w in want if m <= w < e]
            run = torch.tensor([[max(t, 0) for t in tokens[m:e]]])
            how = dict(x=x[None, m:e], ends=None if ends is None else [ends[m:e]],
                       features=None if features is None else features[None, m:e])
            if mine:
                out.append(self.forward(run, cache, [slots[m]], [positions[m]], **how)[0, mine])
            else:
                self.forward(run, cache, [slots[m]], [positions[m]], logits="none", **how)
            m = e
        return torch.cat(out) if out else None

    def _put_feature(self, features: Tensor, layer: int, x: Tensor) -> None:
        """x (the input of `layer`, or the final output: n_layers) into its columns of
        features, for every id of feature_layers that names it."""
        d = self.args.dim
        for c, l in enumerate(self.feature_layers):
            if l == layer:
                features[..., c * d: (c + 1) * d] = x.reshape(features.shape[:-1] + (d,))

    def _final_feature(self, x: Tensor, features: Tensor | None) -> None:
        if features is not None and self.args.n_layers in self.feature_layers:
            self._put_feature(features, self.args.n_layers, x)

    def embed(self, tokens: Tensor) -> Tensor:
        """The embedding rows of tokens in float32, times the model's embedding scale."""
        x = self.tok_embeddings[tokens].float()
        return x * self.args.embed_scale if self.args.embed_scale != 1.0 else x

    @property
    def full_speed_rows(self) -> int:
        """The fewest rows with which a pass reads a prompt at full speed: the prompt kernel's
        threshold where the native layers run it (fewer rows take the row-by-row kernel, slower
        per row), else 1."""
        n = self.numerics
        if n.native_layers and n.prompt_kernel and kernels.available():
            return kernels.prompt_rows(True)
        return 1

    def native_layers(self, cache: KVCache):
        """The C path for all layers (kernels.NativeLayers) if this model and cache can take it,
        else None. Numerics.native_layers off keeps the per-layer PyTorch path (comparisons)."""
        if self._native is False:
            self._native = None
            if self.numerics.native_layers:
                self._native = kernels.NativeLayers.from_model(
                    self.args, list(self.layers), self.cos, self.sin,
                    prompt_rows=kernels.prompt_rows(self.numerics.prompt_kernel),
                    layer_ropes=[self.rope_sets[r] for r in self.rope_of])
        if self._native is None or not {cache.k.dtype, cache.v.dtype} <= kernels.CACHE_DTYPES.keys():
            return None
        if not (cache.k.is_contiguous() and cache.v.is_contiguous()):
            return None
        return self._native
