"""The memory plan printed before loading: what the process will hold, line by line.

What is counted (the loader, the engine and the server hold exactly these; the plan's total is
checked against a server's measured peak, VmHWM, in tests/test_memory_measured.py and
experiments/memory_check.py):

- weights, mode "native" (GGUF; what "auto" means where the native kernels build): 2-D tensors
  of the types the kernels read (choices.KERNEL_TYPES) count at their size in the file, once:
  those the kernels copy into their own layout (int8 Q4_K, Q6_K, Q4_0, Q5_0 in 16-row groups:
  the same bytes) have their file pages released after the copy (gguf_file.release_pages),
  the others are read in place from the file's mapping, every page of them resident. Not
  counted: token_embd.weight where output.weight exists: its rows are read from the mapping
  and its pages dropped after each lookup (quant.GGUFEmbedding), so it stays in the page cache,
  not in this process. A draft model's output.weight read in place counts only the rows of its
  shortlist (--spec-draft-vocab: the rows the draft reads). Every other 2-D tensor is dense at
  the compute dtype, which is float32 in this mode (the kernels take float32 activations).
- weights, mode "int4" (GGUF; "auto" where the native kernels do not build): 2-D tensors stored
  as Q4_K, Q4_0 or Q4_1 (with a row count that is a multiple of 16, as the int4 kernel needs)
  are repacked to int4, rows*cols/2 bytes, plus a bf16 scale and offset per group of 32
  weights (rows*cols/32 * 4 bytes); every other 2-D tensor is dense at the compute dtype;
  token_embd.weight is always dense (a model without output.weight uses it as the output
  projection too, with no second copy); norms are float32, biases are at the compute dtype.
  Mode "dense": every 2-D tensor at the compute dtype. A float32 compute dtype implies dense.
- KV cache: n_parallel * (ctx_size + max_k + 1) positions * 2 (K and V) * n_layers * n_kv_heads
  * head_dim, at --cache-type-k / -v's bytes per element (f16: 2, the default; f32: 4; the
  draft's cache: -ctkd / -ctvd), preallocated once. With --kv-unified the
  slots share ctx_size positions (each with room for its own draft): (ctx_size + n_parallel *
  (max_k + 1)) positions, the memory given as they are written and given back when an idle
  slot's cache is dropped, plus a page at each end of every slot's run per layer and head.
- working memory, float32, per model: the logits it holds (the target: every slot's
  verification rows, n_parallel * (max_k + 1) rows * vocab; a draft: a row a slot), the rope
  tables, 2 * (ctx_size + max_k + 1) * head_dim / 2, and the tokenizer and the file's metadata
  as Python objects: VOCAB_ENTRY_BYTES per vocabulary entry, measured on the Qwen2.5 file
  (GGUF header 45 MB + tokenizer 55 MB for 151,936 entries, RSS before and after). Plus the
  buffers of the largest pass, once: the models' passes run one at a time (one worker steps
  the engine), so the largest one's buffers are counted, in its model's row. A pass of one
  prefill chunk: chunk * max(3 * ffn_dim (gate, up, product), n_heads * ctx_size (attention
  scores)) and the largest layer weight expanded to float32 (models/linear.py: compact
  weights are expanded per call; not in dense float32, where nothing is copied); in native
  mode with every layer weight readable by the kernels, the layers run in C
  (kernels/forward.c) and the pass is c_layer_bytes' instead: no expanded weight, no score
  matrix. Prefill computes no logits.
- the runtime: RUNTIME_BYTES, Python, PyTorch, the kernels and the server's libraries, measured.
- the suffix pool of earlier answers, when full (--spec-suffix-pool).
- the host prompt cache (--cache-ram): named with its cap but not in the total, which is what
  the process holds with it empty; it fills as slots put prompts aside.

Not counted: transient copies while loading (a tensor is read, then packed: one tensor at a
time), and in modes int4/dense the mmap of the model file (read once while loading).
"""

from __future__ import annotations

