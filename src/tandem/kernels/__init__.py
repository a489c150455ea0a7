"""Native kernels: matrix products on GGUF blocks in place and whole decoder layers (forward.c),
built on first use.

The C files (tq.h says which does what) are compiled together once per machine with the system's
C compiler (gcc or cc, `-O3 -mavx2 -mfma -mf16c -fopenmp`) into $TANDEM_HOME/kernels/ under a
name that hashes the sources, the headers (with iq_grids.h, the i-quants' tables, written from
the gguf package's by grids.py), the flags and the compiler's version, then loaded
with ctypes. It links libgomp.so.1, the OpenMP runtime that PyTorch's CPU wheel already loaded,
so both share one thread pool. At load the ctypes mirror of forward.c's structs (_Linear,
_Layer, _Model) is checked field by field against the C layout (tq_layout), and every type of
choices.KERNEL_TYPES against tq_block_bytes; a mismatch makes the library unusable.

There is one build per VARIANTS entry (AVX2, AVX-512 with VNNI, the same with AVX512_BF16's
vdpbf16ps for BF16d products, and the AVX-512 code over SIMDe for tests); all give the same
bits, and the fastest one this CPU runs is used (`in_use()`).
Nothing else depends on it: on a CPU without AVX2/FMA/F16C, with no compiler, or when the build
or those checks fail, `available()` is False and `unavailable_reason()` says why. The module
has no switches of its own: the thread count, the activation rounding and the prompt-kernel
threshold are arguments (the config owns the settings).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import numpy as np
import torch

from ..choices import KERNEL_TYPES
from ..errors import TandemError
from . import grids

HERE = Path(__file__).parent
SOURCES = [HERE / f for f in ("activations.c", "rowdot16.c", "rowdot8.c", "rowdotx.c", "rowdotxk.c",
                              "rowdotn.c", "rowdotb.c",
                              "rowdoti.c", "gemm.c",
                              "matmul.c",
                              "dequant.c", "forward.c")]  # compiled together into one library
HEADERS = [HERE / f for f in ("tq.h", "blocks.h", "gemm_avx2.h", "groups16.h", "rowdotx_avx2.h",
                              "rowdotxk_avx2.h", "iquants.h", "bf16.h")]
CFLAGS = ["-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp", "-shared", "-fPIC"]
REQUIRED_CPU_FLAGS = ("avx2", "fma", "f16c")
# The builds of the same sources: name -> (extra compiler flags, CPU flags it needs). Every
# variant gives the same bits (blocks.h: 512-bit integer sums are folded to the 256-bit ones
# before any float arithmetic); the fastest one this CPU runs is the default (`variant()`).
# avx512-simde is the AVX-512 code compiled with SIMDe's portable intrinsics (Debian's
# libsimde-dev): slow, for testing that code on a machine without AVX-512.
VARIANTS = {
    "avx2": ([], ()),
    "avx512": (["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni"],
               ("avx512f", "avx512bw", "avx512vl", "avx512_vnni")),
    # the avx512 build whose BF16d products run vdpbf16ps itself (the others: its bits by fma
    # under DAZ / FTZ, rowdotb.c); used only where tq_bf16_check finds the same bits
    "avx512bf16": (["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-mavx512bf16"],
                   ("avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16")),
    "avx512-simde": (["-DTQ_SIMDE"], ()),
}
# Products of at least this many activation rows (K-quant weights, int16 activations) take the
# prompt kernel (gemm.c: weights unpacked once per block of rows), fewer the row-by-row kernels
# (same bits). Decode and verification (at most MR = 10 rows: 8 or 9 drafted tokens) stay on
# the row-by-row kernels, which re-derive every weight for each 10-row pass; prompt chunks take
# the prompt kernel. With the weights in cache it already wins from 8 rows
# (experiments/kernel_bench.c), so 16 is a safe margin, not a measured break-even.
# the KV cache dtypes tq_forward reads -> its flag for keys (TQ_K_F16 in tq.h; values: x 2)
CACHE_DTYPES = {torch.float32: 0, torch.float16: 1}
PROMPT_ROWS = 16
ROW_BY_ROW = 1 << 62  # as prompt_rows: the row-by-row kernels for every product (comparisons)


def prompt_rows(prompt_kernel: bool) -> int:
    """The prompt_rows argument for a config's prompt_kernel switch."""
    return PROMPT_ROWS if prompt_kernel else ROW_BY_ROW

