"""A model split by gguf-split (NAME-00001-of-00003.gguf ...) opened from its first shard as one
model, as llama-server opens it: the same answers as the single file, tensors read in place
from each shard's mapping, every broken split refused naming the file and what is wrong."""

from __future__ import annotations

import functools
import json
import mmap
import shutil
import struct

import gguf
import httpx
import numpy as np
import pytest

from tandem.check import inspect_model
from tandem.cli import main
from tandem.errors import ModelFileError
from tandem.memory import fmt_bytes
from tandem.models.gguf_file import GGUFFile, release_pages

from . import tiny
from .servers import GREEDY, Server

QT = gguf.GGMLQuantizationType
PROMPT = "def add(a, b):"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """A tiny Q8_0 qwen2 as one file and as three shards written by the gguf package's own
    splitting writer (10 tensors a shard, 27 in all), as convert_hf_to_gguf --split-max-tensors
    and gguf-split write them."""
    d = tmp_path_factory.mktemp("split")
    m = tiny.hf_model("qwen2", seed=7)
    single = tiny.write_gguf(m, d / "single.gguf", "qwen2", qtype=QT.Q8_0)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gguf, "GGUFWriter", functools.partial(gguf.GGUFWriter, split_max_tensors=10))
        tiny.write_gguf(m, d / "m.gguf", "qwen2", qtype=QT.Q8_0)
    shards = [d / f"m-{k:05d}-of-00003.gguf" for k in (1, 2, 3)]
    assert all(p.is_file() for p in shards) and not (d / "m.gguf").exists()
    return single, shards


@pytest.fixture
def copy(model, tmp_path):
    """A fresh copy of the shards to break."""
    return [shutil.copy(p, tmp_path / p.name) for p in model[1]]


def _mapping(a: np.ndarray):
    while isinstance(a, np.ndarray) and a.base is not None:
        a = a.base
    return a.obj if isinstance(a, memoryview) else a


def _patch_key(path, key: str, fmt: str, value: int) -> None:
    """Overwrite metadata `key`'s value (just after its u32 type) in place."""
    data = bytearray(path.read_bytes())
    at = data.index(struct.pack("<Q", len(key)) + key.encode()) + 8 + len(key) + 4
    struct.pack_into(fmt, data, at, value)
    path.write_bytes(bytes(data))


def _tensor_names(path) -> list[str]:
    return [t.name for t in gguf.GGUFReader(path).tensors]


def _gen(capsys, path) -> dict:
    code = main(["generate", "-t", "1", "-m", str(path), "-p", PROMPT, "-n", "12", "--temp", "0",
                 "--ignore-eos", "--json"])
    out = capsys.readouterr()
    assert code == 0, out.err
    return json.loads(out.out)


def test_the_shards_are_one_model(model):
    single, shards = model
    one, split = GGUFFile(single), GGUFFile(shards[0])
    assert split.files == shards and one.files == [single]
    assert split.metadata["split.count"] == 3 and split.arch == "qwen2"
    assert list(split.tensors) == list(one.tensors)  # all 27, in the file's order
    for name, t in split.tensors.items():
        assert t.qtype == one.tensors[name].qtype and t.shape == one.tensors[name].shape
        assert np.array_equal(t.data, one.tensors[name].data)
    assert split.weight_bytes == one.weight_bytes
    assert split.size_on_disk == sum(p.stat().st_size for p in shards) > one.size_on_disk
    assert one.size_on_disk == single.stat().st_size
    split.check_overlaps()


def test_tensors_are_views_of_their_own_shard(model):
    shards = model[1]
    split = GGUFFile(shards[0])
    by_file = {name: p for p in shards for name in _tensor_names(p)}
    maps = {}
    for name, t in split.tensors.items():
        m = _mapping(t.data)
        assert isinstance(m, mmap.mmap), name  # nothing copied
        assert not t.data.flags.writeable and not t.data.flags.owndata
        assert len(m) == by_file[name].stat().st_size  # its own shard's mapping
        maps.setdefault(by_file[name], set()).add(id(m))
    assert len(maps) == 3 and all(len(ids) == 1 for ids in maps.values())
    # the kernels' release of a copied tensor's file pages finds each shard's mapping
    assert all(release_pages(t.data) for t in split.tensors.values())