import math
import mmap
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from .choices import CACHE_TYPES, INT4_TYPES, KERNEL_OF, KERNEL_TYPES, NO_KERNEL
from .errors import TandemError
from .models.args import ModelArgs

if TYPE_CHECKING:
    from .config import EngineConfig, Numerics
    from .models.gguf_file import GGUFFile

INT4_GROUP = 32
# the runtime: Python, PyTorch 2.13 (CPU wheel), the kernels and the server's libraries (FastAPI,
# uvicorn, tokenizers, jinja2): `tandem serve` of a tiny model (tests.tiny) holds 257 MiB
# before loading it and 274 MiB once it serves (VmRSS; a bare `import torch`: 218 MiB)
RUNTIME_BYTES = 272 * 1024 * 1024
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
    runtime: int  # Python, PyTorch and the server's libraries (RUNTIME_BYTES)
    available: int
    available_source: str  # where `available` came from, for the table
    settings: str = ""
    pool: int = 0  # the suffix pool's index when full (--spec-suffix-pool)
    prompt_cache: int | None = 0  # the host prompt cache's cap (--cache-ram; None: no limit)

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
            lines.append(f"{'runtime (Python, PyTorch, the server)':<40} {'':>10} {'':>10} {'':>10} "
                         f"{fmt_bytes(self.runtime):>10}")
        if self.pool:
            lines.append(f"{'suffix pool of earlier answers, when full':<40} {'':>10} {'':>10} "
                         f"{'':>10} {fmt_bytes(self.pool):>10}")
        lines.append(f"{'total':<40} {'':>32} {fmt_bytes(self.total):>10}")
        lines += self._prompt_cache_lines()
        lines.append(f"{'available (' + self.available_source + ')':<40} {'':>32} "
                     f"{fmt_bytes(self.available):>10}")
        if self.fits:
            lines.append(f"fits: yes, {fmt_bytes(self.available - self.total)} to spare")
        else:
            lines.append(f"fits: NO, {fmt_bytes(self.total - self.available)} short")
        return "\n".join(lines)


    def as_json(self) -> dict:
        """The plan in bytes, as /props serves it: each model's lines, the runtime, the pool,
        the host prompt cache's cap (null: no limit), the total, what was available."""
        return {
            "models": [{"role": r.role, "name": r.name, "held_as": r.held_as,
                        "weights": r.weights, "kv_cache": r.kv_cache, "working": r.working,
                        "total": r.total} for r in self.rows],
            "runtime": self.runtime, "suffix_pool": self.pool,
            "host_prompt_cache_cap": self.prompt_cache, "total": self.total,
            "available": self.available, "available_source": self.available_source,
            "fits": self.fits}

    def _prompt_cache_lines(self) -> list[str]:
        """The host prompt cache (--cache-ram): not in the total, which is what the process holds
        with it empty; it fills as slots put prompts aside, up to its cap."""
        cap = self.prompt_cache
        if cap == 0:
            return []
        if cap is None:
            return [f"{'host prompt cache (--cache-ram -1)':<40} {'':>32} {'no limit':>10}"]
        out = [f"{'host prompt cache, up to (--cache-ram)':<40} {'':>32} {fmt_bytes(cap):>10}",
               f"{'total with the host prompt cache full':<40} {'':>32} "
               f"{fmt_bytes(self.total + cap):>10}"]
        if self.fits and self.total + cap > self.available:
            out.append(f"  the host prompt cache can outgrow what is available: "
                       f"--cache-ram {(self.available - self.total) >> 20} at most")
        return out


def resident() -> dict[str, int]:
    """This process's resident memory now and at its peak (VmRSS, VmHWM), and now its
    anonymous and file-backed parts, in bytes (Linux; {} elsewhere)."""
    keys = {"VmRSS": "resident", "VmHWM": "peak_resident", "RssAnon": "anonymous",
            "RssFile": "file_backed"}
    try:
        with open("/proc/self/status") as f:
            return {keys[k]: int(v.split()[0]) * 1024 for k, _, v in
                    (line.partition(":") for line in f) if k in keys}
    except OSError:
        return {}


