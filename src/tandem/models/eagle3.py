"""EAGLE-3 draft heads: one decoder layer that reads the target's hidden states.

A head is read from llama.cpp's GGUF (`general.architecture = eagle3`) or from a Hugging Face
checkpoint in any of the layouts llama.cpp's converter accepts (SpecForge
`LlamaForCausalLMEagle3`: `midlayer.*`; vLLM/AngelSlim `Eagle3LlamaForCausalLM`; speculators
`Eagle3Speculator`: `layers.0.*`, its config nested in `transformer_layer_config`). It is
checked against its target when loaded; every refusal names the key or tensor.

What it computes (llama.cpp's src/models/eagle3.cpp, the EAGLE-3 paper):

    f_P  = the inputs of the target's layers target_layers[0..2] at position P, concatenated
    g_P  = fc(f_P)                                  (RMS-normed first with norm_before_fc)
    at position P the layer reads the pair (token[P+1], g_P), rope at P:
    x    = [attn_norm(embed(token[P+1])), hidden_norm(g_P)]       (2 * dim wide)
    h1   = r + wo(attention(wq x, wk x, wv x))      r = g_P (hidden_norm(g_P) with
                                                    norm_before_residual)
    h_P  = h1 + down(silu(gate(n)) * up(n)),  n = ffn_norm(h1)    the pre-norm output
    logits = lm_head(out_norm(h_P)) over the draft vocabulary; draft id i is target id d2t[i]

Drafting past the target's features, the next pair is (drafted token, h_P): the head's own
pre-norm output stands in for the target's features.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from .. import kernels
from ..config import Numerics
from ..errors import ModelFileError
from .args import ModelArgs
from .decoder import KVCache, apply_rope, attend_row, rms_norm, rope_tables
from .gguf_file import GGUFFile
from .linear import Dense

ARCH = "eagle3"
# the Hugging Face architectures llama.cpp's converter reads as EAGLE-3 heads
HF_ARCHS = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM", "Eagle3Speculator",
            "Eagle3DraftModel")

# the layer's tensors: GGUF name, Hugging Face name (after "midlayer." / "layers.0.")
LAYER = {
    "attn_norm": ("blk.0.attn_norm.weight", "input_layernorm.weight"),
    "hidden_norm": ("blk.0.attn_norm_2.weight", "hidden_norm.weight"),
    "wq": ("blk.0.attn_q.weight", "self_attn.q_proj.weight"),
    "wk": ("blk.0.attn_k.weight", "self_attn.k_proj.weight"),
    "wv": ("blk.0.attn_v.weight", "self_attn.v_proj.weight"),
    "wo": ("blk.0.attn_output.weight", "self_attn.o_proj.weight"),
    "ffn_norm": ("blk.0.ffn_norm.weight", "post_attention_layernorm.weight"),
    "gate": ("blk.0.ffn_gate.weight", "mlp.gate_proj.weight"),
    "up": ("blk.0.ffn_up.weight", "mlp.up_proj.weight"),
    "down": ("blk.0.ffn_down.weight", "mlp.down_proj.weight"),
}
# outside the layer: GGUF name, Hugging Face name
OUTER = {
    "fc": ("fc.weight", "fc.weight"),
    "enc_norm": ("enc.output_norm.weight", "input_norm.weight"),
    "out_norm": ("output_norm.weight", "norm.weight"),
    "lm_head": ("output.weight", "lm_head.weight"),
    "embed": ("token_embd.weight", "embed_tokens.weight"),
    "d2t": ("d2t", "d2t"),
}
LINEARS = ("wq", "wk", "wv", "wo", "gate", "up", "down", "fc")


@dataclass(slots=True)
class HeadConfig:
    dim: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_dim: int
    norm_eps: float
    rope_theta: float
    rope_interleaved: bool  # GGUF: q/k permuted for llama.cpp's rope on adjacent pairs
    target_layers: tuple[int, ...]
    target_dim: int
    vocab_size: int  # the target's vocabulary, which the head's tokens are ids of
    norm_before_residual: bool = False
    norm_before_fc: bool = False

    def args(self) -> ModelArgs:
        """The layer's shape as a one-layer model's (its KV cache, rope tables)."""
        return ModelArgs(arch=ARCH, dim=self.dim, n_layers=1, n_heads=self.n_heads,
                         n_kv_heads=self.n_kv_heads, ffn_dim=self.ffn_dim,
                         vocab_size=self.vocab_size, head_dim=self.head_dim,
                         norm_eps=self.norm_eps, rope_theta=self.rope_theta,
                         rope_interleaved=self.rope_interleaved)


class Eagle3Head:
    """A loaded head: `encode` fuses target features, `forward` runs the layer over pairs
    into its own KV cache, `logits` projects pre-norm outputs onto the draft vocabulary and
    `to_target` maps draft ids to the target's."""

    def __init__(self, cfg: HeadConfig, w: dict[str, Any], embed: Callable[[Tensor], Tensor],
                 lm_head: torch.nn.Module, d2t: Tensor | None, max_len: int, path: Path,
                 source: str, dtype: torch.dtype) -> None:
        self.cfg, self.w, self.embed, self.lm_head, self.d2t = cfg, w, embed, lm_head, d2t
        self.args = cfg.args()
        self.path, self.source, self.dtype = path, source, dtype
        self.cos, self.sin = rope_tables(self.args, max_len)
        self.load_seconds = 0.0

    @property
    def draft_vocab(self) -> int:
        return self.lm_head.out_features if hasattr(self.lm_head, "out_features") else \
            self.lm_head.weight.shape[0]

    @property
    def target_layers(self) -> tuple[int, ...]:
        return self.cfg.target_layers

    def prepare_kernels(self) -> float:
        """Make its linears' kernel layouts now, as LoadedModel.prepare_kernels does for a
        model, so that no request's draft pays them; seconds taken."""
        from .quant import GGUFLinear

        t0 = time.perf_counter()
        for lin in [*self.w.values(), self.lm_head]:
            if isinstance(lin, GGUFLinear):
                lin.kernel_blocks()
        return time.perf_counter() - t0

    @torch.inference_mode()
    def encode(self, feats: Tensor) -> Tensor:
        """(T, 3 * target_dim) target features -> (T, dim) g, float32."""
        x = feats.float()
        if self.cfg.norm_before_fc:
            x = rms_norm(x, self.w["enc_norm"], self.cfg.norm_eps)
        return self.w["fc"](x.to(self.dtype)).float()

    @torch.inference_mode()
    def forward(self, ids: list[int], g: Tensor, cache: KVCache, slot: int,
                start: int) -> Tensor:
        """The pairs (ids[t], g[t]) at positions start + t of the cache's slot -> the pre-norm
        outputs h (T, dim) float32; their keys and values are written (the caller records
        them with cache.append)."""
        c, w = self.cfg, self.w
        T = len(ids)
        e = self.embed(torch.tensor(ids, dtype=torch.long)).float()
        gn = rms_norm(g.float(), w["hidden_norm"], c.norm_eps)
        x = torch.cat([rms_norm(e, w["attn_norm"], c.norm_eps), gn], -1).to(self.dtype)
        q = w["wq"](x).float().view(1, T, c.n_heads, c.head_dim)
        k = w["wk"](x).float().view(1, T, c.n_kv_heads, c.head_dim)
        v = w["wv"](x).float().view(1, T, c.n_kv_heads, c.head_dim)
        pos = torch.arange(start, start + T)
        cos, sin = self.cos[pos][None], self.sin[pos][None]
        q = apply_rope(q, cos, sin, c.rope_interleaved)[0]  # (T, H, D)
        k = apply_rope(k, cos, sin, c.rope_interleaved)[0]
        kc, vc = cache.k[0, slot], cache.v[0, slot]  # (Hkv, max_len, D)
        kc[:, start: start + T] = k.transpose(0, 1).to(kc.dtype)
        vc[:, start: start + T] = v[0].transpose(0, 1).to(vc.dtype)
        scale = c.head_dim ** -0.5
        if T == 1:
            o = attend_row(q[0], kc, vc, start + 1, scale).view(1, -1)
        else:
            n = start + T
            mask = torch.arange(n)[None, :] <= pos[:, None]  # (T, n) causal
            o = F.scaled_dot_product_attention(
                q.transpose(0, 1)[None], kc[None, :, :n].float(), vc[None, :, :n].float(),
                attn_mask=mask[None, None], enable_gqa=True, scale=scale)
            o = o[0].transpose(0, 1).reshape(T, -1)
        r = gn if c.norm_before_residual else g.float()
        h1 = r + w["wo"](o.to(self.dtype)).float()
        n1 = rms_norm(h1, w["ffn_norm"], c.norm_eps).to(self.dtype)
        return h1 + w["down"](F.silu(w["gate"](n1)) * w["up"](n1)).float()

    @torch.inference_mode()
    def logits(self, h: Tensor) -> Tensor:
        """Pre-norm outputs (n, dim) -> logits over the draft vocabulary (n, draft_vocab)."""
        x = rms_norm(h.float(), self.w["out_norm"], self.cfg.norm_eps).to(self.dtype)
        return self.lm_head(x).float()

    def to_target(self, draft_ids: Tensor | list[int]) -> list[int]:
        ids = torch.as_tensor(draft_ids, dtype=torch.long)
        return (ids if self.d2t is None else self.d2t[ids]).tolist()

    def cache(self, n_slots: int, max_len: int,
              types: tuple[str, str] = ("f32", "f32")) -> KVCache:
        """Its own KV cache (--cache-type-k-draft / -v-draft types)."""
        return KVCache.of_types(self.args, n_slots, max_len, types)


