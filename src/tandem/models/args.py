"""The architecture differences of the llama/qwen2/qwen3 family, as fields."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class ModelArgs:
    arch: str  # "qwen2" | "llama" | "qwen3" (as named in the file)
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_dim: int
    vocab_size: int
    head_dim: int = 0  # 0 = dim // n_heads
    norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_interleaved: bool = False  # GGUF llama stores q/k permuted for interleaved (GPT-J) rope
    qkv_bias: bool = False  # qwen2
    qk_norm: bool = False  # qwen3: an RMS norm over each head of q and k before rope
    tie_embeddings: bool = False
    max_seq_len: int = 4096  # the model's trained context

    def __post_init__(self) -> None:
        if self.head_dim == 0:
            self.head_dim = self.dim // self.n_heads

    @property
    def kv_bytes_per_token(self) -> int:
        """KV cache bytes per token per sequence in float32; halve for bf16."""
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * 4