def fmt_bytes(n: int) -> str:
    return f"{n / GiB:.2f} GiB" if n >= GiB else f"{n / MiB:.1f} MiB"


def held_as(spec: ModelSpec, numerics: Numerics) -> tuple[str, int]:
    """(how the weights are held, bytes per dense element), by the loader's own rule
    (models.loader.weight_form)."""
    from .models.loader import weight_form

    all_f32 = all(t == "F32" for t, _ in spec.tensors.values())
    mode, dtype = weight_form(numerics, all_f32, spec.source)
    return mode, 4 if dtype == "float32" else 2


def weight_bytes(tensors: dict[str, tuple[str, tuple[int, ...]]], mode: str, el: int,
                 out_rows: int = 0, repacked: Iterable[str] = ()) -> int:
    """Bytes the weights take once loaded (mode: effective mode; el: dense bytes per element).
    out_rows: a draft's shortlist (--spec-draft-vocab): the rows of its own output.weight it
    reads, where the kernels read them in place (the types in `repacked` are copied whole
    into the kernels' layout, so held whole)."""
    total = 0
    tied = "output.weight" not in tensors
    for name, (type_name, shape) in tensors.items():
        n = math.prod(shape)
        if mode == "native" and len(shape) == 2 and type_name in KERNEL_TYPES:
            # (a matrix the kernels repack, int8 Q4_K, takes the same bytes in their layout,
            # and its pages of the file are released. token_embd.weight: read row by row from
            # the file, its pages dropped after each lookup (quant.GGUFEmbedding), so held
            # only where it is also the output projection)
            held = _file_bytes(type_name, n)
            if name == "output.weight" and out_rows and type_name not in repacked:
                held = held * min(out_rows, shape[0]) // shape[0]
            if name != "token_embd.weight" or tied:
                total += held
        elif len(shape) < 2:
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
                  prefill_chunk: int, expanded: int = 0, logit_rows: int | None = None) -> int:
    """float32 buffers of one forward pass (see the module docstring); expanded: elements of
    the largest weight a prefill chunk expands to float32; logit_rows: rows of logits held
    (default: every slot's verification rows, n_parallel * (max_k + 1))."""
    rows = n_parallel * (max_k + 1) if logit_rows is None else logit_rows
    verify_logits = rows * args.vocab_size
    chunk = min(prefill_chunk, ctx_size)
    activations = chunk * max(3 * args.ffn_dim, args.n_heads * ctx_size)
    rope = (ctx_size + max_k + 1) * args.head_dim  # cos and sin, head_dim/2 each
    return 4 * (verify_logits + activations + expanded + rope) + VOCAB_ENTRY_BYTES * args.vocab_size


