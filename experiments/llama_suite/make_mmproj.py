#!/usr/bin/env python3
"""A Gemma 3 mmproj for Gemma 3 270M, standing in for the suite's tinygemma3 projector.

llama.cpp's suite runs its multimodal tests on ggml-org/tinygemma3-GGUF, a tiny random Gemma 3
whose mmproj the hub serves; no machine here reaches the hub. This writes a random SigLIP
tower and Gemma 3 projector of the same kind (128 x 128 images in 4 x 4 patches, pooled to
8 x 8 = 64 tokens per image) that projects into Gemma 3 270M's 640-wide embedding, in the
mmproj GGUF layout llama.cpp's converter writes (tests/tiny_vision.py). Like tinygemma3's,
its images mean nothing to the model: the suite checks the API (status codes, token counts,
cache reuse, slot files), not what the model says about a cat.

Usage: make_mmproj.py OUT.gguf [--siglip]

--siglip: Gemma 3's own SigLIP tower shape instead (896 x 896 images in 14 x 14 patches, 27
layers 1152 wide, 256 tokens per image, ~800 MB in F16), still random: for memory
measurements (experiments/memory_check.py).
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: tests.tiny_vision


SIGLIP = {"image_size": 896, "patch_size": 14, "hidden_size": 1152, "intermediate_size": 4304,
          "num_hidden_layers": 27, "num_attention_heads": 16}


def main(out: str, siglip: bool = False) -> None:
    import transformers

    from tests import tiny_vision

    torch.manual_seed(0)
    text = transformers.Gemma3TextConfig(hidden_size=640, intermediate_size=64,
                                         num_hidden_layers=1, num_attention_heads=1,
                                         num_key_value_heads=1, head_dim=32, vocab_size=16)
    vision = {**tiny_vision.VISION, "image_size": 128, "hidden_size": 64,
              "intermediate_size": 128, **(SIGLIP if siglip else {})}
    cfg = transformers.Gemma3Config(text_config=text.to_dict(), vision_config=vision,
                                    mm_tokens_per_image=256 if siglip else 64, boi_token_index=0,
                                    eoi_token_index=1, image_token_index=2)
    m = transformers.Gemma3ForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "soft_emb_norm" in name:
                p.zero_()
            elif p.dim() == 1 and "norm" in name:
                p.fill_(1.0)
            elif p.dim() == 1:
                p.zero_()
            elif "mm_input_projection" in name:  # rows of the 270M's embedding scale
                p.copy_(torch.randn_like(p) * 0.03)
            else:
                p.copy_(torch.randn_like(p) / p[0].numel() ** 0.5)
    tiny_vision.write_mmproj(m, Path(out))


if __name__ == "__main__":
    main(sys.argv[1], "--siglip" in sys.argv[2:])
