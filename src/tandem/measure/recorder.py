"""A recording proxy for `tandem bench --agent`: it sits between an agent client and a server,
forwards every request (a streamed answer streamed through as it arrives, event by event) and
records, per request: a hash of what it asked (the ids servers make up left out), when it started, when the answer's headers and its first content (text,
reasoning or a tool call) came, when it ended, the prompt and completion tokens, the tool calls
in the answer and the server's `timings` (draft_n, draft_n_accepted, cache_n, prompt_ms, ...).

Standard library only, as scripts/speculative-benchmark.py is, so it measures llama-server and
Tandem alike and imports nothing of the engine. It reads the answers of chat completions
(`/v1/chat/completions`, plain and streamed), the Responses API (`/v1/responses`) and
llama-server's `/completion`.

    with Recorder("http://127.0.0.1:8080") as rec:    # the agent talks to rec.url
        ...
        requests = rec.take()                          # the records since the last take
"""

from __future__ import annotations

import hashlib
import http.client
import json
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# headers that belong to one connection, not to the request or answer they travel with
HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer",
       "upgrade", "host", "content-length", "accept-encoding"}
TEXT_LIMIT = 2000  # characters of an answer's text kept in a record


class Answer:
    """What one answer said, read from its body or its stream's events as they pass."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.calls: dict[object, dict] = {}  # by stream index or item id, in order of arrival
        self.usage: dict = {}
        self.timings: dict | None = None
        self.started = False  # some content (text, reasoning, tool call) has arrived

    def feed_event(self, obj: object) -> bool:
        """One streamed event's JSON; True when it carried the answer's first content."""
        if not isinstance(obj, dict):
            return False
        before = self.started
        self._common(obj)
        kind = obj.get("type")
        if isinstance(kind, str) and kind.startswith("response."):
            self._responses_event(kind, obj)
        else:
            for choice in obj.get("choices") or []:
                self._chat_delta(choice.get("delta") or {})
            if isinstance(obj.get("content"), str) and obj["content"]:  # /completion
                self.text.append(obj["content"])
                self.started = True
        return self.started and not before

    def feed_body(self, obj: object) -> None:
        """A whole (not streamed) answer's JSON."""
        if not isinstance(obj, dict):
            return
        self._common(obj)
        for choice in obj.get("choices") or []:
            message = choice.get("message") or {}
            self._chat_delta(message)
            if isinstance(choice.get("text"), str):
                self.text.append(choice["text"])
        for item in obj.get("output") or []:  # the Responses API
            self._responses_item(item)
        if isinstance(obj.get("content"), str):
            self.text.append(obj["content"])

    def _common(self, obj: dict) -> None:
        for where in (obj, obj.get("response") if isinstance(obj.get("response"), dict) else {}):
            if isinstance(where.get("timings"), dict):
                self.timings = where["timings"]
            if isinstance(where.get("usage"), dict):
                self.usage = where["usage"]

    def _chat_delta(self, delta: dict) -> None:
        for key in ("reasoning_content", "content"):
            if isinstance(delta.get(key), str) and delta[key]:
                if key == "content":
                    self.text.append(delta[key])
                self.started = True
        for i, call in enumerate(delta.get("tool_calls") or []):
            slot = self.calls.setdefault(call.get("index", i), {"name": "", "arguments": ""})
            function = call.get("function") or {}
            slot["name"] += function.get("name") or ""
            slot["arguments"] += function.get("arguments") or ""
            self.started = True

    def _responses_event(self, kind: str, obj: dict) -> None:
        if kind.endswith(".delta"):
            self.started = True
        if kind == "response.output_text.delta":
            self.text.append(obj.get("delta") or "")
        elif kind == "response.output_item.done" and isinstance(obj.get("item"), dict):
            if obj["item"].get("type") == "function_call":
                self._responses_item(obj["item"])

    def _responses_item(self, item: dict) -> None:
        if item.get("type") == "function_call":
            key = item.get("call_id") or item.get("id") or len(self.calls)
            self.calls[key] = {"name": item.get("name", ""), "arguments": item.get("arguments", "")}
        elif item.get("type") == "message":
            for part in item.get("content") or []:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    self.text.append(part["text"])

    def record(self) -> dict:
        text = "".join(self.text)
        u, t = self.usage, self.timings or {}
        # without usage (a stream not asked for it), the counts of llama-server's timings
        prompt = t.get("prompt_n", 0) + t.get("cache_n", 0) if "prompt_n" in t else None
        return {
            "prompt_tokens": u.get("prompt_tokens", u.get("input_tokens", prompt)),
            "completion_tokens": u.get("completion_tokens",
                                       u.get("output_tokens", t.get("predicted_n"))),
            "tool_calls": list(self.calls.values()),
            "text": text[:TEXT_LIMIT], "text_chars": len(text),
            "text_sha256": hashlib.sha256(text.encode()).hexdigest(),
            "timings": self.timings,
        }