def c_layer_bytes(args: ModelArgs, ctx_size: int, n_parallel: int, max_k: int,
                  prefill_chunk: int, threads: int = 0, float_rows: bool = False,
                  logit_rows: int | None = None) -> int:
    """Working buffers when every layer runs in C (kernels/forward.c, native mode): a pass of
    `chunk` rows allocates the normed input (max of dim, q width, ffn_dim), q, k, v, the
    attention output, the residual update, gate and up, all float32, plus the quantized
    activations (int16: half a float per value; room for a scale and a sum per 16 values, the
    Q4_0 / Q5_0 down projection's, kernels/matmul.c's tq_scratch_alloc; per-16 integer sum)
    and the embeddings with their copy (float_rows: F16 / BF16 layers, which take the
    activations as float32: a float per value instead of half); each thread keeps the attention scores of one key/value
    head's query heads over the whole cache. Nothing is
    expanded and no score matrix is built. Plus the verify logits, rope tables and vocabulary
    as in working_bytes."""
    chunk = min(prefill_chunk, ctx_size)
    qd, kd = args.n_heads * args.head_dim, args.n_kv_heads * args.head_dim
    kmax = max(args.dim, qd, args.ffn_dim)
    per_row = kmax * (1 + (1 if float_rows else 0.5) + 5 / 32) + 2 * qd + 2 * kd + 3 * args.dim \
        + 2 * args.ffn_dim
    group = args.n_heads // args.n_kv_heads  # query heads per key/value head
    scores = (threads or os.cpu_count() or 1) * group * (ctx_size + max_k + 10)
    return (working_bytes(args, ctx_size, n_parallel, max_k, 0, logit_rows=logit_rows)
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
         pool_tokens: int = 0, draft_vocab: int = 0) -> MemoryPlan:
    """The memory the engine will hold for these models under `cfg` (context, slots, weights,
    dtype, prefill chunk), with max_k spare positions per slot; `available` overrides the
    probe. embeddings (--embedding, --reranking): the target's KV also counts Engine.embed's
    caches, --batch-size positions kept for one-pass inputs and one slot's context for a long
    input pooled last (embedding.py). pool_tokens: the suffix pool's budget (counted full).
    draft_vocab: a draft model's shortlist (--spec-draft-vocab; 0: it reads every row).

    The models' passes run one at a time (one worker steps the engine), so only the largest
    pass's buffers are counted, in its model's row; each row keeps its own persistent working
    memory (logits, rope tables, vocabulary)."""
    if not isinstance(max_k, int) or max_k < 0:
        raise TandemError(f"max drafted tokens must be an integer >= 0, got {max_k!r}")
    # the most rows a pass holds: a prompt chunk read alone (or --batch-size, if larger)
    ctx, slots, chunk = cfg.ctx_size, cfg.n_parallel, max(cfg.prefill_chunk, cfg.batch_size)
    from .kernels import REPACK_FROM

    rows, passes = [], []
    for spec in models:
        numerics = cfg.numerics(spec.role)
        eff_mode, el = held_as(spec, numerics)
        kv_el = [CACHE_TYPES[t] for t in cfg.cache_types(spec.role)]
        kv = kv_cache_bytes(spec.args, ctx, slots, max_k, kv_el[0], cfg.kv_unified, kv_el[1])
        if embeddings and spec.role == "target":
            kv += sum(kv_cache_bytes(spec.args, n, 1, 0, kv_el[0], False, kv_el[1])
                      for n in (cfg.batch_size, ctx))
        draft = spec.role == "draft"
        logit_rows = slots if draft else None  # a draft's logits: one row a slot
        persistent = working_bytes(spec.args, ctx, slots, max_k, 0, logit_rows=logit_rows)
        if c_layers(spec, eff_mode):
            full = c_layer_bytes(spec.args, ctx, slots, max_k, chunk, logit_rows=logit_rows,
                                 float_rows=any(t in ("F16", "BF16")
                                                for t, _ in spec.tensors.values()))
        else:
            full = working_bytes(spec.args, ctx, slots, max_k, chunk,
                                 0 if (eff_mode, el) == ("dense", 4)
                                 else largest_layer_weight(spec.tensors), logit_rows=logit_rows)
        passes.append(full - persistent)
        rows.append(PlanRow(
            spec.role, spec.name,
            f"int4 (Q4_K/Q4_0/Q4_1) + {_dtype_name(el)}" if eff_mode == "int4" else
            f"GGUF blocks in place + {_dtype_name(el)}" if eff_mode == "native" else
            f"dense {_dtype_name(el)}",
            weight_bytes(spec.tensors, eff_mode, el, draft_vocab if draft else 0,
                         REPACK_FROM if numerics.bits == 8 else ()),
            kv, persistent, cfg.cache_types(spec.role),
            matrix_kernels(spec.tensors) if eff_mode == "native" and spec.source == "gguf" else "",
        ))
    if passes:  # the largest pass, in its model's row
        big = max(range(len(passes)), key=passes.__getitem__)
        rows[big].working += passes[big]
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
    settings += ", no host prompt cache" if ram == 0 else ""
    return MemoryPlan(rows, RUNTIME_BYTES, available, source, settings,
                      pool_tokens * POOL_BYTES_PER_TOKEN, ram)


def _dtype_name(el: int) -> str:
    return "float32" if el == 4 else "bfloat16"
