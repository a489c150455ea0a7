"""Native kernels: matrix products on GGUF blocks in place (qmatmul.c) and whole decoder layers
(forward.c), built on first use.

The C files are compiled together once per machine with the system's C compiler (gcc or cc, `-O3 -mavx2
-mfma -mf16c -fopenmp`) into $TANDEM_HOME/kernels/ under a name that hashes the source, the
flags and the compiler's version, then loaded with ctypes. It links libgomp.so.1, the OpenMP
runtime that PyTorch's CPU wheel already loaded, so both share one thread pool.

Nothing else depends on it: on a CPU without AVX2/FMA/F16C, with no compiler, or with
TANDEM_KERNELS=0, `available()` is False and the loader falls back to PyTorch's int4 kernel and
bf16 weights (the reason is in `unavailable_reason()`).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import numpy as np
import torch

from ..errors import TandemError

HERE = Path(__file__).parent
SOURCES = [HERE / "qmatmul.c", HERE / "forward.c"]  # compiled together into one library
HEADERS = [HERE / "tq.h"]
CFLAGS = ["-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp", "-shared", "-fPIC"]
REQUIRED_CPU_FLAGS = ("avx2", "fma", "f16c")
# ggml type ids handled by qmatmul.c
TYPES = {"Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14}

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_reason: str | None = None
_loaded = False


def _cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _compiler() -> str | None:
    for cc in (os.environ.get("CC"), "gcc", "cc"):
        if cc and shutil.which(cc):
            return cc
    return None


def _cache_dir() -> Path:
    home = os.environ.get("TANDEM_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "tandem")
    return Path(home) / "kernels"


def _build() -> ctypes.CDLL:
    missing = [f for f in REQUIRED_CPU_FLAGS if f not in _cpu_flags()]
    if missing:
        raise OSError(f"this CPU lacks {', '.join(missing)}")
    cc = _compiler()
    if cc is None:
        raise OSError("no C compiler (gcc or cc) on PATH")
    version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout
    key = hashlib.sha256(b"".join(f.read_bytes() for f in SOURCES + HEADERS)
                         + " ".join(CFLAGS).encode() + version.encode())
    out = _cache_dir() / f"qmatmul-{key.hexdigest()[:16]}.so"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
        os.close(fd)
        r = subprocess.run([cc, *CFLAGS, "-o", tmp, *map(str, SOURCES), "-lm"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            os.unlink(tmp)
            raise OSError(f"{cc} failed: {r.stderr.strip()[:500]}")
        os.replace(tmp, out)  # atomic: concurrent builders each write their own temp file
    lib = ctypes.CDLL(str(out))
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.tq_matmul.argtypes = [ctypes.c_int, ptr, i64, i64, ptr, i64, ptr, ptr, ctypes.c_int,
                              ctypes.c_int]
    lib.tq_matmul.restype = ctypes.c_int
    lib.tq_dequantize.argtypes = [ctypes.c_int, ptr, i64, i64, ptr, ctypes.c_int]
    lib.tq_dequantize.restype = ctypes.c_int
    lib.tq_block_bytes.argtypes = [ctypes.c_int]
    lib.tq_block_bytes.restype = i64
    lib.tq_forward.argtypes = [ptr, ptr, ptr, i64, i64, ptr, i64, ptr, ptr, ctypes.c_int]
    lib.tq_forward.restype = ctypes.c_int
    lib.tq_set_prompt_rows.argtypes = [i64]
    lib.tq_set_prompt_rows.restype = i64
    if os.environ.get("TANDEM_PROMPT_KERNEL", "1") == "0":  # row-by-row kernel for every M
        lib.tq_set_prompt_rows(1 << 62)
    return lib


def set_prompt_rows(m: int) -> int:
    """Products of at least m activation rows (K-quant weights, int16 activations) take the
    prompt kernel (16 unless changed); returns the previous value. Both kernels give the same
    bits; this is for comparisons."""
    return _lib_or_raise().tq_set_prompt_rows(m)


def _load() -> ctypes.CDLL | None:
    global _lib, _reason, _loaded
    with _lock:
        if not _loaded:
            _loaded = True
            if os.environ.get("TANDEM_KERNELS", "1") == "0":
                _reason = "disabled by TANDEM_KERNELS=0"
            else:
                try:
                    _lib = _build()
                except OSError as e:
                    _reason = str(e)
    return _lib


def available() -> bool:
    return _load() is not None


def unavailable_reason() -> str | None:
    _load()
    return _reason


def supports(type_name: str) -> bool:
    return type_name in TYPES and available()


def _lib_or_raise() -> ctypes.CDLL:
    lib = _load()
    if lib is None:
        raise TandemError(f"native kernels unavailable: {_reason}")
    return lib


ACTIVATION_BITS = (16, 8)


def matmul(type_name: str, blocks: np.ndarray, n: int, k: int, x: torch.Tensor,
           bias: torch.Tensor | None = None, bits: int = 16) -> torch.Tensor:
    """x (..., K) float32 -> (..., N) float32 = x @ W.T + bias, W the GGUF blocks (N rows).

    bits: how the kernel quantizes the activations per block, 16 (default; error <= 1/32766
    of the block's largest value) or 8 (llama.cpp's Q8_K/Q8_0: 1/254, faster).
    """
    lib = _lib_or_raise()
    rows = x.reshape(-1, k)
    if rows.dtype != torch.float32 or not rows.is_contiguous():
        rows = rows.float().contiguous()
    y = torch.empty(rows.shape[0], n, dtype=torch.float32)
    rc = lib.tq_matmul(TYPES[type_name], blocks.ctypes.data, n, k, rows.data_ptr(), rows.shape[0],
                       y.data_ptr(), None if bias is None else bias.data_ptr(),
                       torch.get_num_threads(), bits)
    if rc != 0:
        raise TandemError(f"tq_matmul({type_name}, N={n}, K={k}) failed with {rc}")
    return y.view(*x.shape[:-1], n)


def dequantize(type_name: str, blocks: np.ndarray, n: int, k: int) -> torch.Tensor:
    """The (N, K) float32 weights of GGUF blocks."""
    lib = _lib_or_raise()
    out = torch.empty(n, k, dtype=torch.float32)
    rc = lib.tq_dequantize(TYPES[type_name], blocks.ctypes.data, n, k, out.data_ptr(),
                           torch.get_num_threads())
    if rc != 0:
        raise TandemError(f"tq_dequantize({type_name}, N={n}, K={k}) failed with {rc}")
    return out


# ---- whole decoder layers (forward.c) -------------------------------------------------------

class _Linear(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int64), ("N", ctypes.c_int64), ("K", ctypes.c_int64),
                ("W", ctypes.c_void_p), ("bias", ctypes.c_void_p)]


class _Layer(ctypes.Structure):
    _fields_ = [("attn_norm", ctypes.c_void_p), ("ffn_norm", ctypes.c_void_p)] + [
        (name, _Linear) for name in ("wq", "wk", "wv", "wo", "gate", "up", "down")]


class _Model(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int64) for name in (
        "n_layers", "dim", "n_heads", "n_kv_heads", "head_dim", "ffn_dim", "rope_len",
        "rope_interleaved", "bits")] + [
        ("eps", ctypes.c_float), ("cos", ctypes.c_void_p), ("sin", ctypes.c_void_p),
        ("layers", ctypes.c_void_p)]


LAYER_LINEARS = {"wq": "wq", "wk": "wk", "wv": "wv", "wo": "wo", "gate": "w_gate", "up": "w_up",
                 "down": "w_down"}


class NativeLayers:
    """Every decoder layer of a model in one C call (forward.c), for a few rows at a time.

    Built from the layers' GGUF blocks (read in place), float32 norms and rope tables; the
    object keeps every array it points into alive. `from_model` returns None when the model
    cannot take this path (a linear that is not GGUF blocks, mixed activation rounding, a
    shape forward.c does not handle, or no native kernels here).
    """

    def __init__(self, args, layers: list, cos: torch.Tensor, sin: torch.Tensor, bits: int):
        self._keep: list[object] = [cos, sin]
        self._layers = (_Layer * len(layers))()
        for i, blk in enumerate(layers):
            lay = self._layers[i]
            for norm in ("attn_norm", "ffn_norm"):
                t = getattr(blk, norm).float().contiguous()
                self._keep.append(t)
                setattr(lay, norm, t.data_ptr())
            for field, attr in LAYER_LINEARS.items():
                lin = getattr(blk, attr)
                self._keep.append(lin)
                setattr(lay, field, _Linear(
                    TYPES[lin.type_name], lin.out_features, lin.in_features,
                    lin.blocks.ctypes.data, None if lin.bias is None else lin.bias.data_ptr()))
        self._model = _Model(
            n_layers=len(layers), dim=args.dim, n_heads=args.n_heads,
            n_kv_heads=args.n_kv_heads, head_dim=args.head_dim, ffn_dim=args.ffn_dim,
            rope_len=cos.shape[0], rope_interleaved=int(args.rope_interleaved), bits=bits,
            eps=args.norm_eps, cos=cos.data_ptr(), sin=sin.data_ptr(),
            layers=ctypes.addressof(self._layers))

    @staticmethod
    def shape_fits(args) -> bool:
        """forward.c takes these model dimensions (the memory plan asks the same)."""
        return not (args.dim % 32 or args.head_dim % 8 or args.n_heads % args.n_kv_heads)

    @classmethod
    def from_model(cls, args, layers: list, cos: torch.Tensor, sin: torch.Tensor
                   ) -> "NativeLayers | None":
        if not available() or not layers or not cls.shape_fits(args):
            return None
        if cos.dtype != torch.float32 or not cos.is_contiguous() or not sin.is_contiguous():
            return None
        bits = set()
        for blk in layers:
            for attr in LAYER_LINEARS.values():
                lin = getattr(blk, attr)
                if getattr(lin, "type_name", None) not in TYPES or not hasattr(lin, "blocks"):
                    return None
                bits.add(lin.bits)
        if len(bits) != 1:
            return None
        return cls(args, layers, cos, sin, bits.pop())

    def forward(self, x: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                slots: list[int], positions: list[int]) -> torch.Tensor:
        """x (M, dim) float32, row m the token at positions[m] of cache slot slots[m]; returns
        the hidden states after the last layer (M, dim). Writes each row's keys and values."""
        lib = _lib_or_raise()
        x = x.float().contiguous().clone()
        m = x.shape[0]
        slot_a = (ctypes.c_int64 * m)(*slots)
        pos_a = (ctypes.c_int64 * m)(*positions)
        n_slots, max_len = k_cache.shape[1], k_cache.shape[3]
        rc = lib.tq_forward(ctypes.byref(self._model), k_cache.data_ptr(), v_cache.data_ptr(),
                            n_slots, max_len, x.data_ptr(), m, slot_a, pos_a,
                            torch.get_num_threads())
        if rc != 0:
            raise TandemError(f"tq_forward failed with {rc} (rows {m}, positions "
                              f"{min(positions)}..{max(positions)}, cache length {max_len})")
        return x
