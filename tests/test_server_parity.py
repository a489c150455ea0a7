"""llama-server parity: what llama.cpp's own server suite (tools/server/tests) checks of the API,
ported onto tiny models (experiments/llama_suite runs that suite itself against Tandem).

Two servers start once for the module, with one tiny qwen2 model:
- FULL: llama-server's optional features on: 2 slots sharing --ctx-size 512 (256 each),
  --embedding --pooling mean, --slot-save-path, --cors-origins localhost, --alias b,a,
  --tags, -v (answers carry __verbose), --context-shift;
- PLAIN: the model alone, every optional feature at its default (off).
"""

from __future__ import annotations

import argparse
import base64
import concurrent.futures
import math
import socket
import struct
from types import SimpleNamespace

import httpx
import pytest
import torch

from tests import tiny
from tests.servers import GREEDY, Server

PROMPTS = ["The quick brown fox", "for i in range(10):", "Once upon a time"]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    d = tmp_path_factory.mktemp("parity")
    model = tiny.hf_model("qwen2", seed=3)
    path = tiny.write_gguf(model, d / "target.gguf", "qwen2")
    (d / "slots").mkdir()
    full = Server(["--model", str(path), "--ctx-size", "512", "--parallel", "2", "-t", "1",
                   "--spec-type", "ngram-simple", "--embedding", "--pooling", "mean",
                   "--slot-save-path", str(d / "slots"), "--cors-origins", "localhost",
                   "--alias", "b,a", "--tags", "chat,small", "-v", "--metrics",
                   "--context-shift"],
                  d / "full.log")
    plain = Server(["--model", str(path), "--ctx-size", "256", "-t", "1"], d / "plain.log")
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda s: s.wait_ready(120), (full, plain)))
        yield SimpleNamespace(full=full, plain=plain, model=model, dir=d, path=path)
    finally:
        full.stop()
        plain.stop()


def post(server: Server, path: str, body: dict, **kw) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=60, **kw)


def ok(r: httpx.Response) -> dict | list:
    assert r.status_code == 200, r.text
    return r.json()


def greedy(server: Server, prompt, n: int = 8, **extra) -> dict:
    return ok(post(server, "/completion", {"prompt": prompt, "n_predict": n,
                                           "cache_prompt": False, **GREEDY, **extra}))


# -- prompts: several in one request, every form llama-server takes --------------------------

def test_several_prompts_get_one_answer_each_in_order(built):
    s = built.full
    ids = ok(post(s, "/tokenize", {"content": PROMPTS[1]}))["tokens"]
    alone = [greedy(s, p)["content"] for p in PROMPTS]
    out = greedy(s, [PROMPTS[0], ids, {"prompt_string": PROMPTS[2]}])
    assert isinstance(out, list) and [o["index"] for o in out] == [0, 1, 2]
    assert [o["content"] for o in out] == alone
    # a list mixing ids and text is ONE prompt, as llama-server reads it
    mixed = greedy(s, [*ids, " print(i)"])
    assert isinstance(mixed, dict) and mixed["tokens_evaluated"] > len(ids)


def test_several_prompts_stream_interleaved_with_their_index(built):
    r = httpx.post(f"{built.full.url}/completion", timeout=60, json={
        "prompt": PROMPTS[:2], "n_predict": 6, "stream": True, "cache_prompt": False, **GREEDY})
    assert r.status_code == 200
    chunks = [httpx.Response(200, content=line[6:]).json()
              for line in r.text.split("\n") if line.startswith("data: ")]
    by_index = {0: "", 1: ""}
    finals = {}
    for c in chunks:
        by_index[c["index"]] += c["content"]
        if c["stop"]:
            finals[c["index"]] = c
    assert set(finals) == {0, 1}
    assert by_index == {i: greedy(built.full, PROMPTS[i], 6)["content"] for i in (0, 1)}


def test_oai_completions_answer_every_prompt_n_times(built):
    s = built.full
    out = ok(post(s, "/v1/completions", {"prompt": PROMPTS[:2], "n": 2, "max_tokens": 5,
                                          **GREEDY}))
    texts = [c["text"] for c in out["choices"]]
    assert [c["index"] for c in out["choices"]] == [0, 1, 2, 3]
    first, second = (greedy(s, p, 5) for p in PROMPTS[:2])
    assert texts == [first["content"]] * 2 + [second["content"]] * 2
    # each prompt counted once, every answer's tokens
    assert out["usage"]["prompt_tokens"] == first["tokens_evaluated"] + second["tokens_evaluated"]
    assert out["usage"]["completion_tokens"] == 2 * (first["tokens_predicted"] +
                                                     second["tokens_predicted"])


def test_chat_n_choices_and_stream_refused_with_n(built):
    s = built.full
    msgs = [{"role": "user", "content": "hello"}]
    out = ok(post(s, "/v1/chat/completions", {"messages": msgs, "n": 3, "max_tokens": 4,
                                               **GREEDY}))
    assert len(out["choices"]) == 3 and [c["index"] for c in out["choices"]] == [0, 1, 2]
    assert len({c["message"]["content"] for c in out["choices"]}) == 1  # greedy: the same
    assert out["usage"]["completion_tokens"] == 3 * out["timings"]["predicted_n"]
    r = post(s, "/v1/chat/completions", {"messages": msgs, "n": 2, "stream": True})
    assert r.status_code == 400 and "without streaming" in r.json()["error"]["message"]


