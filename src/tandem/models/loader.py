"""Loading a model (GGUF file or Hugging Face safetensors directory) into the decoder."""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from torch import Tensor

from .. import kernels
from ..config import Numerics
from ..errors import ModelFileError, TandemError
from .args import ModelArgs
from .checks import HF_KEYS, check_args, check_tensors, check_vocabulary, gguf_keys
from .decoder import Block, Transformer
from .gguf_file import GGUFFile
from .linear import Dense

log = logging.getLogger("tandem.models")

SUPPORTED_ARCHS = ("qwen2", "llama", "qwen3", "gemma3")
GEMMA3_SWA_PATTERN = 6  # llama.cpp's: every sixth layer attends to everything, the others slide
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}  # choices.DTYPES but auto


@dataclass(slots=True)
class RankHead:
    """A reranker's classification head (GGUF `cls.output`), as llama.cpp applies it with
    --pooling rank: scores = weight @ h + bias over the last token's final-normed hidden state,
    softmaxed for qwen3 (Qwen3-Reranker: labels "yes", "no"); the relevance is scores[0].
    `template` is the file's "rerank" prompt ({query} and {document} replaced), or None."""

    weight: Tensor  # (n labels, dim) float32
    bias: Tensor | None
    softmax: bool
    labels: list[str]
    template: str | None

    def score(self, h: Tensor) -> float:
        out = self.weight @ h.float()
        if self.bias is not None:
            out = out + self.bias
        if self.softmax:
            out = torch.softmax(out, -1)
        return float(out[0])


@dataclass(slots=True)
class LoadedModel:
    path: Path
    args: ModelArgs
    model: Transformer
    tokenizer: object  # tandem.tokenizer.Tokenizer
    source: str  # "gguf" | "hf"
    dtype: torch.dtype
    load_seconds: float
    name: str = ""
    rank_head: RankHead | None = None  # a reranker's (GGUF cls.output), else None

    def prepare_kernels(self) -> float:
        """Make every linear's kernel layout now (the int8 products' 16-row groups,
        `GGUFLinear.kernel_blocks`), which its first pass would otherwise make inside the
        first request's prompt time; seconds taken."""
        from .quant import GGUFLinear

        t0 = time.perf_counter()
        for mod in self.model.modules():
            if isinstance(mod, GGUFLinear):
                mod.kernel_blocks()
        return time.perf_counter() - t0


def _number(value: Any, kind: type, where: str, key: str, default: Any = None) -> Any:
    """A hyperparameter as int or float; a missing one takes `default` (None: required), a
    value of another type (text, a list, a fractional count, NaN) is refused by name."""
    if value is None:
        if default is None:
            raise ModelFileError(f"{where}: missing {key}")
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            kind is int and not (isinstance(value, int) or float(value).is_integer())):
        what = "an integer" if kind is int else "a number"
        raise ModelFileError(f"{where}: {key} is {value!r}; expected {what}")
    return kind(value)


