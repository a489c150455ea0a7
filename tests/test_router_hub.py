"""The router's downloads from the Hugging Face hub (llama-server's POST /models, DELETE /models,
`-hf` of a preset repo; server/router/hub.py, downloads.py) against a stand-in for the hub on
127.0.0.1 (the endpoints huggingface_hub calls: the repo's info, HEAD and GET of
resolve/COMMIT/FILE with X-Repo-Commit, ETag, Content-Length), serving tiny GGUF models. Nothing
here reaches the internet: the router finds the stand-in by $MODEL_ENDPOINT."""

from __future__ import annotations

import functools
import json
import os
import threading
import time
from pathlib import Path

import gguf
import httpx
import pytest

from . import tiny
from .hubstub import StandInHub
from .servers import GREEDY, Server, model_rows


DOWNLOAD = "org/model-router-download:F16"


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """org/tiny-GGUF (Q8_0 and F16 of one tiny model, a projector), org/model-router-download
    (F16), org/split-GGUF (Q8_0 in three shards), org/broken-GGUF (F16 in two shards, the
    second failing), org/test-preset (a preset.ini of two models of those repos)."""
    d = tmp_path_factory.mktemp("hub")
    model = tiny.hf_model("qwen2", seed=0)
    tiny.write_gguf(model, d / "m.gguf", "qwen2")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gguf, "GGUFWriter", functools.partial(gguf.GGUFWriter, split_max_tensors=10))
        tiny.write_gguf(model, d / "s.gguf", "qwen2")
    shards = sorted(d.glob("s-0000*-of-*.gguf"))
    n = len(shards)
    blob = (d / "m.gguf").read_bytes()
    h = StandInHub()
    h.repos["org/tiny-GGUF"] = {"tiny-Q8_0.gguf": blob, "tiny-F16.gguf": blob,
                                "mmproj-tiny-F16.gguf": b"not a projector", "README.md": b"hi"}
    h.repos["org/model-router-download"] = {"model-router-download-F16.gguf": blob}
    h.repos["org/split-GGUF"] = {f"Q8_0/split-Q8_0-{k:05d}-of-{n:05d}.gguf": s.read_bytes()
                                 for k, s in enumerate(shards, 1)}
    h.repos["org/broken-GGUF"] = {"broken-F16-00001-of-00002.gguf": blob,
                                  "broken-F16-00002-of-00002.gguf": blob + b"other"}
    h.broken.add(("org/broken-GGUF", "broken-F16-00002-of-00002.gguf"))
    h.repos["org/slow-GGUF"] = {"slow-Q4_K_M.gguf": bytes(1 << 21)}
    h.slow.add(("org/slow-GGUF", "slow-Q4_K_M.gguf"))
    h.repos["org/test-preset"] = {"preset.ini": (
        "version = 1\n\n[*]\nctx-size = 256\n\n"
        "[tiny-preset]\nhf-repo = org/tiny-GGUF:Q8_0\nno-mmproj = true\n\n"
        "[split-test]\nhf-repo = org/split-GGUF\n").encode(), "README.md": b"a preset"}
    yield h, d
    h.server.shutdown()