_lock = threading.Lock()
_libs: dict[str, ctypes.CDLL | None] = {}  # variant -> the loaded library (None: failed)
_reasons: dict[str, str] = {}  # variant -> why it is unavailable


@functools.cache
def _cpu_flags() -> frozenset[str]:
    """This CPU's flags (/proc/cpuinfo), read once: every product asks which build to use."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def _compiler() -> str | None:
    for cc in (os.environ.get("CC"), "gcc", "cc"):
        if cc and shutil.which(cc):
            return cc
    return None


def _cache_dir() -> Path:
    home = os.environ.get("TANDEM_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "tandem")
    return Path(home) / "kernels"


class _Field(ctypes.Structure):  # tq.h's tq_field
    _fields_ = [("name", ctypes.c_char_p), ("offset", ctypes.c_int64), ("size", ctypes.c_int64)]


def _c_layout(lib: ctypes.CDLL) -> dict[str, tuple[int, int]]:
    """tq_layout's table: "tq_model" -> (0, sizeof), "tq_model.dim" -> (offsetof, sizeof)."""
    out = {}
    entries = lib.tq_layout()
    for i in range(10_000):
        if entries[i].name is None:
            return out
        out[entries[i].name.decode()] = (entries[i].offset, entries[i].size)
    raise OSError("tq_layout has no end")


def _layout_error(layout: dict[str, tuple[int, int]], mirrors=None) -> str | None:
    """What differs between the ctypes mirrors [(Structure, C name)] (default: _Linear, _Layer,
    _Model) and the C layout, or None."""
    for cls, cname in mirrors or _MIRRORS:
        if cname not in layout:
            return f"{cname} is not in tq_layout"
        names = [f[0] for f in cls._fields_]
        for key, (offset, _) in layout.items():  # a field missing on either side first
            if key.startswith(cname + ".") and key.split(".", 1)[1] not in names:
                return (f"{key} (at offset {offset} in C) is missing from the ctypes mirror "
                        f"{cls.__name__}")
        for name in names:
            if f"{cname}.{name}" not in layout:
                return (f"{cname}.{name} (at offset {getattr(cls, name).offset} in the ctypes "
                        f"mirror {cls.__name__}) is not a field of {cname} in C")
        for name in names:  # then, in order, the first field at another offset or size
            key, f = f"{cname}.{name}", getattr(cls, name)
            if (f.offset, f.size) != layout[key]:
                return (f"{key} is at offset {layout[key][0]} (size {layout[key][1]}) in C but "
                        f"at offset {f.offset} (size {f.size}) in the ctypes mirror "
                        f"{cls.__name__}")
        if ctypes.sizeof(cls) != layout[cname][1]:
            return (f"sizeof {cname} is {layout[cname][1]} in C but {ctypes.sizeof(cls)} in "
                    f"the ctypes mirror {cls.__name__}")
    return None


_chosen = ""  # the build chosen by choose_build ("" = variant's choice)


def choose_build(name: str) -> None:
    """From now on the kernels run the build `name` (a VARIANTS key; "" = this CPU's fastest),
    e.g. avx2 on an AVX-512 CPU to time that path; the config owns the setting
    (Numerics.kernel_build). Every build gives the same bits."""
    global _chosen
    if name and name not in VARIANTS:
        raise TandemError(f"kernel build {name!r} (TANDEM_KERNEL_BUILD) is not one of "
                          f"{', '.join(VARIANTS)}")
    _chosen = name


def variant() -> str:
    """The build the kernels use on this CPU: avx512bf16 where it has AVX512F/BW/VL, VNNI and
    BF16, avx512 without BF16, unless choose_build named another."""
    if _chosen:
        return _chosen
    return _fallbacks()[0]


def _fallbacks() -> list[str]:
    """The builds this CPU runs, fastest first."""
    cpu = _cpu_flags()
    return [v for v in ("avx512bf16", "avx512") if all(f in cpu for f in VARIANTS[v][1])] + ["avx2"]