def test_object_prompts_with_media_are_refused(built):
    r = post(built.full, "/completion", {"prompt": {"prompt_string": "x",
                                                    "multimodal_data": ["AAAA"]}})
    assert r.status_code == 400 and "multimodal" in r.json()["error"]["message"]


# -- chat templates: prefill, continue_final_message, token counts ---------------------------

def test_trailing_assistant_message_is_continued(built):
    s = built.full
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello the"}]
    out = ok(post(s, "/v1/chat/completions", {"messages": msgs, "max_tokens": 3, **GREEDY}))
    prompt = out["__verbose"]["prompt"]  # -v: the rendered prompt comes back
    assert prompt.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nHello the")
    explicit = ok(post(s, "/apply-template", {"messages": msgs, "continue_final_message": True,
                                              "add_generation_prompt": False}))["prompt"]
    assert explicit == prompt
    parts = [{"type": "text", "text": "Wh"}, {"type": "text", "text": "ill"}]
    joined = ok(post(s, "/apply-template", {"messages": [msgs[0], {"role": "assistant",
                                                                    "content": parts}]}))
    assert joined["prompt"].endswith("assistant\nWh\n\nill")
    for bad in ({"messages": msgs, "continue_final_message": True,
                 "add_generation_prompt": True},
                {"messages": [*msgs, {"role": "assistant", "content": "again"}]}):
        r = post(s, "/v1/chat/completions", bad)
        assert r.status_code == 400, r.text


def test_add_generation_prompt_false_and_input_tokens(built):
    s = built.full
    msgs = [{"role": "user", "content": "count me"}]
    closed = ok(post(s, "/apply-template", {"messages": msgs, "add_generation_prompt": False}))
    assert closed["prompt"] == "<|im_start|>user\ncount me<|im_end|>\n"
    opened = ok(post(s, "/apply-template", {"messages": msgs}))["prompt"]
    n = len(ok(post(s, "/tokenize", {"content": opened}))["tokens"])
    assert ok(post(s, "/chat/completions/input_tokens", {"messages": msgs})) == {
        "input_tokens": n}


def test_verbose_only_when_asked_or_started_with_v(built):
    body = {"messages": [{"role": "user", "content": "Book"}], "max_tokens": 2}
    assert "__verbose" not in ok(post(built.plain, "/v1/chat/completions", body))
    out = ok(post(built.plain, "/v1/chat/completions", {**body, "verbose": True}))
    assert "Book" in out["__verbose"]["prompt"]


# -- response fields, probabilities, tokenize ------------------------------------------------

def test_response_fields_keep_only_the_named_paths(built):
    out = greedy(built.full, PROMPTS[0], 4,
                 response_fields=["content", "generation_settings/n_predict", "prompt"])
    assert set(out) == {"content", "generation_settings/n_predict", "prompt"}
    assert out["generation_settings/n_predict"] == 4 and out["prompt"] == PROMPTS[0]


def test_post_sampling_probs_are_the_samplers_distribution(built):
    body = {"prompt": PROMPTS[0], "n_predict": 4, "n_probs": 5, "temperature": 1.0,
            "top_k": 3, "top_p": 1.0, "min_p": 0.0, "seed": 7, "cache_prompt": False}
    post_ = ok(post(built.full, "/completion", {**body, "post_sampling_probs": True}))
    raw = ok(post(built.full, "/completion", body))
    assert post_["content"] == raw["content"]  # the same draw; only the report differs
    for p, r in zip(post_["completion_probabilities"], raw["completion_probabilities"]):
        assert "logprob" not in p and 0 < p["prob"] <= 1
        tops = p["top_probs"]
        assert len(tops) == 3  # top-k 3: the others have probability 0 and are left out
        assert sum(t["prob"] for t in tops) == pytest.approx(1.0, abs=1e-5)
        assert p["id"] in [t["id"] for t in tops]
        # the same three tokens as the raw top 3, renormalized among themselves
        raw3 = r["top_logprobs"][:3]
        assert [t["id"] for t in tops] == [t["id"] for t in raw3]
        z = sum(math.exp(t["logprob"]) for t in raw3)
        for t, q in zip(tops, raw3):
            assert t["prob"] == pytest.approx(math.exp(q["logprob"]) / z, rel=1e-4)


def test_tokenize_with_pieces(built):
    s = built.full
    text = "héllo wörld 😀 for i"
    plain = ok(post(s, "/tokenize", {"content": text}))["tokens"]
    pieces = ok(post(s, "/tokenize", {"content": text, "with_pieces": True}))["tokens"]
    assert [p["id"] for p in pieces] == plain
    raw = b"".join(p["piece"].encode() if isinstance(p["piece"], str) else bytes(p["piece"])
                   for p in pieces)
    assert raw.decode() == text
    assert any(isinstance(p["piece"], list) for p in pieces)  # a split character: its bytes


