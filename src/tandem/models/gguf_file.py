"""Reading GGUF files with the `gguf` package: checked opening, metadata as Python values."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ModelFileError

GGUF_MAGIC = b"GGUF"


@dataclass(slots=True)
class RawTensor:
    """One tensor as stored: `data` is float (F32/F16/BF16) or the raw block bytes (quantized).

    shape is (rows, cols) in PyTorch order (the file's ne reversed).
    """

    name: str
    qtype: Any  # gguf.GGMLQuantizationType
    shape: tuple[int, ...]
    data: np.ndarray

    @property
    def type_name(self) -> str:
        return self.qtype.name


def _field_value(field) -> Any:
    from gguf import GGUFValueType

    value = field.contents()
    if field.types and field.types[0] == GGUFValueType.ARRAY and isinstance(value, list):
        return value
    if isinstance(value, np.generic):
        return value.item()
    return value


class GGUFFile:
    """An opened GGUF: `metadata` (key -> Python value), `arch`, and `tensors` by name."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        if not self.path.exists():
            raise ModelFileError(f"model file not found: {self.path}")
        if self.path.is_dir():
            raise ModelFileError(
                f"{self.path} is a directory without config.json; expected a .gguf file or a "
                "Hugging Face directory (config.json, *.safetensors, tokenizer.json)"
            )
        size = self.path.stat().st_size
        with open(self.path, "rb") as f:
            magic = f.read(4)
        if magic != GGUF_MAGIC:
            raise ModelFileError(
                f"{self.path} is not a GGUF file (starts with {magic!r}, expected b'GGUF'); "
                "supported: GGUF files and Hugging Face safetensors directories"
            )
        from gguf import GGUFReader

        try:
            self.reader = GGUFReader(self.path, "r")
        except Exception as e:  # the reader raises assorted errors on a cut-off header
            raise ModelFileError(
                f"{self.path} is a truncated or corrupt GGUF file ({type(e).__name__}: {e}); "
                "pull or download it again"
            ) from None
        self.metadata: dict[str, Any] = {}
        for key, field in self.reader.fields.items():
            if key.startswith("GGUF."):
                continue
            try:
                self.metadata[key] = _field_value(field)
            except Exception as e:
                raise ModelFileError(f"{self.path}: cannot read metadata {key!r}: {e}") from None
        self.tensors: dict[str, RawTensor] = {}
        for t in self.reader.tensors:
            end = int(t.data_offset) + int(t.n_bytes)
            if end > size:
                raise ModelFileError(
                    f"{self.path} is truncated: tensor {t.name!r} ends at byte {end} but the file "
                    f"has {size} bytes; pull or download it again"
                )
            shape = tuple(int(x) for x in reversed(t.shape.tolist()))
            self.tensors[t.name] = RawTensor(t.name, t.tensor_type, shape, t.data)
        self.arch: str = str(self.metadata.get("general.architecture", ""))
        if not self.arch:
            raise ModelFileError(f"{self.path}: no general.architecture in the GGUF metadata")

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
