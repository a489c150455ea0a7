"""The memory plan printed before loading: weights, KV cache and working buffers per model.

What is counted (the loader and the decoder hold exactly these):

- weights, mode "native" (GGUF; what "auto" means where the native kernels build): 2-D tensors
  of the types the kernels read (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K) stay in the
  file's memory map and are read in place, so they count at their size in the file: every
  token reads every one of them, so all their pages become resident. token_embd.weight of such
  a type is read row by row (only the rows of tokens seen become resident, a few MB): counted
  only when it is also the output projection (a model without output.weight). Every other 2-D
  tensor is dense at the compute dtype, which is float32 in this mode (the kernels take float32
  activations).
- weights, mode "int4" (GGUF; "auto" where the native kernels do not build): 2-D tensors stored as Q4_K, Q4_0 or Q4_1 (with a row count that
  is a multiple of 16, as the int4 kernel needs) are repacked to int4, rows*cols/2 bytes, plus a
  bf16 scale and offset per group of 32 weights (rows*cols/32 * 4 bytes); every other 2-D
  tensor is dense at the compute dtype; token_embd.weight is always dense (a model without
  output.weight uses it as the output projection too, with no second copy); norms are float32,
  biases are at the compute dtype.
  Mode "dense": every 2-D tensor at the compute dtype. A float32 compute dtype implies dense.
- KV cache: n_parallel * (ctx_size + max_k + 1) positions * 2 (K and V) * n_layers * n_kv_heads
  * head_dim, at --cache-type-k / -v's bytes per element (f16: 2, the default; f32: 4; the
  draft's cache: -ctkd / -ctvd), preallocated once. With --kv-unified the
  slots share ctx_size positions (each with room for its own draft): (ctx_size + n_parallel *
  (max_k + 1)) positions, the memory given as they are written and given back when an idle
  slot's cache is dropped, plus a page at each end of every slot's run per layer and head.
- working buffers, float32: the verify logits, n_parallel * (max_k + 1) rows * vocab; one
  prefill chunk's activations, chunk * max(3 * ffn_dim (gate, up, product),
  n_heads * ctx_size (attention scores)); the largest layer weight expanded to float32 for a
  prefill chunk's GEMM (models/linear.py: compact weights are expanded per call; not in dense
  float32, where nothing is copied); the rope tables, 2 * (ctx_size + max_k + 1) * head_dim / 2.
  In native mode with every layer weight readable by the kernels, the layers run in C
  (kernels/forward.c) and the chunk term is c_layer_bytes' instead: no expanded weight, no
  score matrix.
  Prefill computes no logits. Plus the tokenizer and the file's metadata as Python objects
  (vocabulary, merges): VOCAB_ENTRY_BYTES per vocabulary entry, measured on the Qwen2.5 file
  (GGUF header 45 MB + tokenizer 55 MB for 151,936 entries, RSS before and after).
- the PyTorch runtime: TORCH_RUNTIME_BYTES, the peak RSS of a fresh
  `python -c "import torch"` measured with torch 2.13 (CPU wheel): 223,600 KiB.

Not counted: transient copies while loading (a tensor is dequantized, then packed), the
tokenizer, and in modes int4/dense the mmap of the model file (read once while loading).
"""

from __future__ import annotations

import math
import mmap
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .choices import CACHE_TYPES, INT4_TYPES, KERNEL_OF, KERNEL_TYPES, NO_KERNEL
from .errors import TandemError
from .models.args import ModelArgs

if TYPE_CHECKING:
    from .config import EngineConfig, Numerics
    from .models.gguf_file import GGUFFile

INT4_GROUP = 32
TORCH_RUNTIME_BYTES = 223_600 * 1024
# the suffix pool's index per output token it holds (Python lists and dicts: 72 MB for 65536
# tokens under tracemalloc, bench/results/suffix-pool)
POOL_BYTES_PER_TOKEN = 1100
MiB = 1 << 20
VOCAB_ENTRY_BYTES = 690  # tokenizer + parsed metadata per vocabulary entry (see above)
GiB = 1 << 30