def _build(name: str | None = None) -> ctypes.CDLL:
    name = variant() if name is None else name
    extra, needs = VARIANTS[name]
    missing = [f for f in (*REQUIRED_CPU_FLAGS, *needs) if f not in _cpu_flags()]
    if missing:
        raise OSError(f"this CPU lacks {', '.join(missing)}")
    cc = _compiler()
    if cc is None:
        raise OSError("no C compiler (gcc or cc) on PATH")
    # TANDEM_KERNEL_CFLAGS: more flags, e.g. "-fsanitize=address" for a checked build (its own
    # file: the flags are part of the name)
    flags = [*CFLAGS, *extra, *os.environ.get("TANDEM_KERNEL_CFLAGS", "").split()]
    version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout
    grids_h = grids.header()  # iq_grids.h: the i-quants' tables, from the gguf package
    key = hashlib.sha256(b"".join(f.name.encode() + b"\0" + f.read_bytes()
                                  for f in SOURCES + HEADERS)
                         + grids_h.encode() + " ".join(flags).encode() + version.encode())
    out = _cache_dir() / f"tq-{name}-{key.hexdigest()[:16]}.so"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
        os.close(fd)
        with tempfile.TemporaryDirectory(dir=out.parent) as inc:
            Path(inc, "iq_grids.h").write_text(grids_h)
            r = subprocess.run([cc, *flags, f"-I{inc}", "-o", tmp, *map(str, SOURCES), "-lm"],
                               capture_output=True, text=True)
        if r.returncode != 0:
            os.unlink(tmp)
            # the errors first: notes and warnings can fill the start of the compiler's output
            errors = [ln for ln in r.stderr.splitlines() if "error" in ln]
            raise OSError(f"{cc} failed: {chr(10).join(errors or [r.stderr.strip()])[:500]}")
        os.replace(tmp, out)  # atomic: concurrent builders each write their own temp file
    lib = ctypes.CDLL(str(out))
    i64, ptr, c_int = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
    lib.tq_matmul.argtypes = [c_int, ptr, i64, i64, ptr, i64, ptr, ptr, c_int, c_int, c_int, i64]
    lib.tq_matmul.restype = c_int
    for fn in (lib.tq_repack_q4kx, lib.tq_repack_q5kx, lib.tq_repack_q6kx, lib.tq_repack_q2kx,
               lib.tq_repack_q3kx, lib.tq_repack_iq4xsx):
        fn.argtypes, fn.restype = [ptr, i64, i64, ptr], c_int
    lib.tq_repack_q50x.argtypes, lib.tq_repack_q50x.restype = [ptr, i64, i64, ptr, c_int], c_int
    lib.tq_dequantize.argtypes = [c_int, ptr, i64, i64, ptr, c_int]
    lib.tq_dequantize.restype = c_int
    lib.tq_block_bytes.argtypes = [c_int]
    lib.tq_block_bytes.restype = i64
    lib.tq_forward.argtypes = [ptr, ptr, ptr, i64, i64, ptr, i64, ptr, ptr, ptr, c_int, c_int,
                               ptr, i64, ptr]
    lib.tq_forward.restype = c_int
    lib.tq_layout.argtypes = []
    lib.tq_layout.restype = ctypes.POINTER(_Field)
    wrong = _layout_error(_c_layout(lib))
    if wrong:
        raise OSError(f"the ctypes mirror of tq.h's structs is out of date: {wrong}")
    lib.tq_bf16_check.restype = lib.tq_bf16_native.restype = c_int
    bad = lib.tq_bf16_check()
    if bad:
        raise OSError(f"this build's BF16d product differs from fma under DAZ / FTZ in {bad} "
                      f"probe lanes (a vdpbf16ps that rounds otherwise)")
    for name, type_id in KERNEL_TYPES.items():
        if lib.tq_block_bytes(type_id) == 0:
            raise OSError(f"choices.KERNEL_TYPES has {name} = {type_id}, which the kernels do "
                          f"not take (tq_block_bytes is 0)")
    return lib


