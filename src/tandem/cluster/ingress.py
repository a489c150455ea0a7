"""The fleet's HTTP side: one Ray Serve ingress deployment in front of the engine replicas.

Every route is forwarded, as it came, to one replica's own app (replica.py), so the API key,
the body limit, the errors, the page and the streams are one `tandem serve`'s. Two are the
fleet's own: GET /health (200 with how many replicas are ready; 503 while none is) and GET
/metrics with --metrics (board.py: the replicas' counters summed, queue depth and KV use per
replica). Each answer names its replica in the header `x-tandem-replica`.

Before forwarding, the request's routing facts are computed here (affinity.Route): its session
(`x-session` header, or `id_slot`) and the block keys of its prompt in the model's tokens (the
chat template rendered for `messages`, `prompt` or `input` encoded), read by router.py.

Faults: a replica that fails before it has the request (it died, Ray is replacing it) -> the
request goes to another (up to TRIES times); one that fails after -> 502 with a message, or in
a stream that has started, an error event and the end of the stream.
"""


import asyncio
import json
import logging
import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from ray import serve
from ray.serve.exceptions import BackPressureError

from ..server import anthropic
from ..server.app import Guard, error_response
from ..server.metrics import CONTENT_TYPE
from ..server.schemas import ApiError
from ..server.state import ServerState
from .affinity import Route, block_keys
from .board import NAME, NAMESPACE, render
from .replica import loopback_grpc

log = logging.getLogger("tandem.server")
TRIES = 3
READY_S = 0.25
METHODS = ["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"]

app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)


class _Ingress:
    """The deployment's class (launch.py deploys `Ingress`, the end of this file)."""

    def __init__(self, settings, replicas: int, engines: str) -> None:
        import ray

        loopback_grpc()
        self.engines_app, self.engines = engines, None  # the replicas' application
        self.settings, self.replicas = settings, replicas
        self.guard = Guard(None, ServerState(settings))  # the API key of /metrics
        self.board = ray.get_actor(NAME, namespace=NAMESPACE)
        self.tok, self.tok_tried = None, False
        self.asked = (0.0, 0)  # (when, replicas ready)
        self.scraped: dict = {}  # the fleet's totals at the last /metrics (board.render)

    @app.get("/health")
    @app.get("/v1/health")
    async def health(self) -> JSONResponse:
        self.asked = (0.0, 0)  # asked now
        ready = await self._ready()
        if ready == 0:
            return error_response(_loading(self.replicas))
        return JSONResponse({"status": "ok", "replicas_ready": ready,
                             "replicas": self.replicas})

    @app.get("/metrics")
    async def metrics(self, request: Request) -> Response:
        if not self.settings.metrics_endpoint:  # a replica answers as without --metrics
            return await self.forward(request)
        error = self.guard._check(request.scope, {k.lower(): v for k, v in
                                                  request.headers.items()})
        if error is not None:
            return error_response(error, request.url.path)
        view = await self.board.fleet.remote()
        response = Response(render(view, self.scraped), media_type=CONTENT_TYPE)
        started = min((s["t_start"] for s in view["replicas"].values()), default=0)
        response.raw_headers.append((b"Process-Start-Time-Unix", str(started).encode()))
        return response  # (llama-server's header: the first replica's start)

    @app.api_route("/{path:path}", methods=METHODS)
    async def forward(self, request: Request) -> Response:
        body = await _body(request, self.settings.max_body_bytes)
        call = {"method": request.method, "path": request.url.path,
                "query": request.url.query, "headers": list(request.headers.items()),
                "body": body, "client": tuple(request.client) if request.client else None}
        path = request.url.path
        if await self._ready() == 0:  # loading, or every replica gone: Ray is replacing them
            return error_response(_loading(self.replicas), path)
        route = await self._route(request, body)
        gen, took, why = None, None, ""
        for _ in range(TRIES):
            gen = self.engines.call.remote(call, route=route)
            try:
                took = await gen.__anext__()
                break
            except Exception as e:  # not started on that replica: another one
                why = _reason(e)
                if isinstance(e, BackPressureError):  # every replica's queue is full
                    return error_response(ApiError(503, "the server is busy: every replica's "
                                                        "queue is full; try again later"), path)
                log.warning("a replica failed before taking %s %s (%s); trying another",
                            request.method, path, why)
        if took is None:
            return error_response(ApiError(503, f"no replica could take the request: {why}"),
                                  path)
        try:
            start = await gen.__anext__()
        except Exception as e:
            return error_response(ApiError(502, f"the replica handling the request failed "
                                                f"before answering: {_reason(e)}"), path)
        stream = StreamingResponse(_rest(gen, path, start), status_code=start["status"])
        stream.raw_headers = [(k.encode("latin-1"), v.encode("latin-1"))
                              for k, v in start["headers"]]
        stream.raw_headers.append((b"x-tandem-replica", took["replica"].encode()))
        return stream

    async def _ready(self) -> int:
        """Replicas ready now (reporting to the board, asked at most every READY_S); the
        handle once one is."""
        now = time.monotonic()
        if now - self.asked[0] > READY_S:
            self.asked = (now, len((await self.board.fleet.remote())["replicas"]))
        ready = self.asked[1]
        if ready and self.engines is None:
            self.engines = serve.get_deployment_handle(
                "Engine", app_name=self.engines_app).options(stream=True)
        return ready

    async def _route(self, request: Request, body: bytes) -> Route:
        session = request.headers.get("x-session")
        try:
            data = json.loads(body) if body else {}
        except ValueError:
            data = {}
        if not isinstance(data, dict):
            data = {}
        session = _session(session, data)
        tok = await self._tokenizer()
        try:
            tokens = await asyncio.to_thread(_prompt_tokens, tok, data)
        except Exception:  # a body the replica will refuse; nothing to route by
            tokens = []
        return Route(session, block_keys(tokens))

    async def _tokenizer(self):
        """The target's tokenizer, from the model file a replica reports (once); None where
        this node cannot read it: prompts are then keyed by their UTF-8 bytes."""
        if self.tok_tried:
            return self.tok
        reps = (await self.board.fleet.remote())["replicas"]
        if not reps:
            return None
        self.tok_tried = True
        path = next(iter(reps.values()))["model_path"]
        try:
            self.tok = await asyncio.to_thread(_load_tokenizer, path)
            if self.settings.chat_template is not None:
                self.tok.chat_template = self.settings.chat_template
        except Exception as e:
            log.warning("routing by bytes, not tokens: the tokenizer of %s: %s", path, e)
        return self.tok


