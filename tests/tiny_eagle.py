"""Tiny random EAGLE-3 heads for a tiny target, in both formats, and a float reference.

`reference` is written from the EAGLE-3 paper and llama.cpp's src/models/eagle3.cpp, plainly,
in Hugging Face layout (rope on halves, d2t as offsets): the pairs (token[P+1], g_P) through
one causal layer over the whole sequence at once, no cache.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from . import tiny


def head_config(target_cfg, dim: int | None = None, draft_vocab: int = 40, **over) -> dict:
    t = target_cfg
    dim = dim or t.hidden_size
    n = t.num_hidden_layers
    cfg = dict(architectures=["LlamaForCausalLMEagle3"], hidden_size=dim, intermediate_size=96,
               num_attention_heads=4, num_key_value_heads=2, head_dim=dim // 4,
               num_hidden_layers=1, rms_norm_eps=1e-6, rope_theta=10000.0,
               vocab_size=t.vocab_size, draft_vocab_size=draft_vocab,
               max_position_embeddings=512, target_hidden_size=t.hidden_size,
               eagle_aux_hidden_state_layer_ids=[0, n // 2, n],
               norm_before_residual=False, norm_before_fc=False)
    cfg.update(over)
    return cfg


def head_weights(cfg: dict, seed: int = 0, own_embed: bool = False) -> dict[str, torch.Tensor]:
    """Random weights in SpecForge's names; d2t offsets to a random subset of the vocabulary."""
    g = torch.Generator().manual_seed(seed)
    d, td, f = cfg["hidden_size"], cfg["target_hidden_size"], cfg["intermediate_size"]
    qd = cfg["num_attention_heads"] * cfg["head_dim"]
    kd = cfg["num_key_value_heads"] * cfg["head_dim"]
    dv, v = cfg["draft_vocab_size"], cfg["vocab_size"]

    def mat(n: int, k: int) -> torch.Tensor:
        return torch.randn(n, k, generator=g) / k ** 0.5 * 1.5

    def norm(n: int) -> torch.Tensor:
        return 1 + 0.1 * torch.randn(n, generator=g)

    w = {"fc.weight": mat(d, 3 * td), "midlayer.input_layernorm.weight": norm(d),
         "midlayer.hidden_norm.weight": norm(d), "midlayer.self_attn.q_proj.weight": mat(qd, 2 * d),
         "midlayer.self_attn.k_proj.weight": mat(kd, 2 * d),
         "midlayer.self_attn.v_proj.weight": mat(kd, 2 * d),
         "midlayer.self_attn.o_proj.weight": mat(d, qd),
         "midlayer.post_attention_layernorm.weight": norm(d),
         "midlayer.mlp.gate_proj.weight": mat(f, d), "midlayer.mlp.up_proj.weight": mat(f, d),
         "midlayer.mlp.down_proj.weight": mat(d, f), "norm.weight": norm(d),
         "lm_head.weight": mat(dv, d)}
    ids = torch.randperm(v, generator=g)[:dv].sort().values
    w["d2t"] = ids - torch.arange(dv)  # offsets, as SpecForge saves them
    t2d = torch.zeros(v, dtype=torch.bool)
    t2d[ids] = True
    w["t2d"] = t2d
    if cfg.get("norm_before_fc"):
        w["input_norm.weight"] = norm(3 * td)
    if own_embed:
        w["embed_tokens.weight"] = torch.randn(v, d, generator=g)
    return w


def write_hf(cfg: dict, w: dict[str, torch.Tensor], path: Path) -> Path:
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg))
    save_file({k: v.contiguous() for k, v in w.items()}, str(path / "model.safetensors"))
    return path


# SpecForge's names -> llama.cpp's (as the trainer's export writes them)
from tandem.train.export import GGUF_NAMES  # noqa: E402