def _load(name: str | None = None) -> ctypes.CDLL | None:
    """The library of a variant, built and loaded once per process; by default this CPU's best
    (`variant()`), or the AVX2 build where that one fails to build."""
    if name is None:
        return _load(in_use())
    with _lock:
        if name not in _libs:
            try:
                _libs[name] = _build(name)
            except OSError as e:
                _libs[name], _reasons[name] = None, str(e)
    return _libs[name]


def in_use() -> str:
    """The variant the kernels run here: variant(), unless it fails to build (or its check),
    then the next this CPU runs (avx512, avx2)."""
    if _chosen:
        return _chosen  # what was asked for, or unavailable_reason says why not
    return next((v for v in _fallbacks() if _load(v) is not None), "avx2")


def available() -> bool:
    """The library builds and loads on this machine (and its checks pass)."""
    return _load() is not None


def unavailable_reason(name: str | None = None) -> str | None:
    """Why a variant (default: this CPU's) cannot be used, or None."""
    name = in_use() if name is None else name
    return None if _load(name) is not None else _reasons[name]


def supports(type_name: str) -> bool:
    return type_name in KERNEL_TYPES and available()


def _lib_or_raise(name: str | None = None) -> ctypes.CDLL:
    lib = _load(name)
    if lib is None:
        raise TandemError(f"native kernels unavailable: {unavailable_reason(name)}")
    return lib


_thread_cap = 0  # at most this many threads per call; 0: none (cap_threads)


def cap_threads(n: int) -> int:
    """From now on every product and pass runs on at most n threads (0: as many as asked);
    the engine lowers it while other processes keep CPUs busy (cpushare.py). The results do not
    depend on it. Returns the previous cap."""
    global _thread_cap
    before, _thread_cap = _thread_cap, max(0, n)
    return before


def _threads(n: int) -> int:
    return min(n, _thread_cap) if _thread_cap else n


# Layouts of the kernels' own, made from GGUF blocks at load (not ggml types): Q4_K, Q5_K, Q6_K,
# Q4_0, Q5_0 (rowdotx.c), Q2_K, Q3_K and IQ4_XS (rowdotxk.c) in groups of 16 rows for int8
# activations, the same bytes rearranged.
REPACKED_TYPES = {"Q4_Kx16": 112, "Q5_Kx16": 113, "Q6_Kx16": 114, "Q4_0x16": 102,
                  "Q5_0x16": 106, "Q2_Kx16": 110, "Q3_Kx16": 111, "IQ4_XSx16": 123}
REPACK_FROM = {t.removesuffix("x16"): t for t in REPACKED_TYPES}
_REPACK_FN = {"Q4_K": "tq_repack_q4kx", "Q5_K": "tq_repack_q5kx", "Q6_K": "tq_repack_q6kx",
              "Q2_K": "tq_repack_q2kx", "Q3_K": "tq_repack_q3kx",
              "IQ4_XS": "tq_repack_iq4xsx"}  # Q4_0, Q5_0: q50x
# values per weight block of the repacked types
REPACKED_BLOCK = {t: 32 if t.startswith(("Q4_0", "Q5_0")) else 256 for t in REPACKED_TYPES}
# values per int8 activation block that the 16-row group types also take, finer than their
# weights' block (tq_matmul_check): the K-quants' 32, 64 or 128, the 32-weight types' 16
ACT_BLOCKS = {256: (32, 64, 128), 32: (16,)}