@pytest.fixture
def cache(tmp_path, monkeypatch, hub):
    """In this process: the stand-in as the hub, an empty cache."""
    monkeypatch.setenv("MODEL_ENDPOINT", hub[0].url)
    monkeypatch.setenv("LLAMA_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


# --- hub.py in this process -------------------------------------------------------------

def test_plan_picks_the_tag_its_shards_and_the_projector(cache):
    from tandem.server.router import hub

    p = hub.plan("org/tiny-GGUF")  # no tag: Q8_0 (no Q4_K_M)
    assert (p.id, p.files) == ("org/tiny-GGUF:Q8_0", ["tiny-Q8_0.gguf", "mmproj-tiny-F16.gguf"])
    assert hub.plan("org/tiny-GGUF:f16").files[0] == "tiny-F16.gguf"
    split = hub.plan("org/split-GGUF:Q8_0")
    assert len(split.files) > 1 and all("-of-" in f for f in split.files)
    assert hub.plan("org/test-preset").preset
    with pytest.raises(hub.HubError, match="no repository org/nothing-here"):
        hub.plan("org/nothing-here")
    with pytest.raises(hub.HubError, match="no GGUF model of tag Q2_K.*tiny-F16.gguf"):
        hub.plan("org/tiny-GGUF:Q2_K")
    with pytest.raises(hub.HubError, match="expected <user>/<model>"):
        hub.plan("not a name")


def test_fetch_writes_the_cache_layout_the_router_reads_and_remove_empties_it(cache, hub):
    import threading

    from tandem.server.router import hfcache
    from tandem.server.router import hub as hubmod

    seen = []
    first = hubmod.fetch(hubmod.plan("org/split-GGUF"), lambda *a: seen.append(a),
                         threading.Event())
    assert first.name.endswith("-00001-of-00003.gguf") or "-00001-of-" in first.name
    [m] = hfcache.cached_models()
    assert m.id == "org/split-GGUF:Q8_0" and len(m.files) > 1
    assert all(f.is_file() for f in m.files)
    assert seen[-1][1] == seen[-1][2] > 0  # the last file's progress: done == total
    assert hubmod.remove("org/split-GGUF:Q8_0")
    assert hfcache.cached_models() == []
    assert not any((hfcache.repo_dir("org/split-GGUF") / "blobs").iterdir())
    assert not hubmod.remove("org/split-GGUF:Q8_0")  # nothing left


def test_a_failed_download_leaves_no_file_of_its_own(cache, hub):
    import threading

    from tandem.server.router import hfcache
    from tandem.server.router import hub as hubmod

    with pytest.raises(Exception, match="500|broke"):
        hubmod.fetch(hubmod.plan("org/broken-GGUF:F16"), lambda *a: None, threading.Event())
    repo = hfcache.repo_dir("org/broken-GGUF")
    assert hfcache.cached_models() == []
    assert [p for p in repo.rglob("*") if p.is_file() and ".lock" not in p.name] == []


# --- the router ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def router(hub, tmp_path_factory):
    """`tandem serve -hf org/test-preset`: the preset repo fetched, the router on its models."""
    h, _ = hub
    d = tmp_path_factory.mktemp("router-hub")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "LLAMA_"))}
    env.update(MODEL_ENDPOINT=h.url, LLAMA_CACHE=str(d / "cache"), HF_HUB_DISABLE_TELEMETRY="1")
    s = Server(["-hf", "org/test-preset", "--models-max", "2", "--threads", "1",
                "--no-warmup"], d / "router.log", env=env)
    try:
        s.wait_ready(90)
        yield s, d / "cache"
    finally:
        s.stop()


def _wait(s: Server, name: str, want: str, timeout: float = 240) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = model_rows(s).get(name)
        if row is not None and row["status"]["value"] == want:
            return row
        time.sleep(0.05)
    raise AssertionError(f"{name} never became {want}: {model_rows(s).get(name)}\n"
                         f"{s.log()[-3000:]}")


class Events:
    """/models/sse's events, collected in a thread from the moment the stream is open."""

    def __init__(self, s: Server) -> None:
        self.got: list[dict] = []
        self.open = threading.Event()
        self.stop = threading.Event()
        threading.Thread(target=self._listen, args=(s,), daemon=True).start()
        assert self.open.wait(10), "the SSE stream did not open"

    def _listen(self, s: Server) -> None:
        with httpx.stream("GET", f"{s.url}/models/sse", timeout=60) as r:
            self.open.set()
            for line in r.iter_lines():
                if self.stop.is_set():
                    return
                if line.startswith("data: "):
                    self.got.append(json.loads(line[6:]))

    def wait(self, event: str, model: str, timeout: float = 30) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for e in self.got:
                if e.get("event") == event and e.get("model") == model:
                    return e
            time.sleep(0.02)
        raise AssertionError(f"no {event} for {model}: {self.got}")


