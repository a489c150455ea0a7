"""`tandem generate` on tiny models: streamed text, --json fields, and every error a user can
make, each a one-line message with exit code 2 and no traceback."""

from __future__ import annotations

import json
import subprocess
import sys

import gguf
import numpy as np
import pytest

from tandem.cli import main

from . import tiny


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    target = tiny.write_gguf(tiny.hf_model("qwen2", seed=5), d / "t.gguf", "qwen2")
    draft = tiny.write_gguf(tiny.hf_model("qwen2", seed=6), d / "d.gguf", "qwen2")
    return d, target, draft


def gen(capsys, *args) -> tuple[int, str, str]:
    code = main(["generate", "-t", "1", *map(str, args)])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_json_has_llama_cpp_completion_fields(files, capsys):
    _, target, draft = files
    code, out, err = gen(capsys, "-m", target, "-p", "def add(a, b):", "-n", 12, "--temp", 0,
                         "--ignore-eos", "--json")
    assert code == 0
    d = json.loads(out)
    assert d["tokens_predicted"] == 12 == len(d["tokens"])
    assert d["stop_type"] == "limit" and d["tokens_evaluated"] > 0
    for k in ("prompt_n", "prompt_ms", "predicted_n", "predicted_ms", "predicted_per_second"):
        assert k in d["timings"]
    assert "draft_n" not in d["timings"]  # no speculation, no draft statistics
    # with a draft model, statistics appear
    code, out2, err2 = gen(capsys, "-m", target, "-md", draft, "-p", "def add(a, b):", "-n", 12,
                           "--temp", 0, "--ignore-eos", "--spec-type", "draft-simple",
                           "--spec-draft-p-min", 0, "--json")
    d2 = json.loads(out2)
    assert d2["tokens"] == d["tokens"]  # greedy: the draft never changes the answer
    assert d2["timings"]["draft_n"] > 0 and "draft_n_accepted" in d2["timings"]
    assert d2["speculative"]["type"] == "draft-simple"
    assert d2["speculative"]["n_drafts"] > 0
    # no --spec-type with a draft model means auto: suffix, then the draft, sized per step
    # (here the draft costs as much as the target, so it may rightly choose not to draft)
    code, out3, _ = gen(capsys, "-m", target, "-md", draft, "-p", "def add(a, b):", "-n", 12,
                        "--temp", 0, "--ignore-eos", "--json")
    d3 = json.loads(out3)
    assert d3["tokens"] == d["tokens"]
    assert d3["speculative"]["type"] == "suffix,draft-simple" and "draft_n" in d3["timings"]


def test_streams_text_and_summarizes_on_stderr(files, capsys):
    _, target, draft = files
    code, out, err = gen(capsys, "-m", target, "-md", draft, "-p", "hello", "-n", 8, "--temp", 0,
                         "--ignore-eos")
    assert code == 0 and out.strip()
    assert "generated" in err and "speculative:" in err and "accepted" in err


def test_chat_uses_the_model_template(files, capsys):
    _, target, _ = files
    code, out, _ = gen(capsys, "-m", target, "-p", "hi", "-n", 4, "--temp", 0, "--chat", "--json")
    assert code == 0
    # ChatML wrapping: the evaluated prompt is longer than the bare text
    assert json.loads(out)["tokens_evaluated"] > 4


def _write_arch(path, arch: str):
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def errors(files, tmp_path):
    d, target, _ = files
    data = target.read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[: len(data) // 2])
    (tmp_path / "text.gguf").write_text("not a model\n")
    _write_arch(tmp_path / "phi.gguf", "phi3")
    return {
        "missing": ([tmp_path / "nope.gguf"], "not found"),
        "not gguf": ([tmp_path / "text.gguf"], "not a GGUF file"),
        "truncated": ([tmp_path / "cut.gguf"], "truncated"),
        "arch": ([tmp_path / "phi.gguf"], "unsupported architecture 'phi3'"),
    }


@pytest.mark.parametrize("case", ["missing", "not gguf", "truncated", "arch"])
def test_model_file_errors_are_one_clear_line(files, tmp_path, capsys, case):
    cases = errors(files, tmp_path)
    args, needle = cases[case]
    code, out, err = gen(capsys, "-m", *args, "-p", "x")
    assert code == 2, err
    assert needle in err and str(args[0]) in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_unsupported_tensor_type_names_tensor_and_types(tmp_path, capsys):
    import torch

    ref = tiny.hf_model("qwen2", seed=5)
    sd = ref.state_dict()
    sd["model.layers.0.self_attn.q_proj.weight"] = torch.zeros_like(
        sd["model.layers.0.self_attn.q_proj.weight"])
    path = tmp_path / "i32.gguf"
    orig = gguf.GGUFWriter.add_tensor

    def add_tensor(self, name, tensor, *a, **kw):  # store one weight as I32
        if name == "blk.0.attn_q.weight":
            tensor = tensor.astype(np.int32)
        return orig(self, name, tensor, *a, **kw)

    gguf.GGUFWriter.add_tensor = add_tensor
    try:
        tiny.write_gguf(ref, path, "qwen2")
    finally:
        gguf.GGUFWriter.add_tensor = orig
    code, _, err = gen(capsys, "-m", path, "-p", "x")
    assert code == 2
    assert "blk.0.attn_q.weight" in err and "I32" in err and "Q4_K" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("flags,needle", [
    (["--top-p", "1.5"], "top_p must be between 0 and 1"),
    (["--min-p", "-0.1"], "min_p must be between 0 and 1"),
    (["--spec-type", "eagle"], "unknown spec type 'eagle'"),
    (["--spec-type", "draft-simple"], "needs a draft model"),
    (["-c", "4"], "ctx-size must be >= 16"),
])
def test_bad_flag_values(files, capsys, flags, needle):
    _, target, _ = files
    code, _, err = gen(capsys, "-m", target, "-p", "x", *flags)
    assert code == 2 and needle in err and "Traceback" not in err


def test_unparseable_flag_exits_2_without_traceback(files):
    _, target, _ = files
    p = subprocess.run([sys.executable, "-m", "tandem.cli", "generate", "-m", str(target),
                        "-p", "x", "--temp", "warm"], capture_output=True, text=True)
    assert p.returncode == 2
    assert "--temp" in p.stderr and "'warm'" in p.stderr and "Traceback" not in p.stderr