def repack(type_name: str, blocks: np.ndarray, n: int, k: int, bits: int) -> tuple[str, np.ndarray] | None:
    """(type, blocks) of the kernels' faster layout for a linear of GGUF blocks whose activations
    are rounded to `bits`, or None where it has none (then the GGUF blocks are used in place).
    Q4_K, Q5_K, Q6_K, Q4_0, Q5_0, Q2_K, Q3_K, IQ4_XS with int8 activations: 16-row groups (a copy of the
    same size: the file's pages are then no longer read); N not a multiple of 16 gets zero
    rows after its own (the caller keeps the first N outputs). A row's result does not depend
    on the rows grouped with it, so any subset of a matrix's rows repacked gives those rows'
    bits."""
    if type_name not in REPACK_FROM or bits != 8 or k % REPACKED_BLOCK[REPACK_FROM[type_name]]:
        return None
    lib = _lib_or_raise()
    src = np.ascontiguousarray(blocks)
    if n % 16:
        src = np.concatenate([src, np.zeros((16 - n % 16, src.shape[1]), np.uint8)])
        n = len(src)
    out = np.empty_like(src)
    if type_name in ("Q4_0", "Q5_0"):
        rc = lib.tq_repack_q50x(src.ctypes.data, n, k, out.ctypes.data, int(type_name == "Q5_0"))
    else:
        rc = getattr(lib, _REPACK_FN[type_name])(src.ctypes.data, n, k, out.ctypes.data)
    if rc != 0:
        raise TandemError(f"repacking {type_name} (N={n}, K={k}) failed")
    return REPACK_FROM[type_name], out


# The same GGUF blocks read with other activations: BF16d, BF16 weights against activations
# rounded to bf16 (round to nearest even), vdpbf16ps's arithmetic in every build (rowdotb.c)
ACT_TYPES = {"BF16d": 130}


def type_id(type_name: str) -> int:
    for table in (KERNEL_TYPES, REPACKED_TYPES, ACT_TYPES):
        if type_name in table:
            return table[type_name]
    raise TandemError(f"{type_name!r} is not a type the native kernels take")


def matmul(type_name: str, blocks: np.ndarray, n: int, k: int, x: torch.Tensor,
           bias: torch.Tensor | None = None, *, bits: int = 16, ablock: int = 0,
           threads: int = 1, prompt_rows: int = PROMPT_ROWS,
           build: str | None = None) -> torch.Tensor:
    """x (..., K) float32 -> (..., N) float32 = x @ W.T + bias, W the GGUF blocks (N rows).

    bits: how the kernel quantizes the activations per block, 16 (default; error <= 1/32766
    of the block's largest value) or 8 (llama.cpp's Q8_K/Q8_0: 1/254, faster). ablock: values
    per activation block, 0 (the weights' block: 256 for K-quants, else 32) or, for int8 and
    the 16-row group types, ACT_BLOCKS (finer steps: 32, 64 or 128 for the K-quants', 16 for
    Q4_0's and Q5_0's). threads: the
    OpenMP threads to run on. prompt_rows: see PROMPT_ROWS (1 << 62: the row-by-row kernel for
    every product). build: a VARIANTS name (default: this CPU's, `variant()`). The result does
    not depend on threads, prompt_rows, the build or the other rows.
    """
    lib = _lib_or_raise(build)
    rows = x.reshape(-1, k)
    if rows.dtype != torch.float32 or not rows.is_contiguous():
        rows = rows.float().contiguous()
    y = torch.empty(rows.shape[0], n, dtype=torch.float32)
    if ablock and (bits != 8 or ablock not in ACT_BLOCKS.get(REPACKED_BLOCK.get(type_name), ())):
        takes = "; ".join(f"{', '.join(t for t, b in REPACKED_BLOCK.items() if b == wb)} take "
                          f"{', '.join(map(str, ab))}" for wb, ab in ACT_BLOCKS.items())
        raise TandemError(f"activation blocks of {ablock} values: only int8 products of the "
                          f"16-row group types take them ({takes}; got {type_name}, int{bits})")
    rc = lib.tq_matmul(type_id(type_name), blocks.ctypes.data, n, k, rows.data_ptr(),
                       rows.shape[0], y.data_ptr(), None if bias is None else bias.data_ptr(),
                       _threads(threads), bits, ablock, prompt_rows)
    if rc != 0:
        raise TandemError(f"tq_matmul({type_name}, N={n}, K={k}) failed with {rc}")
    return y.view(*x.shape[:-1], n)


def dequantize(type_name: str, blocks: np.ndarray, n: int, k: int, *, threads: int = 1,
               build: str | None = None) -> torch.Tensor:
    """The (N, K) float32 weights of GGUF blocks."""
    lib = _lib_or_raise(build)
    out = torch.empty(n, k, dtype=torch.float32)
    rc = lib.tq_dequantize(KERNEL_TYPES[type_name], blocks.ctypes.data, n, k, out.data_ptr(),
                           threads)
    if rc != 0:
        raise TandemError(f"tq_dequantize({type_name}, N={n}, K={k}) failed with {rc}")
    return out


