"""An EAGLE-3 draft head in float32, laid out as SpecForge's `LlamaForCausalLMEagle3`
checkpoints (the names llama.cpp's converter reads): the float reference of what a runtime
computes, and the module `tandem train-head` trains.

What it computes (llama.cpp's src/models/eagle3.cpp, the EAGLE-3 paper):

    encoder   g_P = fc(concat of the target's inputs to 3 layers at position P)   (3 td -> d)
    decoder   at position P the pair (token[P+1], g_P), RoPE at P:
              x  = [input_layernorm(embed(token[P+1])), hidden_norm(g_P)]           (2 d)
              h1 = g_P + o_proj(attention(q, k, v of x))       (hidden_norm(g_P) with
                                                                norm_before_residual)
              h  = h1 + mlp(post_attention_layernorm(h1))       the PRE-NORM output
              logits = lm_head(norm(h))                         over the draft vocabulary
    drafting  d1 = argmax of the last true pair's logits; the next pair is (d1, h) one
              position on, h being the previous position's pre-norm output; and so on.

The draft vocabulary: draft id i is target id i + d2t[i] (offsets, as HF checkpoints hold
them); t2d marks which target ids the draft vocabulary holds.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

KV = tuple[Tensor, Tensor]  # keys after rope, values: (B, Hkv, L, D) each


@dataclass(slots=True)
class HeadConfig:
    """The head's shape; the HF config.json fields, by their names."""

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int  # the target's
    draft_vocab_size: int
    target_hidden_size: int
    eagle_aux_hidden_state_layer_ids: list[int] = field(default_factory=list)
    head_dim: int = 0  # 0: hidden_size // num_attention_heads
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 4096
    norm_before_residual: bool = False
    norm_before_fc: bool = False
    own_embeddings: bool = False  # an embed_tokens of its own (else the target's)

    def __post_init__(self) -> None:
        if self.head_dim == 0:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"{self.num_attention_heads} heads do not group over "
                             f"{self.num_key_value_heads} key/value heads")

    @property
    def n_features(self) -> int:
        return len(self.eagle_aux_hidden_state_layer_ids)

    def to_hf(self) -> dict:
        """config.json as SpecForge writes an EAGLE-3 Llama head (llama.cpp converts it)."""
        cfg = {k: v for k, v in asdict(self).items() if k != "own_embeddings"}
        cfg["eagle_aux_hidden_state_layer_ids"] = list(self.eagle_aux_hidden_state_layer_ids)
        return {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
                "num_hidden_layers": 1, "hidden_act": "silu", "tie_word_embeddings": False,
                "torch_dtype": "float32", **cfg}

    @classmethod
    def from_hf(cls, cfg: dict, own_embeddings: bool = False) -> "HeadConfig":
        names = set(cls.__dataclass_fields__) - {"own_embeddings"}
        return cls(**{k: v for k, v in cfg.items() if k in names},
                   own_embeddings=own_embeddings)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope(x: Tensor, positions: Tensor, theta: float) -> Tensor:
    """HF's rotate_half RoPE: x (B, H, T, D), positions (B, T) -> x turned by position."""
    half = x.shape[-1] // 2
    inv = 1.0 / theta ** (torch.arange(half, dtype=torch.float64, device=x.device) / half)
    ang = (positions.to(torch.float64)[..., None] * inv)[:, None]  # (B, 1, T, D/2)
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