def args_from_gguf(g: GGUFFile) -> ModelArgs:
    if g.arch not in SUPPORTED_ARCHS:
        raise ModelFileError(
            f"{g.path}: unsupported architecture {g.arch!r}; supported: {', '.join(SUPPORTED_ARCHS)}"
        )

    def num(key: str, kind: type = int, default: Any = None) -> Any:
        return _number(g.get(key), kind, str(g.path), f"GGUF metadata '{g.arch}.{key}'",
                       default)

    n_heads, dim = num("attention.head_count"), num("embedding_length")
    tokens = g.metadata.get("tokenizer.ggml.tokens")
    embed = g.tensors.get("token_embd.weight")
    vocab = num("vocab_size", default=0) or (len(tokens) if isinstance(tokens, list) else 0) \
        or (embed.shape[0] if embed is not None else 0)
    head_dim = num("attention.key_length", default=0) or \
        num("rope.dimension_count", default=0) or dim // max(n_heads, 1)
    value_dim = num("attention.value_length", default=head_dim)
    if value_dim != head_dim:
        raise ModelFileError(f"{g.path}: {g.arch}.attention.value_length ({value_dim}) differs "
                             f"from the key length ({head_dim}); Tandem needs them equal")
    args = ModelArgs(
        arch=g.arch,
        dim=dim,
        n_layers=num("block_count"),
        n_heads=n_heads,
        n_kv_heads=num("attention.head_count_kv", default=n_heads),
        ffn_dim=num("feed_forward_length"),
        vocab_size=int(vocab),
        head_dim=head_dim,
        norm_eps=num("attention.layer_norm_rms_epsilon", float, 1e-5),
        rope_theta=num("rope.freq_base", float, 10000.0),
        rope_interleaved=g.arch == "llama",  # convert_hf_to_gguf permutes llama's q/k
        qkv_bias="blk.0.attn_q.bias" in g.tensors,
        qk_norm=g.arch in ("qwen3", "gemma3"),
        tie_embeddings="output.weight" not in g.tensors,
        max_seq_len=num("context_length", default=4096),
    )
    if g.arch == "gemma3":
        _gemma3_from_gguf(args, g, num)
    rope_dims = num("rope.dimension_count", default=args.head_dim)
    if rope_dims != args.head_dim:
        raise ModelFileError(f"{g.path}: {g.arch}.rope.dimension_count is {rope_dims}, the head "
                             f"dimension {args.head_dim}; partial rotary embeddings are not "
                             "supported")
    return args


def _gemma3_from_gguf(args: ModelArgs, g: GGUFFile, num: Callable[..., Any]) -> None:
    """Gemma 3's fields as llama.cpp reads a gemma3 file: embeddings times sqrt(dim), sandwich
    norms, GELU-tanh, sliding-window layers (five of every six; their rope base 10000,
    unscaled), linear rope scaling of the others from rope.scaling.factor, and the attention
    scale of the head dimension (dim / heads for the 62-layer 27B)."""
    args.embed_scale = args.dim ** 0.5
    args.post_norms, args.act = True, "gelu_tanh"
    args.sliding_window = num("attention.sliding_window", default=0)
    pattern = g.get("attention.sliding_window_pattern")
    if args.sliding_window <= 0:
        args.sliding_window = 0  # no window: every layer attends to everything
    elif isinstance(pattern, list):  # per layer, as newer converters write it
        args.swa_layers = tuple(bool(p) for p in pattern)
    else:
        n = num("attention.sliding_window_pattern", default=GEMMA3_SWA_PATTERN)
        args.swa_layers = tuple(i % n < n - 1 for i in range(args.n_layers))
    args.rope_theta_swa = num("rope.freq_base_swa", float, 10000.0)
    cap = num("final_logit_softcapping", float, 0.0)
    if cap:
        raise ModelFileError(f"{g.path}: {g.arch}.final_logit_softcapping is {cap}; Tandem does "
                             "not cap logits")
    kind = g.get("rope.scaling.type")
    factor = num("rope.scaling.factor", float, 0.0)
    if factor and kind in (None, "linear"):
        args.rope_scale = factor
    elif factor and kind != "none":
        raise ModelFileError(f"{g.path}: {g.arch}.rope.scaling.type is {kind!r}; Tandem reads "
                             "linear rope scaling only")
    args.attn_scale = (args.dim / args.n_heads if args.n_layers == 62 else args.head_dim) ** -0.5


