"""Tiny random models for tests: the same weights as a Hugging Face safetensors directory and
as a GGUF file written with gguf.GGUFWriter, plus a small byte-level BPE tokenizer."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "The quick brown fox jumps over the lazy dog. " * 3,
    "for i in range(10):\n    print(i * i)\n",
    "Summarize the following document in three sentences.",
    "Once upon a time there was a small robot who loved to read.",
    "import os\nimport sys\n\nclass Model:\n    pass\n",
    "héllo wörld — ünïcode ✓ 日本語 😀",
]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n'"
    " }}{% endif %}"
)

HERMES = (  # a chat template with a place for tools, as Qwen2.5's and Hermes' have
    "{% if tools %}<|im_start|>system\n<tools>{% for t in tools %}\n{{ t | tojson }}{% endfor %}"
    "\n</tools><|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>\n"
    "{\"name\": \"{{ c.function.name }}\", \"arguments\": {{ c.function.arguments | tojson }}}"
    "\n</tool_call>{% endfor %}{% else %}{{ m.content }}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@lru_cache(maxsize=1)
def bpe() -> tuple[list[str], list[str]]:
    """(tokens by id, merges) of a byte-level BPE trained on CORPUS; specials at the end."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(CORPUS, trainer)
    state = json.loads(tok.to_str())["model"]
    vocab = state["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])] + SPECIALS
    merges = [m if isinstance(m, str) else " ".join(m) for m in state["merges"]]
    return tokens, merges


def config(arch: str, **over) -> dict:
    tokens, _ = bpe()
    cfg = dict(
        hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=len(tokens), max_position_embeddings=512,
        rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False,
        bos_token_id=len(tokens) - 3, eos_token_id=len(tokens) - 1,
    )
    cfg.update(over)
    return cfg


# Gemma 3's shape in small: heads of 32, five sliding-window layers (a window of 4 positions,
# their own rope base) to every full one, whose rope is linearly scaled
GEMMA3 = dict(
    head_dim=32, num_hidden_layers=3, sliding_window=4, query_pre_attn_scalar=32,
    layer_types=["sliding_attention", "full_attention", "sliding_attention"],
    rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
                     "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
    tie_word_embeddings=True, hidden_activation="gelu_pytorch_tanh", pad_token_id=0,
)

# a model whose every matrix is a multiple of 256 wide and of 16 rows (Q4_K, rowdotx.c's groups)
Q4K_SHAPE = dict(hidden_size=256, intermediate_size=512)


def hf_model(arch: str, seed: int = 0, **over):
    """A transformers model with random weights (float32), scaled so logits are informative."""
    import transformers

    torch.manual_seed(seed)
    if arch == "qwen2":
        c = transformers.Qwen2Config(**config(arch, **over))
        m = transformers.Qwen2ForCausalLM(c)
    elif arch == "llama":
        c = transformers.LlamaConfig(**config(arch, **over))
        m = transformers.LlamaForCausalLM(c)
    elif arch == "qwen3":  # heads of 32 (q: 128 wide on a 64-wide model), normed before rope
        c = transformers.Qwen3Config(**config(arch, **{"head_dim": 32, **over}))
        m = transformers.Qwen3ForCausalLM(c)
    elif arch == "gemma3":
        c = transformers.Gemma3TextConfig(**config(arch, **{**GEMMA3, **over}))
        m = transformers.Gemma3ForCausalLM(c)
    else:
        raise ValueError(arch)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("norm.weight"):  # gemma's norms multiply by 1 + w
                p.copy_((arch != "gemma3") + 0.1 * torch.randn_like(p))
            elif p.dim() == 1:  # biases
                p.copy_(0.1 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / p.shape[-1] ** 0.5 * 1.5)
    return m.eval()


def write_hf(model, path: Path) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tokens, merges = bpe()
    model.save_pretrained(path, safe_serialization=True)
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m.split(" ")) for m in merges]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=SPECIALS[0],
                                   eos_token=SPECIALS[2], additional_special_tokens=SPECIALS[1:2])
    fast.chat_template = CHATML
    fast.save_pretrained(path)
    return path


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf's llama q/k permutation (neox halves -> interleaved pairs)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(
        w.shape)


RERANK_TEMPLATE = "<|im_start|>{query}<|im_end|>\n{document}<|im_end|>\n<|im_start|>"