# -- flags: context over slots, aliases, tags, metrics, hosts ----------------------------------

def test_ctx_size_is_the_total_over_slots(built):
    props = ok(httpx.get(f"{built.full.url}/props"))
    assert props["total_slots"] == 2 and props["default_generation_settings"]["n_ctx"] == 256
    r = post(built.full, "/completion", {"prompt": "hello " * 300})
    err = r.json()["error"]
    assert r.status_code == 400 and err["type"] == "exceed_context_size_error"
    assert err["n_ctx"] == 256


def test_context_shift_goes_on_past_a_full_slot(built):
    """llama.cpp's test_ctx_shift_enabled: a 200-token prompt in a 256-token slot still gets
    its 96 tokens with --context-shift, and the answer says truncated; without the flag the
    generation stops where the slot is full (also truncated)."""
    prompt = [(11 * i + 5) % 200 + 3 for i in range(200)]
    body = {"prompt": prompt, "n_predict": 96, "ignore_eos": True, **GREEDY}
    out = ok(post(built.full, "/completion", body))
    assert out["timings"]["prompt_n"] == 200 and out["timings"]["predicted_n"] == 96
    assert out["truncated"] is True and out["stop_type"] == "limit"
    kept = ok(post(built.full, "/completion", {**body, "n_keep": -1, "n_discard": 8}))
    assert kept["timings"]["predicted_n"] == 96 and kept["truncated"] is True
    assert kept["generation_settings"]["n_keep"] == -1
    short = ok(post(built.full, "/completion", {**body, "n_predict": 20}))
    assert short["tokens_predicted"] == 20 and short["truncated"] is False
    plain = ok(post(built.plain, "/completion", body))
    assert plain["tokens_predicted"] == 56 and plain["truncated"] is True
    r = post(built.full, "/completion", {**body, "n_keep": -2})
    assert r.status_code == 400 and "n_keep" in r.text


def test_aliases_and_tags(built):
    (model,) = ok(httpx.get(f"{built.full.url}/v1/models"))["data"]
    assert model["id"] == "a"  # the first alias in alphabetical order, as llama-server
    assert model["aliases"] == ["a", "b"] and model["tags"] == ["chat", "small"]
    (plain,) = ok(httpx.get(f"{built.plain.url}/v1/models"))["data"]
    assert plain["id"].endswith("target.gguf") and plain["tags"] == []


def test_optional_endpoints_answer_501_when_off(built):
    p = built.plain
    assert httpx.get(f"{p.url}/metrics").status_code == 501
    assert post(p, "/v1/embeddings", {"input": "x"}).status_code == 501
    r = post(p, "/slots/0?action=save", {"filename": "x.bin"})
    assert r.status_code == 501 and "--slot-save-path" in r.json()["error"]["message"]
    assert httpx.get(f"{built.full.url}/metrics").status_code == 200


def _second_loopback() -> str:
    """::1 where IPv6 loopback works, else 127.0.0.2 (all of 127/8 is loopback on Linux)."""
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return "::1"
    except OSError:
        return "127.0.0.2"


def test_several_listen_addresses(built, tmp_path):
    import subprocess
    import time

    from tests.servers import SERVE, free_port

    second = _second_loopback()
    port = free_port()
    log = open(tmp_path / "hosts.log", "w")
    proc = subprocess.Popen([*SERVE, "--model", str(built.path), "-c", "128", "-t", "1",
                             "--no-warmup", "--host", f"127.0.0.1,{second}", "--port",
                             str(port)], stdout=log, stderr=subprocess.STDOUT)
    try:
        for host in ("127.0.0.1", f"[{second}]" if ":" in second else second):
            url, deadline = f"http://{host}:{port}/health", time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    if httpx.get(url, timeout=2).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.1)
            assert httpx.get(url, timeout=2).status_code == 200, \
                (tmp_path / "hosts.log").read_text()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()


@pytest.mark.parametrize("argv,message", [
    (["--chat-template", "vicuna"], "built-in names Tandem knows chatml, llama3"),
    (["--ctx-size", "64", "--parallel", "8"], "8 tokens per slot"),
    (["--no-such-flag"], "unrecognized arguments"),
])
def test_flags_it_cannot_honour_are_refused(built, capsys, argv, message):
    from tandem.server import cli

    p = argparse.ArgumentParser(exit_on_error=False)
    cli.add_arguments(p)
    try:
        args = p.parse_args(["--model", str(built.path), *argv])
        cli._settings(args)
    except (argparse.ArgumentError, SystemExit) as e:
        assert "unrecognized" in message, e
        return
    except Exception as e:  # TandemError
        assert message in str(e)
        return
    raise AssertionError(f"{argv} was accepted")


def test_offline_refuses_a_model_that_is_not_pulled(monkeypatch):
    from tandem import registry
    from tandem.errors import ModelFileError
    from tandem.server import cli

    monkeypatch.setattr(registry, "is_pulled", lambda name: False)
    with pytest.raises(ModelFileError, match="--offline forbids downloading"):
        cli._check_exists("--model", "default", offline=True)
    cli._check_exists("--model", "default", offline=False)  # pulled when loading