@dataclass(slots=True)
class ModelSpec:
    """One model as the plan sees it: its args and {tensor name -> (type name, shape)}.

    Type names are GGML's (Q4_K, Q6_K, F32, BF16, ...); a Hugging Face directory is always
    loaded dense (source "hf").
    """

    role: str  # "target" | "draft"
    args: ModelArgs
    tensors: dict[str, tuple[str, tuple[int, ...]]]
    name: str = ""
    source: str = "gguf"  # "gguf" | "hf"

    @classmethod
    def from_gguf(cls, role: str, g: GGUFFile, args: ModelArgs) -> ModelSpec:
        """From an opened tandem.models.gguf_file.GGUFFile and its ModelArgs."""
        tensors = {t.name: (t.type_name, tuple(t.shape)) for t in g.tensors.values()}
        return cls(role, args, tensors, Path(g.path).name, "gguf")

    @classmethod
    def from_hf_dir(cls, role: str, path: Path, args: ModelArgs) -> ModelSpec:
        """From a safetensors directory: shapes and dtypes come from the file headers."""
        from safetensors import safe_open

        tensors: dict[str, tuple[str, tuple[int, ...]]] = {}
        for f in sorted(Path(path).glob("*.safetensors")):
            with safe_open(str(f), framework="pt") as sf:
                for k in sf.keys():
                    s = sf.get_slice(k)
                    tensors[k] = (s.get_dtype(), tuple(s.get_shape()))
        return cls(role, args, tensors, Path(path).name, "hf")


@dataclass(slots=True)
class PlanRow:
    """One model's share of the plan, in bytes."""

    role: str
    name: str
    held_as: str  # e.g. "int4 + bfloat16"
    weights: int
    kv_cache: int
    working: int
    kv_types: tuple[str, str] = ("f16", "f16")  # --cache-type-k / -v (the draft's: -ctkd / -ctvd)
    kernels: str = ""  # each matrix type, its count and the kernel that reads it (native mode)

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.working


@dataclass(slots=True)
class MemoryPlan:
    rows: list[PlanRow]
    runtime: int  # the PyTorch runtime itself
    available: int
    available_source: str  # where `available` came from, for the table
    settings: str = ""
    pool: int = 0  # the suffix pool's index when full (--spec-suffix-pool)

    @property
    def total(self) -> int:
        return sum(r.total for r in self.rows) + self.runtime + self.pool

    @property
    def fits(self) -> bool:
        return self.total <= self.available

    def format(self) -> str:
        head = f"{'':<40} {'weights':>10} {'KV cache':>10} {'working':>10} {'total':>10}"
        lines = [f"memory plan ({self.settings})" if self.settings else "memory plan", head]
        for r in self.rows:
            label = f"{r.role} {r.name}"[:40]
            lines.append(f"{label:<40} {fmt_bytes(r.weights):>10} {fmt_bytes(r.kv_cache):>10} "
                         f"{fmt_bytes(r.working):>10} {fmt_bytes(r.total):>10}")
        for r in self.rows:
            lines.append(f"  {r.role} weights held as {r.held_as}" + (
                f"; KV cache keys {r.kv_types[0]}, values {r.kv_types[1]}" if r.kv_cache else
                " (no KV cache)"))
            if r.kernels:
                lines.append(f"  {r.role} matrices: {r.kernels}")
        if self.runtime:
            lines.append(f"{'PyTorch runtime':<40} {'':>10} {'':>10} {'':>10} "
                         f"{fmt_bytes(self.runtime):>10}")
        if self.pool:
            lines.append(f"{'suffix pool of earlier answers, when full':<40} {'':>10} {'':>10} "
                         f"{'':>10} {fmt_bytes(self.pool):>10}")
        lines.append(f"{'total':<40} {'':>32} {fmt_bytes(self.total):>10}")
        lines.append(f"{'available (' + self.available_source + ')':<40} {'':>32} "
                     f"{fmt_bytes(self.available):>10}")
        if self.fits:
            lines.append(f"fits: yes, {fmt_bytes(self.available - self.total)} to spare")
        else:
            lines.append(f"fits: NO, {fmt_bytes(self.total - self.available)} short")
        return "\n".join(lines)


def fmt_bytes(n: int) -> str:
    return f"{n / GiB:.2f} GiB" if n >= GiB else f"{n / MiB:.1f} MiB"


def held_as(spec: ModelSpec, numerics: Numerics) -> tuple[str, int]:
    """(how the weights are held, bytes per dense element), by the loader's own rule
    (models.loader.weight_form)."""
    from .models.loader import weight_form

    all_f32 = all(t == "F32" for t, _ in spec.tensors.values())
    mode, dtype = weight_form(numerics, all_f32, spec.source)
    return mode, 4 if dtype == "float32" else 2


def weight_bytes(tensors: dict[str, tuple[str, tuple[int, ...]]], mode: str, el: int) -> int:
    """Bytes the weights take once loaded (mode: effective mode; el: dense bytes per element)."""
    total = 0
    tied = "output.weight" not in tensors
    for name, (type_name, shape) in tensors.items():
        n = math.prod(shape)
        if mode == "native" and len(shape) == 2 and type_name in KERNEL_TYPES:
            # (a matrix the kernels repack, int8 Q4_K, takes the same bytes in their layout,
            # and its pages of the file are then no longer read)
            if name != "token_embd.weight" or tied:
                total += _file_bytes(type_name, n)
            continue
        if len(shape) < 2:
            total += n * (el if name.endswith(".bias") else 4)
        elif mode == "int4" and _packs_to_int4(name, type_name, shape):
            total += n // 2 + n // INT4_GROUP * 2 * 2
        else:
            total += n * el
    return total