def write_gguf(cfg: dict, w: dict[str, torch.Tensor], path: Path, qtype=None,
               tokens: list[str] | None = None, drop: tuple[str, ...] = (),
               meta: dict | None = None) -> Path:
    """As llama.cpp's converter writes a head: q/k permuted, d2t absolute int64, the target's
    vocabulary; qtype quantizes the matrices. drop: GGUF tensors left out; meta: keys
    (without the "eagle3." prefix) overridden, None removes one (bad-input tests)."""
    import gguf

    wr = gguf.GGUFWriter(str(path), "eagle3")
    keys = {"block_count": 1, "context_length": cfg["max_position_embeddings"],
            "embedding_length": cfg["hidden_size"],
            "feed_forward_length": cfg["intermediate_size"],
            "attention.head_count": cfg["num_attention_heads"],
            "attention.head_count_kv": cfg["num_key_value_heads"],
            "attention.layer_norm_rms_epsilon": cfg["rms_norm_eps"],
            "rope.freq_base": cfg["rope_theta"],
            "target_layers": cfg["eagle_aux_hidden_state_layer_ids"],
            "target_hidden_size": cfg["target_hidden_size"],
            "norm_before_residual": cfg["norm_before_residual"],
            "norm_before_fc": cfg["norm_before_fc"]}
    keys.update(meta or {})
    for k, v in keys.items():
        if v is None:
            continue
        if isinstance(v, bool):
            wr.add_bool(f"eagle3.{k}", v)
        elif isinstance(v, list):
            wr.add_array(f"eagle3.{k}", [int(x) for x in v])
        elif isinstance(v, float):
            wr.add_float32(f"eagle3.{k}", v)
        else:
            wr.add_uint32(f"eagle3.{k}", int(v))
    toks = tiny.bpe()[0] if tokens is None else tokens
    wr.add_tokenizer_model("gpt2")
    wr.add_token_list(toks)
    for name, t in w.items():
        if name == "t2d":
            continue
        if name == "d2t":
            if "d2t" not in drop:
                a = (t.long() + torch.arange(t.numel())).numpy().astype(np.int64)
                wr.add_tensor("d2t", a, raw_dtype=gguf.GGMLQuantizationType.I64)
            continue
        out = GGUF_NAMES[name]
        if out in drop:
            continue
        a = t.detach().float().numpy().copy()
        if name.endswith("q_proj.weight"):
            a = tiny._permute(a, cfg["num_attention_heads"])
        elif name.endswith("k_proj.weight"):
            a = tiny._permute(a, cfg["num_key_value_heads"])
        if qtype is not None and a.ndim == 2 and not name.startswith("embed"):
            wr.add_tensor(out, gguf.quants.quantize(a, qtype), raw_dtype=qtype)
        else:
            wr.add_tensor(out, a)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    return path


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = (pos[:, None].double() * inv[None]).float()
    cos, sin = torch.cat([ang.cos()] * 2, -1)[:, None], torch.cat([ang.sin()] * 2, -1)[:, None]
    rot = torch.cat([-x[..., d // 2:], x[..., : d // 2]], -1)
    return x * cos + rot * sin


def reference(cfg: dict, w: dict[str, torch.Tensor], embed: torch.Tensor, feats: torch.Tensor,
              next_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(pre-norm h (T, d), draft-vocabulary logits (T, dv), target ids of the rows' argmax)
    for the pairs (next_ids[P], features[P]) at positions 0..T-1; embed: the target's
    (V, d) embedding table unless the head has its own."""
    eps, H, Hkv, hd = (cfg["rms_norm_eps"], cfg["num_attention_heads"],
                       cfg["num_key_value_heads"], cfg["head_dim"])
    L = lambda name: w["midlayer." + name]  # noqa: E731
    x = feats.float()
    if cfg.get("norm_before_fc"):
        x = _rms(x, w["input_norm.weight"], eps)
    g = x @ w["fc.weight"].T
    table = w.get("embed_tokens.weight", embed)
    e = table[torch.tensor(next_ids)].float()
    gn = _rms(g, L("hidden_norm.weight"), eps)
    h = torch.cat([_rms(e, L("input_layernorm.weight"), eps), gn], -1)
    T = len(next_ids)
    pos = torch.arange(T)
    q = _rope((h @ L("self_attn.q_proj.weight").T).view(T, H, hd), pos, cfg["rope_theta"])
    k = _rope((h @ L("self_attn.k_proj.weight").T).view(T, Hkv, hd), pos, cfg["rope_theta"])
    v = (h @ L("self_attn.v_proj.weight").T).view(T, Hkv, hd)
    k, v = k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)
    scores = torch.einsum("thd,shd->hts", q, k) / hd ** 0.5
    scores = scores.masked_fill(pos[None, :, None] < pos[None, None, :], float("-inf"))
    o = torch.einsum("hts,shd->thd", scores.softmax(-1), v).reshape(T, H * hd)
    r = gn if cfg.get("norm_before_residual") else g
    h1 = r + o @ L("self_attn.o_proj.weight").T
    n1 = _rms(h1, L("post_attention_layernorm.weight"), eps)
    out = h1 + (F.silu(n1 @ L("mlp.gate_proj.weight").T) * (n1 @ L("mlp.up_proj.weight").T)) \
        @ L("mlp.down_proj.weight").T
    logits = _rms(out, w["norm.weight"], eps) @ w["lm_head.weight"].T
    top = logits.argmax(-1)
    return out, logits, top + w["d2t"][top]
