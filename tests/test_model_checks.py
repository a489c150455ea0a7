"""A damaged model file is refused at load, before any kernel reads it, with one message naming
the tensor or key, what was expected and what the file has (issue 20's cases: a norm with twice
its values, attention weights with half, double or swapped dimensions, metadata out of range or
of the wrong type, blocks missing or extra, tensors overlapping or misaligned, a tokenizer
larger than the embedding). The CLI exits 2; `tandem serve` exits 2 without serving.

Files are edited in place through gguf's own reader (GGUFReader in "r+" mode), as a user's
hex editor would: header values change, nothing moves."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

from tandem.errors import ModelFileError
from tandem.models.loader import load_model
from tests import tiny

GEN = [sys.executable, "-m", "tandem.cli", "generate"]


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("checks")
    return tiny.write_gguf(tiny.hf_model("qwen2", seed=1), d / "good.gguf", "qwen2")


def edited(good: Path, tmp_path: Path, edit) -> Path:
    path = tmp_path / "edited.gguf"
    shutil.copy(good, path)
    r = gguf.GGUFReader(path, "r+")
    edit(r)
    r.data.flush()
    del r
    return path


def tensor_part(r: gguf.GGUFReader, name: str, part: str) -> np.ndarray:
    """A tensor info's field in the file: "dims" (the file's order, row length first),
    "type" or "offset"."""
    field = next(t.field for t in r.tensors if t.name == name)
    return field.parts[{"dims": 3, "type": 4, "offset": 5}[part]]


def meta(r: gguf.GGUFReader, key: str) -> np.ndarray:
    return r.fields[key].parts[-1]


def refused(path: Path, *needles: str) -> str:
    with pytest.raises(ModelFileError) as e:
        load_model(path)
    message = str(e.value)
    for n in needles:
        assert n in message, message
    return message


def test_the_undamaged_file_loads(good):
    assert load_model(good).args.n_layers == 2


def test_a_norm_with_twice_its_values(good, tmp_path):
    def edit(r):
        tensor_part(r, "blk.0.ffn_norm.weight", "dims")[0] *= 2

    refused(edited(good, tmp_path, edit), "'blk.0.ffn_norm.weight'", "shape [128]",
            "expected [64]", "qwen2.embedding_length 64")


@pytest.mark.parametrize("change", ["half", "double", "swapped"])
def test_attention_weights_with_wrong_dimensions(good, tmp_path, change):
    def edit(r):
        dims = tensor_part(r, "blk.0.attn_q.weight", "dims")  # (64 in, 64 out)
        if change == "half":
            dims[1] //= 2
        elif change == "double":
            dims[1] *= 2
        else:  # attn_k (32 rows of 64) given as 64 rows of 32
            k = tensor_part(r, "blk.0.attn_k.weight", "dims")
            k[:] = k[::-1].copy()

    name = "'blk.0.attn_k.weight'" if change == "swapped" else "'blk.0.attn_q.weight'"
    message = refused(edited(good, tmp_path, edit), name, "expected", "head dimension 16")
    assert "shape [64, 32]" in message if change == "swapped" else "columns" in message


@pytest.mark.parametrize("key,value,needles", [
    ("qwen2.attention.head_count", 0, ["head_count is 0", "from 1 to"]),
    ("qwen2.attention.head_count", 3, ["head_count (3) is not a multiple", "head_count_kv (2)"]),
    ("qwen2.block_count", 3, ["missing tensor 'blk.2."]),
    ("qwen2.block_count", 1, ["'blk.1.", "belongs to block 1", "block_count is 1"]),
    ("qwen2.embedding_length", 1 << 30, ["embedding_length is 1073741824", "from 1 to 65536"]),
    ("qwen2.context_length", 0, ["context_length is 0"]),
])
def test_metadata_out_of_range_or_inconsistent(good, tmp_path, key, value, needles):
    def edit(r):
        meta(r, key)[0] = value

    refused(edited(good, tmp_path, edit), *needles)


def test_metadata_of_the_wrong_type_or_not_finite(good, tmp_path):
    def float_head_count(r):  # the value's type tag says float32 now (4 bytes either way)
        field = r.fields["qwen2.attention.head_count"]
        field.parts[2][0] = gguf.GGUFValueType.FLOAT32
        field.parts[3].view(np.float32)[0] = 2.5

    refused(edited(good, tmp_path, float_head_count), "head_count' is 2.5", "an integer")

    def nan_eps(r):
        meta(r, "qwen2.attention.layer_norm_rms_epsilon")[0] = np.nan

    refused(edited(good, tmp_path, nan_eps), "layer_norm_rms_epsilon is nan")

    def negative_rope(r):
        meta(r, "qwen2.rope.freq_base")[0] = -1.0

    refused(edited(good, tmp_path, negative_rope), "rope.freq_base is -1.0", "positive")


def test_tensors_overlapping_or_misaligned(good, tmp_path):
    def overlap(r):  # two same-shaped tensors made to share their bytes
        tensor_part(r, "blk.0.ffn_norm.weight", "offset")[0] = \
            tensor_part(r, "blk.0.attn_norm.weight", "offset")[0]

    refused(edited(good, tmp_path, overlap), "blk.0.attn_norm.weight", "blk.0.ffn_norm.weight",
            "overlap")

    def misaligned(r):
        tensor_part(r, "blk.1.ffn_norm.weight", "offset")[0] += 4

    refused(edited(good, tmp_path, misaligned), "'blk.1.ffn_norm.weight'", "general.alignment")


def test_a_tokenizer_larger_than_the_embedding(tmp_path):
    tokens, _ = tiny.bpe()
    model = tiny.hf_model("qwen2", seed=1, vocab_size=len(tokens) - 10,
                          bos_token_id=0, eos_token_id=1)
    path = tiny.write_gguf(model, tmp_path / "small-vocab.gguf", "qwen2")
    refused(path, "'token_embd.weight'", f"[{len(tokens) - 10}, 64]", f"[{len(tokens)}, 64]")


def test_a_config_json_missing_or_mistyping_a_key(tmp_path):
    d = tiny.write_hf(tiny.hf_model("qwen2", seed=1), tmp_path / "hf")
    cfg = json.loads((d / "config.json").read_text())
    del cfg["num_attention_heads"]
    (d / "config.json").write_text(json.dumps(cfg))
    refused(d, "config.json", "missing 'num_attention_heads'")
    cfg["num_attention_heads"] = "four"
    (d / "config.json").write_text(json.dumps(cfg))
    refused(d, "'num_attention_heads' is 'four'", "an integer")


def test_the_cli_exits_2_and_the_server_does_not_start(good, tmp_path):
    def edit(r):
        tensor_part(r, "blk.0.attn_q.weight", "dims")[1] //= 2

    path = edited(good, tmp_path, edit)
    r = subprocess.run([*GEN, "-m", str(path), "-p", "hi", "-n", "2"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and "'blk.0.attn_q.weight'" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    serve = subprocess.run([sys.executable, "-m", "tandem.cli", "serve", "-m", str(path),
                            "--port", "0"], capture_output=True, text=True, timeout=120)
    assert serve.returncode == 2 and "'blk.0.attn_q.weight'" in serve.stderr, serve.stderr


def test_a_special_token_id_outside_the_vocabulary_is_ignored_with_a_warning(good, tmp_path,
                                                                              caplog):
    """As llama.cpp: a bad special id is named in the log and the default used."""
    def edit(r):
        meta(r, "tokenizer.ggml.eos_token_id")[0] = 99999

    with caplog.at_level("WARNING"):
        m = load_model(edited(good, tmp_path, edit))
    assert "tokenizer.ggml.eos_token_id is 99999, not a token id (0..302)" in caplog.text
    assert m.tokenizer.eos_id is None


@pytest.fixture(scope="module")
def gemma(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("gemma")
    return tiny.write_gguf(tiny.hf_model("gemma3", seed=1), d / "gemma.gguf", "gemma3")


def test_a_gemma3_file_checked_for_its_own_tensors_and_keys(gemma, tmp_path):
    """Gemma 3's sandwich norms are required tensors of their shape, and its rope scaling, its
    sliding-window pattern and its logit cap are checked by name."""
    assert load_model(gemma).args.swa_layers == (True, False, True)

    def post_norm_wider(r):
        tensor_part(r, "blk.1.post_ffw_norm.weight", "dims")[0] *= 2

    refused(edited(gemma, tmp_path, post_norm_wider), "'blk.1.post_ffw_norm.weight'",
            "shape [128]", "expected [64]")

    def yarn(r):
        meta(r, "gemma3.rope.scaling.type")  # present: written as "linear"
        field = r.fields["gemma3.rope.scaling.type"]
        field.parts[-1][:] = np.frombuffer(b"yarn\0\0", np.uint8)

    refused(edited(gemma, tmp_path, yarn), "gemma3.rope.scaling.type is 'yarn", "linear")

    def fewer_blocks(r):  # the per-layer pattern names three
        meta(r, "gemma3.block_count")[0] = 2

    refused(edited(gemma, tmp_path, fewer_blocks), "pattern names 3 layers",
            "gemma3.block_count is 2")