def _file_bytes(type_name: str, n: int) -> int:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[type_name]]
    return n // block * size


def _packs_to_int4(name: str, type_name: str, shape: tuple[int, ...]) -> bool:
    # The int4 kernel takes row counts that are multiples of 16; other matrices stay dense.
    embedding = name in ("token_embd.weight", "model.embed_tokens.weight")
    return type_name in INT4_TYPES and not embedding and shape[0] % 16 == 0


def kv_cache_bytes(args: ModelArgs, ctx_size: int, n_parallel: int, max_k: int, el: int,
                   unified: bool = False, v_el: int | None = None) -> int:
    """K and V of every slot, el bytes a key element and v_el (default el) a value element
    (--cache-type-k / -v). With --kv-unified the slots hold ctx_size tokens together, each
    with room for a draft, and the memory is given as positions are written: that many
    positions, plus up to a page per layer, slot, K/V and head at each end of what a slot holds."""
    per_position = args.n_layers * args.n_kv_heads * args.head_dim * (el + (v_el or el))
    if unified:
        slack = 2 * 2 * args.n_layers * n_parallel * args.n_kv_heads * mmap.PAGESIZE
        return (ctx_size + n_parallel * (max_k + 1)) * per_position + slack
    return n_parallel * (ctx_size + max_k + 1) * per_position


def working_bytes(args: ModelArgs, ctx_size: int, n_parallel: int, max_k: int,
                  prefill_chunk: int, expanded: int = 0) -> int:
    """float32 buffers of one forward pass (see the module docstring); expanded: elements of
    the largest weight a prefill chunk expands to float32."""
    verify_logits = n_parallel * (max_k + 1) * args.vocab_size
    chunk = min(prefill_chunk, ctx_size)
    activations = chunk * max(3 * args.ffn_dim, args.n_heads * ctx_size)
    rope = (ctx_size + max_k + 1) * args.head_dim  # cos and sin, head_dim/2 each
    return 4 * (verify_logits + activations + expanded + rope) + VOCAB_ENTRY_BYTES * args.vocab_size


def c_layer_bytes(args: ModelArgs, ctx_size: int, n_parallel: int, max_k: int,
                  prefill_chunk: int, threads: int = 0, float_rows: bool = False) -> int:
    """Working buffers when every layer runs in C (kernels/forward.c, native mode): a pass of
    `chunk` rows allocates the normed input (max of dim, q width, ffn_dim), q, k, v, the
    attention output, the residual update, gate and up, all float32, plus the quantized
    activations (int16: half a float per value, and per-32 scale and sum, per-16 integer sum)
    and the embeddings with their copy (float_rows: F16 / BF16 layers, which take the
    activations as float32: a float per value instead of half); each thread keeps the attention scores of one key/value
    head's query heads over the whole cache. Nothing is
    expanded and no score matrix is built. Plus the verify logits, rope tables and vocabulary
    as in working_bytes."""
    chunk = min(prefill_chunk, ctx_size)
    qd, kd = args.n_heads * args.head_dim, args.n_kv_heads * args.head_dim
    kmax = max(args.dim, qd, args.ffn_dim)
    per_row = kmax * (1 + (1 if float_rows else 0.5) + 3 / 32) + 2 * qd + 2 * kd + 3 * args.dim \
        + 2 * args.ffn_dim
    group = args.n_heads // args.n_kv_heads  # query heads per key/value head
    scores = (threads or os.cpu_count() or 1) * group * (ctx_size + max_k + 10)
    return (working_bytes(args, ctx_size, n_parallel, max_k, 0)
            + 4 * int(math.ceil(chunk * per_row) + scores))


def c_layers(spec: "ModelSpec", mode: str) -> bool:
    """Whether the loaded model runs its layers in C: native mode, dimensions forward.c takes,
    and every layer weight of a type the kernels read (decoder.Transformer.native_layers)."""
    from .kernels import NativeLayers

    if mode != "native" or spec.source == "hf" or not NativeLayers.shape_fits(spec.args):
        return False
    layer = [t for name, (t, shape) in spec.tensors.items()
             if name.startswith("blk.") and name.endswith(".weight") and len(shape) == 2]
    return bool(layer) and all(t in KERNEL_TYPES for t in layer)