def test_the_remote_preset_lists_its_models_and_one_downloads_as_it_loads(router, hub):
    s, cache = router
    listing = model_rows(s)
    assert {"tiny-preset", "split-test"} <= set(listing)
    row = listing["tiny-preset"]
    assert row["source"] == "preset" and row["path"] is None and row["status"]["value"] == \
        "unloaded"
    assert not (cache / "models--org--tiny-GGUF").exists()  # nothing fetched before a load
    r = httpx.post(f"{s.url}/models/load", json={"model": "tiny-preset"}, timeout=30)
    assert r.status_code == 200 and r.json() == {"success": True}, r.text
    row = _wait(s, "tiny-preset", "loaded")
    assert row["path"].endswith("tiny-Q8_0.gguf")
    r = httpx.post(f"{s.url}/completion", json={"model": "tiny-preset", "prompt": "one two",
                                                "n_predict": 4, **GREEDY}, timeout=60)
    assert r.status_code == 200 and "content" in r.json(), r.text
    assert "org/tiny-GGUF:Q8_0" in model_rows(s)  # the cache's model too, as llama-server


def test_post_models_downloads_in_the_background_then_lists_loads_and_deletes(router, hub):
    s, cache = router
    events = Events(s)
    r = httpx.post(f"{s.url}/models", json={"model": DOWNLOAD}, timeout=30)
    assert r.status_code == 200 and r.json() == {"success": True}, r.text
    events.wait("download_finished", DOWNLOAD)
    progress = [e for e in events.got if e["event"] == "download_progress"]
    assert progress and progress[-1]["model"] == DOWNLOAD
    [(url, p)] = progress[-1]["data"]["progress"].items()
    assert url.endswith("/resolve/" + hub[0].commit("org/model-router-download")
                        + "/model-router-download-F16.gguf") and p["done"] == p["total"] > 0
    row = model_rows(s)[DOWNLOAD]
    assert row["source"] == "cache" and row["can_remove"] is True
    r = httpx.post(f"{s.url}/v1/completions", json={"model": DOWNLOAD, "prompt": "one two",
                                                    "max_tokens": 4, **GREEDY}, timeout=60)
    assert r.status_code == 200, r.text  # autoloaded, answered
    # again: it exists now
    r = httpx.post(f"{s.url}/models", json={"model": DOWNLOAD}, timeout=30)
    assert r.status_code == 400 and "already exists" in r.json()["error"]["message"]
    # DELETE: a loaded model is stopped, its files removed, it leaves the list
    r = httpx.delete(f"{s.url}/models", params={"model": DOWNLOAD}, timeout=60)
    assert r.status_code == 200 and r.json() == {"success": True}, r.text
    assert DOWNLOAD not in model_rows(s)
    events.wait("model_remove", DOWNLOAD)
    repo = cache / "models--org--model-router-download"
    assert not [p for p in repo.rglob("*.gguf")] and not any((repo / "blobs").iterdir())
    events.stop.set()


def test_bad_downloads_and_deletes_are_refused_naming_the_model(router, hub):
    s, cache = router

    def post(name):
        return httpx.post(f"{s.url}/models", json={"model": name}, timeout=30)

    r = post("org/nothing-here")
    assert r.status_code == 400 and "no repository org/nothing-here" in r.text
    r = post("org/tiny-GGUF:Q2_K")
    assert r.status_code == 400 and "no GGUF model of tag Q2_K" in r.text
    r = post("not a repo")
    assert r.status_code == 400 and "expected <user>/<model>" in r.text
    r = httpx.post(f"{s.url}/models", json={}, timeout=10)
    assert r.status_code == 400 and "model name is missing" in r.text
    r = post("org/test-preset")
    assert r.status_code == 400 and "preset repo" in r.text
    r = httpx.delete(f"{s.url}/models", params={"model": "org/never:Q8_0"}, timeout=10)
    assert r.status_code == 404 and "org/never:Q8_0" in r.text
    r = httpx.delete(f"{s.url}/models", params={"model": "split-test"}, timeout=10)
    assert r.status_code == 400 and "not removable" in r.text and "preset" in r.text
    r = httpx.delete(f"{s.url}/models", timeout=10)
    assert r.status_code == 400 and "model name is missing" in r.text


