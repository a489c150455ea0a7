"""Reading GGUF files: checked opening, metadata as Python values, tensors as mapped views.

The header is parsed here with `struct` over a read-only memory map instead of with
`gguf.GGUFReader`, which builds several numpy views per array element: for a 150k-token
vocabulary (tokens + merges) that takes tens of seconds, this parser well under one. Types and block
sizes come from the `gguf` package. Values equal `GGUFReader`'s `field.contents()`.

Layout (GGUF v2/v3, all integers in the file's byte order, strings as u64 length + UTF-8 bytes):

    magic b"GGUF" | u32 version | u64 tensor_count | u64 kv_count
    kv_count    x (string key, u32 value_type, value)
                    value of an ARRAY: u32 item_type, u64 count, count x value
    tensor_count x (string name, u32 n_dims, n_dims x u64 ne, u32 ggml_type, u64 offset)
    padding to `general.alignment` (default 32), then the tensor data; offsets count from there.
"""

from __future__ import annotations

import math
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGMLQuantizationType, GGUFValueType
from gguf.gguf_reader import READER_SUPPORTED_VERSIONS
from gguf.quants import quant_shape_to_byte_shape

from ..errors import ModelFileError

GGUF_MAGIC = b"GGUF"

VT = GGUFValueType
QT = GGMLQuantizationType

# Scalar value types as numpy dtypes (byte order added per file).
_SCALARS: dict[GGUFValueType, type[np.generic]] = {
    VT.UINT8: np.uint8, VT.INT8: np.int8, VT.UINT16: np.uint16, VT.INT16: np.int16,
    VT.UINT32: np.uint32, VT.INT32: np.int32, VT.UINT64: np.uint64, VT.INT64: np.int64,
    VT.FLOAT32: np.float32, VT.FLOAT64: np.float64, VT.BOOL: np.bool_,
}
# Tensor types GGUFReader shows as numbers; every other type is raw block bytes (uint8).
_PLAIN_TENSORS: dict[GGMLQuantizationType, type[np.generic]] = {
    QT.F16: np.float16, QT.F32: np.float32, QT.F64: np.float64,
    QT.I8: np.int8, QT.I16: np.int16, QT.I32: np.int32, QT.I64: np.int64,
}


GGML_MAX_DIMS = 4


@dataclass(slots=True)
class RawTensor:
    """One tensor as stored: `data` is float (F32/F16) or the raw block bytes (quantized, BF16).

    shape is (rows, cols) in PyTorch order (the file's ne reversed).
    """

    name: str
    qtype: Any  # gguf.GGMLQuantizationType
    shape: tuple[int, ...]
    data: np.ndarray

    @property
    def type_name(self) -> str:
        return self.qtype.name


@dataclass(slots=True)
class _TensorInfo:
    name: str
    ne: tuple[int, ...]  # the file's order: ne[0] is the row length
    qtype: GGMLQuantizationType
    offset: int  # from the start of the data section


def release_pages(data: np.ndarray) -> bool:
    """Drop a tensor's whole pages of its file mapping from this process (MADV_DONTNEED): for a
    tensor the kernels copied into their own layout, whose file pages would otherwise stay
    resident beside the copy. The mapping is read-only, so a later read faults the same bytes
    back from the file; pages shared with a neighbouring tensor at either end stay. Only a view
    of a file mapping is touched (never anonymous memory); returns whether it was one."""
    base = data
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    if isinstance(base, memoryview):  # np.frombuffer's view of the mapping
        base = base.obj
    if not isinstance(base, mmap.mmap) or not hasattr(mmap, "MADV_DONTNEED") or base.closed:
        return False
    start = data.ctypes.data - np.frombuffer(base, np.uint8, 1, 0).ctypes.data
    first = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE
    last = (start + data.nbytes) // mmap.PAGESIZE * mmap.PAGESIZE
    if last > first:
        base.madvise(mmap.MADV_DONTNEED, first, last - first)
    return True


