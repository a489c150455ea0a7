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


# llama.cpp's gguf-split: NAME-00001-of-0000N.gguf ... (llama_split_path); the first shard holds
# the metadata, every shard these keys and its own tensors.
SPLIT_NO, SPLIT_COUNT, SPLIT_TENSORS = "split.no", "split.count", "split.tensors.count"
SHARD_NAME = "{}-{:05d}-of-{:05d}.gguf"


@dataclass(slots=True)
class _File:
    """One GGUF file as read: its metadata, its tensors (views of its mapping) and their spans."""

    path: Path
    metadata: dict[str, Any]
    tensors: dict[str, RawTensor]
    spans: list[tuple[int, int, str]]  # (start, end, name) in the data section, sorted

    def split_key(self, key: str) -> int | None:
        value = self.metadata.get(key)
        if value is not None and (type(value) is not int or value < 0):
            raise ModelFileError(f"{self.path}: {key} is {value!r}; expected a count")
        return value


class GGUFFile:
    """An opened GGUF: `metadata` (key -> Python value), `arch`, and `tensors` by name.

    Tensor data are read-only views of the memory-mapped file (nothing is copied on opening).
    A model split by gguf-split is opened from its first shard, as llama.cpp opens it: every
    shard is mapped, `tensors` holds all of theirs (each a view of its own shard), `metadata`
    is the first shard's and `files` lists the shards.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        first = _read_file(self.path)
        self.metadata: dict[str, Any] = first.metadata
        self.tensors: dict[str, RawTensor] = dict(first.tensors)
        self._files = [first]
        count = first.split_key(SPLIT_COUNT) or 1
        if count > 1:
            self._check_first(first.split_key(SPLIT_NO), count)
        self.arch: str = str(self.metadata.get("general.architecture", ""))
        if not self.arch:
            raise ModelFileError(f"{self.path}: no general.architecture in the GGUF metadata")
        if count > 1:
            self._open_shards(count)

    @property
    def files(self) -> list[Path]:
        """The files of the model: its one file, or every shard in order."""
        return [f.path for f in self._files]

    @property
    def size_on_disk(self) -> int:
        return sum(p.stat().st_size for p in self.files)

    def check_overlaps(self) -> None:
        """No two tensors of a file share bytes (a tensor whose size was edited would read its
        neighbour's data as its own). The loader calls it after the shape checks, whose
        message says more about an edited tensor."""
        for f in self._files:
            for (a0, a1, a), (b0, b1, b) in zip(f.spans, f.spans[1:]):
                if b0 < a1 and b1 > b0:
                    raise ModelFileError(
                        f"{f.path}: tensors {a!r} (bytes {a0} to {a1} of the data section) and "
                        f"{b!r} (from byte {b0}) overlap; the file is corrupt")

    def _shard_path(self, no: int, count: int, k: int) -> Path | None:
        """Shard k's path (0-based) from this file's name as shard `no` of `count`, or None
        where the name does not end in -0000{no+1}-of-0000{count}.gguf."""
        tail = SHARD_NAME.format("", no + 1, count)
        name = self.path.name
        if not name.endswith(tail) or len(name) == len(tail):
            return None
        return self.path.with_name(SHARD_NAME.format(name[: -len(tail)], k + 1, count))

    def _check_first(self, no: int | None, count: int) -> None:
        if no is None:
            raise ModelFileError(f"{self.path}: {SPLIT_COUNT} is {count} but {SPLIT_NO} is missing")
        if no == 0:
            if self._shard_path(0, count, 0) is None:
                raise ModelFileError(
                    f"{self.path} is shard 1 of {count} of a split model but is not named as "
                    f"gguf-split names its shards (NAME{SHARD_NAME.format('', 1, count)}), so "
                    "the other shards cannot be found; rename the shards")
            return
        first = self._shard_path(no, count, 0)
        where = (f"load the first shard, {first}" if first is not None
                 else "load the first shard (split.no 0)")
        raise ModelFileError(f"{self.path} is shard {no + 1} of {count} of a split model; "
                             f"{where}, which opens the others (as llama.cpp does)")

    def _open_shards(self, count: int) -> None:
        """Shards 2..count beside the first: each present, numbered as named, of the same
        count, no tensor twice, and all of them holding split.tensors.count tensors."""
        for k in range(1, count):
            path = self._shard_path(0, count, k)
            assert path is not None  # _check_first checked the name
            if not path.is_file():
                raise ModelFileError(f"{path} is missing: shard {k + 1} of {count} of the split "
                                     f"model {self.path}; download every shard")
            f = _read_file(path)
            n, no = f.split_key(SPLIT_COUNT), f.split_key(SPLIT_NO)
            if n != count:
                raise ModelFileError(f"{path}: {SPLIT_COUNT} is {n} but the first shard "
                                     f"{self.path} says {count}; the shards do not belong together")
            if no != k:
                raise ModelFileError(f"{path}: {SPLIT_NO} is {no} but its name says shard "
                                     f"{k + 1} of {count} ({SPLIT_NO} {k})")
            for name, t in f.tensors.items():
                if name in self.tensors:
                    other = next(g.path for g in self._files if name in g.tensors)
                    raise ModelFileError(f"{path}: tensor {name!r} is also in {other}; a tensor "
                                         "appears twice in the split model")
                self.tensors[name] = t
            self._files.append(f)
        total = self._files[0].split_key(SPLIT_TENSORS)
        if total != len(self.tensors):
            raise ModelFileError(
                f"{self.path}: {SPLIT_TENSORS} is {total} but the {count} shards hold "
                f"{len(self.tensors)} tensors; a shard is from another model or corrupt")

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


def _read_file(path: Path) -> _File:
    """One GGUF file's metadata and tensors, each tensor a view of the file's mapping."""
    _check_path(path)
    with open(path, "rb") as f:
        magic = f.read(4)
        if magic != GGUF_MAGIC:
            raise ModelFileError(
                f"{path} is not a GGUF file (starts with {magic!r}, expected b'GGUF'); "
                "supported: GGUF files and Hugging Face safetensors directories"
            )
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    r = _HeaderReader(path, buf, _byte_order(path, buf), offset=8)
    n_tensors, n_kv = r.u64("tensor count"), r.u64("metadata count")
    metadata = _read_metadata(r, n_kv)
    infos = [_read_tensor_info(r, i) for i in range(n_tensors)]
    align = _alignment(path, metadata)
    data_start = -(-r.off // align) * align
    tensors: dict[str, RawTensor] = {}
    for info in infos:
        if info.name in tensors:
            raise ModelFileError(f"{path}: tensor {info.name!r} appears twice")
        if info.offset % align:
            raise ModelFileError(
                f"{path}: tensor {info.name!r} starts at offset {info.offset} of the "
                f"data section, not a multiple of general.alignment ({align})")
        tensors[info.name] = _tensor(r, data_start, info)
    spans = sorted((i.offset, i.offset + tensors[i.name].data.nbytes, i.name) for i in infos)
    return _File(path, metadata, tensors, spans)


def _check_path(path: Path) -> None:
    if not path.exists():
        raise ModelFileError(f"model file not found: {path}")
    if path.is_dir():
        raise ModelFileError(
            f"{path} is a directory without config.json; expected a .gguf file or a "
            "Hugging Face directory (config.json, *.safetensors, tokenizer.json)"
        )


def _byte_order(path: Path, buf: mmap.mmap) -> str:
    """'<' or '>': a version whose low 16 bits are 0 was written in the other byte order."""
    if len(buf) < 8:
        raise ModelFileError(f"{path} is truncated: {len(buf)} bytes; pull or download it again")
    (version,) = struct.unpack_from("<I", buf, 4)
    bo = "<"
    if version & 0xFFFF == 0:
        (version,), bo = struct.unpack_from(">I", buf, 4), ">"
    if version not in READER_SUPPORTED_VERSIONS:
        raise ModelFileError(
            f"{path} is GGUF version {version}; supported versions: "
            f"{', '.join(map(str, READER_SUPPORTED_VERSIONS))}"
        )
    return bo


def _read_metadata(r: _HeaderReader, count: int) -> dict[str, Any]:
    metadata: dict[str, Any] = {}
    for i in range(count):
        key = r.string(f"metadata key {i}")
        value = r.value(r.u32(f"type of {key!r}"), f"metadata {key!r}")
        if key in metadata:
            raise ModelFileError(f"{r.path}: metadata key {key!r} appears twice")
        metadata[key] = value
    return metadata


def _read_tensor_info(r: _HeaderReader, i: int) -> _TensorInfo:
    name = r.string(f"name of tensor {i}")
    what = f"tensor info {name!r}"
    n_dims = r.u32(what)
    if not 1 <= n_dims <= GGML_MAX_DIMS:
        raise ModelFileError(f"{r.path}: tensor {name!r} has {n_dims} dimensions; "
                             f"GGUF tensors have 1 to {GGML_MAX_DIMS}")
    ne = tuple(r.u64(what) for _ in range(n_dims))
    raw_type, offset = r.u32(what), r.u64(what)
    try:
        qtype = QT(raw_type)
    except ValueError:
        raise ModelFileError(
            f"{r.path}: tensor {name!r} has unknown GGML type {raw_type}; "
            "a newer `gguf` package may know it"
        ) from None
    return _TensorInfo(name, ne, qtype, offset)


def _alignment(path: Path, metadata: dict[str, Any]) -> int:
    align = metadata.get("general.alignment", GGUF_DEFAULT_ALIGNMENT)
    if type(align) is not int or align <= 0 or align & (align - 1):
        raise ModelFileError(f"{path}: general.alignment is {align!r}; expected a power of two")
    return align


def _tensor(r: _HeaderReader, data_start: int, info: _TensorInfo) -> RawTensor:
    buf, path = r.buf, r.path
    shape = tuple(reversed(info.ne))  # (rows, cols)
    n_elements = math.prod(info.ne)
    block_size, type_size = GGML_QUANT_SIZES[info.qtype]
    n_bytes = n_elements * type_size // block_size
    start = data_start + info.offset
    if start + n_bytes > len(buf):
        raise ModelFileError(
            f"{path} is truncated: tensor {info.name!r} ends at byte {start + n_bytes} "
            f"but the file has {len(buf)} bytes; pull or download it again"
        )
    plain = _PLAIN_TENSORS.get(info.qtype)
    if plain is not None:
        data = np.frombuffer(buf, np.dtype(plain).newbyteorder(r.bo), n_elements, start)
        return RawTensor(info.name, info.qtype, shape, data.reshape(shape))
    try:
        byte_shape = quant_shape_to_byte_shape(shape, info.qtype)
    except ValueError as e:
        raise ModelFileError(f"{path}: tensor {info.name!r}: {e}") from None
    data = np.frombuffer(buf, np.uint8, n_bytes, start).reshape(byte_shape)
    return RawTensor(info.name, info.qtype, shape, data)