# ---- whole decoder layers (forward.c) -------------------------------------------------------

# ctypes mirrors of tq.h's structs, checked against tq_layout when the library loads

class _Linear(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int64), ("N", ctypes.c_int64), ("K", ctypes.c_int64),
                ("W", ctypes.c_void_p), ("bias", ctypes.c_void_p), ("bits", ctypes.c_int64),
                ("ablock", ctypes.c_int64)]


class _Layer(ctypes.Structure):
    _fields_ = [(name, ctypes.c_void_p) for name in (
        "attn_norm", "ffn_norm", "q_norm", "k_norm", "post_attn_norm", "post_ffn_norm", "cos",
        "sin")] + [("window", ctypes.c_int64)] + [
        (name, _Linear) for name in ("wq", "wk", "wv", "wo", "gate", "up", "down")]


class _Model(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int64) for name in (
        "n_layers", "dim", "n_heads", "n_kv_heads", "head_dim", "ffn_dim", "rope_len",
        "rope_interleaved", "prompt_rows", "act")] + [
        ("eps", ctypes.c_float), ("attn_scale", ctypes.c_float), ("cos", ctypes.c_void_p),
        ("sin", ctypes.c_void_p), ("layers", ctypes.c_void_p)]


ACTS = {"silu": 2, "gelu_tanh": 3}  # tq.h's TQ_PRE_SILU, TQ_PRE_GELU


_MIRRORS = ((_Linear, "tq_linear"), (_Layer, "tq_layer"), (_Model, "tq_model"))


LAYER_LINEARS = {"wq": "wq", "wk": "wk", "wv": "wv", "wo": "wo", "gate": "w_gate", "up": "w_up",
                 "down": "w_down"}


