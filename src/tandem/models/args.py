"""The architecture differences of the llama/qwen2/qwen3/gemma3 family, as fields."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class ModelArgs:
    arch: str  # "qwen2" | "llama" | "qwen3" | "gemma3" (as named in the file)
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
    # gemma3
    embed_scale: float = 1.0  # each embedding row times this on the way in (gemma: sqrt(dim))
    post_norms: bool = False  # the attention's and the FFN's outputs RMS-normed before each
    # residual addition (gemma's "sandwich" norms)
    act: str = "silu"  # the gated FFN's activation: "silu" | "gelu_tanh"
    attn_scale: float = 0.0  # the attention scores' scale; 0: head_dim ** -0.5
    rope_scale: float = 1.0  # linear rope scaling of the full-attention layers (positions / it)
    sliding_window: int = 0  # > 0: the layers in swa_layers see only the last this many positions
    swa_layers: tuple[bool, ...] = ()  # per layer: a sliding-window layer
    rope_theta_swa: float = 0.0  # the sliding-window layers' rope base (0: rope_theta), unscaled

    def __post_init__(self) -> None:
        if self.head_dim == 0:
            self.head_dim = self.dim // self.n_heads
        if self.attn_scale == 0.0:
            self.attn_scale = self.head_dim ** -0.5

    def window(self, layer: int) -> int:
        """How many positions back layer `layer` attends (0: all)."""
        swa = self.swa_layers and self.swa_layers[layer]
        return self.sliding_window if swa else 0

    def layer_rope(self, layer: int) -> tuple[float, float]:
        """(rope base, linear scale) of layer `layer`."""
        if self.window(layer) and self.rope_theta_swa:
            return self.rope_theta_swa, 1.0
        return self.rope_theta, self.rope_scale

    @property
    def kv_bytes_per_token(self) -> int:
        """KV cache bytes per token per sequence in float32; halve for bf16."""
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * 4
