"""Weights: dequantizing any GGUF tensor; repacking 4-bit GGUF blocks for PyTorch's CPU int4 kernel.

The int4 kernel (`torch._weight_int4pack_mm_for_cpu`, aten/src/ATen/native/cpu/int4mm_kernel.cpp),
as read there and checked by experiment on torch 2.13 (this machine runs its AVX2 build):

- weight: `torch._convert_weight_to_int4pack_for_cpu(q, inner_k_tiles)` with q int32 (N, K), values
  0..15, N % 16 == 0, K even; it returns uint8 (N, K/2) in a layout that depends on the CPU build
  (AVX-512 pairs rows n and n+32 of each 64-row block in one byte, AVX2 rows n and n+16 of each
  32-row block), so pack at load time on the machine that runs it and never cache the bytes.
  inner_k_tiles is ignored on the CPU.
- scales_and_zeros: (K/group, N, 2) in the activation dtype: [..., 0] the scale s, [..., 1] the
  zero z; group size 32, 64, 128 or 256 along K.
- each weight is dequantized in float32 as (q - 8) * s + z: z is the value at the middle of the
  16-level grid, not an integer zero point (AVX-512: fma(q - 8, s, z); AVX2: fma(q, s, z - 8 s)).
- activations: 2-D contiguous; only bf16 has a vectorized kernel (fp16/fp32 run a scalar loop,
  far slower); products accumulate in float32 and the output is rounded to bf16. M is processed
  in blocks of 4 rows, each block dequantizing the weights again.

A GGUF Q4_0 / Q4_1 / Q4_K group of 32 weights is `w = scale * q + offset` with q in 0..15, so it
maps onto the kernel with group size 32 as s = scale, z = offset + 8 * scale. The only loss is
rounding s and z to bf16: |w_kernel - w| <= 2^-8 * (8 |s| + |z|), a few percent of one
quantization step.

Worked example: a Q4_K group with d * sc = 0.02 and dmin * m = 0.05 holds w = 0.02 q - 0.05.
Then s = 0.02 and z = -0.05 + 8 * 0.02 = 0.11, and the kernel computes (q - 8) * 0.02 + 0.11 =
0.02 q - 0.05 for every q in 0..15 (up to rounding 0.02 and 0.11 to bf16). A Q4_0 block
w = d (q - 8) gives s = d, z = 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as QT
from gguf import quants as gguf_quants

from .. import choices, kernels
from ..errors import ModelFileError, TandemError
from .gguf_file import RawTensor, release_pages
from .linear import Dense

GROUP_SIZE = 32  # every 4-bit GGUF type scales groups of 32 weights
KERNEL_ZERO = 8  # the kernel dequantizes q as (q - 8) * s + z
PACK_CHUNK_ROWS = 4096  # rows decoded at a time: bounds the int32 staging copy (a multiple of 64)
FLOAT_TYPES = (QT.F32, QT.F16, QT.BF16, QT.F64)
INT4_TYPES = tuple(QT[name] for name in choices.INT4_TYPES)


def _gguf_can_dequantize(qtype: QT) -> bool:
    # gguf.quants has one class per block type, named like the type (Q4_K, IQ2_XS, ...)
    return isinstance(getattr(gguf_quants, qtype.name, None), type)


def supported_types() -> list[str]:
    """Names of the tensor types `dequantize` reads, e.g. ['F32', 'F16', 'Q4_0', ...]."""
    return [t.name for t in QT if t in FLOAT_TYPES or _gguf_can_dequantize(t)]


def dequantize(raw: RawTensor) -> torch.Tensor:
    """The tensor's values as float32 with shape `raw.shape`, equal to gguf.quants.dequantize."""
    data = raw.data
    if raw.qtype in (QT.F32, QT.F16, QT.F64):
        values = data.astype(np.float32)  # always a fresh, writable copy of the mapped file
    elif raw.qtype == QT.BF16:
        values = (data.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    elif _gguf_can_dequantize(raw.qtype):
        values = gguf_quants.dequantize(data, raw.qtype)
    else:
        raise ModelFileError(
            f"tensor {raw.name!r} has type {raw.type_name}, which Tandem cannot read; "
            f"supported types: {', '.join(supported_types())}"
        )
    return torch.from_numpy(values.reshape(raw.shape))


def dequantize_to(raw: RawTensor, dtype: torch.dtype, chunk_rows: int = 4096) -> torch.Tensor:
    """dequantize(raw).to(dtype), a block of rows at a time: a 151936 x 1536 embedding never
    exists in float32 whole (that transient was 0.9 GB of the load's peak memory)."""
    if len(raw.shape) != 2 or raw.shape[0] <= chunk_rows:
        return dequantize(raw).to(dtype)
    out = torch.empty(raw.shape, dtype=dtype)
    for r in range(0, raw.shape[0], chunk_rows):
        part = RawTensor(raw.name, raw.qtype, (min(chunk_rows, raw.shape[0] - r), raw.shape[1]),
                         raw.data[r:r + chunk_rows])
        out[r:r + chunk_rows] = dequantize(part)
    return out


@dataclass(slots=True)
class Affine4Bit:
    """Decoded 4-bit blocks (float32), w[n, k] = scale[n, k // 32] * q[n, k] + offset[n, k // 32]"""

    q: np.ndarray  # (N, K) uint8, 0..15
    scale: np.ndarray  # (N, K/32) float32
    offset: np.ndarray  # (N, K/32) float32

    def weight(self) -> np.ndarray:
        """(N, K) float32, bit-identical to gguf.quants.dequantize of the same blocks."""
        n, k = self.q.shape
        q = self.q.reshape(n, k // GROUP_SIZE, GROUP_SIZE).astype(np.float32)
        return (self.scale[..., None] * q + self.offset[..., None]).reshape(n, k)


def _f16(blocks: np.ndarray, start: int) -> np.ndarray:
    return blocks[:, start : start + 2].view(np.float16).astype(np.float32)  # (n_blocks, 1)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """(n_blocks, 16) bytes -> (n_blocks, 32): low nibbles are weights 0..15, high ones 16..31."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _decode_q4_0(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    d = _f16(blocks, 0)  # w = d * (q - 8)
    return _nibbles(blocks[:, 2:]), d, -8 * d


def _decode_q4_1(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return _nibbles(blocks[:, 4:]), _f16(blocks, 0), _f16(blocks, 2)  # w = d * q + m


def _decode_q4_k(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One 144-byte super-block = 8 groups of 32: f16 d, f16 dmin, 12 bytes of 6-bit (sc, m) pairs,
    128 bytes of nibbles (bytes 32i..32i+31 hold group 2i in the low and group 2i+1 in the high
    nibble); w = d * sc * q - dmin * m, as in gguf's Q4_K.dequantize_blocks."""
    n = blocks.shape[0]
    sc, m = gguf_quants.Q4_K.get_scale_min(blocks[:, 4:16])  # (n, 8) each
    qs = blocks[:, 16:].reshape(n, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    q = (qs & 0x0F).reshape(n * 8, 32)
    scale = _f16(blocks, 0) * sc.astype(np.float32)
    offset = -(_f16(blocks, 2) * m.astype(np.float32))
    return q, scale.reshape(n * 8, 1), offset.reshape(n * 8, 1)


_DECODERS = {QT.Q4_0: _decode_q4_0, QT.Q4_1: _decode_q4_1, QT.Q4_K: _decode_q4_k}


def decode_4bit(raw: RawTensor, rows: slice = slice(None)) -> Affine4Bit | None:
    """Split the selected rows of a Q4_0 / Q4_1 / Q4_K tensor into q, scale and offset (None for
    other types)."""
    decode = _DECODERS.get(raw.qtype)
    if decode is None or len(raw.shape) != 2:
        return None
    data = raw.data[rows]  # (n, bytes_per_row)
    n, k = data.shape[0], raw.shape[1]
    _, type_size = GGML_QUANT_SIZES[raw.qtype]
    q, scale, offset = decode(np.ascontiguousarray(data).reshape(-1, type_size))
    return Affine4Bit(q.reshape(n, k), scale.reshape(n, -1), offset.reshape(n, -1))


def kernel_scales_and_zeros(blocks: Affine4Bit) -> torch.Tensor:
    """(K/32, N, 2) bf16 [scale, zero] with zero = offset + 8 * scale, the value at q = 8."""
    scale = torch.from_numpy(blocks.scale)  # (N, K/32)
    zero = torch.add(torch.from_numpy(blocks.offset), scale, alpha=KERNEL_ZERO)  # 8 * s is exact
    out = torch.empty((*scale.shape[::-1], 2), dtype=torch.bfloat16)  # (K/32, N, 2)
    out[..., 0] = scale.T
    out[..., 1] = zero.T
    return out


def kernel_weight(blocks: Affine4Bit) -> torch.Tensor:
    """(N, K) float32: the weights as the int4 kernel sees them, (q - 8) * s_bf16 + z_bf16 (equal to
    the AVX-512 kernel's; the AVX2 kernel's rounds z - 8 s first, a few float32 ulps away)."""
    sz = kernel_scales_and_zeros(blocks).float().transpose(0, 1)  # (N, K/32, 2)
    n, k = blocks.q.shape
    q = torch.from_numpy(blocks.q.astype(np.float32)).reshape(n, k // GROUP_SIZE, GROUP_SIZE)
    # (q - 8) * s is exact in float32 (4-bit times 8-bit significands): one rounding, like fma
    return ((q - KERNEL_ZERO) * sz[..., :1] + sz[..., 1:]).reshape(n, k)


@dataclass(slots=True)
class Int4Weight:
    """A (N, K) weight packed for torch._weight_int4pack_mm_for_cpu."""

    packed: torch.Tensor  # (N, K/2) uint8, CPU-specific layout
    scales_and_zeros: torch.Tensor  # (K/32, N, 2) bf16
    shape: tuple[int, int]  # (N, K)
    group_size: int = GROUP_SIZE


def pack_int4(raw: RawTensor, chunk_rows: int = PACK_CHUNK_ROWS) -> Int4Weight | None:
    """Repack a Q4_0 / Q4_1 / Q4_K matrix for the int4 kernel; None for other types and for
    row counts the kernel cannot take (N % 16 != 0).

    Rows are decoded `chunk_rows` at a time; the kernel packs independent 64-row (AVX-512) or
    32-row (AVX2) blocks, so packing chunks whose size is a multiple of 64 and concatenating them
    gives the same bytes as packing the whole matrix.
    """
    if raw.qtype not in INT4_TYPES or len(raw.shape) != 2 or raw.shape[0] % 16 != 0:
        return None
    if chunk_rows % 64 != 0:
        raise ValueError(f"chunk_rows must be a multiple of 64, got {chunk_rows}")
    n, k = raw.shape
    packed, scales = [], []
    for start in range(0, n, chunk_rows):
        blocks = decode_4bit(raw, slice(start, start + chunk_rows))
        q = torch.from_numpy(blocks.q).to(torch.int32)  # (n_chunk, K)
        packed.append(torch._convert_weight_to_int4pack_for_cpu(q, 2))
        scales.append(kernel_scales_and_zeros(blocks))
    return Int4Weight(torch.cat(packed), torch.cat(scales, dim=1), (n, k))


def _int4_mm(x: torch.Tensor, packed: torch.Tensor, sz: torch.Tensor, group: int) -> torch.Tensor:
    rows = x.reshape(-1, x.shape[-1]).to(torch.bfloat16).contiguous()  # (M, K)
    out = torch._weight_int4pack_mm_for_cpu(rows, packed, group, sz)  # (M, N)
    return out.reshape(*x.shape[:-1], packed.shape[0])


class QuantLinear(torch.nn.Module):
    """y = x @ W.T + b with W held as int4 groups; the output has the input's dtype."""

    def __init__(self, weight: Int4Weight, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.group_size = weight.group_size
        self.register_buffer("packed", weight.packed, persistent=False)
        self.register_buffer("scales_and_zeros", weight.scales_and_zeros, persistent=False)
        self.register_buffer("bias", bias, persistent=False)

    def forward(self, x: torch.Tensor, wide: bool = False, rowwise: bool = False) -> torch.Tensor:
        # rowwise: the int4 kernel already gives each row the same bits whatever M is
        if wide:  # prefill: one float32 GEMM beats re-dequantizing every 4 rows
            w = unpack_int4_float(self.packed, self.scales_and_zeros, self.group_size)
            b = None if self.bias is None else self.bias.float()
            return torch.nn.functional.linear(x.float(), w, b).to(x.dtype)
        y = _int4_mm(x, self.packed, self.scales_and_zeros, self.group_size).to(x.dtype)
        if self.bias is not None:
            y = y + self.bias.to(x.dtype)
        return y

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"int4 group {self.group_size}")


class GGUFLinear(torch.nn.Module):
    """y = x @ W.T + b with W the GGUF blocks in place (the file's memory map), float32 in/out.

    Decode and verification rows go through the native kernels (tandem/kernels): weights
    exact, activations rounded per block (bits 16 or 8), float32 sums, batch-invariant, on
    `threads` threads; products of prompt_rows or more rows take the prompt kernel (same bits).
    A wide prefill chunk expands the weight to float32 for one float32 GEMM instead.
    """

    def __init__(self, raw: RawTensor, bias: torch.Tensor | None = None, bits: int = 16,
                 threads: int = 1, prompt_rows: int = kernels.PROMPT_ROWS,
                 act_block: int = 0) -> None:
        super().__init__()
        self.out_features, self.in_features = raw.shape
        self.type_name, self.raw = raw.type_name, raw
        self.bits, self.threads, self.prompt_rows = bits, threads, prompt_rows
        # int8 activation blocks of this many values where finer than the weights' block
        # (0: the weights' block); see rounding()
        self.act_block = act_block
        self.blocks = raw.data  # uint8 view of the file: (N, row bytes)
        self._kernel_blocks: dict[int, tuple[str, np.ndarray]] = {}  # bits -> kernel_blocks()
        self.register_buffer("bias", None if bias is None else bias.float().contiguous(),
                             persistent=False)

    def kernel_blocks(self) -> tuple[str, np.ndarray]:
        """(type, blocks) the kernels read for this product at self.bits: their own layout where
        they have one (kernels.repack: int8 Q4_K / Q6_K / Q4_0 / Q5_0 in 16-row groups, made on first use and
        shared by the PyTorch layers and the C layers), else the GGUF blocks in place."""
        if self.bits not in self._kernel_blocks:
            packed = kernels.repack(self.type_name, self.blocks, self.out_features,
                                    self.in_features, self.bits)
            if packed is not None:  # the file's copy is no longer read: each weight held once
                release_pages(self.blocks)
            self._kernel_blocks[self.bits] = packed or (self.type_name, self.blocks)
        return self._kernel_blocks[self.bits]

    @property
    def repacked(self) -> bool:
        """The kernels read their own copy (kernel_blocks), not the file's blocks."""
        return self.kernel_blocks()[1] is not self.blocks

    def rounding(self, type_name: str | None = None) -> tuple[int, int]:
        """(bits, ablock) of kernels.matmul for this product read as `type_name` (default: its
        kernel_blocks()' type). With act_block (the FFN down projection's input, which carries
        most of int8's KL divergence), int8 activations are rounded finer than the weights'
        own block, never coarser than asked: the 16-row group types take blocks of act_block
        values (K-quants: 64 of their 256) or of 16 (Q4_0, Q5_0: their blocks are 32, the
        scale llama.cpp's Q8_0 gives); the other types (Q8_0, Q4_1, Q5_1, IQ4_NL, the grid
        i-quants) round to int16, which their kernels take at int8's speed (the prompt kernel
        widens int8 to int16 anyway). bench/results/gguf-types/README.md: KL divergence."""
        type_name = type_name or self.kernel_blocks()[0]
        if self.bits != 8 or not self.act_block:
            return self.bits, 0
        if type_name in kernels.REPACKED_TYPES:
            block = kernels.REPACKED_BLOCK[type_name]
            return 8, self.act_block if self.act_block < block else min(kernels.ACT_BLOCKS[block])
        return 16, 0

    def weight_float(self) -> torch.Tensor:
        return kernels.dequantize(self.type_name, self.blocks, self.out_features, self.in_features,
                                  threads=self.threads)

    def forward(self, x: torch.Tensor, wide: bool = False, rowwise: bool = False) -> torch.Tensor:
        # rowwise: the kernels give each row the same bits whatever the number of rows
        if wide:
            return torch.nn.functional.linear(x.float(), self.weight_float(), self.bias).to(x.dtype)
        type_name, blocks = self.kernel_blocks()
        n = len(blocks)  # the layer's rows, or whole 16-row groups of them
        bias = self.bias
        if n != self.out_features and bias is not None:
            bias = torch.cat([bias, bias.new_zeros(n - self.out_features)])
        bits, ablock = self.rounding(type_name)
        y = kernels.matmul(type_name, blocks, n, self.in_features, x, bias, bits=bits,
                           ablock=ablock, threads=self.threads, prompt_rows=self.prompt_rows)
        if n != self.out_features:
            y = y[..., :self.out_features]
        return y.to(x.dtype)

    def rows(self, idx: slice | list[int]) -> GGUFLinear:
        """The layer over output rows idx: a slice reads the same blocks in place, a list
        copies those rows' blocks once."""
        data = self.blocks[idx] if isinstance(idx, slice) else np.ascontiguousarray(self.blocks[idx])
        raw = RawTensor(self.raw.name, self.raw.qtype, (len(data), self.in_features), data)
        bias = None if self.bias is None else self.bias[idx].contiguous()
        return GGUFLinear(raw, bias, self.bits, self.threads, self.prompt_rows, self.act_block)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"{self.type_name} blocks in place, int{self.bits} activations"
                + (f" per {self.act_block}" if self.act_block else ""))


class GGUFEmbedding:
    """Token embeddings read row by row from the GGUF blocks: emb[ids] -> float32 (..., dim).

    Unless the tied output projection (tied) reads the same blocks in place, the file pages a
    lookup faulted in (the kernel maps up to 64 KiB around each row read) are dropped right
    after it: the table stays in the page cache, shared and reclaimable, and this process
    holds no page of it between lookups, not the pages of every token ever seen (a
    4,000-token prompt left 26 MiB of the default target's 131 MiB table resident, growing
    with the vocabulary used)."""

    def __init__(self, raw: RawTensor, threads: int = 1, tied: GGUFLinear | None = None) -> None:
        self.raw, self.threads, self.tied = raw, threads, tied  # tied: the output projection
        self.shape = raw.shape

    @property
    def release(self) -> bool:
        return self.tied is None or self.tied.repacked

    def __getitem__(self, ids: torch.Tensor) -> torch.Tensor:
        flat = ids.reshape(-1).numpy()
        rows = np.ascontiguousarray(self.raw.data[flat])  # (T, row bytes): only these rows
        if self.release:
            release_pages(self.raw.data)
        out = kernels.dequantize(self.raw.type_name, rows, len(flat), self.shape[1],
                                 threads=self.threads)
        return out.view(*ids.shape, self.shape[1])


def native_ok(raw: RawTensor) -> bool:
    """The native kernel reads this 2-D tensor's blocks in place."""
    return (len(raw.shape) == 2 and kernels.supports(raw.type_name)
            and raw.data.ndim == 2 and raw.data.flags.c_contiguous
            and raw.data.dtype.byteorder != ">")  # the kernels read little-endian halves


def _dense_linear(raw: RawTensor, dtype: torch.dtype, bias: torch.Tensor | None) -> Dense:
    return Dense(dequantize_to(raw, dtype), None if bias is None else bias.to(dtype))


_ROW_BLOCK: int | None = None


def _row_block() -> int:
    """Rows per block of the kernel's packed layout on this CPU (32 on AVX2, 64 on AVX-512).

    Within a block of B rows the packed bytes run k-major: byte (k, r) for r < B/2 holds row r
    in its low nibble and row r + B/2 in its high nibble. Found once by packing a probe.
    """
    global _ROW_BLOCK
    if _ROW_BLOCK is None:
        probe = torch.arange(128 * 64, dtype=torch.int32).reshape(128, 64) % 16
        packed = torch._convert_weight_to_int4pack_for_cpu(probe, 2)
        for b in (32, 64, 16, 128):
            if torch.equal(_unpack(packed, b, 128, 64).int(), probe):
                _ROW_BLOCK = b
                break
        else:
            raise TandemError("unknown int4 packed layout in this PyTorch build")
    return _ROW_BLOCK


def _unpack(packed: torch.Tensor, b: int, n: int, k: int) -> torch.Tensor:
    """(N, K/2) packed bytes -> (N, K) uint8 values 0..15 in row order.

    Full blocks of B rows: k-major, byte (k, r) holds row r (low nibble) and r + B/2 (high).
    A last block of T < B rows (N not a multiple of B: 96 rows on AVX-512 are a block of 64
    and 32 more) is packed the simple way, k-major, byte (k, j) holding rows 2j and 2j + 1.
    """
    out = torch.empty(n, k, dtype=torch.uint8)
    full = n // b * b
    if full:
        pb = packed[:full].reshape(full // b, k, b // 2)  # per row block: k-major, B/2 bytes
        blocks = out[:full].view(full // b, b, k)
        blocks[:, : b // 2] = (pb & 0xF).transpose(1, 2)  # rows r < B/2: low nibbles
        blocks[:, b // 2:] = (pb >> 4).transpose(1, 2)  # rows r + B/2: high nibbles
    if n > full:
        pt = packed[full:].reshape(k, (n - full) // 2)
        tail = out[full:].view((n - full) // 2, 2, k)
        tail[:, 0] = (pt & 0xF).T  # rows 2j
        tail[:, 1] = (pt >> 4).T  # rows 2j + 1
    return out


def unpack_int4_float(packed: torch.Tensor, sz: torch.Tensor, group: int) -> torch.Tensor:
    """The kernel's weight values as float32 (N, K): q * s + (z - 8 s) per group.

    Equal to the kernel's (q - 8) * s + z up to one float32 rounding; used for prefill only.
    """
    n, k = packed.shape[0], packed.shape[1] * 2
    q = _unpack(packed, _row_block(), n, k).view(n, k // group, group)
    s = sz[..., 0].t().float().contiguous().unsqueeze(-1)  # (N, K/group, 1)
    z = sz[..., 1].t().float().contiguous().unsqueeze(-1) - KERNEL_ZERO * s
    return torch.addcmul(z, q, s).view(n, k)


def make_linear(raw: RawTensor, dtype: torch.dtype, mode: str, bias: RawTensor | None = None,
                bits: int = 16, threads: int = 1, prompt_rows: int = kernels.PROMPT_ROWS,
                act_block: int = 0) -> torch.nn.Module:
    """A linear layer for a (N, K) GGUF weight (+ optional (N,) bias).

    mode "native": the types the native kernels read (Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q4_K/Q5_K/Q6_K)
    become a GGUFLinear over the file's blocks (exact weights), anything else a Dense in `dtype`;
    mode "int4": Q4_0 / Q4_1 / Q4_K become a QuantLinear (exact up to bf16 scales), anything else a
    Dense in `dtype`; mode "dense": a Dense in `dtype` for every type.
    """
    if mode not in choices.LINEAR_MODES:
        raise TandemError(f"unknown weight mode {mode!r}; accepted: "
                          f"{', '.join(choices.LINEAR_MODES)}")
    if len(raw.shape) != 2:
        raise ModelFileError(f"tensor {raw.name!r} has shape {raw.shape}; a linear weight is 2-D")
    bias_values = None if bias is None else dequantize(bias).reshape(-1)
    if bias_values is not None and bias_values.shape[0] != raw.shape[0]:
        raise ModelFileError(
            f"bias {bias.name!r} has {bias_values.shape[0]} values; weight {raw.name!r} has "
            f"{raw.shape[0]} rows"
        )
    if mode == "native" and native_ok(raw):
        return GGUFLinear(raw, bias_values, bits, threads, prompt_rows, act_block)
    packed = pack_int4(raw) if mode == "int4" else None
    if packed is None:
        return _dense_linear(raw, dtype, bias_values)
    return QuantLinear(packed, None if bias_values is None else bias_values.to(dtype))