class Recorder:
    """The proxy: a threaded HTTP server on 127.0.0.1 (a free port) in front of `upstream`."""

    def __init__(self, upstream: str, timeout: float = 1800.0) -> None:
        parts = urllib.parse.urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.timeout = timeout
        self.t0 = time.monotonic()
        self._records: list[dict] = []
        self._lock = threading.Condition()
        self._in_flight = 0
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> Recorder:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def mark(self) -> None:
        """Times of later records count from now."""
        self.t0 = time.monotonic()

    def begin(self) -> None:
        with self._lock:
            self._in_flight += 1

    def add(self, record: dict | None) -> None:
        """A request's record (None: one not recorded) once its answer has been passed on."""
        with self._lock:
            if record is not None:
                self._records.append(record)
            self._in_flight -= 1
            self._lock.notify_all()

    def take(self, wait: float = 10.0) -> list[dict]:
        """The records since the last take, in order of their start; first waits up to `wait`
        seconds for the requests in flight (a client may read an answer's last byte before
        its record is made)."""
        with self._lock:
            self._lock.wait_for(lambda: self._in_flight == 0, timeout=wait)
            out, self._records = self._records, []
        return sorted(out, key=lambda r: r["start_s"])


def _handler(recorder: Recorder) -> type[BaseHTTPRequestHandler]:
    class Handler(_Forward):
        rec = recorder
    return Handler


class _Forward(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    rec: Recorder

    def log_message(self, *args) -> None:  # quiet: the records are the log
        pass

    def handle(self) -> None:
        try:
            super().handle()
        except (ConnectionResetError, BrokenPipeError):
            pass  # a client closed a kept-alive connection

    def do_GET(self) -> None:
        self._forward()

    do_POST = do_PUT = do_DELETE = do_OPTIONS = do_GET

    def _forward(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        self.rec.begin()
        start = time.monotonic()
        record = {"method": self.command, "path": self.path, "start_s": start - self.rec.t0,
                  **_request_fields(body)}
        conn = http.client.HTTPConnection(*self.rec.upstream, timeout=self.rec.timeout)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
            conn.request(self.command, self.path, body=body, headers=headers)
            resp = conn.getresponse()
            record["status"] = resp.status
            record["head_s"] = time.monotonic() - self.rec.t0
            answer = Answer()
            if "text/event-stream" in (resp.getheader("Content-Type") or ""):
                record["stream"] = True
                record["first_s"] = self._stream(resp, answer)
            else:
                record["stream"] = False
                self._plain(resp, answer)
            record.update(answer.record())
        except (OSError, http.client.HTTPException) as e:
            record["error"] = f"{type(e).__name__}: {e}"
            self.close_connection = True
        finally:
            conn.close()
            record["end_s"] = time.monotonic() - self.rec.t0
            quiet = self.path.split("?")[0] in ("/health", "/v1/models", "/models", "/props")
            self.rec.add(None if quiet else record)

    def _head(self, resp: http.client.HTTPResponse, extra: dict[str, str]) -> None:
        self.send_response(resp.status, resp.reason)
        for k, v in resp.getheaders():
            if k.lower() not in HOP:
                self.send_header(k, v)
        for k, v in extra.items():
            self.send_header(k, v)
        self.end_headers()

    def _plain(self, resp: http.client.HTTPResponse, answer: Answer) -> None:
        data = resp.read()
        self._head(resp, {"Content-Length": str(len(data))})
        self.wfile.write(data)
        self.wfile.flush()
        try:
            answer.feed_body(json.loads(data))
        except ValueError:
            pass

    def _stream(self, resp: http.client.HTTPResponse, answer: Answer) -> float | None:
        """Pass the events through as they come (chunked); the first content's time."""
        self._head(resp, {"Transfer-Encoding": "chunked"})
        first, event = None, b""
        while True:
            line = resp.readline()
            event += line
            if line.startswith(b"data:"):
                try:
                    obj = json.loads(line[5:].strip())
                except ValueError:
                    obj = None
                if answer.feed_event(obj) and first is None:
                    first = time.monotonic() - self.rec.t0
            if line in (b"\n", b"\r\n", b"") and event:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                self.wfile.flush()
                event = b""
            if not line:
                break
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()
        return first


def _request_fields(body: bytes | None) -> dict:
    """What a record keeps of the request: its size, the sampling it asked for, its shape."""
    if not body:
        return {}
    try:
        obj = json.loads(body)
    except ValueError:
        return {"request_bytes": len(body)}
    if not isinstance(obj, dict):
        return {"request_bytes": len(body)}
    items = obj.get("messages") if isinstance(obj.get("messages"), list) else obj.get("input")
    stable = json.dumps(_without_ids(obj), sort_keys=True).encode()
    return {"request_bytes": len(body), "request_sha256": hashlib.sha256(stable).hexdigest(),
            "model": obj.get("model"),
            "temperature": obj.get("temperature"), "max_tokens": obj.get("max_tokens",
                                                                          obj.get("max_output_tokens")),
            "items": len(items) if isinstance(items, list) else None,
            "tools": len(obj["tools"]) if isinstance(obj.get("tools"), list) else 0}


VOLATILE = {"id", "call_id", "tool_call_id", "previous_response_id"}


def _without_ids(obj: object) -> object:
    """The request without the ids a server made up (tool calls', responses', items'), so that
    two runs that sent the same conversation hash alike."""
    if isinstance(obj, dict):
        return {k: _without_ids(v) for k, v in obj.items() if k not in VOLATILE}
    if isinstance(obj, list):
        return [_without_ids(v) for v in obj]
    return obj