# -- CORS ------------------------------------------------------------------------------------

@pytest.mark.parametrize("origin,allowed", [
    ("http://localhost:3000", True), ("http://127.0.0.1", True), ("http://[::1]:8080", True),
    ("http://evil.com", False), ("http://localhost.evil.com", False),
])
def test_cors_origins_localhost(built, origin, allowed):
    r = httpx.options(f"{built.full.url}/completion", headers={
        "Origin": origin, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "Authorization"})
    assert r.status_code == 200
    assert r.headers.get("access-control-allow-origin") == (origin if allowed else None)
    if allowed:
        assert r.headers["access-control-allow-credentials"] == "true"
        assert r.headers["access-control-allow-methods"] == "GET, POST, DELETE, OPTIONS"
        assert r.headers["access-control-allow-headers"] == "*"


def test_cors_default_reflects_any_origin(built):
    r = httpx.options(f"{built.plain.url}/v1/chat/completions", headers={
        "Origin": "https://web.mydomain.fr", "Access-Control-Request-Method": "POST"})
    assert r.headers["access-control-allow-origin"] == "https://web.mydomain.fr"


# -- embeddings ------------------------------------------------------------------------------

def test_embeddings_are_the_models_pooled_hidden_states(built):
    s = built.full
    text = "The quick brown fox jumps"
    ids = ok(post(s, "/tokenize", {"content": text}))["tokens"]
    out = ok(post(s, "/v1/embeddings", {"input": text, "model": "m"}))
    (item,) = out["data"]
    vec = torch.tensor(item["embedding"])
    assert out["usage"] == {"prompt_tokens": len(ids), "total_tokens": len(ids)}
    assert vec.norm().item() == pytest.approx(1.0, abs=1e-5)
    with torch.no_grad():  # transformers' last hidden state (after the final norm), mean-pooled
        h = built.model.model(torch.tensor([ids])).last_hidden_state[0].mean(0)
    ref = h / h.norm()
    assert torch.nn.functional.cosine_similarity(vec, ref, dim=0).item() > 0.9999
    # the same vector from every form of the same input, and in base64
    forms = [ids, {"prompt_string": text},
             {"content": [{"type": "text", "text": "The quick"},
                          {"type": "text", "text": " brown fox jumps"}]}]
    many = ok(post(s, "/v1/embeddings", {"input": forms}))["data"]
    assert [d["index"] for d in many] == [0, 1, 2]
    for d in many:
        assert torch.allclose(torch.tensor(d["embedding"]), vec, atol=1e-6)
    b64 = ok(post(s, "/v1/embeddings", {"input": text, "encoding_format": "base64"}))
    raw = base64.b64decode(b64["data"][0]["embedding"])
    assert torch.allclose(torch.tensor(struct.unpack(f"<{len(raw) // 4}f", raw)), vec,
                          atol=1e-6)
    native = ok(post(s, "/embedding", {"content": text, "embd_normalize": -1}))
    assert len(native) == 1 and len(native[0]["embedding"]) == 1  # pooled: one vector
    unnormed = torch.tensor(native[0]["embedding"][0])
    assert unnormed.norm().item() == pytest.approx(h.norm().item(), rel=1e-3)


@pytest.mark.parametrize("body,status,message", [
    ({"input": []}, 400, "empty list"),
    ({"input": "word " * 600}, 400, "too large to process"),
    ({"input": {"content": "string"}}, 400, "list of parts"),
    ({"input": {"content": [{"type": "image_url", "image_url": {"url": "x"}}]}}, 400,
     "multimodal"),
    ({}, 400, "required"),
])
def test_bad_embedding_inputs(built, body, status, message):
    r = post(built.full, "/v1/embeddings", body)
    assert r.status_code == status and message in r.json()["error"]["message"], r.text


def test_embeddings_do_not_disturb_generation(built):
    s = built.full
    before = greedy(s, PROMPTS[2], 12)["content"]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        gen = pool.submit(greedy, s, PROMPTS[2], 12)
        emb = pool.submit(lambda: ok(post(s, "/v1/embeddings", {"input": PROMPTS * 3})))
        assert gen.result()["content"] == before and len(emb.result()["data"]) == 9


# -- slot files --------------------------------------------------------------------------------