def test_greedy_output_equals_the_single_file(model, capsys):
    single, shards = model
    a, b = _gen(capsys, single), _gen(capsys, shards[0])
    assert a["tokens_predicted"] == 12
    assert b["tokens"] == a["tokens"] and b["content"] == a["content"]


def test_check_counts_every_shard(model, capsys):
    shards = model[1]
    total = sum(p.stat().st_size for p in shards)
    assert inspect_model("target", str(shards[0])).size == total
    code = main(["check", "-m", str(shards[0]), "-c", "256"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"{fmt_bytes(total)} on disk" in out and "(qwen2, 2 layers, dim 64" in out
    assert "memory plan" in out and out.rstrip().endswith("verdict: can run")


def test_a_later_shard_names_the_first(model):
    shards = model[1]
    with pytest.raises(ModelFileError, match="shard 2 of 3") as e:
        GGUFFile(shards[1])
    assert f"load the first shard, {shards[0]}" in str(e.value)


def test_a_missing_shard(copy):
    copy[1].unlink()
    with pytest.raises(ModelFileError) as e:
        GGUFFile(copy[0])
    assert f"{copy[1]} is missing: shard 2 of 3" in str(e.value)


def test_a_wrong_split_count(copy):
    _patch_key(copy[2], "split.count", "<H", 4)
    with pytest.raises(ModelFileError) as e:
        GGUFFile(copy[0])
    assert f"{copy[2]}: split.count is 4 but the first shard {copy[0]} says 3" in str(e.value)


def test_a_shard_numbered_unlike_its_name(copy):
    _patch_key(copy[1], "split.no", "<H", 2)
    with pytest.raises(ModelFileError) as e:
        GGUFFile(copy[0])
    assert f"{copy[1]}: split.no is 2 but its name says shard 2 of 3" in str(e.value)


def test_a_wrong_total_tensor_count(copy):
    _patch_key(copy[0], "split.tensors.count", "<i", 28)
    with pytest.raises(ModelFileError, match="split.tensors.count is 28 but the 3 shards hold 27"):
        GGUFFile(copy[0])


def test_a_tensor_in_two_shards(copy):
    """A name of the last shard renamed to a first-shard tensor's name of the same length."""
    first, last = _tensor_names(copy[0]), _tensor_names(copy[2])
    old, new = next((a, b) for a in last for b in first if len(a) == len(b))
    data = copy[2].read_bytes()
    copy[2].write_bytes(data.replace(struct.pack("<Q", len(old)) + old.encode(),
                                     struct.pack("<Q", len(new)) + new.encode()))
    with pytest.raises(ModelFileError) as e:
        GGUFFile(copy[0])
    assert f"{copy[2]}: tensor {new!r} is also in {copy[0]}" in str(e.value)


def test_overlapping_tensors_in_a_shard(copy):
    """The last shard's second tensor moved onto its first: check_overlaps names that shard."""
    a, b = gguf.GGUFReader(copy[2]).tensors[:2]
    data = bytearray(copy[2].read_bytes())
    info = data.index(struct.pack("<Q", len(b.name)) + b.name.encode()) + 8 + len(b.name)
    at = info + 4 + 8 * len(b.shape) + 4  # n_dims, ne, type: then the u64 offset
    offset = struct.unpack_from("<Q", data, at)[0]  # from the start of the data section
    struct.pack_into("<Q", data, at, offset - (b.data_offset - a.data_offset))
    copy[2].write_bytes(bytes(data))
    g = GGUFFile(copy[0])
    with pytest.raises(ModelFileError, match="overlap") as e:
        g.check_overlaps()
    assert str(e.value).startswith(f"{copy[2]}: tensors ")


def test_serve_the_first_shard_answers_completion(model, tmp_path, capsys):
    single, shards = model
    want = _gen(capsys, single)
    s = Server(["--model", str(shards[0]), "--ctx-size", "256", "-t", "1"], tmp_path / "s.log")
    try:
        s.wait_ready(120)
        r = httpx.post(f"{s.url}/completion", timeout=60, json={
            "prompt": PROMPT, "n_predict": 12, "ignore_eos": True, "return_tokens": True,
            **GREEDY})
        assert r.status_code == 200, r.text
        assert r.json()["tokens"] == want["tokens"]
        assert r.json()["content"] == want["content"]
    finally:
        s.stop()