def write_gguf(model, path: Path, arch: str, qtype=None, rank_tokens: list[int] | None = None
               ) -> Path:
    """The model's weights in a GGUF file with the tokenizer metadata llama.cpp writes.

    qtype: a gguf.GGMLQuantizationType to quantize 2-D weights with (default F32; Q4_K needs
    every row a multiple of 256 wide: `hf_model(arch, **Q4K_SHAPE)`).
    rank_tokens: make it a reranker as llama.cpp converts Qwen3-Reranker: a `cls.output`
    head of those tokens' output rows (labels "yes", "no"), pooling type rank and a "rerank"
    prompt (RERANK_TEMPLATE).
    """
    import gguf

    c = model.config
    tokens, merges = bpe()
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    rope = c.rope_parameters
    rope = rope.get("full_attention", rope)
    w.add_rope_freq_base(float(getattr(c, "rope_theta", None) or rope["rope_theta"]))
    if arch == "gemma3":  # as convert_hf_to_gguf writes Gemma 3 (the pattern is llama.cpp's)
        w.add_sliding_window(c.sliding_window)
        sliding = [t == "sliding_attention" for t in c.layer_types]
        if sliding != [i % 6 < 5 for i in range(len(sliding))]:  # else llama.cpp's default
            w.add_sliding_window_pattern(sliding)
        if rope.get("rope_type") == "linear":
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(rope["factor"])
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    head_dim = getattr(c, "head_dim", None)
    if head_dim and head_dim != c.hidden_size // c.num_attention_heads:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("llama-bpe" if arch == "llama" else "qwen2")
    w.add_token_list(tokens)
    types = [1] * (len(tokens) - len(SPECIALS)) + [3] * len(SPECIALS)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(len(tokens) - 3)
    w.add_eos_token_id(len(tokens) - 1)
    w.add_add_bos_token(arch == "llama")
    if rank_tokens is None:
        w.add_chat_template(CHATML)
    else:
        w.add_chat_template([{"name": "default", "template": CHATML},
                             {"name": "rerank", "template": RERANK_TEMPLATE}])
        w.add_pooling_type(gguf.PoolingType.RANK)
        w.add_classifier_output_labels(["yes", "no"])
        head = model.lm_head.weight.detach().float().numpy()[rank_tokens].copy()
        w.add_tensor("cls.output.weight", head)
    names = {
        "model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    per_layer = {
        "input_layernorm.weight": "attn_norm.weight",
        "post_attention_layernorm.weight": "ffn_norm.weight",
        "self_attn.q_proj.weight": "attn_q.weight", "self_attn.q_proj.bias": "attn_q.bias",
        "self_attn.k_proj.weight": "attn_k.weight", "self_attn.k_proj.bias": "attn_k.bias",
        "self_attn.v_proj.weight": "attn_v.weight", "self_attn.v_proj.bias": "attn_v.bias",
        "self_attn.q_norm.weight": "attn_q_norm.weight",
        "self_attn.k_norm.weight": "attn_k_norm.weight",
        "self_attn.o_proj.weight": "attn_output.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
        # gemma3's sandwich
        **({"post_attention_layernorm.weight": "post_attention_norm.weight",
            "pre_feedforward_layernorm.weight": "ffn_norm.weight",
            "post_feedforward_layernorm.weight": "post_ffw_norm.weight"} if arch == "gemma3" else {}),
        "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight",
    }
    for name, t in model.state_dict().items():
        if name == "lm_head.weight" and c.tie_word_embeddings:
            continue
        if name.startswith("model.layers."):
            i, rest = name[len("model.layers."):].split(".", 1)
            out = f"blk.{i}.{per_layer[rest]}"
        else:
            out = names[name]
        a = t.detach().float().numpy().copy()
        if arch == "gemma3" and name.endswith("norm.weight"):
            a = a + 1  # convert_hf_to_gguf stores gemma's 1 + w
        if arch == "llama" and rest_is(name, "q_proj"):
            a = _permute(a, c.num_attention_heads)
        elif arch == "llama" and rest_is(name, "k_proj"):
            a = _permute(a, c.num_key_value_heads)
        if qtype is not None and a.ndim == 2:
            a = (quantize_q4_k(a) if qtype == gguf.GGMLQuantizationType.Q4_K
                 else random_blocks(a, qtype) if qtype.name in RANDOM_BLOCKS
                 else gguf.quants.quantize(a, qtype))
            w.add_tensor(out, a, raw_dtype=qtype)
        else:
            w.add_tensor(out, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def rest_is(name: str, proj: str) -> bool:
    return f"self_attn.{proj}." in name


# types the gguf package cannot quantize: (block weights, block bytes, {f16 offset: value}),
# the scales chosen so that weights come out about as large as the model's (std ~0.02)
RANDOM_BLOCKS = {"Q2_K": (256, 84, {80: 1e-3, 82: 5e-4}), "Q3_K": (256, 110, {108: 3e-4}),
                 "IQ4_XS": (256, 136, {0: 2e-5}), "IQ4_NL": (32, 18, {0: 2e-4}),
                 "IQ2_XXS": (256, 66, {0: 3e-4}), "IQ3_XXS": (256, 98, {0: 1.2e-4}),
                 "IQ3_S": (256, 110, {0: 1.2e-4}),
                 "IQ2_XS": (256, 74, {0: 3e-4}),
                 "IQ2_S": (256, 82, {0: 3e-4}),
                 "TQ2_0": (256, 66, {64: 0.016}),
                 "TQ1_0": (256, 54, {52: 0.025}),
                 "IQ1_S": (256, 50, {0: 2.7e-3}),
                 "IQ1_M": (256, 56, {48: 2.7e-3})}  # put_f16: IQ1_M's scale in four nibbles


def random_blocks(a: np.ndarray, qtype) -> np.ndarray:
    """Blocks of random quants and sub-scales in a's shape (the model is random anyway), seeded
    by a's values: every bit pattern of the type's layout, read by the kernels as it is."""
    block, nbytes, scales = RANDOM_BLOCKS[qtype.name]
    rows, k = a.shape
    rng = np.random.default_rng(abs(int(a.sum() * 1e6)) % 2**32)
    b = rng.integers(0, 256, size=(rows * k // block, nbytes), dtype=np.uint8)
    for at, v in scales.items():
        put_f16(b, qtype.name, at, v)
    return b.reshape(rows, -1)


def put_f16(b: np.ndarray, type_name: str, at: int, v) -> None:
    """Blocks b (n, bytes) get the fp16 scale v (one, or one per block) at byte `at`; IQ1_M's
    is spread over the top nibbles of the four 16-bit words at `at` (nibble i in word i), whose
    low 12 bits (its sub-scales) stay."""
    h = np.asarray(v, np.float16).reshape(-1, 1)
    if type_name != "IQ1_M":
        b[:, at: at + 2] = h.view(np.uint8)
        return
    nibbles = (h.view(np.uint16) >> np.array([0, 4, 8, 12], np.uint16)) & 0xF
    words = b[:, at: at + 8].copy().view(np.uint16)
    b[:, at: at + 8] = ((words & 0x0FFF) | nibbles << 12).astype(np.uint16).view(np.uint8)


def quantize_q4_k(a: np.ndarray) -> np.ndarray:
    """float32 (rows, K) -> Q4_K blocks (rows, K / 256 * 144), as the gguf package cannot make
    them: per 32-value sub-block x ~ d * sc * q - dmin * mn (q 4 bits, sc and mn 6 bits, d and
    dmin f16 per 256), packed as ggml packs them (scales in 12 bytes; each byte of a 64-value
    chunk holds value l in its low nibble and l + 32 in its high one)."""
    rows, k = a.shape
    x = a.reshape(rows, k // 256, 8, 32).astype(np.float64)
    mins = np.maximum(0.0, -x.min(-1))  # (rows, nsb, 8)
    scales = (x.max(-1) + mins) / 15
    d = (scales.max(-1) / 63).astype(np.float16)
    dmin = (mins.max(-1) / 63).astype(np.float16)
    df, dmf = d.astype(np.float64)[..., None], dmin.astype(np.float64)[..., None]
    sc = np.clip(np.round(np.divide(scales, df, out=np.zeros_like(scales), where=df > 0)), 0, 63)
    mn = np.clip(np.round(np.divide(mins, dmf, out=np.zeros_like(mins), where=dmf > 0)), 0, 63)
    step = (df * sc)[..., None]
    q = np.divide(x + (dmf * mn)[..., None], step, out=np.zeros_like(x), where=step > 0)
    q = np.clip(np.round(q), 0, 15).astype(np.uint8).reshape(rows, k // 256, 256)
    sc, mn = sc.astype(np.uint8), mn.astype(np.uint8)
    out = np.zeros((rows, k // 256, 144), np.uint8)
    out[..., 0:2] = d[..., None].view(np.uint8)
    out[..., 2:4] = dmin[..., None].view(np.uint8)
    for j in range(4):
        out[..., 4 + j] = (sc[..., j] & 63) | (sc[..., j + 4] >> 4) << 6
        out[..., 8 + j] = (mn[..., j] & 63) | (mn[..., j + 4] >> 4) << 6
        out[..., 12 + j] = (sc[..., j + 4] & 15) | (mn[..., j + 4] & 15) << 4
    for c in range(4):
        out[..., 16 + 32 * c: 48 + 32 * c] = q[..., 64 * c: 64 * c + 32] | q[..., 64 * c + 32: 64 * c + 64] << 4
    return out.reshape(rows, -1)


def small_q4_0_gguf(path: Path) -> Path:
    """A 90M-parameter qwen2 in Q4_0 (1024 wide, 8 layers, a 4,096 context): big enough that
    its weights and KV cache, not the runtime alone, show in a server's resident memory."""
    import gguf

    model = hf_model("qwen2", hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                     num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=4096)
    return write_gguf(model, path, "qwen2", gguf.GGMLQuantizationType.Q4_0)
