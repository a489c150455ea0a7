"""The memory plan against what a server process really holds: /props serves the plan printed
before loading beside the process's VmHWM; after a warm-up request and a request that fills
the context, the plan's total must be within 10% of the peak (issue 60)."""

from __future__ import annotations

import httpx
import pytest

from tests import tiny
from tests.servers import Server

GREEDY = {"temperature": 0.0, "top_k": 1}


def _fill_and_read(server: Server, ctx: int) -> dict:
    """Warm up, fill the context (ctx - 64 prompt tokens, 16 generated), return /props'
    memory object."""
    httpx.post(f"{server.url}/completion", json={"prompt": "hello", "n_predict": 8, **GREEDY},
               timeout=120).raise_for_status()
    text = open(tiny.__file__, encoding="utf-8").read()
    ids = httpx.post(f"{server.url}/tokenize", json={"content": text}, timeout=60).json()["tokens"]
    ids = (ids * (ctx // len(ids) + 1))[:ctx - 64]
    r = httpx.post(f"{server.url}/completion", timeout=600, json={
        "prompt": ids, "n_predict": 16, "cache_prompt": False, **GREEDY})
    r.raise_for_status()
    assert r.json()["tokens_evaluated"] == len(ids)
    return httpx.get(f"{server.url}/props", timeout=30).json()["memory"]


def _check(memory: dict) -> None:
    print({k: v for k, v in memory.items() if k != "plan"}, memory["plan"])
    plan, peak = memory["plan"], memory["peak_resident"]
    assert plan["total"] == sum(m["total"] for m in plan["models"]) + plan["runtime"] \
        + plan["suffix_pool"]
    assert memory["resident"] <= peak
    assert abs(plan["total"] - peak) <= 0.10 * peak, (
        f"planned {plan['total'] / 2**20:.0f} MiB, peak {peak / 2**20:.0f} MiB")


def test_a_small_models_plan_is_within_10_percent_of_the_servers_peak(tmp_path):
    """A 90M-parameter Q4_0 model (repacked by the kernels: its file pages released), its
    KV cache filled: the weights and the cache, not the runtime alone, make up the peak."""
    path = tiny.small_q4_0_gguf(tmp_path / "m.gguf")
    server = Server(["-m", str(path), "--ctx-size", "4096", "--threads", "2",
                     "--cache-type-k", "f32", "--cache-type-v", "f32"], tmp_path / "log")
    try:
        server.wait_ready(300)
        memory = _fill_and_read(server, 4096)
    finally:
        server.stop()
    plan = memory["plan"]
    assert plan["models"][0]["kv_cache"] == 8 * 4113 * 2 * 256 * 4  # layers, positions, K+V, f32
    _check(memory)


@pytest.mark.real
def test_the_default_pairs_plan_is_within_10_percent_of_the_servers_peak(tmp_path):
    server = Server(["-m", "default", "-md", "default-draft", "--ctx-size", "2048",
                     "--threads", "2"], tmp_path / "log")
    try:
        server.wait_ready(600)
        memory = _fill_and_read(server, 2048)
    finally:
        server.stop()
    assert [m["role"] for m in memory["plan"]["models"]] == ["target", "draft"]
    _check(memory)


def _mapped_rss(path) -> int:
    """Bytes of the file `path` resident in this process's mappings (/proc/self/smaps)."""
    total, inside = 0, False
    for line in open("/proc/self/smaps"):
        first = line.split()[0]
        if "-" in first and ":" not in first:  # a mapping's header line
            inside = line.rstrip().endswith(str(path))
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1]) * 1024
    return total


def test_embedding_lookups_leave_no_pages_of_the_table_resident(tmp_path):
    """An untied token_embd.weight stays in the page cache, not in the process: the pages a
    lookup faults in (the kernel maps 64 KiB around each row) are dropped after it. A table
    that is also the output projection read in place keeps them (they are its weights)."""
    import gguf
    import numpy as np
    import torch

    from tandem.models.gguf_file import GGUFFile
    from tandem.models.quant import GGUFEmbedding, GGUFLinear

    rows = np.random.default_rng(0).standard_normal((20000, 256)).astype(np.float32)
    w = gguf.GGUFWriter(str(tmp_path / "e.gguf"), "llama")
    q8 = gguf.GGMLQuantizationType.Q8_0
    w.add_tensor("token_embd.weight", gguf.quants.quantize(rows, q8), raw_dtype=q8)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    g = GGUFFile(tmp_path / "e.gguf")
    raw = g.tensors["token_embd.weight"]
    ids = torch.randint(0, 20000, (2000,), generator=torch.Generator().manual_seed(0))
    expected = gguf.quants.dequantize(raw.data[ids.numpy()], q8)
    untied = GGUFEmbedding(raw)
    assert untied.release
    np.testing.assert_array_equal(untied[ids].numpy(), expected)
    assert _mapped_rss(g.path) <= 64 << 10  # at most a page at each end of the table
    tied = GGUFEmbedding(raw, tied=GGUFLinear(raw, bits=8))
    assert not tied.release  # Q8_0: the output projection reads the file's blocks in place
    np.testing.assert_array_equal(tied[ids].numpy(), expected)
    assert _mapped_rss(g.path) > 1 << 20


def test_a_server_whose_plan_does_not_fit_refuses_to_load_with_the_numbers(tmp_path):
    """Refused before any weight is read: the plan's total against what is available."""
    import subprocess

    from tests.servers import SERVE, free_port

    path = tiny.write_gguf(tiny.hf_model("qwen2"), tmp_path / "m.gguf", "qwen2")
    r = subprocess.run([*SERVE, "-m", str(path), "--ctx-size", str(2**34), "--port",
                        str(free_port())], capture_output=True, text=True, timeout=120)
    out = r.stdout + r.stderr
    assert r.returncode != 0
    assert "fits: NO" in out
    assert "the memory plan does not fit: it needs" in out and "is available (MemAvailable)" in out
    assert "loaded in" not in out  # nothing was loaded
