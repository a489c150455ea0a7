"""Router mode (`tandem serve --models-dir DIR --models-preset FILE`, llama-server's "using
multiple models"): a real router over tiny models, each loaded one a child `tandem serve`.
The listing, autoload, routing by "model", streaming through the router, load / unload,
--models-max's least-recently-used unload, the /models/sse events, the draft picked at load
(greedy output equal to the target's alone), and every bad input: an unknown model, a preset
key Tandem does not know, a load that does not fit in memory, a split model missing a shard;
the other models keep serving."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import threading
import time

import gguf
import httpx
import pytest

from . import tiny
from .servers import GREEDY, SERVE, Server, model_rows

CHAT = [{"role": "user", "content": "Count: one two three"}]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """alpha, beta (other weights), alpha-draft (alpha's weights: every greedy draft accepted),
    split/ (three shards), broken/ (its second shard missing); a preset with [*], a section
    for a directory model, a model of its own (custom) and one too large for any machine."""
    d = tmp_path_factory.mktemp("router")
    root = d / "models"
    root.mkdir()
    alpha = tiny.hf_model("qwen2", seed=0)
    tiny.write_gguf(alpha, root / "alpha.gguf", "qwen2")
    tiny.write_gguf(alpha, root / "alpha-draft.gguf", "qwen2")
    tiny.write_gguf(tiny.hf_model("qwen2", seed=1), root / "beta.gguf", "qwen2")
    for name in ("split", "broken"):
        (root / name).mkdir()
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(gguf, "GGUFWriter", functools.partial(gguf.GGUFWriter,
                                                             split_max_tensors=10))
            tiny.write_gguf(alpha, root / name / "m.gguf", "qwen2")
    (root / "broken" / "m-00002-of-00003.gguf").unlink()
    # llama-server's cache (the hub's layout): org/tiny-GGUF:Q8_0, beta's file
    snap = d / "cache" / "models--org--tiny-GGUF" / "snapshots" / ("ab" * 20)
    snap.mkdir(parents=True)
    (snap / "tiny-Q8_0.gguf").symlink_to(root / "beta.gguf")
    (d / "cache" / "models--org--tiny-GGUF" / "refs").mkdir()
    (d / "cache" / "models--org--tiny-GGUF" / "refs" / "main").write_text("ab" * 20)
    preset = d / "models.ini"
    preset.write_text(f"version = 1\n\n[*]\nctx-size = 256\n\n[beta]\nn-predict = 6\n\n"
                      f"[custom]\nmodel = {root / 'beta.gguf'}\ntemp = 0\n\n"
                      f"[huge]\nmodel = {root / 'alpha.gguf'}\nc = 400000000\n\n"
                      "[hub]\nhf-repo = org/tiny-GGUF\ndedup-cache-models = 1\n")
    return d, root, preset


@pytest.fixture(scope="module")
def router(models):
    d, root, preset = models
    s = Server(["--models-dir", str(root), "--models-preset", str(preset), "--models-max", "2",
                "--threads", "1", "--no-warmup"], d / "router.log",
               env={**os.environ, "LLAMA_CACHE": str(d / "cache")})
    try:
        s.wait_ready(60)
        yield s
    finally:
        s.stop()


def _status(s: Server, name: str) -> str:
    return model_rows(s)[name]["status"]["value"]


def _wait(s: Server, name: str, want: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _status(s, name) == want:
            return
        time.sleep(0.05)
    raise AssertionError(f"{name} never became {want}: {model_rows(s)[name]}\n{s.log()[-3000:]}")


def _post(s: Server, path: str, body: dict, timeout: float = 60) -> httpx.Response:
    return httpx.post(f"{s.url}{path}", json=body, timeout=timeout)


def _load(s: Server, name: str, **extra) -> None:
    r = _post(s, "/models/load", {"model": name, **extra})
    assert r.status_code == 200 and r.json() == {"success": True}, r.text
    _wait(s, name, "loaded")


def _unload_all(s: Server) -> None:
    for name, m in model_rows(s).items():
        if m["status"]["value"] != "unloaded":
            _post(s, "/models/unload", {"model": name})
            _wait(s, name, "unloaded")


def _chat(s: Server, model: str, **extra) -> dict:
    r = _post(s, "/v1/chat/completions", {"model": model, "messages": CHAT, "max_tokens": 8,
                                          **GREEDY, **extra})
    assert r.status_code == 200, r.text
    return r.json()


def test_lists_every_model_of_the_folder_and_the_preset(router, models):
    _, root, _ = models
    listing = model_rows(router)
    # the cache's org/tiny-GGUF:Q8_0 is hidden by [hub]'s dedup-cache-models
    assert sorted(listing) == ["alpha", "alpha-draft", "beta", "broken", "custom", "hub",
                               "huge", "split"]
    assert listing["hub"]["path"].endswith("tiny-Q8_0.gguf")
    alpha, split = listing["alpha"], listing["split"]
    assert alpha["status"] == {"value": "unloaded"} and alpha["draft"] is None
    assert alpha["path"] == str(root / "alpha.gguf") and alpha["source"] == "models_dir"
    assert split["path"] == str(root / "split" / "m-00001-of-00003.gguf")
    assert len(split["files"]) == 3
    assert listing["custom"]["source"] == "preset"
    assert "ctx-size = 256" in listing["beta"]["status"]["preset"]
    props = httpx.get(f"{router.url}/props", timeout=10).json()
    assert props["role"] == "router" and props["max_instances"] == 2
    assert props["models_autoload"] is True and props["build_info"].startswith("b")
    assert httpx.get(f"{router.url}/health", timeout=10).status_code == 200
    v1 = httpx.get(f"{router.url}/v1/models", timeout=10).json()["data"]
    assert [m["id"] for m in v1] == sorted(listing)
    page = httpx.get(f"{router.url}/", timeout=10)  # the web page, as in single-model mode
    assert page.status_code == 200 and "<html" in page.text.lower()


def test_a_chat_loads_its_model_and_is_routed_by_name(router):
    _unload_all(router)
    a = _chat(router, "alpha")
    assert a["model"] == "alpha" and _status(router, "alpha") == "loaded"
    b = _chat(router, "beta")
    assert b["model"] == "beta"
    assert b["choices"][0]["message"]["content"] != a["choices"][0]["message"]["content"]
    assert _chat(router, "alpha")["choices"] == a["choices"]  # the same engine, greedy
    # GET: ?model= picks the child (its own /props: its model and the preset's flags)
    props = httpx.get(f"{router.url}/props", params={"model": "beta"}, timeout=10).json()
    assert props["model_alias"] == "beta" and props["default_generation_settings"]["n_ctx"] \
        == 256


def test_a_stream_passes_through_chunk_by_chunk(router):
    body = {"model": "alpha", "messages": CHAT, "max_tokens": 8, "stream": True, **GREEDY}
    events = []
    with httpx.stream("POST", f"{router.url}/v1/chat/completions", json=body,
                      timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith(
            "text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[6:]))
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events
                   if e["choices"])
    assert len(events) > 2 and text == _chat(router, "alpha")["choices"][0]["message"][
        "content"]
    # the router asks a child's /health when the child logs that it is ready (not every 50
    # ms: polling took CPU from the load); a changed line would slow every load by ~1 s
    from tandem.server.router.children import READY_LINE

    assert f"[alpha] {READY_LINE}" in router.log()


def test_models_max_unloads_the_least_recently_used(router):
    _unload_all(router)
    _load(router, "alpha")
    _load(router, "beta")
    _chat(router, "alpha")  # beta is now the least recently used
    _load(router, "custom")
    listing = model_rows(router)
    assert {n: m["status"]["value"] for n, m in listing.items()
            if m["status"]["value"] != "unloaded"} == {"alpha": "loaded", "custom": "loaded"}
    # custom's preset section: temp 0, the shared ctx-size from [*]
    props = httpx.get(f"{router.url}/props", params={"model": "custom"}, timeout=10).json()
    assert props["default_generation_settings"]["params"]["temperature"] == 0
    assert props["default_generation_settings"]["n_ctx"] == 256


def test_load_and_unload_send_their_events(router):
    _unload_all(router)
    events: list[dict] = []
    ready = threading.Event()

    def listen():
        with httpx.stream("GET", f"{router.url}/models/sse", timeout=60) as r:
            ready.set()
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(json.loads(line[6:]))
                    if events[-1].get("data", {}).get("status") == "unloaded":
                        return

    t = threading.Thread(target=listen, daemon=True)
    t.start()
    assert ready.wait(10)
    _load(router, "beta")
    r = _post(router, "/models/unload", {"model": "beta"})
    assert r.status_code == 200 and r.json() == {"success": True}
    t.join(30)
    assert [(e["event"], e["data"]["status"]) for e in events if e["model"] == "beta"] == [
        ("model_status", "loading"), ("status_change", "loaded"),
        ("status_change", "unloaded")]
    assert _status(router, "beta") == "unloaded"
    r = _post(router, "/models/unload", {"model": "beta"})
    assert r.status_code == 400 and "not running" in r.json()["error"]["message"]


def test_a_draft_picked_at_load_gives_the_targets_own_greedy_output(router):
    _unload_all(router)
    alone = _chat(router, "alpha", max_tokens=24)
    _load(router, "alpha", draft="alpha-draft")
    item = model_rows(router)["alpha"]
    assert item["draft"] == "alpha-draft" and "--model-draft" in item["status"]["args"]
    props = httpx.get(f"{router.url}/props", params={"model": "alpha"}, timeout=10).json()
    assert props["speculative"]["enabled"] and props["draft_model_path"].endswith(
        "alpha-draft.gguf")
    paired = _chat(router, "alpha", max_tokens=24)
    assert paired["choices"] == alone["choices"]
    assert paired["timings"]["draft_n"] > 0  # the draft did propose
    _load(router, "alpha", draft=None)  # loaded again without one
    assert model_rows(router)["alpha"]["draft"] is None
    r = _post(router, "/models/load", {"model": "alpha", "draft": "nope"})
    assert r.status_code == 404 and "nope" in r.json()["error"]["message"]


def test_a_cache_model_hidden_from_the_list_still_answers(router):
    _unload_all(router)
    hidden = _chat(router, "org/tiny-GGUF:Q8_0")  # beta's file, through llama-server's cache
    assert hidden["choices"] == _chat(router, "hub")["choices"]


def test_a_split_model_loads_from_its_shards(router):
    _unload_all(router)
    assert _chat(router, "split")["choices"] == _chat(router, "alpha")["choices"]


def test_bad_requests_are_refused_by_name_and_the_others_keep_serving(router):
    _unload_all(router)
    _load(router, "alpha")
    r = _post(router, "/v1/chat/completions", {"model": "nope", "messages": CHAT})
    assert r.status_code == 400 and "'nope' not found" in r.json()["error"]["message"]
    r = _post(router, "/models/load", {"model": "nope"})
    assert r.status_code == 404 and "'nope'" in r.json()["error"]["message"]
    r = _post(router, "/v1/chat/completions", {"messages": CHAT})
    assert r.status_code == 400 and "model name is missing" in r.json()["error"]["message"]
    r = _post(router, "/models", {"model": "org/tiny-GGUF:Q8_0"})  # a download: it is there
    assert r.status_code == 400 and "already exists" in r.json()["error"]["message"]
    # a split model missing a shard: refused naming it, before any child starts
    r = _post(router, "/models/load", {"model": "broken"})
    assert r.status_code == 400 and "m-00002-of-00003.gguf" in r.json()["error"]["message"]
    # a load whose memory plan does not fit: refused with the numbers
    r = _post(router, "/models/load", {"model": "huge"})
    msg = r.json()["error"]["message"]
    assert r.status_code == 400 and "does not fit in memory" in msg and "needs" in msg \
        and "available" in msg, msg
    assert _status(router, "huge") == "unloaded" and _status(router, "broken") == "unloaded"
    # autoload off for this request: 400 until loaded
    r = httpx.post(f"{router.url}/v1/chat/completions?autoload=false",
                   json={"model": "beta", "messages": CHAT}, timeout=30)
    assert r.status_code == 400 and "not loaded" in r.json()["error"]["message"]
    assert _chat(router, "alpha")["model"] == "alpha"  # still serving


def test_load_on_startup_then_asleep_then_woken_by_a_request(models, tmp_path):
    _, root, _ = models
    preset = tmp_path / "p.ini"
    preset.write_text("[alpha]\nload-on-startup = true\n")
    s = Server(["--models-dir", str(root), "--models-preset", str(preset), "--threads", "1",
                "--ctx-size", "256", "--no-warmup", "--sleep-idle-seconds", "1"],
               tmp_path / "log", env={**os.environ, "LLAMA_CACHE": str(tmp_path / "no-cache")})
    try:
        s.wait_ready(60)
        _wait(s, "alpha", "sleeping", 60)  # loaded at start (load-on-startup), then asleep
        before = _chat(s, "alpha")
        _wait(s, "alpha", "sleeping", 30)
        assert _chat(s, "alpha")["choices"] == before["choices"]  # woken, the same answer
    finally:
        s.stop()


def _start(args: list[str], tmp_path) -> subprocess.CompletedProcess:
    return subprocess.run([*SERVE, *args, "--port", "0"], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path,
                          env={**os.environ, "LLAMA_CACHE": str(tmp_path / "no-cache")})


def test_a_preset_key_tandem_does_not_know_stops_the_start(models, tmp_path):
    _, root, _ = models
    bad = tmp_path / "bad.ini"
    bad.write_text(f"[m]\nmodel = {root / 'alpha.gguf'}\nctx-sise = 256\n")
    out = _start(["--models-preset", str(bad)], tmp_path)
    assert out.returncode == 2 and "ctx-sise" in out.stderr and str(bad) in out.stderr
    hub = tmp_path / "hub.ini"
    hub.write_text("[m]\nhf-repo = ggml-org/models\n")
    out = _start(["--models-preset", str(hub), "--offline"], tmp_path)  # (else downloaded)
    assert out.returncode == 2 and "hf-repo" in out.stderr and "--offline" in out.stderr
    out = _start(["--models-dir", str(tmp_path / "none")], tmp_path)
    assert out.returncode == 2 and "none: no such folder" in out.stderr
    out = _start(["--models-dir", str(root), "-md", str(root / "alpha.gguf")], tmp_path)
    assert out.returncode == 2 and "--model-draft with --models-dir" in out.stderr
    out = _start(["--models-dir", str(root), "-m", str(root / "alpha.gguf")], tmp_path)
    assert out.returncode == 2 and "has no --model of its own" in out.stderr


def _catalog(tmp_path, preset_text: str | None = None, models_dir=None):
    from tandem.flags import Parser
    from tandem.server import cli
    from tandem.server.router.catalog import Catalog

    parser = Parser(prog="tandem serve")
    cli.add_arguments(parser)
    preset = None
    if preset_text is not None:
        preset = tmp_path / "p.ini"
        preset.write_text(preset_text)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LLAMA_CACHE", str(tmp_path / "no-cache"))
        return Catalog(None if models_dir is None else str(models_dir),
                       None if preset is None else str(preset), parser)


def test_a_folder_is_read_as_llama_server_reads_it(tmp_path):
    d = tmp_path / "m"
    (d / "vision").mkdir(parents=True)
    (d / "big").mkdir()
    for name in ("one.gguf", "mmproj-x.gguf", "mtp-one.gguf", "notes.txt", "vision/v-Q8_0.gguf",
                 "vision/mmproj-F16.gguf", "big/b-00001-of-00002.gguf",
                 "big/b-00002-of-00002.gguf"):
        (d / name).write_bytes(b"")
    cat = _catalog(tmp_path, models_dir=d)
    by_id = {e.id: e for e in cat.entries()}
    assert sorted(by_id) == ["big", "one", "vision"]  # projectors and sidecars are not models
    assert by_id["vision"].mmproj == (d / "vision" / "mmproj-F16.gguf").resolve()
    assert by_id["vision"].model_args()[-2:] == ["--mmproj", str(by_id["vision"].mmproj)]
    assert by_id["big"].path.name == "b-00001-of-00002.gguf" and len(by_id["big"].files) == 2


def test_preset_keys_are_the_flags_short_long_or_variables(tmp_path):
    cat = _catalog(tmp_path, "version = 1\n[*]\nc = 512\n[m]\nmodel = /x/m.gguf\n"
                             "jinja = false\nLLAMA_ARG_N_PARALLEL = 2\nmetrics = true\n"
                             "md = /x/d.gguf\nload-on-startup = true\nstop-timeout = 3\n")
    m = cat.get("m")
    assert m.args == ["-c=512", "--no-jinja", "--parallel=2", "--metrics"]
    assert m.draft == "/x/d.gguf" and m.load_on_startup and m.stop_timeout == 3
    assert m.source == "preset" and str(m.path) == "/x/m.gguf"


@pytest.mark.parametrize("text,named", [
    ("[m]\nmodel = /x/m.gguf\nport = 9\n", "port: set by the router"),
    ("[m]\nmodel = /x/m.gguf\nhf-file = a.gguf\n", "hf-file: not supported by Tandem"),
    ("[m]\nctx-size = 9\n", "[m] is not a model"),
    ("[m]\nmodel = /x/m.gguf\njinja = perhaps\n", "jinja = 'perhaps': expected true or false"),
    ("[m\nmodel = x\n", "not an INI file"),
])
def test_a_bad_preset_is_refused_naming_what(tmp_path, text, named):
    from tandem.errors import TandemError

    with pytest.raises(TandemError, match="p.ini") as e:
        _catalog(tmp_path, text)
    assert named in str(e.value)