# ---- recognizing a head -----------------------------------------------------------------------


def _hf_config(path: Path) -> dict | None:
    try:
        cfg = json.loads((path / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return cfg if isinstance(cfg, dict) else None


def _flat(cfg: dict) -> dict:
    """A speculators config's layer settings (`transformer_layer_config`) merged over it."""
    inner = cfg.get("transformer_layer_config")
    return {**cfg, **inner} if isinstance(inner, dict) else cfg


def is_head(path: str | Path) -> bool:
    """Whether path is an EAGLE-3 head (a GGUF of architecture eagle3, or a Hugging Face
    directory of one of HF_ARCHS or, as llama.cpp's converter decides, a one-layer model with
    a draft_vocab_size)."""
    p = Path(path)
    if p.is_dir():
        cfg = _hf_config(p)
        if cfg is None:
            return False
        archs = cfg.get("architectures") or []
        flat = _flat(cfg)
        return any(a in HF_ARCHS for a in archs) or (
            "draft_vocab_size" in flat and flat.get("num_hidden_layers") == 1)
    if p.is_file():
        try:
            return GGUFFile(p).arch == ARCH
        except ModelFileError:
            return False
    return False


# ---- loading ------------------------------------------------------------------------------------


@dataclass(slots=True)
class HeadFile:
    """A head as read and checked, not yet built: its tensors as stored (GGUF RawTensors or
    torch tensors), under `names` (role -> tensor name); d2t as absolute target ids."""

    path: Path
    source: str  # "gguf" | "hf"
    cfg: HeadConfig
    tensors: dict[str, Any]
    names: dict[str, str]
    d2t: Tensor | None

    def shapes(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        """{tensor name: (type name, shape)} as the memory plan reads models."""
        out = {}
        for n, t in self.tensors.items():
            kind = t.type_name if hasattr(t, "type_name") else str(t.dtype).split(".")[-1]
            out[n] = (kind, tuple(t.shape))
        return out


def read_head(path: str | Path, targs: ModelArgs, ttokens: list[str] | None) -> HeadFile:
    """The head at path (GGUF file or Hugging Face directory), checked against a target of
    shape `targs` and vocabulary `ttokens` (None: not compared); every refusal names the key
    or tensor. Nothing is dequantized: the server checks a head before it listens."""
    p = Path(path)
    if not p.exists():
        raise ModelFileError(f"EAGLE-3 head not found: {p}")
    head = _read_hf(p, targs) if p.is_dir() else _read_gguf(p, targs, ttokens)
    if head.d2t is not None:
        n = targs.vocab_size
        bad = ((head.d2t < 0) | (head.d2t >= n)).nonzero()
        if len(bad):
            i = int(bad[0])
            raise ModelFileError(f"{p}: tensor {head.names['d2t']!r} maps draft id {i} to "
                                 f"target id {int(head.d2t[i])}, outside the target's "
                                 f"vocabulary (0..{n - 1})")
    return head


def load_head(path: str | Path, target, numerics: Numerics | None = None,
              max_len: int = 4096) -> Eagle3Head:
    """Read the head at path for `target` (a LoadedModel), checked against it; its linears
    compute as `numerics` says (GGUF blocks on the native kernels where they can)."""
    from .quant import dequantize, make_linear

    numerics = Numerics() if numerics is None else numerics
    t0 = time.perf_counter()
    f = read_head(path, target.args, getattr(target.tokenizer, "tokens", None))
    mode = "native" if numerics.weights in ("auto", "native") and kernels.available() \
        else "dense"
    dt = torch.float32

    def linear(role: str) -> torch.nn.Module:
        t = f.tensors[f.names[role]]
        if f.source == "hf":
            return Dense(t.to(dt))
        # fc reads the target's layer inputs, whose few outliers (thousands, next to values
        # near 1) would leave the rest nothing of an int8 block: 16-bit activations there
        bits = 16 if role == "fc" else numerics.bits
        return make_linear(t, dt, mode, bits=bits, threads=numerics.thread_count)

    def vector(role: str) -> Tensor:
        t = f.tensors[f.names[role]]
        return t.float() if f.source == "hf" else dequantize(t).float()

    w: dict[str, Any] = {n: linear(n) for n in LINEARS}
    for n in ("attn_norm", "hidden_norm", "ffn_norm", "out_norm", "enc_norm"):
        if f.names[n] in f.tensors:
            w[n] = vector(n)
    lm_head = linear("lm_head") if f.names["lm_head"] in f.tensors else target.model.output
    embed = target.model.embed
    if f.names["embed"] in f.tensors:
        table = vector("embed")
        embed = lambda ids: table[ids]  # noqa: E731
    head = Eagle3Head(f.cfg, w, embed, lm_head, f.d2t, max_len, f.path, f.source, dt)
    head.load_seconds = time.perf_counter() - t0
    return head


def _int(value: Any, where: str, key: str, default: Any = None) -> int:
    if value is None and default is not None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not float(value).is_integer():
        raise ModelFileError(f"{where}: {key} is {value!r}; expected an integer")
    return int(value)


def _read_gguf(p: Path, targs: ModelArgs, ttokens: list[str] | None) -> HeadFile:
    g = GGUFFile(p)
    where = str(p)
    if g.arch != ARCH:
        raise ModelFileError(f"{where}: general.architecture is {g.arch!r}; an EAGLE-3 head "
                             f"has {ARCH!r} (use it as --model-draft with "
                             "--spec-type draft-simple instead)")
    g.check_overlaps()
    key = lambda k: f"{ARCH}.{k}"  # noqa: E731
    layers = g.get("target_layers", g.get("extract_layers"))
    if not isinstance(layers, list):
        raise ModelFileError(f"{where}: missing GGUF metadata '{key('target_layers')}' (the "
                             "3 target layers whose hidden states the head reads)")
    dim = _int(g.get("embedding_length"), where, key("embedding_length"))
    n_heads = _int(g.get("attention.head_count"), where, key("attention.head_count"))
    head_dim = _int(g.get("attention.key_length"), where, key("attention.key_length"),
                    default=dim // max(n_heads, 1))
    cfg = HeadConfig(
        dim=dim, n_heads=n_heads,
        n_kv_heads=_int(g.get("attention.head_count_kv"), where,
                        key("attention.head_count_kv"), default=n_heads),
        head_dim=head_dim,
        ffn_dim=_int(g.get("feed_forward_length"), where, key("feed_forward_length")),
        norm_eps=float(g.get("attention.layer_norm_rms_epsilon", 1e-6)),
        rope_theta=float(g.get("rope.freq_base", 10000.0)),
        rope_interleaved=True,
        target_layers=tuple(_int(v, where, key("target_layers")) for v in layers),
        target_dim=_int(g.get("target_hidden_size"), where, key("target_hidden_size")),
        vocab_size=targs.vocab_size,
        norm_before_residual=bool(g.get("norm_before_residual", False)),
        norm_before_fc=bool(g.get("norm_before_fc", False)))
    _check_vocabulary(g.metadata.get("tokenizer.ggml.tokens"), ttokens, where)
    names = {k: v[0] for k, v in {**LAYER, **OUTER}.items()}
    shapes = {n: tuple(t.shape) for n, t in g.tensors.items()}
    _check(cfg, shapes, names, targs, where, "GGUF metadata", key)
    d2t = None
    if names["d2t"] in g.tensors:
        d2t = torch.from_numpy(np.asarray(g.tensors[names["d2t"]].data).astype(np.int64)
                               .reshape(-1).copy())
    return HeadFile(p, "gguf", cfg, g.tensors, names, d2t)


def _check_vocabulary(tokens: Any, theirs: list[str] | None, where: str) -> None:
    """A head that carries a vocabulary (llama.cpp's converter copies the target's) must carry
    the target's: a head trained for another model would draft ids of another vocabulary."""
    if not isinstance(tokens, list) or theirs is None:
        return
    if len(tokens) != len(theirs):
        raise ModelFileError(
            f"{where}: tokenizer.ggml.tokens has {len(tokens)} entries, the target's "
            f"{len(theirs)}; this head was made for another target")
    for i in (0, len(tokens) // 2, len(tokens) - 1):
        if tokens[i] != theirs[i]:
            raise ModelFileError(
                f"{where}: token {i} is {tokens[i]!r} in the head's tokenizer.ggml.tokens and "
                f"{theirs[i]!r} in the target's; this head was made for another target")


def _check(cfg: HeadConfig, shapes: dict[str, tuple], names: dict[str, str], t: ModelArgs,
           where: str, keys: str, key: Callable[[str], str]) -> None:
    """The head's shape against itself and against the target's (t), every refusal by name."""
    if len(cfg.target_layers) != 3:
        raise ModelFileError(f"{where}: {keys} '{key('target_layers')}' has "
                             f"{len(cfg.target_layers)} entries {list(cfg.target_layers)}; "
                             "EAGLE-3 reads exactly 3 target layers")
    bad = [i for i in cfg.target_layers if not 0 <= i <= t.n_layers]
    if bad:
        raise ModelFileError(f"{where}: {keys} '{key('target_layers')}' "
                             f"{list(cfg.target_layers)} names layer {bad[0]}; the target has "
                             f"{t.n_layers} layers (0..{t.n_layers})")
    if cfg.target_dim != t.dim:
        raise ModelFileError(f"{where}: {keys} '{key('target_hidden_size')}' is "
                             f"{cfg.target_dim}, the target's hidden size {t.dim}; this head "
                             "was made for another target")
    if cfg.n_heads <= 0 or cfg.n_kv_heads <= 0 or cfg.n_heads % cfg.n_kv_heads:
        raise ModelFileError(f"{where}: {cfg.n_heads} attention heads over {cfg.n_kv_heads} "
                             "key/value heads; the first must be a multiple of the second")
    d, qd, kd = cfg.dim, cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    want = {"fc": (d, 3 * cfg.target_dim), "attn_norm": (d,), "hidden_norm": (d,),
            "wq": (qd, 2 * d), "wk": (kd, 2 * d), "wv": (kd, 2 * d), "wo": (d, qd),
            "ffn_norm": (d,), "gate": (cfg.ffn_dim, d), "up": (cfg.ffn_dim, d),
            "down": (d, cfg.ffn_dim), "out_norm": (d,)}
    if cfg.norm_before_fc:
        want["enc_norm"] = (3 * cfg.target_dim,)
    for n, shape in want.items():
        got = shapes.get(names[n])
        if got is None:
            raise ModelFileError(f"{where}: missing tensor {names[n]!r}")
        if tuple(got) != shape:
            raise ModelFileError(f"{where}: tensor {names[n]!r} has shape {list(got)}, "
                                 f"expected {list(shape)}")
    emb = shapes.get(names["embed"])
    if emb is not None and tuple(emb) != (t.vocab_size, d):
        raise ModelFileError(f"{where}: tensor {names['embed']!r} has shape {list(emb)}, "
                             f"expected [{t.vocab_size}, {d}] (the target's vocabulary)")
    if emb is None and d != t.dim:
        raise ModelFileError(f"{where}: the head is {d} wide and has no {names['embed']!r}; "
                             f"the target's embeddings are {t.dim} wide")
    lm = shapes.get(names["lm_head"])
    d2t = shapes.get(names["d2t"])
    if lm is None:
        if d != t.dim or d2t is not None:
            raise ModelFileError(f"{where}: missing tensor {names['lm_head']!r}")
    elif len(lm) != 2 or lm[1] != d or (d2t is None and lm[0] != t.vocab_size):
        raise ModelFileError(f"{where}: tensor {names['lm_head']!r} has shape {list(lm)}, "
                             f"expected [draft vocabulary, {d}] with a 'd2t' map, or "
                             f"[{t.vocab_size}, {d}]")
    if d2t is not None and (lm is None or tuple(d2t) != (lm[0],)):
        raise ModelFileError(f"{where}: tensor {names['d2t']!r} has shape {list(d2t)}, "
                             f"expected [{lm[0] if lm else '?'}] (one target id per row of "
                             f"{names['lm_head']!r})")


def _read_hf(p: Path, t: ModelArgs) -> HeadFile:
    from safetensors import safe_open

    where = f"{p}/config.json"
    raw = _hf_config(p)
    if raw is None:
        raise ModelFileError(f"{where} cannot be read as JSON")
    c = _flat(raw)
    files = sorted(p.glob("*.safetensors"))
    if not files:
        raise ModelFileError(f"{p} has config.json but no *.safetensors files")
    tensors: dict[str, Tensor] = {}
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as sf:
                for k in sf.keys():
                    tensors[_hf_name(k)] = sf.get_tensor(k)
        except Exception as e:  # safetensors raises its own error types for a bad file
            raise ModelFileError(f"{f}: cannot be read as safetensors: {e}") from None
    dim = _int(c.get("hidden_size"), where, "hidden_size")
    n_heads = _int(c.get("num_attention_heads"), where, "num_attention_heads")
    layers = c.get("eagle_aux_hidden_state_layer_ids") or \
        [2, t.n_layers // 2, t.n_layers - 3]
    if not isinstance(layers, list):
        raise ModelFileError(f"{where}: eagle_aux_hidden_state_layer_ids is {layers!r}; "
                             "expected a list of 3 layer ids")
    vocab = _int(c.get("vocab_size"), where, "vocab_size", default=t.vocab_size)
    if vocab != t.vocab_size:
        raise ModelFileError(f"{where}: vocab_size is {vocab}, the target's {t.vocab_size}; "
                             "this head was made for another target")
    cfg = HeadConfig(
        dim=dim, n_heads=n_heads,
        n_kv_heads=_int(c.get("num_key_value_heads"), where, "num_key_value_heads",
                        default=n_heads),
        head_dim=_int(c.get("head_dim"), where, "head_dim", default=dim // max(n_heads, 1)),
        ffn_dim=_int(c.get("intermediate_size"), where, "intermediate_size"),
        norm_eps=float(c.get("rms_norm_eps", 1e-6)),
        rope_theta=float(c.get("rope_theta", 10000.0)), rope_interleaved=False,
        target_layers=tuple(_int(v, where, "eagle_aux_hidden_state_layer_ids")
                            for v in layers),
        target_dim=_int(c.get("target_hidden_size"), where, "target_hidden_size",
                        default=t.dim),
        vocab_size=t.vocab_size,
        norm_before_residual=bool(c.get("norm_before_residual", False)),
        norm_before_fc=bool(c.get("norm_before_fc", False)))
    names = {k: v[1] for k, v in {**LAYER, **OUTER}.items()}
    names.update({k: "layer." + v[1] for k, v in LAYER.items()})
    shapes = {n: tuple(x.shape) for n, x in tensors.items()}
    _check(cfg, shapes, names, t, where, "config", lambda k: {
        "target_layers": "eagle_aux_hidden_state_layer_ids"}.get(k, k))
    d2t = None
    if "d2t" in tensors:  # offsets in these checkpoints: target id = i + d2t[i]
        d2t = tensors["d2t"].long().reshape(-1) + torch.arange(tensors["d2t"].numel())
    return HeadFile(p, "hf", cfg, tensors, names, d2t)


def _hf_name(k: str) -> str:
    """A checkpoint's tensor name in one spelling: no "model." prefix, the layer's tensors
    under "layer." (SpecForge's "midlayer.", speculators' "layers.0.")."""
    k = k.removeprefix("model.")
    for prefix in ("midlayer.", "layers.0."):
        if k.startswith(prefix):
            return "layer." + k[len(prefix):]
    return k