def matrix_kernels(tensors: dict[str, tuple[str, tuple[int, ...]]]) -> str:
    """Each 2-D tensor type of a GGUF model in native mode, its count and its kernel, e.g.
    "Q3_K x113 (row kernels, prompt kernel); ..."; a type without one says so."""
    counts = Counter(type_name for type_name, shape in tensors.values() if len(shape) == 2)
    return "; ".join(f"{t} x{n} ({KERNEL_OF.get(t, NO_KERNEL)})" for t, n in counts.most_common())


def largest_layer_weight(tensors: dict[str, tuple[str, tuple[int, ...]]]) -> int:
    """Elements of the largest 2-D weight inside the layers (not the embedding or output)."""
    sizes = [math.prod(shape) for name, (_, shape) in tensors.items()
             if len(shape) == 2 and name not in ("token_embd.weight", "output.weight",
                                                 "model.embed_tokens.weight", "lm_head.weight")]
    return max(sizes, default=0)


def available_memory() -> tuple[int, str]:
    """(bytes free for a new process, where the figure came from)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, "MemAvailable"
    except OSError:
        pass
    pages = os.sysconf("SC_AVPHYS_PAGES")
    return pages * os.sysconf("SC_PAGE_SIZE"), "free physical pages"


def plan(models: list[ModelSpec], cfg: EngineConfig, max_k: int = 0, *,
         available: int | None = None, embeddings: bool = False,
         pool_tokens: int = 0) -> MemoryPlan:
    """The memory the engine will hold for these models under `cfg` (context, slots, weights,
    dtype, prefill chunk), with max_k spare positions per slot; `available` overrides the
    probe. embeddings (--embedding, --reranking): the target's KV also counts Engine.embed's
    caches, --batch-size positions kept for one-pass inputs and one slot's context for a long
    input pooled last (embedding.py). pool_tokens: the suffix pool's budget (counted full)."""
    if not isinstance(max_k, int) or max_k < 0:
        raise TandemError(f"max drafted tokens must be an integer >= 0, got {max_k!r}")
    # the most rows a pass holds: a prompt chunk read alone (or --batch-size, if larger)
    ctx, slots, chunk = cfg.ctx_size, cfg.n_parallel, max(cfg.prefill_chunk, cfg.batch_size)
    rows = []
    for spec in models:
        eff_mode, el = held_as(spec, cfg.numerics(spec.role))
        kv_el = [CACHE_TYPES[t] for t in cfg.cache_types(spec.role)]
        kv = kv_cache_bytes(spec.args, ctx, slots, max_k, kv_el[0], cfg.kv_unified, kv_el[1])
        if embeddings and spec.role == "target":
            kv += sum(kv_cache_bytes(spec.args, n, 1, 0, kv_el[0], False, kv_el[1])
                      for n in (cfg.batch_size, ctx))
        rows.append(PlanRow(
            spec.role, spec.name,
            f"int4 (Q4_K/Q4_0/Q4_1) + {_dtype_name(el)}" if eff_mode == "int4" else
            f"GGUF blocks in place + {_dtype_name(el)}" if eff_mode == "native" else
            f"dense {_dtype_name(el)}",
            weight_bytes(spec.tensors, eff_mode, el),
            kv,
            c_layer_bytes(spec.args, ctx, slots, max_k, chunk,
                          float_rows=any(t in ("F16", "BF16") for t, _ in spec.tensors.values()))
            if c_layers(spec, eff_mode) else
            working_bytes(spec.args, ctx, slots, max_k, chunk,
                          0 if (eff_mode, el) == ("dense", 4) else largest_layer_weight(spec.tensors)),
            cfg.cache_types(spec.role),
            matrix_kernels(spec.tensors) if eff_mode == "native" and spec.source == "gguf" else "",
        ))
    if available is None:
        available, source = available_memory()
    else:
        source = "given"
    settings = (f"ctx-size {ctx} shared by {slots} slot(s) (--kv-unified)" if cfg.kv_unified
                else f"ctx-size {ctx} x {slots} slot(s)")
    settings += f", {max_k} spare positions for drafts, prefill chunk {chunk}"
    if embeddings:
        settings += ", embeddings' caches"
    ram = cfg.cache_ram_bytes(available)
    settings += (", no host prompt cache" if ram == 0 else
                 ", host prompt cache as it grows, no limit (--cache-ram -1)" if ram is None else
                 f", host prompt cache up to {ram >> 20} MiB as it grows (--cache-ram)")
    return MemoryPlan(rows, TORCH_RUNTIME_BYTES, available, source, settings,
                      pool_tokens * POOL_BYTES_PER_TOKEN)


def _dtype_name(el: int) -> str:
    return "float32" if el == 4 else "bfloat16"