class NativeLayers:
    """Every decoder layer of a model in one C call (forward.c), for a few rows at a time.

    Built from the layers' GGUF blocks (read in place), float32 norms and rope tables; the
    object keeps every array it points into alive. `from_model` returns None when the model
    cannot take this path (a linear that is not GGUF blocks, a shape forward.c does not
    handle, or no native kernels here). Each product rounds its activations as its linear's
    `rounding()` says (`--activations int8-down64`: the FFN down projection's in blocks of 64).
    """

    def __init__(self, args, layers: list, cos: torch.Tensor, sin: torch.Tensor,
                 prompt_rows: int, build: str | None = None, repacked: bool = True,
                 layer_ropes: list | None = None):
        # repacked: the kernels' own layouts where they have one (`repack`; False: the GGUF
        # blocks for every product, as kernels without those layouts read them).
        # layer_ropes: each layer's (cos, sin) where it differs from the model's (gemma3's
        # sliding layers), else None
        self.build = build  # a VARIANTS name, None: this CPU's
        self._keep: list[object] = [cos, sin]
        self._layers = (_Layer * len(layers))()
        for i, blk in enumerate(layers):
            lay = self._layers[i]
            for norm in ("attn_norm", "ffn_norm", "q_norm", "k_norm", "post_attn_norm",
                         "post_ffn_norm"):
                t = getattr(blk, norm, None)
                if t is None:  # q_norm, k_norm: qwen3, gemma3; post norms gemma3 (NULL: none)
                    continue
                t = t.float().contiguous()
                self._keep.append(t)
                setattr(lay, norm, t.data_ptr())
            if layer_ropes is not None and layer_ropes[i][0] is not cos:
                lc, ls = layer_ropes[i]
                assert lc.shape == cos.shape and lc.dtype == torch.float32 and lc.is_contiguous()
                self._keep += [lc, ls]
                lay.cos, lay.sin = lc.data_ptr(), ls.data_ptr()
            lay.window = args.window(i)
            for field, attr in LAYER_LINEARS.items():
                lin = getattr(blk, attr)
                self._keep.append(lin)
                # the kernels' own layout where they have one (same bits in every build)
                type_name, blocks = (lin.kernel_blocks() if repacked
                                     else (lin.type_name, lin.blocks))
                if len(blocks) != lin.out_features:  # padded to whole groups: N is the layer's
                    type_name, blocks = lin.type_name, lin.blocks
                self._keep.append(blocks)
                bits, ablock = lin.rounding(type_name)
                setattr(lay, field, _Linear(
                    type_id(type_name), lin.out_features, lin.in_features,
                    blocks.ctypes.data, None if lin.bias is None else lin.bias.data_ptr(),
                    bits, ablock))
        self._model = _Model(
            n_layers=len(layers), dim=args.dim, n_heads=args.n_heads,
            n_kv_heads=args.n_kv_heads, head_dim=args.head_dim, ffn_dim=args.ffn_dim,
            rope_len=cos.shape[0], rope_interleaved=int(args.rope_interleaved),
            prompt_rows=prompt_rows, act=ACTS[args.act], eps=args.norm_eps,
            attn_scale=args.attn_scale, cos=cos.data_ptr(), sin=sin.data_ptr(),
            layers=ctypes.addressof(self._layers))

    @staticmethod
    def shape_fits(args) -> bool:
        """forward.c takes these model dimensions (the memory plan asks the same)."""
        return not (args.dim % 32 or args.head_dim % 8 or args.n_heads % args.n_kv_heads)

    @classmethod
    def from_model(cls, args, layers: list, cos: torch.Tensor, sin: torch.Tensor, *,
                   prompt_rows: int = PROMPT_ROWS,
                   layer_ropes: list | None = None) -> "NativeLayers | None":
        if not available() or not layers or not cls.shape_fits(args):
            return None
        if cos.dtype != torch.float32 or not cos.is_contiguous() or not sin.is_contiguous():
            return None
        for blk in layers:
            for attr in LAYER_LINEARS.values():
                lin = getattr(blk, attr)
                if getattr(lin, "type_name", None) not in KERNEL_TYPES or not hasattr(lin, "kernel_blocks"):
                    return None
        return cls(args, layers, cos, sin, prompt_rows, layer_ropes=layer_ropes)

    def forward(self, x: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                slots: list[int], positions: list[int], *, threads: int,
                ends: list[int] | None = None, capture: tuple[int, ...] = (),
                features: torch.Tensor | None = None) -> torch.Tensor:
        """x (M, dim) float32, row m the token at positions[m] of cache slot slots[m]; returns
        the hidden states after the last layer (M, dim), on `threads` OpenMP threads. Writes
        each row's keys and values. ends: per row the position its attention stops before
        (default positions[m] + 1, causal; an image's rows see the whole image).
        features: a float32 (M, len(capture) * dim) tensor that receives each row's input to
        the layers `capture` (an EAGLE-3 head's; an id past the last layer is the caller's)."""
        lib = _lib_or_raise(self.build)
        x = x.float().contiguous().clone()
        m = x.shape[0]
        slot_a = (ctypes.c_int64 * m)(*slots)
        pos_a = (ctypes.c_int64 * m)(*positions)
        ends_a = None if ends is None else (ctypes.c_int64 * m)(*ends)
        n_slots, max_len = k_cache.shape[1], k_cache.shape[3]
        kv_types = CACHE_DTYPES[k_cache.dtype] | 2 * CACHE_DTYPES[v_cache.dtype]
        cap_a, cap_out = None, None
        if features is not None and capture:
            assert features.dtype == torch.float32 and features.is_contiguous()
            assert tuple(features.shape) == (m, len(capture) * x.shape[1]), features.shape
            cap_a, cap_out = (ctypes.c_int64 * len(capture))(*capture), features.data_ptr()
        rc = lib.tq_forward(ctypes.byref(self._model), k_cache.data_ptr(), v_cache.data_ptr(),
                            n_slots, max_len, x.data_ptr(), m, slot_a, pos_a, ends_a,
                            _threads(threads), kv_types, cap_a, len(capture), cap_out)
        if rc != 0:
            raise TandemError(f"tq_forward failed with {rc} (rows {m}, positions "
                              f"{min(positions)}..{max(positions)}, cache length {max_len})")
        return x