def test_a_failed_download_says_why_and_leaves_nothing_listed(router, hub):
    s, cache = router
    events = Events(s)
    name = "org/broken-GGUF:F16"
    r = httpx.post(f"{s.url}/models", json={"model": name}, timeout=30)
    assert r.status_code == 200, r.text
    failed = events.wait("download_failed", name)
    assert "500" in failed["data"]["error"] or "broke" in failed["data"]["error"]
    row = model_rows(s)[name]
    assert row["status"]["value"] == "failed" and row["status"]["error"] == \
        failed["data"]["error"]
    r = httpx.get(f"{s.url}/models", params={"reload": "1"}, timeout=30)
    ids = {m["id"]: m for m in r.json()["data"]}
    assert ids[name]["source"] == "cache" and ids[name]["status"]["value"] == "failed"
    assert [p for p in (cache / "models--org--broken-GGUF").rglob("*.gguf")] == []
    r = httpx.delete(f"{s.url}/models", params={"model": name}, timeout=30)
    assert r.status_code == 200 and name not in model_rows(s)
    events.stop.set()


def test_delete_cancels_a_running_download_and_removes_its_part(router, hub):
    s, cache = router
    events = Events(s)
    name = "org/slow-GGUF"  # no tag: its Q4_K_M
    r = httpx.post(f"{s.url}/models", json={"model": name}, timeout=30)
    assert r.status_code == 200, r.text
    events.wait("download_progress", name)
    assert model_rows(s)[name]["status"]["value"] == "downloading"
    r = httpx.post(f"{s.url}/models", json={"model": name}, timeout=30)
    assert r.status_code == 400 and "already being downloaded" in r.text
    r = httpx.delete(f"{s.url}/models", params={"model": name}, timeout=60)
    assert r.status_code == 200 and r.json() == {"success": True}, r.text
    events.wait("model_remove", name)
    assert not any(e["event"] == "download_finished" and e["model"] == name
                   for e in events.got)
    listing = model_rows(s)
    assert name not in listing and "org/slow-GGUF:Q4_K_M" not in listing
    repo = cache / "models--org--slow-GGUF"
    assert [p for p in repo.rglob("*") if p.is_file() and ".lock" not in p.name] == []
    events.stop.set()


def _env(hub, cache: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "LLAMA_"))}
    return {**env, "MODEL_ENDPOINT": hub.url, "LLAMA_CACHE": str(cache),
            "HF_HUB_DISABLE_TELEMETRY": "1"}


def test_serve_hf_of_a_model_repo_downloads_and_serves_it(hub, tmp_path):
    import subprocess

    from .servers import SERVE

    h, _ = hub
    for args, said in ((["-hf", "org/nothing-here"], "no repository org/nothing-here"),
                       (["-hf", "org/tiny-GGUF", "--offline"], "--offline forbids"),
                       (["-hf", "org/test-preset", "-m", "x.gguf"], "both name the model")):
        out = subprocess.run([*SERVE, *args, "--port", "0"], capture_output=True, text=True,
                             timeout=120, env=_env(h, tmp_path / "cache"))
        assert out.returncode == 2 and said in out.stderr, out.stderr
    s = Server(["-hf", DOWNLOAD, "--threads", "1", "--no-warmup", "-c", "256"],
               tmp_path / "serve.log", env=_env(h, tmp_path / "cache"))
    try:
        s.wait_ready(240)
        r = httpx.post(f"{s.url}/completion", json={"prompt": "one two", "n_predict": 4,
                                                    **GREEDY}, timeout=60)
        assert r.status_code == 200, r.text
        path = httpx.get(f"{s.url}/props", timeout=10).json()["model_path"]
        assert path.endswith("model-router-download-F16.gguf") and str(tmp_path) in path
    finally:
        s.stop()


def test_post_models_downloads_even_with_offline_as_llama_server(hub, tmp_path):
    """--offline forbids the downloads nobody asked for; POST /models is asked for."""
    (tmp_path / "models").mkdir()
    s = Server(["--models-dir", str(tmp_path / "models"), "--offline"], tmp_path / "r.log",
               env=_env(hub[0], tmp_path / "cache"))
    try:
        s.wait_ready(120)
        events = Events(s)
        r = httpx.post(f"{s.url}/models", json={"model": "org/tiny-GGUF:F16"}, timeout=30)
        assert r.status_code == 200, r.text
        events.wait("download_finished", "org/tiny-GGUF:F16")
        assert model_rows(s)["org/tiny-GGUF:F16"]["source"] == "cache"
        events.stop.set()
    finally:
        s.stop()