def test_slot_save_restore_erase(built):
    s = built.full
    prompt = "Summarize the following document in three sentences."
    first = ok(post(s, "/completion", {"prompt": prompt, "n_predict": 4, "id_slot": 1,
                                       **GREEDY}))
    saved = ok(post(s, "/slots/1?action=save", {"filename": "one.bin"}))
    n = saved["n_saved"]
    assert n == first["tokens_evaluated"] + first["tokens_predicted"] - 1
    assert saved["n_written"] == (built.dir / "slots" / "one.bin").stat().st_size
    # (slot 1 forgets it too: idle, it would go to the host prompt cache when slot 0 starts,
    # and slot 0 would read it back from there after its own erase)
    assert ok(post(s, "/slots/1?action=erase", {}))["n_erased"] == n
    assert ok(post(s, "/slots/0?action=erase", {}))["id_slot"] == 0
    restored = ok(post(s, "/slots/0?action=restore", {"filename": "one.bin"}))
    assert restored["n_restored"] == n
    again = ok(post(s, "/completion", {"prompt": prompt, "n_predict": 4, "id_slot": 0,
                                       **GREEDY}))
    # the restored cache is reused like a cached prompt, and the answer is unchanged
    assert again["timings"]["cache_n"] == first["tokens_evaluated"] - 1
    assert again["content"] == first["content"]
    assert ok(post(s, "/slots/0?action=erase", {}))["n_erased"] > 0
    fresh = ok(post(s, "/completion", {"prompt": prompt, "n_predict": 4, "id_slot": 0,
                                       **GREEDY}))
    assert fresh["timings"]["cache_n"] == 0 and fresh["content"] == first["content"]


@pytest.mark.parametrize("url,body,message", [
    ("/slots/0?action=save", {"filename": "../escape.bin"}, "plain file name"),
    ("/slots/0?action=save", {}, "plain file name"),
    ("/slots/0?action=restore", {"filename": "missing.bin"}, "no saved slot"),
    ("/slots/0?action=restore", {"filename": "garbage.bin"}, "not a slot file"),
    ("/slots/9?action=erase", {}, "does not exist"),
    ("/slots/0?action=dance", {}, "expected ?action="),
])
def test_bad_slot_actions(built, url, body, message):
    (built.dir / "slots" / "garbage.bin").write_bytes(b"not a slot")
    r = post(built.full, url, body)
    assert r.status_code == 400 and message in r.json()["error"]["message"], r.text


# -- infill --------------------------------------------------------------------------------------

def test_infill_prompt_layout_is_llama_servers():
    """[REP]myproject\\n [SEP]name\\n text [SEP]filename\\n [PRE]prefix prompt [SUF]suffix [MID],
    prefix kept to its last 3/4 of the batch, suffix to its first 1/4 less prompt and markers."""
    from tandem.server.infill import InfillBody, infill_ids

    fim = {"fim_pre": 1001, "fim_suf": 1002, "fim_mid": 1003, "fim_rep": 1004,
           "fim_sep": 1005, "fim_pad": 1006}
    tok = SimpleNamespace(encode=lambda t, **_: [ord(c) for c in t], fim_ids=lambda: fim,
                          add_bos=False, bos_id=None)
    engine = SimpleNamespace(tok=tok, cfg=SimpleNamespace(ctx_size=4096))
    body = InfillBody(input_prefix="abcdefghij", input_suffix="KLMNOPQRST", prompt="xy",
                      input_extra=[{"filename": "f", "text": "T"}])
    ids = infill_ids(engine, body, n_batch=16, n_predict=-1)
    enc = [ord(c) for c in "myproject\n"]
    # prefix: at most 3*(16//4) = 12 tokens -> all 10; suffix: 16//4 - (2 + 2) = 0 -> none
    pre = ids.index(1001)
    assert ids[pre + 1: ids.index(1002)] == [ord(c) for c in "abcdefghij"] + [ord("x"), ord("y")]
    assert ids[ids.index(1002) + 1:] == [1003]
    assert ids[:pre] == [1004, *enc, 1005, ord("f"), 10, ord("T"), 1005,
                         *[ord(c) for c in "filename\n"]]
    wider = infill_ids(engine, body, n_batch=64, n_predict=-1)
    assert wider[wider.index(1002) + 1: -1] == [ord(c) for c in "KLMNOPQRST"]
    long = InfillBody(input_prefix="p" * 30 + "END", input_suffix="S" * 30, prompt="")
    cut = infill_ids(engine, long, n_batch=16, n_predict=-1)
    kept = cut[cut.index(1001) + 1: cut.index(1002)]
    assert len(kept) == 12 and kept[-3:] == [ord(c) for c in "END"]  # the prefix's tail
    assert cut[cut.index(1002) + 1: -1] == [ord("S")] * 2  # 16//4 - 2: the suffix's head


def test_infill_needs_fim_tokens_and_checks_its_fields(built):
    s = built.full
    body = {"input_prefix": "def f():\n", "input_suffix": "\n"}
    r = post(s, "/infill", body)
    assert r.status_code == 501 and "fim_pre" in r.json()["error"]["message"]
    for extra in ({}, {"filename": "ok"}, {"filename": 123, "text": "abc"}):
        r = post(s, "/infill", {**body, "input_extra": [extra]})
        assert r.status_code in (400, 501)
    r = post(s, "/infill", {"input_suffix": "x"})
    assert r.status_code == 400 and "input_prefix" in r.json()["error"]["message"]


