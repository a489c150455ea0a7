"""A trained head written in the two forms that load it elsewhere:

- the Hugging Face checkpoint SpecForge writes (`config.json`, `model.safetensors`), which
  llama.cpp's converter reads (`convert_hf_to_gguf.py --target-model-dir`), d2t as offsets;
- the GGUF llama.cpp's converter would write from it (conversion/llama.py's EAGLE-3 parts):
  architecture "eagle3", the target's tokenizer, q and k permuted for llama.cpp's NORM rope
  (`LlamaModel.permute`), d2t as int64 ABSOLUTE target ids, norms float32, matrices as
  --gguf-type asks (gguf-py's quantizers; a matrix whose rows its blocks do not divide
  falls back to F16, as the converter does).
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import torch
from safetensors.torch import save_file

from ..errors import TandemError
from .head import Eagle3Head

# --gguf-type -> (tensor type of the matrices, general.file_type)
GGUF_TYPES = {
    "f32": ("F32", "ALL_F32"), "f16": ("F16", "MOSTLY_F16"), "bf16": ("BF16", "MOSTLY_BF16"),
    "q8_0": ("Q8_0", "MOSTLY_Q8_0"), "q5_1": ("Q5_1", "MOSTLY_Q5_1"),
    "q5_0": ("Q5_0", "MOSTLY_Q5_0"), "q4_1": ("Q4_1", "MOSTLY_Q4_1"),
    "q4_0": ("Q4_0", "MOSTLY_Q4_0"),
}

# HF name (SpecForge's) -> GGUF name (gguf-py's MODEL_TENSOR names for arch eagle3)
GGUF_NAMES = {
    "fc.weight": "fc.weight",
    "input_norm.weight": "enc.output_norm.weight",
    "embed_tokens.weight": "token_embd.weight",
    "midlayer.input_layernorm.weight": "blk.0.attn_norm.weight",
    "midlayer.hidden_norm.weight": "blk.0.attn_norm_2.weight",
    "midlayer.self_attn.q_proj.weight": "blk.0.attn_q.weight",
    "midlayer.self_attn.k_proj.weight": "blk.0.attn_k.weight",
    "midlayer.self_attn.v_proj.weight": "blk.0.attn_v.weight",
    "midlayer.self_attn.o_proj.weight": "blk.0.attn_output.weight",
    "midlayer.post_attention_layernorm.weight": "blk.0.ffn_norm.weight",
    "midlayer.mlp.gate_proj.weight": "blk.0.ffn_gate.weight",
    "midlayer.mlp.up_proj.weight": "blk.0.ffn_up.weight",
    "midlayer.mlp.down_proj.weight": "blk.0.ffn_down.weight",
    "norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def export_hf(head: Eagle3Head, d: Path) -> None:
    """config.json and model.safetensors (float32; d2t int64 offsets, t2d bool)."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(head.config.to_hf(), indent=2) + "\n")
    state = {k: v.detach().cpu().contiguous() for k, v in head.state_dict().items()}
    save_file(state, str(d / "model.safetensors"), metadata={"format": "pt"})


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's LlamaModel.permute: each head's rotate_half pairs (i, i + D/2) made
    adjacent (2i, 2i + 1), what its NORM rope turns."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2) \
        .reshape(w.shape)


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """permute undone."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2) \
        .reshape(w.shape)


def gguf_tensors(head: Eagle3Head) -> dict[str, np.ndarray]:
    """The head's tensors by GGUF name, float32 (d2t: int64 absolute ids), q/k permuted."""
    c = head.config
    out = {}
    for name, t in head.state_dict().items():
        if name in ("d2t", "t2d"):
            continue
        w = t.detach().cpu().float().numpy()
        if name.endswith("q_proj.weight"):
            w = permute(w, c.num_attention_heads)
        elif name.endswith("k_proj.weight"):
            w = permute(w, c.num_key_value_heads)
        out[GGUF_NAMES[name]] = w
    ids = (head.d2t.cpu() + torch.arange(c.draft_vocab_size)).numpy().astype(np.int64)
    if (ids < 0).any() or (ids >= c.vocab_size).any() or len(np.unique(ids)) != len(ids):
        raise TandemError("the head's d2t maps to target ids out of range or twice")
    out["d2t"] = ids
    return out


def export_gguf(head: Eagle3Head, path: Path, target_metadata: dict, gguf_type: str) -> None:
    """head.gguf as llama.cpp's converter writes an EAGLE-3 head; target_metadata: the
    target GGUF's metadata (its tokenizer.* keys are copied)."""
    if gguf_type not in GGUF_TYPES:
        raise TandemError(f"--gguf-type must be one of {', '.join(GGUF_TYPES)}, got {gguf_type!r}")
    qname, ftype = GGUF_TYPES[gguf_type]
    c = head.config
    w = gguf.GGUFWriter(str(path), "eagle3")
    arch = "eagle3"
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name("tandem EAGLE-3 head")
    w.add_block_count(1)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_rope_freq_base(float(c.rope_theta))
    w.add_layer_norm_rms_eps(float(c.rms_norm_eps))
    w.add_key_length(c.head_dim)
    w.add_value_length(c.head_dim)
    w.add_file_type(gguf.LlamaFileType[ftype])
    w.add_vocab_size(c.vocab_size)
    w.add_rope_dimension_count(c.head_dim)
    # the EAGLE-3 keys (gguf-py's Keys.LLM.TARGET_LAYERS etc.; older gguf-py lacks the helpers)
    w.add_array(f"{arch}.target_layers", [int(i) for i in c.eagle_aux_hidden_state_layer_ids])
    w.add_uint32(f"{arch}.target_hidden_size", c.target_hidden_size)
    w.add_bool(f"{arch}.norm_before_residual", c.norm_before_residual)
    w.add_bool(f"{arch}.norm_before_fc", c.norm_before_fc)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    _copy_tokenizer(w, target_metadata)
    for name, t in gguf_tensors(head).items():
        if name == "d2t":
            w.add_tensor(name, t, raw_dtype=gguf.GGMLQuantizationType.I64)
            continue
        if t.ndim == 1 or qname == "F32":
            w.add_tensor(name, t.astype(np.float32))
            continue
        qtype = gguf.GGMLQuantizationType[qname]
        try:
            data = gguf.quants.quantize(t, qtype)
        except gguf.QuantError:
            qtype, data = gguf.GGMLQuantizationType.F16, gguf.quants.quantize(
                t, gguf.GGMLQuantizationType.F16)
        w.add_tensor(name, data, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _copy_tokenizer(w: gguf.GGUFWriter, meta: dict) -> None:
    """The target's tokenizer.* keys with the types llama.cpp's converter gives them: token
    ids uint32, flags bool, lists of strings, int32 token types, float32 scores."""
    for key, value in meta.items():
        if not key.startswith("tokenizer."):
            continue
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        elif isinstance(value, list):
            w.add_array(key, value)
        else:
            raise TandemError(f"cannot copy the target's metadata {key!r} ({type(value).__name__})")


def export(head: Eagle3Head, d: Path, target_path: Path, gguf_type: str) -> list[Path]:
    """Both forms into d (the GGUF only for a GGUF target, whose tokenizer it carries);
    the paths written."""
    from ..models.gguf_file import GGUFFile

    export_hf(head, d)
    written = [d / "config.json", d / "model.safetensors"]
    if Path(target_path).is_file():
        export_gguf(head, d / "head.gguf", GGUFFile(target_path).metadata, gguf_type)
        written.append(d / "head.gguf")
    return written