class _HeaderReader:
    """A cursor over the file's bytes; every read past the end is a ModelFileError."""

    def __init__(self, path: Path, buf: mmap.mmap, byte_order: str, offset: int) -> None:
        self.path, self.buf, self.size, self.off = path, buf, len(buf), offset
        self.bo = byte_order  # "<" or ">"
        self._u32, self._u64 = struct.Struct(byte_order + "I"), struct.Struct(byte_order + "Q")
        self._dtypes = {t: np.dtype(d).newbyteorder(byte_order) for t, d in _SCALARS.items()}

    def u32(self, what: str) -> int:
        return self._int(self._u32, what)

    def u64(self, what: str) -> int:
        return self._int(self._u64, what)

    def _int(self, s: struct.Struct, what: str) -> int:
        self.need(s.size, what)
        (value,) = s.unpack_from(self.buf, self.off)
        self.off += s.size
        return value

    def need(self, n: int, what: str) -> None:
        if self.off + n > self.size:
            raise ModelFileError(
                f"{self.path} is truncated or corrupt: {what} at byte {self.off} needs {n} bytes "
                f"but the file has {self.size}; pull or download it again"
            )

    def string(self, what: str) -> str:
        n = self.u64(what)
        self.need(n, what)
        start, self.off = self.off, self.off + n
        return self._decode(self.buf[start : self.off], what)

    def value(self, vtype: int, what: str) -> Any:
        """One metadata value as a Python value; arrays (also nested ones) as one flat list."""
        if vtype == VT.STRING:
            return self.string(what)
        if vtype == VT.ARRAY:
            return self.array(what)
        dtype = self._dtype(vtype, what)
        self.need(dtype.itemsize, what)
        value = np.frombuffer(self.buf, dtype, 1, self.off)[0].item()
        self.off += dtype.itemsize
        return value

    def array(self, what: str) -> list:
        item_type, count = self.u32(what), self.u64(what)
        if item_type == VT.STRING:
            return self._strings(count, what)
        if item_type == VT.ARRAY:
            return [x for _ in range(count) for x in self.array(what)]
        dtype = self._dtype(item_type, what)
        self.need(count * dtype.itemsize, what)
        values = np.frombuffer(self.buf, dtype, count, self.off).tolist()
        self.off += count * dtype.itemsize
        return values

    def _strings(self, count: int, what: str) -> list[str]:
        # The hot loop of opening a model (tokens and merges): well under a microsecond a string.
        buf, off, size, unpack = self.buf, self.off, self.size, self._u64.unpack_from
        out: list[str] = []
        append = out.append
        try:
            for _ in range(count):
                (n,) = unpack(buf, off)
                end = off + 8 + n
                if end > size:
                    break
                append(str(buf[off + 8 : end], "utf-8"))
                off = end
        except struct.error:  # fewer than 8 bytes left for the length
            pass
        except UnicodeDecodeError as e:
            raise ModelFileError(f"{self.path}: {what} item {len(out)} is not UTF-8 ({e})") from None
        self.off = off
        if len(out) < count:
            n = 8 if size - off < 8 else 8 + unpack(buf, off)[0]
            self.need(n, f"{what} item {len(out)} of {count}")  # raises: fewer than n bytes left
        return out

    def _decode(self, data: bytes, what: str) -> str:
        try:
            return str(data, "utf-8")
        except UnicodeDecodeError as e:
            raise ModelFileError(f"{self.path}: {what} is not UTF-8 ({e})") from None

    def _dtype(self, vtype: int, what: str) -> np.dtype:
        dtype = self._dtypes.get(vtype)  # type: ignore[call-overload]
        if dtype is None:
            raise ModelFileError(
                f"{self.path}: {what} has unknown GGUF value type {vtype} at byte {self.off}; "
                f"known types: {', '.join(t.name for t in VT)}"
            )
        return dtype


