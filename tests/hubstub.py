"""A stand-in for the Hugging Face hub on 127.0.0.1: the endpoints huggingface_hub calls to
download a file (the repo's info with its commit and file list, HEAD and GET of
resolve/COMMIT/FILE with X-Repo-Commit, ETag, Content-Length, ranges; RepoNotFound and
EntryNotFound errors as the hub codes them). tests/test_router_hub.py and
experiments/llama_suite/hub_standin.py serve their files with it."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class StandInHub:
    """repo -> {path in the repo: bytes}; `broken` files answer HEAD but fail their GET."""

    def __init__(self) -> None:
        self.repos: dict[str, dict[str, bytes]] = {}
        self.broken: set[tuple[str, str]] = set()
        self.slow: set[tuple[str, str]] = set()  # sent in small pieces, slowly
        self.gets: list[str] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_GET(self):
                hub.answer(self, body=True)

            def do_HEAD(self):
                hub.answer(self, body=False)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @staticmethod
    def commit(repo: str) -> str:
        return hashlib.sha1(repo.encode()).hexdigest()

    def answer(self, h: BaseHTTPRequestHandler, body: bool) -> None:
        path = h.path.split("?")[0].lstrip("/")
        if path.startswith("api/models/"):
            repo = "/".join(path.removeprefix("api/models/").split("/")[:2])
            if repo not in self.repos:
                return self._error(h, 404, "RepoNotFound", "Repository not found", body)
            info = {"id": repo, "modelId": repo, "sha": self.commit(repo), "private": False,
                    "siblings": [{"rfilename": f} for f in self.repos[repo]]}
            return self._send(h, 200, json.dumps(info).encode(), body,
                              {"Content-Type": "application/json"})
        parts = path.split("/")
        repo, file = "/".join(parts[:2]), "/".join(parts[4:])
        if len(parts) < 5 or parts[2] != "resolve" or repo not in self.repos:
            return self._error(h, 404, "RepoNotFound", "Repository not found", body)
        if file not in self.repos[repo]:
            return self._error(h, 404, "EntryNotFound", f"{file} not found", body)
        data = self.repos[repo][file]
        if body:
            self.gets.append(f"{repo}/{file}")
            if (repo, file) in self.broken:
                return self._error(h, 500, "", "the disk of the stand-in hub broke", body)
        headers = {"X-Repo-Commit": self.commit(repo), "Content-Type": "application/octet-stream",
                   "ETag": f'"{hashlib.sha256(data).hexdigest()}"', "Accept-Ranges": "bytes"}
        start = 0
        if body and h.headers.get("Range", "").startswith("bytes="):
            start = int(h.headers["Range"][6:].split("-")[0])
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        self._send(h, 206 if start else 200, data[start:], body, headers,
                   slow=(repo, file) in self.slow)

    def _error(self, h, status: int, code: str, message: str, body: bool) -> None:
        headers = {"Content-Type": "application/json", "X-Error-Message": message}
        if code:
            headers["X-Error-Code"] = code
        self._send(h, status, json.dumps({"error": message}).encode(), body, headers)

    @staticmethod
    def _send(h, status: int, data: bytes, body: bool, headers: dict,
              slow: bool = False) -> None:
        h.send_response(status)
        for k, v in {**headers, "Content-Length": str(len(data))}.items():
            h.send_header(k, v)
        h.end_headers()
        step = 1 << 15 if slow else len(data) or 1
        for at in range(0, len(data) if body else 0, step):
            h.wfile.write(data[at:at + step])
            if slow:
                time.sleep(0.02)