def args_from_hf_config(cfg: dict, path: Path) -> ModelArgs:
    where = f"{path}/config.json"
    if not isinstance(cfg, dict):
        raise ModelFileError(f"{where}: expected a JSON object, got {type(cfg).__name__}")
    arch = cfg.get("model_type", "")
    arch = "gemma3" if arch == "gemma3_text" else arch  # Gemma3ForCausalLM's text config
    if arch not in SUPPORTED_ARCHS:
        raise ModelFileError(
            f"{path}: unsupported model_type {arch!r}; supported: {', '.join(SUPPORTED_ARCHS)}"
        )

    def num(key: str, kind: type = int, default: Any = None) -> Any:
        return _number(cfg.get(key), kind, where, repr(key), default)

    rope = cfg.get("rope_parameters")
    rope = rope if isinstance(rope, dict) else {}
    local = rope.get("sliding_attention")  # gemma3: rope parameters per layer type
    rope = rope.get("full_attention", rope) if isinstance(local, dict) else rope
    theta = cfg.get("rope_theta") or rope.get("rope_theta") or 10000.0
    n_heads, dim = num("num_attention_heads"), num("hidden_size")
    args = ModelArgs(
        arch=arch,
        dim=dim,
        n_layers=num("num_hidden_layers"),
        n_heads=n_heads,
        n_kv_heads=num("num_key_value_heads", default=0) or n_heads,
        ffn_dim=num("intermediate_size"),
        vocab_size=num("vocab_size"),
        head_dim=num("head_dim", default=0) or dim // max(n_heads, 1),
        norm_eps=num("rms_norm_eps", float, 1e-6),
        rope_theta=_number(theta, float, where, "'rope_theta'"),
        rope_interleaved=False,
        qkv_bias=arch == "qwen2" or bool(cfg.get("attention_bias")),
        qk_norm=arch in ("qwen3", "gemma3"),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        max_seq_len=num("max_position_embeddings", default=4096),
    )
    if arch == "gemma3":
        args.embed_scale = args.dim ** 0.5
        args.post_norms = True
        act = cfg.get("hidden_activation") or "gelu_pytorch_tanh"
        if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
            raise ModelFileError(f"{where}: 'hidden_activation' is {act!r}; expected "
                                 "'gelu_pytorch_tanh'")
        args.act = "gelu_tanh"
        args.attn_scale = num("query_pre_attn_scalar", float, float(args.head_dim)) ** -0.5
        args.sliding_window = num("sliding_window", default=0)
        types = cfg.get("layer_types")
        if isinstance(types, list):
            args.swa_layers = tuple(t == "sliding_attention" for t in types)
        else:
            n = num("sliding_window_pattern", default=GEMMA3_SWA_PATTERN)
            args.swa_layers = tuple(i % n < n - 1 for i in range(args.n_layers))
        local = local if isinstance(local, dict) else {}
        args.rope_theta_swa = _number(local.get("rope_theta") or cfg.get("rope_local_base_freq")
                                      or 10000.0, float, where, "'rope_local_base_freq'")
        scaling = cfg.get("rope_scaling") or rope
        if isinstance(scaling, dict) and scaling.get("rope_type", scaling.get("type")) == "linear":
            args.rope_scale = _number(scaling.get("factor"), float, where, "'factor'")
    return args


def resolve_mode(numerics: Numerics) -> str:
    """The weights' form: "auto" -> "native" where the native kernels are switched on and
    build and load here, else "int4"."""
    mode = numerics.weights
    if numerics.kernels:
        kernels.choose_build(numerics.kernel_build)
    usable = numerics.kernels and kernels.available()
    if mode == "auto":
        return "native" if usable else "int4"
    if mode == "native" and not usable:
        why = kernels.unavailable_reason() if numerics.kernels else "switched off (TANDEM_KERNELS=0)"
        raise TandemError(f"--weights native: native kernels unavailable ({why})")
    return mode