class Attention(nn.Module):
    def __init__(self, c: HeadConfig) -> None:
        super().__init__()
        d2, hd = 2 * c.hidden_size, c.head_dim
        self.q_proj = nn.Linear(d2, c.num_attention_heads * hd, bias=False)
        self.k_proj = nn.Linear(d2, c.num_key_value_heads * hd, bias=False)
        self.v_proj = nn.Linear(d2, c.num_key_value_heads * hd, bias=False)
        self.o_proj = nn.Linear(c.num_attention_heads * hd, c.hidden_size, bias=False)
        self.c = c

    def qkv(self, x: Tensor, positions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """x (B, T, 2d) -> q (B, H, T, D), k and v (B, Hkv, T, D), q and k turned."""
        c, (B, T, _) = self.c, x.shape
        q = self.q_proj(x).view(B, T, -1, c.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, -1, c.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, -1, c.head_dim).transpose(1, 2)
        return rope(q, positions, c.rope_theta), rope(k, positions, c.rope_theta), v


class MLP(nn.Module):
    def __init__(self, c: HeadConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MidLayer(nn.Module):
    """The one decoder layer (SpecForge's `midlayer`)."""

    def __init__(self, c: HeadConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MLP(c)
        self.norm_before_residual = c.norm_before_residual

    def pair(self, e: Tensor, g: Tensor) -> tuple[Tensor, Tensor]:
        """(the attention's input (B, T, 2d), the residual (B, T, d)) of embeddings e and g."""
        gn = self.hidden_norm(g)
        x = torch.cat((self.input_layernorm(e), gn), dim=-1)
        return x, gn if self.norm_before_residual else g

    def finish(self, attn: Tensor, residual: Tensor) -> Tensor:
        """attn (B, H, T, D) -> the pre-norm output h (B, T, d)."""
        B, _, T, _ = attn.shape
        h1 = residual + self.self_attn.o_proj(attn.transpose(1, 2).reshape(B, T, -1))
        return h1 + self.mlp(self.post_attention_layernorm(h1))


class Eagle3Head(nn.Module):
    """fc, midlayer.*, norm, lm_head, the buffers d2t (int64 offsets) and t2d (bool), and
    embed_tokens when the head has its own. Without its own, `target_embed` (a (V, d) tensor
    or a function of token ids, not saved) gives the target's embeddings."""

    def __init__(self, c: HeadConfig) -> None:
        super().__init__()
        self.config = c
        d = c.hidden_size
        if c.norm_before_fc:
            self.input_norm = RMSNorm(c.n_features * c.target_hidden_size, c.rms_norm_eps)
        self.fc = nn.Linear(c.n_features * c.target_hidden_size, d, bias=False)
        self.midlayer = MidLayer(c)
        self.norm = RMSNorm(d, c.rms_norm_eps)
        self.lm_head = nn.Linear(d, c.draft_vocab_size, bias=False)
        if c.own_embeddings:
            self.embed_tokens = nn.Embedding(c.vocab_size, d)
        self.register_buffer("d2t", torch.zeros(c.draft_vocab_size, dtype=torch.int64))
        self.register_buffer("t2d", torch.zeros(c.vocab_size, dtype=torch.bool))
        self.target_embed: Tensor | Callable[[Tensor], Tensor] | None = None

    def set_vocabulary(self, draft_ids: Tensor) -> None:
        """The draft vocabulary as target ids, ascending and distinct."""
        ids = torch.as_tensor(draft_ids, dtype=torch.int64)
        assert len(ids) == self.config.draft_vocab_size and bool((ids.diff() > 0).all())
        self.d2t.copy_(ids - torch.arange(len(ids)))
        self.t2d.zero_()
        self.t2d[ids] = True

    def draft_to_target(self, draft_ids: Tensor) -> Tensor:
        return draft_ids + self.d2t[draft_ids]

    def embed(self, tokens: Tensor) -> Tensor:
        if self.config.own_embeddings:
            return self.embed_tokens(tokens)
        if self.target_embed is None:
            raise RuntimeError("no token embeddings: set target_embed to the target's")
        if callable(self.target_embed):
            return self.target_embed(tokens).float()
        return F.embedding(tokens, self.target_embed).float()

    def encode(self, feats: Tensor) -> Tensor:
        """feats (..., 3 td), the target's layer inputs concatenated -> g (..., d)."""
        feats = feats.float()
        if self.config.norm_before_fc:
            feats = self.input_norm(feats)
        return self.fc(feats)

    def logits(self, h: Tensor) -> Tensor:
        """The pre-norm output h -> logits over the draft vocabulary."""
        return self.lm_head(self.norm(h))

    def forward(self, tokens_next: Tensor, g: Tensor, positions: Tensor,
                past_kv: KV | None = None) -> tuple[Tensor, Tensor, KV]:
        """tokens_next (B, T) long, g (B, T, d), positions (B, T) or (T,) long: the pairs
        (token[P+1], g_P) at P. Every row sees past_kv's rows (earlier positions) and the rows
        of this call up to its own. -> (h (B, T, d) pre-norm, logits (B, T, Vd), the keys and
        values of past_kv and these rows)."""
        B, T = tokens_next.shape
        positions = positions.expand(B, T) if positions.dim() == 1 else positions
        x, residual = self.midlayer.pair(self.embed(tokens_next), g)
        q, k, v = self.midlayer.self_attn.qkv(x, positions)
        if past_kv is not None:
            k, v = torch.cat((past_kv[0], k), dim=2), torch.cat((past_kv[1], v), dim=2)
        L = k.shape[2]
        mask = torch.ones(T, L, dtype=torch.bool, device=q.device).tril(L - T)
        attn = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        h = self.midlayer.finish(attn, residual)
        return h, self.logits(h), (k, v)

    def unroll(self, tokens: Tensor, g: Tensor, steps: int,
               start: int = 0) -> list[tuple[Tensor, Tensor]]:
        """Training-time test: the head over a sequence `steps` times, each step drafting
        one token further, as at test time (SpecForge's cache_hidden attention).

        tokens (B, L): the sequence; g (B, L, d): its encoded target features; row i of every
        step stands for the chain that starts after position i. Step 0 is the plain forward of
        the pairs (tokens[i+1], g_i) at position start + i. Step j > 0 reads at row i the pair
        (tokens[i+1+j], h of step j-1 at row i) at position start + i + j: what drafting reads
        after j accepted drafts, when the drafts were the tokens of the sequence. Its query sees
        step 0's keys of rows 0..i (the true pairs before the chain) and row i's keys of steps
        1..j (the chain's own drafts), each row its own diagonal.

        Returns per step (h (B, L-1, d), logits (B, L-1, Vd)); row i of step j predicts the
        token after tokens[i+1+j]; tokens past the end read as 0 (mask those rows' loss).
        """
        B, L = tokens.shape
        n = L - 1
        attn_mod, scale = self.midlayer.self_attn, self.config.head_dim ** -0.5
        pos = start + torch.arange(n, device=tokens.device).expand(B, n)
        keys: list[tuple[Tensor, Tensor]] = []
        out, hidden = [], g[:, :n]
        for j in range(steps):
            nxt = torch.zeros(B, n, dtype=tokens.dtype, device=tokens.device)
            nxt[:, : max(0, n - j)] = tokens[:, 1 + j:]
            x, residual = self.midlayer.pair(self.embed(nxt), hidden)
            q, k, v = attn_mod.qkv(x, pos + j)
            keys.append((k, v))
            attn = _chain_attention(q, keys, scale)
            hidden = self.midlayer.finish(attn, residual)
            out.append((hidden, self.logits(hidden)))
        return out


def _chain_attention(q: Tensor, keys: list[KV], scale: float) -> Tensor:
    """q (B, H, n, D); keys[0] every row's true pair, causal; keys[1:] the chain's, each row
    seeing only its own (a diagonal) -> (B, H, n, D)."""
    H, n = q.shape[1], q.shape[2]

    def heads(t: Tensor) -> Tensor:  # key/value heads repeated to the query heads
        return t.repeat_interleave(H // t.shape[1], dim=1)

    k0, v0 = heads(keys[0][0]), heads(keys[0][1])
    causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
    scores = [(q @ k0.transpose(-1, -2) * scale).masked_fill(~causal, float("-inf"))]
    rest = [(heads(k), heads(v)) for k, v in keys[1:]]
    scores += [(q * k).sum(-1, keepdim=True) * scale for k, _ in rest]
    p = torch.softmax(torch.cat(scores, dim=-1), dim=-1)
    o = p[..., :n] @ v0
    for m, (_, v) in enumerate(rest):
        o = o + p[..., n + m: n + m + 1] * v
    return o