@pytest.mark.real
def test_real_infill_with_and_without_speculation(tmp_path):
    """Qwen2.5-Coder-0.5B has FIM tokens: the middle of a function, greedy, the same text
    whether speculation runs or not."""
    from tandem import registry

    model = str(registry.pull("default-draft"))
    s = Server(["--model", model, "-c", "2048", "--spec-type", "ngram-simple,suffix"],
               tmp_path / "infill.log")
    try:
        s.wait_ready(300)
        body = {"input_prefix": "def fibonacci(n):\n    ",
                "input_suffix": "\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
                "input_extra": [{"filename": "util.py", "text": "import math\n"}],
                "n_predict": 24, **GREEDY}
        spec = ok(post(s, "/infill", body))
        none = ok(post(s, "/infill", {**body, "speculative.type": "none"}))
        assert spec["content"] == none["content"]
        assert "if n" in spec["content"] and "return" in spec["content"]
        assert spec["tokens_evaluated"] > 20
    finally:
        s.stop()


# -- streams: prompt progress, timings per token ---------------------------------------------

def _events(server: Server, path: str, body: dict) -> list[dict]:
    import json

    r = httpx.post(f"{server.url}{path}", json={**body, "stream": True}, timeout=60)
    assert r.status_code == 200, r.text
    return [json.loads(line[6:]) for line in r.text.split("\n")
            if line.startswith("data: ") and line != "data: [DONE]"]


def test_stream_reports_prompt_progress_then_tokens_with_timings(built):
    s = built.full
    prompt = "the quick brown fox jumps over the lazy dog " * 12
    events = _events(s, "/completion", {"prompt": prompt, "n_predict": 4, "cache_prompt": False,
                                        "return_progress": True, "timings_per_token": True,
                                        **GREEDY})
    progress = [e["prompt_progress"] for e in events if "prompt_progress" in e]
    tokens = [e for e in events if "prompt_progress" not in e and not e["stop"]]
    total = events[-1]["tokens_evaluated"]
    assert progress[0] == {**progress[0], "total": total, "cache": 0, "processed": 0}
    first = next(e for e in events if "prompt_progress" in e)["timings"]
    assert (first["prompt_n"], first["prompt_ms"], first["predicted_n"]) == (0, 0.0, 0)
    assert progress[-1]["processed"] == total and len(progress) >= 2
    assert all(a["processed"] < b["processed"] and a["time_ms"] <= b["time_ms"]
               for a, b in zip(progress, progress[1:]))
    assert events.index(next(e for e in events if e.get("prompt_progress") == progress[-1])) \
        < events.index(tokens[0])  # the prompt is read before the first token
    predicted = [e["timings"]["predicted_n"] for e in tokens]
    assert predicted == sorted(predicted) and predicted[-1] == 4
    plain = _events(s, "/completion", {"prompt": prompt, "n_predict": 4, **GREEDY})
    assert not any("prompt_progress" in e or "timings" in e for e in plain[:-1])


def test_generation_rate_excludes_the_first_token(built):
    """llama-server's timings: the first token comes with the prompt (the pass over its last
    token), so the generation's rate is over the tokens after it; /metrics' gauge likewise."""
    one = ok(post(built.plain, "/completion", {"prompt": "I believe", "n_predict": 1,
                                               **GREEDY}))["timings"]
    assert one["predicted_n"] == 1 and one["prompt_ms"] > 0
    assert one["predicted_per_second"] == 0.0 and one["predicted_per_token_ms"] == 0.0
    httpx.get(f"{built.full.url}/metrics", timeout=30)  # the gauge counts from the last scrape
    for s in (built.plain, built.full):
        t = ok(post(s, "/completion", {"prompt": "I believe", "n_predict": 16, "ignore_eos": True,
                                       "cache_prompt": False, **GREEDY}))["timings"]
        assert t["predicted_n"] == 16 and t["predicted_ms"] > 0
        assert t["predicted_per_second"] == pytest.approx(1e3 / t["predicted_ms"] * 15)
        assert t["predicted_per_token_ms"] == pytest.approx(t["predicted_ms"] / 15)
    text = httpx.get(f"{built.full.url}/metrics", timeout=30).text
    gauge = next(float(line.split()[-1]) for line in text.splitlines()
                 if line.startswith("llamacpp:predicted_tokens_seconds "))
    assert gauge == pytest.approx(1e3 / t["predicted_ms"] * 15, rel=1e-3)


def test_chat_stream_progress_chunks_name_the_role(built):
    events = _events(built.full, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "tell me a story " * 10}], "max_tokens": 3,
        "return_progress": True, "timings_per_token": True, **GREEDY})
    with_progress = [e for e in events if "prompt_progress" in e]
    assert with_progress and all(e["choices"][0]["delta"] == {"role": "assistant",
                                                              "content": None}
                                 for e in with_progress)
    rest = events[len(with_progress):]
    assert not any("role" in c["delta"] for e in rest for c in e["choices"])
    text = [e for e in rest if e["choices"] and e["choices"][0]["delta"].get("content")]
    assert text and all("predicted_n" in e["timings"] for e in text)
    assert "usage" in events[-1] and events[-1]["choices"] == []


def test_ignore_eos_is_reported_as_llama_servers_logit_bias(built):
    s = built.full
    on = greedy(s, PROMPTS[0], 4, ignore_eos=True)["generation_settings"]["logit_bias"]
    assert on and all(e["bias"] is None for e in on)  # null: -inf
    eos = ok(httpx.get(f"{s.url}/props"))["eos_token"]
    eos_id = ok(post(s, "/tokenize", {"content": eos, "parse_special": True}))["tokens"]
    assert eos_id[0] in [e["token"] for e in on]
    assert greedy(s, PROMPTS[0], 4)["generation_settings"]["logit_bias"] == []