class GGUFFile:
    """An opened GGUF: `metadata` (key -> Python value), `arch`, and `tensors` by name.

    Tensor data are read-only views of the memory-mapped file (nothing is copied on opening).
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self._check_path()
        with open(self.path, "rb") as f:
            magic = f.read(4)
            if magic != GGUF_MAGIC:
                raise ModelFileError(
                    f"{self.path} is not a GGUF file (starts with {magic!r}, expected b'GGUF'); "
                    "supported: GGUF files and Hugging Face safetensors directories"
                )
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        r = _HeaderReader(self.path, buf, self._byte_order(buf), offset=8)
        n_tensors, n_kv = r.u64("tensor count"), r.u64("metadata count")
        self.metadata: dict[str, Any] = self._read_metadata(r, n_kv)
        infos = [self._read_tensor_info(r, i) for i in range(n_tensors)]
        align = self._alignment()
        data_start = -(-r.off // align) * align
        self.tensors: dict[str, RawTensor] = {}
        for info in infos:
            if info.name in self.tensors:
                raise ModelFileError(f"{self.path}: tensor {info.name!r} appears twice")
            if info.offset % align:
                raise ModelFileError(
                    f"{self.path}: tensor {info.name!r} starts at offset {info.offset} of the "
                    f"data section, not a multiple of general.alignment ({align})")
            self.tensors[info.name] = self._tensor(buf, data_start, info, r.bo)
        self._spans = sorted((i.offset, i.offset + self.tensors[i.name].data.nbytes, i.name)
                             for i in infos)
        self.arch: str = str(self.metadata.get("general.architecture", ""))
        if not self.arch:
            raise ModelFileError(f"{self.path}: no general.architecture in the GGUF metadata")

    def check_overlaps(self) -> None:
        """No two tensors share bytes (a tensor whose size was edited would read its
        neighbour's data as its own). The loader calls it after the shape checks, whose
        message says more about an edited tensor."""
        for (a0, a1, a), (b0, b1, b) in zip(self._spans, self._spans[1:]):
            if b0 < a1 and b1 > b0:
                raise ModelFileError(
                    f"{self.path}: tensors {a!r} (bytes {a0} to {a1} of the data section) and "
                    f"{b!r} (from byte {b0}) overlap; the file is corrupt")

    def _check_path(self) -> None:
        if not self.path.exists():
            raise ModelFileError(f"model file not found: {self.path}")
        if self.path.is_dir():
            raise ModelFileError(
                f"{self.path} is a directory without config.json; expected a .gguf file or a "
                "Hugging Face directory (config.json, *.safetensors, tokenizer.json)"
            )

    def _byte_order(self, buf: mmap.mmap) -> str:
        """'<' or '>': a version whose low 16 bits are 0 was written in the other byte order."""
        if len(buf) < 8:
            raise ModelFileError(f"{self.path} is truncated: {len(buf)} bytes; pull or download it again")
        (version,) = struct.unpack_from("<I", buf, 4)
        bo = "<"
        if version & 0xFFFF == 0:
            (version,), bo = struct.unpack_from(">I", buf, 4), ">"
        if version not in READER_SUPPORTED_VERSIONS:
            raise ModelFileError(
                f"{self.path} is GGUF version {version}; supported versions: "
                f"{', '.join(map(str, READER_SUPPORTED_VERSIONS))}"
            )
        return bo

    def _read_metadata(self, r: _HeaderReader, count: int) -> dict[str, Any]:
        metadata: dict[str, Any] = {}
        for i in range(count):
            key = r.string(f"metadata key {i}")
            value = r.value(r.u32(f"type of {key!r}"), f"metadata {key!r}")
            if key in metadata:
                raise ModelFileError(f"{self.path}: metadata key {key!r} appears twice")
            metadata[key] = value
        return metadata

    def _read_tensor_info(self, r: _HeaderReader, i: int) -> _TensorInfo:
        name = r.string(f"name of tensor {i}")
        what = f"tensor info {name!r}"
        n_dims = r.u32(what)
        if not 1 <= n_dims <= GGML_MAX_DIMS:
            raise ModelFileError(f"{self.path}: tensor {name!r} has {n_dims} dimensions; "
                                 f"GGUF tensors have 1 to {GGML_MAX_DIMS}")
        ne = tuple(r.u64(what) for _ in range(n_dims))
        raw_type, offset = r.u32(what), r.u64(what)
        try:
            qtype = QT(raw_type)
        except ValueError:
            raise ModelFileError(
                f"{self.path}: tensor {name!r} has unknown GGML type {raw_type}; "
                "a newer `gguf` package may know it"
            ) from None
        return _TensorInfo(name, ne, qtype, offset)

    def _alignment(self) -> int:
        align = self.metadata.get("general.alignment", GGUF_DEFAULT_ALIGNMENT)
        if type(align) is not int or align <= 0 or align & (align - 1):
            raise ModelFileError(
                f"{self.path}: general.alignment is {align!r}; expected a power of two"
            )
        return align

    def _tensor(self, buf: mmap.mmap, data_start: int, info: _TensorInfo, bo: str) -> RawTensor:
        shape = tuple(reversed(info.ne))  # (rows, cols)
        n_elements = math.prod(info.ne)
        block_size, type_size = GGML_QUANT_SIZES[info.qtype]
        n_bytes = n_elements * type_size // block_size
        start = data_start + info.offset
        if start + n_bytes > len(buf):
            raise ModelFileError(
                f"{self.path} is truncated: tensor {info.name!r} ends at byte {start + n_bytes} "
                f"but the file has {len(buf)} bytes; pull or download it again"
            )
        plain = _PLAIN_TENSORS.get(info.qtype)
        if plain is not None:
            data = np.frombuffer(buf, np.dtype(plain).newbyteorder(bo), n_elements, start)
            return RawTensor(info.name, info.qtype, shape, data.reshape(shape))
        try:
            byte_shape = quant_shape_to_byte_shape(shape, info.qtype)
        except ValueError as e:
            raise ModelFileError(f"{self.path}: tensor {info.name!r}: {e}") from None
        data = np.frombuffer(buf, np.uint8, n_bytes, start).reshape(byte_shape)
        return RawTensor(info.name, info.qtype, shape, data)

    def get(self, key: str, default: Any = None) -> Any:
        """An architecture-scoped key, e.g. get('block_count') reads '{arch}.block_count'."""
        return self.metadata.get(f"{self.arch}.{key}", default)

    def require(self, key: str) -> Any:
        value = self.get(key)
        if value is None:
            raise ModelFileError(f"{self.path}: missing GGUF metadata '{self.arch}.{key}'")
        return value

    @property
    def weight_bytes(self) -> int:
        return sum(int(t.data.nbytes) for t in self.tensors.values())