def weight_form(numerics: Numerics, float_file: bool, source: str = "gguf") -> tuple[str, str]:
    """(how the 2-D weights are held, the compute dtype's name): the one home of these rules,
    which the memory plan follows too.

    The form is resolve_mode's, except that a Hugging Face directory, and float32 compute
    outside native mode (the int4 kernel takes bf16 activations), hold dense weights. dtype
    "auto": float32 in native mode (the kernels take float32 activations: no bf16 rounding
    anywhere on that path) and for a file whose tensors are all float32 (tests, references),
    else bfloat16.
    """
    mode = "dense" if source == "hf" else resolve_mode(numerics)
    dtype = numerics.dtype
    if dtype == "auto":
        dtype = "float32" if mode == "native" or float_file else "bfloat16"
    if mode != "native" and dtype == "float32":
        mode = "dense"
    return mode, dtype


def _build(args: ModelArgs, get: Callable[[str], Tensor | None],
           linear: Callable[[str], torch.nn.Module], dtype: torch.dtype, max_len: int,
           names: dict[str, str], numerics: Numerics,
           embedding: Callable[[str], object] | None = None,
           norm_plus: float = 0.0) -> Transformer:
    """names maps our weight roles to the checkpoint's names, with {i} for the layer.
    norm_plus: added to every norm's weights (a Hugging Face Gemma's norms multiply by
    1 + w; its GGUF conversion stores 1 + w).

    embedding(name), if given, returns the embedding table and the tied output projection as
    (table, linear) or None to use the dense path.
    """

    def need(name: str) -> Tensor:
        t = get(name)
        if t is None:
            raise ModelFileError(f"missing tensor {name!r}")
        return t

    blocks = []
    for i in range(args.n_layers):
        w = {role: linear(names[role].format(i=i))
             for role in ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")}
        w["attn_norm"] = need(names["attn_norm"].format(i=i)).float()
        w["ffn_norm"] = need(names["ffn_norm"].format(i=i)).float()
        roles = ("q_norm", "k_norm") * args.qk_norm + ("post_attn_norm", "post_ffn_norm") * \
            args.post_norms
        for role in roles:
            w[role] = need(names[role].format(i=i)).float()
        for role in ("attn_norm", "ffn_norm", *roles):
            w[role] = w[role] + norm_plus
        blocks.append(Block(args, w))
    special = embedding(names["embed"]) if embedding is not None else None
    if special is not None:
        emb, tied = special
    else:
        emb = need(names["embed"]).to(dtype)
        tied = Dense(emb)
    output = tied if args.tie_embeddings else linear(names["output"])
    return Transformer(args, emb, blocks, need(names["norm"]).float() + norm_plus, output,
                       max_len, dtype, numerics)


GGUF_NAMES = {
    "embed": "token_embd.weight", "norm": "output_norm.weight", "output": "output",
    "attn_norm": "blk.{i}.attn_norm.weight", "ffn_norm": "blk.{i}.ffn_norm.weight",
    "q_norm": "blk.{i}.attn_q_norm.weight", "k_norm": "blk.{i}.attn_k_norm.weight",
    "post_attn_norm": "blk.{i}.post_attention_norm.weight",
    "post_ffn_norm": "blk.{i}.post_ffw_norm.weight",
    "wq": "blk.{i}.attn_q", "wk": "blk.{i}.attn_k", "wv": "blk.{i}.attn_v",
    "wo": "blk.{i}.attn_output", "w_gate": "blk.{i}.ffn_gate", "w_up": "blk.{i}.ffn_up",
    "w_down": "blk.{i}.ffn_down",
}
HF_NAMES = {
    "embed": "model.embed_tokens.weight", "norm": "model.norm.weight", "output": "lm_head",
    "attn_norm": "model.layers.{i}.input_layernorm.weight",
    "ffn_norm": "model.layers.{i}.post_attention_layernorm.weight",
    "q_norm": "model.layers.{i}.self_attn.q_norm.weight",
    "k_norm": "model.layers.{i}.self_attn.k_norm.weight",
    "wq": "model.layers.{i}.self_attn.q_proj", "wk": "model.layers.{i}.self_attn.k_proj",
    "wv": "model.layers.{i}.self_attn.v_proj", "wo": "model.layers.{i}.self_attn.o_proj",
    "w_gate": "model.layers.{i}.mlp.gate_proj", "w_up": "model.layers.{i}.mlp.up_proj",
    "w_down": "model.layers.{i}.mlp.down_proj",
}
HF_GEMMA3_NAMES = {  # gemma's sandwich: its post_attention_layernorm norms the attention's output
    **HF_NAMES, "ffn_norm": "model.layers.{i}.pre_feedforward_layernorm.weight",
    "post_attn_norm": "model.layers.{i}.post_attention_layernorm.weight",
    "post_ffn_norm": "model.layers.{i}.post_feedforward_layernorm.weight",
}


def load_gguf(path: Path, numerics: Numerics, max_len: int) -> LoadedModel:
    from ..tokenizer import Tokenizer
    from .quant import GGUFEmbedding, GGUFLinear, dequantize, dequantize_to, make_linear, native_ok

    t0 = time.perf_counter()
    g = GGUFFile(path)
    args = args_from_gguf(g)
    keys = gguf_keys(g.arch)
    check_args(args, keys, str(path))
    check_tensors(args, {n: t.shape for n, t in g.tensors.items()}, GGUF_NAMES, keys, str(path))
    g.check_overlaps()
    tok = Tokenizer.from_gguf_metadata(g.metadata)
    check_vocabulary(len(tok.tokens), args, GGUF_NAMES["embed"], str(path))
    float_file = all(t.type_name == "F32" for t in g.tensors.values())
    mode, dtype = weight_form(numerics, float_file)
    dt = DTYPES[dtype]
    threads, bits = numerics.thread_count, numerics.bits
    prompt_rows = kernels.prompt_rows(numerics.prompt_kernel)
    if mode == "native":
        _warn_no_kernel(g, dtype)

    def get(name: str) -> Tensor | None:
        raw = g.tensors.get(name)
        if raw is None:
            return None
        # matrices (the embedding) straight to the compute dtype; norms stay float32
        return dequantize_to(raw, dt) if len(raw.shape) == 2 else dequantize(raw)

    def linear(base: str) -> torch.nn.Module:
        raw = g.tensors.get(base + ".weight")
        if raw is None:
            raise ModelFileError(f"missing tensor {base + '.weight'!r}")
        down = base.endswith(GGUF_NAMES["w_down"].rsplit(".", 1)[1])
        return make_linear(raw, dt, mode, bias=g.tensors.get(base + ".bias"),
                           bits=numerics.down_bits if down else bits, threads=threads,
                           prompt_rows=prompt_rows,
                           act_block=numerics.down_block if down else 0)

    def embedding(name: str) -> tuple[object, torch.nn.Module] | None:
        raw = g.tensors.get(name)
        if mode != "native" or raw is None or not native_ok(raw):
            return None  # read whole (dense) by get()
        tied = GGUFLinear(raw, bits=bits, threads=threads, prompt_rows=prompt_rows)
        return GGUFEmbedding(raw, threads, tied if args.tie_embeddings else None), tied

    try:
        model = _build(args, get, linear, dt, max_len, GGUF_NAMES, numerics, embedding)
    except ModelFileError as e:
        raise ModelFileError(f"{path}: {e}") from None  # names the file once
    return LoadedModel(path, args, model, tok, "gguf", dt, time.perf_counter() - t0,
                       rank_head=_rank_head(g, args))


def _warn_no_kernel(g: GGUFFile, dtype: str) -> None:
    """Log each matrix type of the file that the native kernels do not read, as the memory plan
    names it (choices.NO_KERNEL): never silently slow."""
    from ..choices import KERNEL_TYPES, NO_KERNEL

    counts = Counter(t.type_name for t in g.tensors.values()
                     if len(t.shape) == 2 and t.type_name not in KERNEL_TYPES
                     and t.type_name != "F32")
    for type_name, n in counts.items():
        log.warning("%s: %d matrices of type %s: %s (here %s; expect a fraction of llama.cpp's "
                    "speed on this file). Native types: %s", Path(g.path).name, n, type_name,
                    NO_KERNEL, dtype, ", ".join(KERNEL_TYPES))


def _rank_head(g: GGUFFile, args: ModelArgs) -> RankHead | None:
    """The file's cls.output head (llama.cpp's LLM_TENSOR_CLS_OUT), checked, or None."""
    from .quant import dequantize

    raw = g.tensors.get("cls.output.weight")
    if raw is None:
        return None
    shape = tuple(raw.shape)
    if len(shape) != 2 or shape[1] != args.dim or not 1 <= shape[0] <= 4096:
        raise ModelFileError(f"{g.path}: tensor 'cls.output.weight' has shape {list(shape)}, "
                             f"expected [labels, {args.dim}] ({g.arch}.embedding_length "
                             f"{args.dim} columns)")
    bias = g.tensors.get("cls.output.bias")
    if bias is not None and tuple(bias.shape) != (shape[0],):
        raise ModelFileError(f"{g.path}: tensor 'cls.output.bias' has shape "
                             f"{list(bias.shape)}, expected [{shape[0]}]")
    labels = g.get("classifier.output_labels") or []
    template = g.metadata.get("tokenizer.chat_template.rerank")
    return RankHead(dequantize(raw).float(), None if bias is None else dequantize(bias).float(),
                    softmax=g.arch == "qwen3",
                    labels=[str(x) for x in labels] if isinstance(labels, list) else [],
                    template=template if isinstance(template, str) else None)


def load_hf(path: Path, numerics: Numerics, max_len: int) -> LoadedModel:
    from safetensors import safe_open

    from ..tokenizer import Tokenizer

    t0 = time.perf_counter()
    try:
        cfg = json.loads((path / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ModelFileError(f"{path}/config.json cannot be read: {e}") from None
    args = args_from_hf_config(cfg, path)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelFileError(f"{path} has config.json but no *.safetensors files")
    tensors: dict[str, Tensor] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as sf:
            for k in sf.keys():
                tensors[k] = sf.get_tensor(k)
    float_file = all(t.dtype == torch.float32 for t in tensors.values())
    dt = DTYPES[weight_form(numerics, float_file, "hf")[1]]
    if not args.tie_embeddings and "lm_head.weight" not in tensors:
        args.tie_embeddings = True
    check_args(args, HF_KEYS, str(path))
    names = HF_GEMMA3_NAMES if args.arch == "gemma3" else HF_NAMES
    check_tensors(args, {k: tuple(t.shape) for k, t in tensors.items()}, names, HF_KEYS,
                  str(path))

    def linear(base: str) -> torch.nn.Module:
        w = tensors.get(base + ".weight")
        if w is None:
            raise ModelFileError(f"missing tensor {base + '.weight'!r}")
        b = tensors.get(base + ".bias")
        return Dense(w.to(dt), None if b is None else b.to(dt))

    tok = Tokenizer.from_hf_dir(path)
    check_vocabulary(len(tok.tokens), args, HF_NAMES["embed"], str(path))
    model = _build(args, tensors.get, linear, dt, max_len, names, numerics,
                   norm_plus=1.0 if args.arch == "gemma3" else 0.0)
    return LoadedModel(path, args, model, tok, "hf", dt, time.perf_counter() - t0)


def load_model(spec: str | Path, numerics: Numerics | None = None, *,
               max_len: int = 4096) -> LoadedModel:
    """Load a named model (pulled on first use), a .gguf file or a HF directory, computing as
    `numerics` says (default: Numerics(), one thread); max_len sizes the rope tables."""
    from ..registry import resolve

    numerics = Numerics() if numerics is None else numerics
    path = resolve(str(spec))
    if path.is_dir() and (path / "config.json").is_file():
        m = load_hf(path, numerics, max_len)
    else:
        m = load_gguf(path, numerics, max_len)
    m.name = str(spec)
    return m