def test_same_seed_same_sampled_text_with_or_without_ngram_speculation(built):
    body = {"prompt": "a b c d a b c d a b c d a b", "n_predict": 24, "temperature": 0.9,
            "top_k": 0, "top_p": 1.0, "min_p": 0.0, "seed": 11, "cache_prompt": False,
            "ignore_eos": True, "return_tokens": True}
    spec = ok(post(built.full, "/completion", body))
    alone = ok(post(built.full, "/completion", {**body, "speculative.type": "none"}))
    assert spec["tokens"] == alone["tokens"]
    assert "draft_n" not in alone["timings"] and spec["timings"]["draft_n"] > 0


def test_templates_get_todays_date_and_llama_servers_builtin_names(tmp_path):
    """--chat-template-file with a template that prints date_string (Llama 3.x's) shows today,
    as llama-server's; a request's chat_template_kwargs wins; built-in names render."""
    from datetime import date

    from tandem.server.prepare import chat_text
    from tandem.server.schemas import ChatBody
    from tandem.tokenizer import BUILTIN_TEMPLATES

    template = ("{% if not date_string is defined %}{% set date_string = '26 Jul 2024' %}"
                "{% endif %}Today: {{ date_string }}|{{ messages[0]['content'] }}")
    tok = SimpleNamespace(apply_chat_template=lambda m, add_generation_prompt, **kw:
                          __import__("jinja2").Template(template).render(messages=m, **kw))
    engine = SimpleNamespace(tok=tok)
    body = ChatBody.model_validate({"messages": [{"role": "user", "content": "hi"}]})
    assert chat_text(engine, body) == f"Today: {date.today().strftime('%d %b %Y')}|hi"
    fixed = ChatBody.model_validate({"messages": [{"role": "user", "content": "hi"}],
                                     "chat_template_kwargs": {"date_string": "1 Jan 2000"}})
    assert chat_text(engine, fixed) == "Today: 1 Jan 2000|hi"
    # FireFunction v2's spelling (datetime), and a variable only llama.cpp's own handler
    # defines (functions) joined to text: nothing, as llama-server renders it
    from tandem.tokenizer import _compile_template

    fire = _compile_template("{% set s = 'Tools:' + functions %}{{ s }} Today is {{ datetime }}.")
    tok.apply_chat_template = lambda m, add_generation_prompt, **kw: fire.render(**kw)
    assert chat_text(engine, body) == f"Tools: Today is {date.today().strftime('%b %d %Y')}."
    import jinja2

    msgs = [{"role": "system", "content": "You are a test."},
            {"role": "user", "content": "Hi there"}]
    cr = jinja2.Template(BUILTIN_TEMPLATES["command-r"]).render(messages=msgs,
                                                                 add_generation_prompt=True)
    assert cr == ("<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>You are a test.<|END_OF_TURN_TOKEN|>"
                  "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>Hi there<|END_OF_TURN_TOKEN|>"
                  "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>")
    l3 = jinja2.Template(BUILTIN_TEMPLATES["llama3"]).render(messages=msgs,
                                                              add_generation_prompt=True)
    assert l3 == ("<|start_header_id|>system<|end_header_id|>\n\nYou are a test.<|eot_id|>"
                  "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\n")


@pytest.mark.parametrize("reasoning,opens,expected_end", [
    ("auto", True, "<|Assistant|><think>\n"),  # DeepSeek-R1's template opens a thought
    ("auto", "knows", "<|Assistant|><think>\n"),  # llama.cpp's copy: closed unless thinking
    ("off", "knows", "<|Assistant|><think>\n</think>"),
    ("on", True, "<|Assistant|><think>\n"),
    ("off", True, "<|Assistant|><think>\n</think>"),  # closed, empty, as llama-server
    ("auto", False, "<|im_start|>assistant\n"),  # Qwen3's: thinking is its own default
    ("off", False, "<|im_start|>assistant\n<think>\n\n</think>\n\n"),  # enable_thinking False
])
def test_reasoning_flag(reasoning, opens, expected_end):
    import jinja2

    from tandem.server.prepare import chat_text
    from tandem.server.schemas import ChatBody

    if opens == "knows":
        template = ("{{ messages[0]['content'] }}<|Assistant|><think>\n"
                    "{% if not enable_thinking %}</think>{% endif %}")
    elif opens:
        template = "{{ messages[0]['content'] }}<|Assistant|><think>\n"
    else:
        template = ("{{ messages[0]['content'] }}<|im_start|>assistant\n"
                    "{% if enable_thinking is defined and not enable_thinking %}"
                    "<think>\n\n</think>\n\n{% endif %}")
    tok = SimpleNamespace(chat_template=template, apply_chat_template=lambda m, **kw:
                          jinja2.Template(template, keep_trailing_newline=True)
                          .render(messages=m, **kw))
    body = ChatBody.model_validate({"messages": [{"role": "user", "content": "Q"}]})
    text = chat_text(SimpleNamespace(tok=tok), body, reasoning)
    assert text == "Q" + expected_end


