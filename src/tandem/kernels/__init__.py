"""Native kernels: matrix products on GGUF blocks in place (qmatmul.c), built on first use.

The C file is compiled once per machine with the system's C compiler (gcc or cc, `-O3 -mavx2
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

SOURCE = Path(__file__).with_name("qmatmul.c")
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
    key = hashlib.sha256(SOURCE.read_bytes() + " ".join(CFLAGS).encode() + version.encode())
    out = _cache_dir() / f"qmatmul-{key.hexdigest()[:16]}.so"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
        os.close(fd)
        r = subprocess.run([cc, *CFLAGS, "-o", tmp, str(SOURCE)], capture_output=True, text=True)
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
    return lib


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
