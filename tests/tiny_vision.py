"""A tiny random Gemma 3 (transformers' Gemma3ForConditionalGeneration) and its vision tower +
projector written as an mmproj GGUF the way llama.cpp's converter writes one
(convert_hf_to_gguf.py: MmprojModel + Gemma3VisionModel)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from . import tiny

# SigLIP in small: 64 x 64 images in 4 x 4 patches (a 16 x 16 grid), pooled 2 x 2 into 8 x 8 = 64
# tokens. The vision width (48) differs from the text width (64, tiny.py's gemma3) so that a
# transposed projection cannot go unnoticed.
VISION = dict(hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              image_size=64, patch_size=4, layer_norm_eps=1e-6, hidden_act="gelu_pytorch_tanh",
              vision_use_head=False)


def hf_model(seed: int = 0, tokens_per_image: int = 64, **vision):
    """Gemma3ForConditionalGeneration with random weights scaled as tiny.hf_model scales them.

    Every matrix is rounded to float16 values, so a file storing it in F16 (as the converter
    does) holds exactly the model's weights."""
    import transformers

    torch.manual_seed(seed)
    text = transformers.Gemma3TextConfig(**tiny.config("gemma3", **tiny.GEMMA3))
    cfg = transformers.Gemma3Config(
        text_config=text.to_dict(), vision_config={**VISION, **vision},
        mm_tokens_per_image=tokens_per_image,
        boi_token_index=0, eoi_token_index=1, image_token_index=2)
    m = transformers.Gemma3ForConditionalGeneration(cfg)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "soft_emb_norm" in name:  # Gemma's RMS norm multiplies by 1 + w
                p.copy_(0.1 * torch.randn_like(p))
            elif p.dim() == 1 and "norm" in name:  # SigLIP's LayerNorms
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif p.dim() == 1:  # biases
                p.copy_(0.1 * torch.randn_like(p))
            elif "mm_input_projection" in name:  # used as x @ W: (vision width, text width)
                p.copy_(torch.randn_like(p) / p.shape[0] ** 0.5)
            elif "position_embedding" in name:
                p.copy_(0.5 * torch.randn_like(p))
            else:  # (out, in) matrices and the patch conv (out, 3, P, P)
                p.copy_(torch.randn_like(p) / p[0].numel() ** 0.5 * 1.5)
            if p.dim() > 1:
                p.copy_(p.half().float())
    return m.eval()


def write_mmproj(model, path: Path, *, outtype: str = "f16", projector_type: str = "gemma3",
                 keys: dict | None = None, skip: tuple[str, ...] = (),
                 replace: dict[str, np.ndarray] | None = None) -> Path:
    """The model's vision tower and projector as llama.cpp's converter writes them.

    outtype "f16" (mmproj-*-f16.gguf) or "f32". The converter stores 1-D tensors and the patch
    and position embeddings in F32 and always the input projection in F16; the other matrices
    in `outtype`. Only mm.soft_emb_norm.weight is changed: Gemma's 1 + w is stored.
    For bad files: keys overrides metadata (None drops a key), skip drops tensors by GGUF name,
    replace stores other arrays under those names, projector_type another projector."""
    import gguf

    c, v = model.config, model.config.vision_config
    F16, F32 = gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.F32
    w = gguf.GGUFWriter(str(path), "clip")
    tokens_per_side = int(c.mm_tokens_per_image ** 0.5)
    scale = (v.image_size // v.patch_size) // tokens_per_side
    meta = {
        "general.type": ("mmproj", "str"),
        "general.file_type": (1 if outtype == "f16" else 0, "u32"),
        "clip.has_vision_encoder": (True, "bool"),
        "clip.vision.projection_dim": (c.text_config.hidden_size, "u32"),
        "clip.vision.image_size": (v.image_size, "u32"),
        "clip.vision.patch_size": (v.patch_size, "u32"),
        "clip.vision.embedding_length": (v.hidden_size, "u32"),
        "clip.vision.feed_forward_length": (v.intermediate_size, "u32"),
        "clip.vision.block_count": (v.num_hidden_layers, "u32"),
        "clip.vision.attention.head_count": (v.num_attention_heads, "u32"),
        "clip.vision.image_mean": ([0.5, 0.5, 0.5], "f32s"),  # Gemma 3's preprocessor_config
        "clip.vision.image_std": ([0.5, 0.5, 0.5], "f32s"),
        "clip.projector_type": (projector_type, "str"),
        "clip.vision.attention.layer_norm_epsilon": (v.layer_norm_eps, "f32"),
        "clip.use_gelu": (True, "bool"),
    }
    if scale > 0 and scale != 4:  # the converter writes it only when not llama.cpp's default
        meta["clip.vision.projector.scale_factor"] = (scale, "u32")
    for key, value in (keys or {}).items():
        if value is None:
            meta.pop(key, None)
        else:
            meta[key] = (value, meta.get(key, (None, "u32"))[1])
    add = {"str": w.add_string, "u32": w.add_uint32, "f32": w.add_float32, "bool": w.add_bool,
           "f32s": lambda k, a: w.add_array(k, [float(x) for x in a])}
    for key, (value, kind) in meta.items():
        add[kind](key, value)

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.MMPROJ, v.num_hidden_layers)
    for hf, t in model.state_dict().items():
        hf = hf.removeprefix("model.")
        if not hf.startswith(("vision_tower.", "multi_modal_projector.")):
            continue
        if not hf.startswith(("vision_tower.vision_model.", "multi_modal_projector.")):
            hf = hf.replace("vision_tower.", "vision_tower.vision_model.", 1)  # the hub's names
        hf = hf.replace("_weight", ".weight")  # mm_input_projection_weight, as the converter
        name = names.get_name(hf, try_suffixes=(".weight", ".bias"))
        assert name is not None, hf
        if name in skip:
            continue
        a = t.detach().float().numpy().copy()
        if "soft_emb_norm.weight" in name:
            a = a + 1
        if "input_projection" in hf:
            qtype = F16
        elif a.ndim == 1 or ".embeddings." in hf:
            qtype = F32
        else:
            qtype = F16 if outtype == "f16" else F32
        if replace and name in replace:
            a = replace[name]
        w.add_tensor(name, a.astype(np.float16 if qtype == F16 else np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_pair(d: Path, seed: int = 5) -> tuple[Path, Path]:
    """(text model GGUF, projector GGUF) of one tiny Gemma 3 with vision, as `tandem serve
    --model --mmproj` takes them."""
    import transformers

    m = hf_model(seed=seed)
    mmproj = write_mmproj(m, d / "mmproj.gguf")
    text = transformers.Gemma3ForCausalLM(m.config.text_config).eval()
    with torch.no_grad():
        text.model.load_state_dict(m.model.language_model.state_dict())
        text.lm_head.weight.copy_(m.lm_head.weight)
    return tiny.write_gguf(text, d / "text.gguf", "gemma3"), mmproj


def reference(model, pixels: torch.Tensor) -> torch.Tensor:
    """transformers' image features: vision tower + multi-modal projector, (tokens, text dim)."""
    with torch.no_grad():
        out = model.model.get_image_features(pixels[None].float())
    return out.pooler_output[0]
