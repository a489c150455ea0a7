"""Images through the server, as llama-server takes them with --mmproj (its suite's
test_security::test_local_media_file and test_slot_save image cases, ported onto a tiny
Gemma 3 and a tiny projector): /completion's multimodal_data and chat image_url parts (data:
URIs, file:// under --media-path only), the image's positions reused from the cache only for
the same image, slot files holding images, and a server without a projector refusing both."""

from __future__ import annotations

import base64
import concurrent.futures
import io
from types import SimpleNamespace

import httpx
import pytest
import torch

from tests import tiny_vision
from tests.servers import GREEDY, Server


def _png(seed: int, size=(40, 24)) -> bytes:
    from PIL import Image

    g = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (size[1], size[0], 3), generator=g, dtype=torch.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels.numpy()).save(out, "PNG")
    return out.getvalue()


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    d = tmp_path_factory.mktemp("media")
    model, mmproj = tiny_vision.write_pair(d)
    (d / "slots").mkdir()
    (d / "media" / "sub").mkdir(parents=True)
    (d / "media" / "sub" / "cat.png").write_bytes(_png(1))
    (d / "outside.png").write_bytes(_png(2))
    common = ["--model", str(model), "--ctx-size", "512", "--parallel", "2", "-t", "1",
              "--slot-save-path", str(d / "slots")]
    vision = Server([*common, "--mmproj", str(mmproj), "--media-path", str(d / "media")],
                    d / "vision.log")
    plain = Server(common, d / "plain.log")
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda s: s.wait_ready(120), (vision, plain)))
        marker = httpx.get(f"{vision.url}/props").json()["media_marker"]
        yield SimpleNamespace(vision=vision, plain=plain, marker=marker, dir=d)
    finally:
        vision.stop()
        plain.stop()


def post(server: Server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=60)


def completion(s, server, images: list[bytes], slot: int = 0, text="What is this: {} then\n"):
    prompt = {"prompt_string": text.format(*[s.marker] * len(images)),
              "multimodal_data": [base64.b64encode(i).decode() for i in images]}
    return post(server, "/completion", {"prompt": prompt, "n_predict": 6, "id_slot": slot,
                                        "cache_prompt": True, **GREEDY})


def chat(server, url: str) -> httpx.Response:
    return post(server, "/v1/chat/completions", {"max_tokens": 1, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "test"},
                                     {"type": "image_url", "image_url": {"url": url}}]}]})


def test_props_say_vision_and_a_random_marker(servers):
    props = httpx.get(f"{servers.vision.url}/props").json()
    assert props["modalities"] == {"vision": True, "video": False, "audio": False}
    assert servers.marker.startswith("<__media_") and len(servers.marker) > 12
    assert httpx.get(f"{servers.plain.url}/props").json()["modalities"]["vision"] is False


def test_an_images_positions_are_reused_only_for_the_same_image(servers):
    s = servers
    first = completion(s, s.vision, [_png(1)])
    assert first.status_code == 200, first.text
    t = first.json()["timings"]
    full = t["prompt_n"]
    assert t["cache_n"] == 0 and full > 64  # 64 positions of the image, and the text
    again = completion(s, s.vision, [_png(1)]).json()
    assert again["timings"]["cache_n"] == full - 1 and again["timings"]["prompt_n"] == 1
    assert again["content"] == first.json()["content"]
    other = completion(s, s.vision, [_png(3)]).json()  # only the text before the image
    before = post(s.vision, "/tokenize", {"content": "What is this: <start_of_image>",
                                          "add_special": True}).json()["tokens"]
    assert other["timings"]["cache_n"] == len(before)
    assert other["timings"]["prompt_n"] == full - len(before)
    two = completion(s, s.vision, [_png(1), _png(3)], text="A: {} B: {}\n").json()
    assert two["timings"]["prompt_n"] + two["timings"]["cache_n"] > 128


@pytest.mark.parametrize("url,status", [
    ("file://sub/cat.png", 200),
    ("file:////sub//cat.png", 200),  # the same file
    ("file://sub/notfound.png", 400),
    ("file://../outside.png", 400),  # no way out of --media-path
])
def test_local_media_files_only_under_the_media_path(servers, url, status):
    r = chat(servers.vision, url)
    assert r.status_code == status, r.text


def test_data_uris_and_bad_images(servers):
    good = "data:image/png;base64," + base64.b64encode(_png(4)).decode()
    assert chat(servers.vision, good).status_code == 200
    r = chat(servers.vision, "data:image/png;base64," + base64.b64encode(b"not an image").decode())
    assert r.status_code == 400 and "cannot be decoded" in r.json()["error"]["message"]
    r = chat(servers.vision, "data:text/plain;base64,AAAA")
    assert r.status_code == 400 and "invalid uri format" in r.json()["error"]["message"]
    r = completion(servers, servers.vision, [_png(1)], text="no marker here\n")
    assert r.status_code == 400 and "1 image(s) but 0 media marker(s)" in r.text


def test_a_server_without_a_projector_refuses_images(servers):
    r = chat(servers.plain, "data:image/png;base64," + base64.b64encode(_png(4)).decode())
    assert r.status_code == 400
    assert "you may need to provide the mmproj" in r.json()["error"]["message"]
    assert chat(servers.plain, "file://sub/cat.png").status_code == 400  # no --media-path
    r = completion(servers, servers.plain, [_png(1)])
    assert r.status_code == 400 and "multimodal" in r.json()["error"]["message"]


def test_slot_files_hold_images(servers):
    s = servers
    first = completion(s, s.vision, [_png(6)], slot=1).json()
    full = first["timings"]["prompt_n"] + first["timings"]["cache_n"]
    saved = post(s.vision, "/slots/1?action=save", {"filename": "image.bin"}).json()
    assert saved["n_saved"] > 64
    assert post(s.vision, "/slots/1?action=erase", {}).status_code == 200
    restored = post(s.vision, "/slots/0?action=restore", {"filename": "image.bin"}).json()
    assert restored["n_restored"] == saved["n_saved"]
    again = completion(s, s.vision, [_png(6)], slot=0).json()
    assert again["timings"]["cache_n"] == full - 1 and again["timings"]["prompt_n"] == 1
    assert again["content"] == first["content"]
    # a server without a projector cannot hold an image: refused, the slot empty and usable
    r = post(s.plain, "/slots/0?action=restore", {"filename": "image.bin"})
    assert r.status_code == 400
    assert "Cannot restore media tokens without an mmproj" in r.json()["error"]["message"]
    r = post(s.plain, "/completion", {"prompt": "The quick brown fox", "id_slot": 0,
                                      "n_predict": 4, **GREEDY})
    assert r.status_code == 200 and r.json()["timings"]["cache_n"] == 0