def test_kv_unified_shares_the_context_and_fails_what_does_not_fit(built):
    """llama.cpp's test_completion_unified: 4 slots over 256 shared tokens. One request may
    write 200 tokens (its share would be 64); four of 70 at once cannot all fit: each answer is
    either whole or a 500 saying the context size has been exceeded, and the server serves on.
    (Any two of 1 + 200 tokens overlap past 256: only requests run one after the other, each
    admitted after the last finished, could all succeed.)"""
    s = Server(["--model", str(built.path), "--ctx-size", "256", "--parallel", "4", "-t", "1",
                "--kv-unified"], built.dir / "unified.log")
    try:
        s.wait_ready(120)
        props = ok(httpx.get(f"{s.url}/props"))
        assert props["default_generation_settings"]["n_ctx"] == 256
        body = {"prompt": "A", "ignore_eos": True, **GREEDY}
        alone = greedy(s, "A", 200, ignore_eos=True)["timings"]
        assert alone["predicted_n"] == 200
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda _: post(s, "/completion", {**body, "n_predict": 200}),
                                    range(4)))
        codes = sorted(r.status_code for r in answers)
        assert codes[0] == 200 and codes[-1] == 500, (alone, [r.text[:300] for r in answers])
        for r in answers:
            if r.status_code == 200:
                assert r.json()["timings"]["predicted_n"] == 200
            else:
                assert "context size has been exceeded" in r.json()["error"]["message"].lower()
        assert greedy(s, "A", 40, ignore_eos=True)["timings"]["predicted_n"] == 40
    finally:
        s.stop()


@pytest.mark.parametrize("idle", ["on", "off"])
def test_idle_slots_go_to_the_prompt_cache_when_a_request_starts(built, idle):
    """llama.cpp's test_clear_and_restore and test_disabled_with_flag: 2 slots sharing one
    context (--kv-unified), --cache-ram. A request starting in slot 1 copies idle slot 0's
    tokens to host memory and clears the slot (its room goes to the shared context); the same
    prompt again is read back from host memory and answers as before. The debug log (-v)
    carries llama-server's markers of those events. --no-cache-idle-slots: slot 0 keeps its
    tokens in place and nothing is saved when slot 1 starts."""
    log = built.dir / f"idle-{idle}.log"
    flags = [] if idle == "on" else ["--no-cache-idle-slots"]
    s = Server(["--model", str(built.path), "--ctx-size", "512", "--parallel", "2", "-t", "1",
                "--kv-unified", "--cache-ram", "100", "-v", *flags], log)
    seen = 0

    def new_log() -> str:
        nonlocal seen
        text = log.read_text()
        out, seen = text[seen:], len(text)
        return out

    try:
        s.wait_ready(120)
        assert ("__TEST_TAG_CACHE_IDLE_SLOTS_ENABLED__" in new_log()) == (idle == "on")
        long = [(7 * i + 3) % 200 + 3 for i in range(60)]
        body = {"n_predict": 4, "cache_prompt": True, **GREEDY}
        first = ok(post(s, "/completion", {"prompt": long, "id_slot": 0, **body}))
        assert first["timings"]["prompt_n"] == 60
        assert "__TEST_TAG_CACHE_IDLE_SLOT__" not in new_log()  # slot 1 held nothing
        ok(post(s, "/completion", {"prompt": [5, 6, 7, 8], "id_slot": 1, **body}))
        assert ("__TEST_TAG_CACHE_IDLE_SLOT__" in new_log()) == (idle == "on")
        again = ok(post(s, "/completion", {"prompt": long, **body}))
        assert again["content"] == first["content"]
        assert (again["timings"]["cache_n"], again["timings"]["prompt_n"]) == (59, 1)
        assert ("updating prompt cache" in new_log()) == (idle == "on")
        more = ok(post(s, "/completion", {"prompt": long + [9, 10, 11], **body}))
        assert more["timings"]["cache_n"] >= 60
        assert "__TEST_TAG_CACHE_IDLE_SLOT__" not in new_log()  # the other slot is empty
    finally:
        s.stop()


def test_cache_ram_brings_back_a_prompt_another_one_displaced(built):
    """llama-server's host-memory prompt cache (on by default): one slot, prompts a, b, a: the
    second a reads one token (the rest comes back from RAM), answers as the first, and the
    metrics count the reused tokens."""
    a = [(7 * i + 3) % 200 + 3 for i in range(100)]
    b = [(13 * i + 1) % 200 + 3 for i in range(90)]
    body = {"n_predict": 6, "cache_prompt": True, **GREEDY}
    first = ok(post(built.plain, "/completion", {"prompt": a, **body}))
    ok(post(built.plain, "/completion", {"prompt": b, **body}))
    again = ok(post(built.plain, "/completion", {"prompt": a, **body}))
    assert first["timings"]["prompt_n"] == 100
    assert (again["timings"]["prompt_n"], again["timings"]["cache_n"]) == (1, 99)
    assert again["content"] == first["content"]
