"""GGUFFile reads what gguf.GGUFReader reads (metadata values, tensor types, shapes, bytes), much
faster, and names the file in a clear error when the file is missing, cut off or not GGUF."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf import GGUFEndian, GGUFReader, GGUFValueType, GGUFWriter
from gguf import quants as gguf_quants

from tandem.errors import ModelFileError
from tandem.models.gguf_file import GGUFFile

# ---- reference: what the previous GGUFReader-based implementation produced --------------------


def reader_view(path: Path) -> tuple[dict, dict]:
    """(metadata, tensors) from gguf.GGUFReader: values from field.contents(), tensors as
    name -> (qtype, (rows, cols), data)."""
    reader = GGUFReader(path, "r")
    metadata = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        value = field.contents()
        metadata[key] = value.item() if isinstance(value, np.generic) else value
    tensors = {t.name: (t.tensor_type, tuple(reversed(t.shape.tolist())), t.data)
               for t in reader.tensors}
    return metadata, tensors


def assert_same_metadata(ours: dict, ref: dict) -> None:
    assert list(ours) == list(ref)
    for key, value in ref.items():
        assert ours[key] == value, key
        assert type(ours[key]) is type(value), key
        if isinstance(value, list):
            assert [type(x) for x in ours[key]] == [type(x) for x in value], key


def assert_same_tensor(ours, ref, full: bool = True) -> None:
    qtype, shape, data = ref
    assert (ours.qtype, ours.shape) == (qtype, shape), ours.name
    assert (ours.data.dtype, ours.data.shape) == (data.dtype, data.shape), ours.name
    a, b = ours.data.reshape(-1).view(np.uint8), data.reshape(-1).view(np.uint8)
    if full:
        assert np.array_equal(a, b), ours.name
    else:  # the first and last bytes place the tensor at the same offset with the same size
        assert np.array_equal(a[:256], b[:256]) and np.array_equal(a[-256:], b[-256:]), ours.name


# ---- tiny files written with gguf.GGUFWriter --------------------------------------------------

VT = GGUFValueType
SCALARS = [
    ("t.u8", 200, VT.UINT8), ("t.i8", -100, VT.INT8), ("t.u16", 60000, VT.UINT16),
    ("t.i16", -30000, VT.INT16), ("t.u32", 4_000_000_000, VT.UINT32), ("t.i32", -2_000_000_000, VT.INT32),
    ("t.u64", 2**63 + 5, VT.UINT64), ("t.i64", -(2**62), VT.INT64), ("t.f32", 1e-6, VT.FLOAT32),
    ("t.f64", 1 / 3, VT.FLOAT64), ("t.bool", True, VT.BOOL), ("t.str", "héllo ✓", VT.STRING),
]


def write_gguf(path: Path, endianess: GGUFEndian = GGUFEndian.LITTLE, alignment: int | None = None,
               arch: str | None = "llama") -> dict[str, np.ndarray]:
    """A small GGUF with every metadata value type and F32/F16/BF16/Q8_0/Q4_0 tensors; returns the
    float values of the tensors by name."""
    w = GGUFWriter(path, arch or "llama", endianess=endianess)
    if arch is None:
        w.kv_data[0].pop("general.architecture")
    if alignment:
        w.add_custom_alignment(alignment)
    for key, value, vtype in SCALARS:
        w.add_key_value(key, value, vtype)
    w.add_array("t.ints", [3, -1, 4, 1, -5])
    w.add_key_value("t.u8s", [1, 2, 255], VT.ARRAY, VT.UINT8)
    w.add_array("t.floats", [0.5, -2.25, 1e-3])
    w.add_array("t.bools", [True, False, True])
    w.add_array("t.strings", ["a", "", "Ġhello", "日本", "<|im_end|>"])
    w.add_array("t.nested", [[1, 2], [3, 4, 5]])
    w.add_array("t.nested_strings", [["x", "yz"], ["w"]])
    w.add_block_count(2)
    rng = np.random.default_rng(0)
    values = {name: rng.standard_normal(shape).astype(np.float32)
              for name, shape in [("norm", (64,)), ("f32", (3, 64)), ("f16", (4, 64)),
                                  ("bf16", (2, 64)), ("q8", (5, 64)), ("q4", (6, 64))]}
    w.add_tensor("norm", values["norm"])
    w.add_tensor("f32", values["f32"])
    w.add_tensor("f16", values["f16"].astype(np.float16))
    for name, qtype in [("bf16", QT.BF16), ("q8", QT.Q8_0), ("q4", QT.Q4_0)]:
        w.add_tensor(name, gguf_quants.quantize(values[name], qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return values


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_gguf(path)
    return path


def test_tiny_file_equals_gguf_reader(tiny):
    g = GGUFFile(tiny)
    metadata, tensors = reader_view(tiny)
    assert_same_metadata(g.metadata, metadata)
    assert list(g.tensors) == list(tensors)
    for name, ref in tensors.items():
        assert_same_tensor(g.tensors[name], ref)
    assert g.path == tiny and g.arch == "llama"
    assert g.get("block_count") == g.require("block_count") == 2
    assert g.weight_bytes == sum(int(d.nbytes) for _, _, d in tensors.values())


def test_tiny_file_values(tiny):
    g = GGUFFile(tiny)
    for key, value, vtype in SCALARS:
        expected = float(np.float32(value)) if vtype == VT.FLOAT32 else value
        assert g.metadata[key] == expected and type(g.metadata[key]) is type(value), key
    assert g.metadata["t.u8s"] == [1, 2, 255]
    assert g.metadata["t.floats"] == [0.5, -2.25, float(np.float32(1e-3))]
    assert g.metadata["t.strings"] == ["a", "", "Ġhello", "日本", "<|im_end|>"]
    assert g.metadata["t.nested"] == [1, 2, 3, 4, 5]  # flattened, as GGUFReader does
    assert g.metadata["t.nested_strings"] == ["x", "yz", "w"]
    assert g.tensors["f32"].shape == (3, 64) and g.tensors["norm"].shape == (64,)
    assert g.tensors["q8"].data.shape == (5, 2 * 34) and g.tensors["q8"].data.dtype == np.uint8
    assert not g.tensors["f32"].data.flags.writeable  # a view of the mapped file, not a copy


@pytest.mark.parametrize("endianess", [GGUFEndian.LITTLE, GGUFEndian.BIG])
def test_weights_read_back_in_either_byte_order_and_custom_alignment(tmp_path, endianess):
    path = tmp_path / "m.gguf"
    values = write_gguf(path, endianess=endianess, alignment=512)
    order = "big" if endianess == GGUFEndian.BIG else "little"
    assert path.read_bytes()[4:8] == (3).to_bytes(4, order)  # the version, in that byte order
    g = GGUFFile(path)
    assert_same_metadata(g.metadata, reader_view(path)[0])
    assert g.metadata["general.alignment"] == 512 and g.metadata["t.i64"] == -(2**62)
    assert np.array_equal(g.tensors["f32"].data, values["f32"])
    assert np.array_equal(g.tensors["f16"].data, values["f16"].astype(np.float16))
    q8 = gguf_quants.dequantize(g.tensors["q8"].data, QT.Q8_0)
    assert np.abs(q8 - values["q8"]).max() < 0.05


# ---- errors ------------------------------------------------------------------------------------


def _cut(src: Path, dst: Path, n: int) -> Path:
    dst.write_bytes(src.read_bytes()[:n])
    return dst


def test_truncated_header_names_the_file(tiny, tmp_path):
    data = tiny.read_bytes()
    strings_at = data.index("Ġhello".encode())  # inside the string array t.strings
    tensor_info_at = data.index(b"bf16")
    for n in [6, 20, 40, strings_at + 2, tensor_info_at + 2, tensor_info_at + 14]:
        path = _cut(tiny, tmp_path / f"cut{n}.gguf", n)
        with pytest.raises(ModelFileError, match=f"{path.name} is truncated"):
            GGUFFile(path)


def test_truncated_tensor_data_names_the_tensor(tiny, tmp_path):
    path = _cut(tiny, tmp_path / "cut.gguf", tiny.stat().st_size - 10)
    with pytest.raises(ModelFileError, match=r"cut.gguf is truncated: tensor 'q4' ends at byte"):
        GGUFFile(path)


def test_not_gguf_empty_missing_and_directory(tmp_path):
    bad = tmp_path / "model.bin"
    bad.write_bytes(b"PK\x03\x04" + bytes(100))
    with pytest.raises(ModelFileError, match=r"model.bin is not a GGUF file \(starts with b'PK"):
        GGUFFile(bad)
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    with pytest.raises(ModelFileError, match=r"empty.gguf is not a GGUF file \(starts with b''"):
        GGUFFile(empty)
    with pytest.raises(ModelFileError, match="model file not found: .*nothing.gguf"):
        GGUFFile(tmp_path / "nothing.gguf")
    with pytest.raises(ModelFileError, match="is a directory"):
        GGUFFile(tmp_path)


def test_unsupported_version_and_missing_architecture(tiny, tmp_path):
    v1 = tmp_path / "v1.gguf"
    v1.write_bytes(b"GGUF" + (1).to_bytes(4, "little") + tiny.read_bytes()[8:])
    with pytest.raises(ModelFileError, match="v1.gguf is GGUF version 1; supported versions: 2, 3"):
        GGUFFile(v1)
    no_arch = tmp_path / "noarch.gguf"
    write_gguf(no_arch, arch=None)
    with pytest.raises(ModelFileError, match="noarch.gguf: no general.architecture"):
        GGUFFile(no_arch)


def test_unknown_value_type_is_reported(tiny, tmp_path):
    data = bytearray(tiny.read_bytes())
    at = data.index(b"t.u8") + 4  # the u32 value type follows the key
    data[at : at + 4] = (99).to_bytes(4, "little")
    path = tmp_path / "badtype.gguf"
    path.write_bytes(bytes(data))
    with pytest.raises(ModelFileError, match=r"badtype.gguf: metadata 't.u8' has unknown GGUF value type 99"):
        GGUFFile(path)


# ---- the real model files ----------------------------------------------------------------------


@pytest.mark.real
@pytest.mark.parametrize("name", ["default", "default-draft", "smollm2-135m", "gemma3-270m"])
def test_real_file_equals_gguf_reader_and_opens_fast(name, capsys):
    from tandem.registry import pull

    path = pull(name, quiet=True)
    start = time.perf_counter()
    g = GGUFFile(path)
    ours = time.perf_counter() - start
    start = time.perf_counter()
    metadata, tensors = reader_view(path)
    theirs = time.perf_counter() - start
    with capsys.disabled():
        print(f"\n{Path(path).name}: GGUFFile {ours:.2f} s, gguf.GGUFReader {theirs:.2f} s")
    assert_same_metadata(g.metadata, metadata)
    assert list(g.tensors) == list(tensors)
    names = list(tensors)
    sample = set(names[:3] + names[-3:] + [n for n in names if n.endswith("norm.weight")][:2])
    for tensor_name, ref in tensors.items():
        assert_same_tensor(g.tensors[tensor_name], ref, full=tensor_name in sample)
    assert g.weight_bytes == sum(int(d.nbytes) for _, _, d in tensors.values())
    assert ours < 2.0, f"opening {path} took {ours:.2f} s"