def _session(header: str | None, data: dict) -> str | None:
    """The request's session: its x-session header, else, for a request naming a slot
    (`id_slot` >= 0), one session for all of them: a client naming slots means one server's
    (llama.cpp's test_kv_keep_only_active: slot 1's launch clears idle slot 0 there)."""
    slot = data.get("id_slot")
    if header is None and isinstance(slot, int) and slot >= 0:
        return "id_slot"
    return header


def _loading(replicas: int) -> ApiError:
    return ApiError(503, f"Loading model: no replica is ready yet (0 of {replicas})")


def _load_tokenizer(path: str):
    from pathlib import Path

    from ..models.gguf_file import GGUFFile
    from ..tokenizer import Tokenizer

    if Path(path).is_dir():
        return Tokenizer.from_hf_dir(path)
    return Tokenizer.from_gguf_metadata(GGUFFile(Path(path)).metadata)


def _prompt_tokens(tok, data: dict) -> list[int]:
    """The prompt's tokens as the replica will see them, near enough to key its prefix: the
    chat template over `messages`, else `prompt` / `input` (a string, or token ids)."""
    messages, prompt = data.get("messages"), data.get("prompt", data.get("input"))
    if isinstance(messages, list):
        if isinstance(data.get("system"), str):  # Anthropic's system prompt
            messages = [{"role": "system", "content": data["system"]}, *messages]
        text = None
        if tok is not None:
            try:
                text = tok.apply_chat_template(messages)
            except Exception:  # parts, tools, images: their JSON still keys the prefix
                text = None
        prompt = text if text is not None else json.dumps(messages, sort_keys=True)
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return prompt
    if not isinstance(prompt, str):
        return []
    if tok is None:
        return list(prompt.encode())
    return tok.encode(prompt, add_special=False, parse_special=True)


async def _body(request: Request, limit: int) -> bytes:
    """The body, or none past the limit: the replica's guard answers 413 from the length."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        return b""
    return await request.body()


async def _rest(gen, path: str, start: dict):
    """The body's chunks; a failure mid-stream ends it with an error event."""
    sse = any(k.lower() == "content-type" and v.startswith("text/event-stream")
              for k, v in start["headers"])
    finished = False
    try:
        async for chunk in gen:
            yield chunk
        finished = True
    except Exception as e:
        error = ApiError(502, f"the replica handling the request failed: {_reason(e)}")
        log.warning("%s: %s", path, error.message)
        finished = True
        if sse and anthropic.is_anthropic(path):
            yield f"event: error\ndata: {json.dumps(anthropic.error_body(error))}\n\n".encode()
        elif sse:
            yield f"data: {json.dumps(error.body())}\n\n".encode()
    finally:
        if not finished:  # the client went away: the replica stops generating
            gen.cancel()


def _reason(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}".rstrip(": ")


# Here, at the end: every process that imports this module needs its routes bound to the class
# (serve.ingress rewrites the app's routes), and the app is pickled now, with the functions
# above already defined.
Ingress = serve.ingress(app)(_Ingress)
