"""The allowed values of Tandem's settings, named once: flags offer them, configs check them,
the loader, the memory plan and the kernels read them from here."""

from __future__ import annotations

# --weights: how a GGUF file's 2-D weights are held
#   native: the GGUF blocks read in place by Tandem's kernels (types in KERNEL_TYPES);
#   int4: 4-bit blocks (INT4_TYPES) repacked for PyTorch's int4 CPU kernel;
#   dense: everything dequantized to the compute dtype;
#   auto: native where the kernels build on this machine, else int4.
WEIGHT_MODES = ("auto", "native", "int4", "dense")
LINEAR_MODES = WEIGHT_MODES[1:]  # what "auto" resolves to

# --dtype: the compute dtype (auto: float32 for float32 files and native weights, else bf16)
DTYPES = ("auto", "float32", "bfloat16")

# --activations: how the native kernels round activations per block, by name -> the integer
# bits of every product's activations but the FFN down projection's, of that one, and its
# values per int8 block (0: the weights' block, 256 for K-quants)
#   int16: max|x| / 16383 steps; int8: llama.cpp's Q8_K / Q8_0 rounding (max|x| / 127);
#   mixed: int8, except int16 for the down projection's input, SiLU(gate) * up, whose outliers
#   carry most of int8's KL divergence (bench/results/kl-divergence-mixed);
#   int8-down64: int8, the down projection's input finer than its weights' block: per 64
#   values (K-quants: a scale per 64 instead of 256; much of mixed's gain at int8's speed,
#   bench/results/kl-divergence-down64), per 16 (Q4_0, Q5_0), int16 (other types);
#   GGUFLinear.rounding
ACTIVATIONS = {"int16": (16, 16, 0), "int8": (8, 8, 0), "mixed": (8, 16, 0),
               "int8-down64": (8, 8, 64)}

# --cache-type-k / --cache-type-v (llama-server's names): how the KV cache holds a row -> bytes
# per element. f16: IEEE halves (llama-server's default), read into float32 for attention
CACHE_TYPES = {"f16": 2, "f32": 4}

# --spec-type: proposers tried in order; auto = n-gram then the draft model, k chosen per step
SPEC_TYPES = ("none", "ngram-simple", "suffix", "draft-simple", "draft-eagle3", "auto")

# GGML type ids of the block types the native kernels read (ggml.h; the enum in kernels/tq.h)
KERNEL_TYPES = {"Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8,
                "Q4_K": 12, "Q5_K": 13, "Q6_K": 14,
                "Q2_K": 10, "Q3_K": 11, "IQ4_NL": 20, "IQ4_XS": 23, "F16": 1, "BF16": 30,
                "IQ2_XXS": 16, "IQ2_XS": 17, "IQ2_S": 22, "IQ3_XXS": 18, "IQ3_S": 21,
                "IQ1_S": 19, "IQ1_M": 29, "TQ1_0": 34, "TQ2_0": 35}

# which kernel reads each KERNEL_TYPES matrix (the memory plan and `tandem check` name it)
KERNEL_OF = {
    **dict.fromkeys(("Q4_K", "Q5_K", "Q6_K"),
                    "K-quant kernels, int8 in 16-row groups, prompt kernel"),
    **dict.fromkeys(("Q4_0", "Q5_0"), "row kernels, int8 in 16-row groups"),
    **dict.fromkeys(("Q4_1", "Q5_1", "IQ4_NL"), "row kernels"),
    **dict.fromkeys(("IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M",
                     "TQ1_0", "TQ2_0"), "row kernels"),  # kernels/rowdoti.c
    "Q8_0": "row kernels, prompt kernel",
    **dict.fromkeys(("Q2_K", "Q3_K", "IQ4_XS"),
                    "row kernels, int8 in 16-row groups, prompt kernel"),
    **dict.fromkeys(("F16", "BF16"), "float kernels, tiled prompt kernel"),
}
# what a matrix of a type outside KERNEL_TYPES costs in native mode
NO_KERNEL = ("no native kernel: expanded at load to the compute dtype (several times the "
             "file's bytes, and a fraction of the speed)")

# block types that map exactly onto PyTorch's int4 kernel (w = scale * q + offset, q in 0..15)
INT4_TYPES = ("Q4_0", "Q4_1", "Q4_K")

# --pooling: how an embedding pools the target's final hidden states
#   last: the token that has read the whole input (causal models' default); mean; cls: the first
#   token; none: one vector per token (/embedding only); rank: a reranker's classification head
#   on the last token (POST /rerank, set by --reranking)
POOLING = ("none", "mean", "cls", "last", "rank")

# --reasoning: a chat template's thinking: on/off set its enable_thinking; auto leaves it be
REASONING = ("on", "off", "auto")

# --reasoning-format: where a chat answer's <think> ... </think> goes: none leaves it in the
# content; deepseek (and auto) puts it in reasoning_content; deepseek-legacy does both
REASONING_FORMAT = ("none", "deepseek", "deepseek-legacy", "auto")

# -fa / --flash-attn (llama-server's values; accepted, no effect in Tandem)
FLASH_ATTN = ("on", "off", "auto")
