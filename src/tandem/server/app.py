"""The FastAPI application: llama.cpp's endpoints, the guard (API key, body size), the error
shape. OpenAI's endpoints are in oai.py.

    GET  /health            503 {"error": {"message": "Loading model"}} while loading, then 200
    POST /completion        llama.cpp's fields in and out; SSE when "stream": true
    POST /tokenize          {"content": str, "add_special": bool} -> {"tokens": [...]}
    POST /detokenize        {"tokens": [...]} -> {"content": str}
    GET  /props             default generation settings, total_slots, model path, speculation
    GET  /slots             what every slot is doing
    GET  /metrics           Prometheus text (see metrics.py)

Every error is {"error": {"message", "type", "code"}} with its HTTP status, from any endpoint.
Any origin may call the API (CORS, as llama-server); the API key still applies.
"""

from __future__ import annotations

import hmac
import json
import logging

from fastapi import FastAPI, Request as HttpRequest
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

from .jobs import off_loop, read_body, sse_response, submit, wait_result
from .prepare import build_request, n_predict_of, prompt_ids
from .results import generation_settings, spec_settings
from .schemas import ApiError, CompletionBody, parse_body
from .state import ServerState
from .worker import Delta, Done

log = logging.getLogger("tandem.server")

PUBLIC_PATHS = ("/health", "/v1/health", "/models", "/v1/models")


def error_response(e: ApiError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status)


class Guard:
    """ASGI middleware: the API key (Authorization: Bearer KEY, or X-Api-Key) and the body
    size limit, checked before any handler runs."""

    def __init__(self, app, state: ServerState) -> None:
        self.app, self.state = app, state

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        error = self._check(scope, headers)
        if error is not None:
            return await error_response(error)(scope, receive, send)
        limit = self.state.settings.max_body_bytes
        seen = 0

        async def counted_receive():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise ApiError(413, _too_large(limit))
            return message

        await self.app(scope, counted_receive, send)

    def _check(self, scope, headers: dict[str, str]) -> ApiError | None:
        key = self.state.settings.api_key
        if key and scope["path"] not in PUBLIC_PATHS and scope["method"] != "OPTIONS":
            given = headers.get("x-api-key") or ""
            auth = headers.get("authorization", "")
            if auth.lower().startswith("bearer "):
                given = auth[7:].strip()
            if not given:
                return ApiError(401, "missing API key: send 'Authorization: Bearer KEY'")
            if not hmac.compare_digest(given.encode(), key.encode()):
                return ApiError(401, "invalid API key")
        length = headers.get("content-length")
        limit = self.state.settings.max_body_bytes
        if length is not None and length.isdigit() and int(length) > limit:
            return ApiError(413, _too_large(limit))
        return None


def _too_large(limit: int) -> str:
    return f"the request body is larger than {limit // (1024 * 1024)} MB, the most this " \
           "server accepts"


def create_app(state: ServerState) -> FastAPI:
    from .oai import router as oai_router

    app = FastAPI(title="tandem", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.tandem = state

    @app.exception_handler(ApiError)
    async def _api_error(_req, e: ApiError):
        return error_response(e)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(req, e: StarletteHTTPException):
        if e.status_code == 404:
            return error_response(ApiError(404, f"no such endpoint: {req.method} {req.url.path}"))
        if e.status_code == 405:
            return error_response(ApiError(405, f"{req.method} is not allowed on {req.url.path}"))
        return error_response(ApiError(e.status_code, str(e.detail)))

    @app.exception_handler(Exception)
    async def _internal(_req, e: Exception):
        log.exception("unhandled error")
        return error_response(ApiError(500, f"internal error: {type(e).__name__}: {e}"))

    app.add_middleware(Guard, state=state)
    # outermost: browsers on another origin may call the API (preflight OPTIONS answered
    # here, before the key check), as llama-server allows
    app.add_middleware(CORSMiddleware, allow_origins=["*"], allow_methods=["*"],
                       allow_headers=["*"])
    _llama_routes(app, state)
    app.include_router(oai_router)
    return app


def _llama_routes(app: FastAPI, state: ServerState) -> None:
    @app.get("/health")
    @app.get("/v1/health")
    async def health():
        state.ready()
        return {"status": "ok"}

    @app.post("/completion")
    @app.post("/completions")
    async def completion(http: HttpRequest):
        engine, _ = state.ready()
        body: CompletionBody = parse_body(await read_body(http, state), CompletionBody)
        ids = await off_loop(prompt_ids, engine, body.prompt)
        req = build_request(engine, body, ids, n_predict_of(body.n_predict), body.n_probs,
                            state.settings.sampling)
        job = submit(state, req, body.stream)
        if body.stream:
            return await sse_response(http, state, job,
                                      _completion_chunks(state, body.return_tokens))
        result = await wait_result(http, state, job)
        # llama-server's fields: the ids only when asked for (return_tokens), the prompt as
        # text, whether the answer has a new line
        return {"index": 0, **result, "model": state.model_name,
                "tokens": result["tokens"] if body.return_tokens else [],
                "prompt": engine.tok.decode(ids), "has_new_line": "\n" in result["content"]}

    @app.post("/tokenize")
    async def tokenize(http: HttpRequest):
        engine, _ = state.ready()
        data = _json_object(await read_body(http, state))
        content, add_special = data.get("content", ""), data.get("add_special", False)
        if not isinstance(content, str) or not isinstance(add_special, bool):
            raise ApiError(400, "tokenize: 'content' must be a string, 'add_special' a boolean")
        tokens = await off_loop(lambda: engine.tok.encode(content, add_special=add_special,
                                                          parse_special=True))
        return {"tokens": tokens}

    @app.post("/detokenize")
    async def detokenize(http: HttpRequest):
        engine, _ = state.ready()
        tokens = _json_object(await read_body(http, state)).get("tokens", [])
        vocab = engine.tok.vocab_size
        if not (isinstance(tokens, list) and all(
                isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab
                for t in tokens)):
            raise ApiError(400, f"detokenize: 'tokens' must be a list of token ids in "
                                f"0..{vocab - 1}")
        return {"content": engine.tok.decode(tokens)}

    @app.get("/props")
    async def props():
        engine, _ = state.ready()
        return {
            "default_generation_settings": {
                "id": 0, "n_ctx": engine.cfg.ctx_size,
                "params": generation_settings(state.settings.sampling, engine.spec,
                                              engine.cfg.ctx_size),
            },
            "total_slots": engine.cfg.n_parallel,
            "model_path": state.model_path,
            "model_alias": state.model_name,
            "draft_model_path": state.draft_path,
            "speculative": spec_settings(engine.spec, state.draft_path),
            "chat_template": engine.tok.chat_template or "",
            "bos_token": _token_text(engine, engine.tok.bos_id),
            "eos_token": _token_text(engine, engine.tok.eos_id),
            "build_info": "tandem",
        }

    @app.get("/slots")
    async def slots():
        if not state.settings.slots_endpoint:
            raise ApiError(501, "this server was started with --no-slots: GET /slots is off")
        _, worker = state.ready()
        return worker.slots()

    @app.get("/metrics")
    async def metrics():
        return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)


def _completion_chunks(state: ServerState, return_tokens: bool):
    """llama-server's /completion stream: a chunk per step (its token ids only with
    return_tokens), then the full result with stop: true. `from_draft` says, per token,
    whether it was an accepted draft token."""

    def render(event: Delta | Done) -> list[dict]:
        if isinstance(event, Delta):
            chunk = {"index": 0, "content": event.text,
                     "tokens": event.tokens if return_tokens else [], "stop": False,
                     "from_draft": event.from_draft}
            if event.logprobs:
                from .results import probabilities

                chunk["completion_probabilities"] = probabilities(state.engine, event.logprobs)
            return [chunk]
        # the text went out in the chunks; the final one carries the stats, as llama-server's
        final = {"index": 0, **event.result, "content": "", "tokens": [],
                 "model": state.model_name}
        final.pop("completion_probabilities", None)  # each chunk carried its own
        return [final]

    return render


def _json_object(raw: bytes) -> dict:
    try:
        data = json.loads(raw or b"{}")
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ApiError(400, f"the request body is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise ApiError(400, "the request body must be a JSON object")
    return data


def _token_text(engine, token_id: int | None) -> str:
    return "" if token_id is None else engine.tok.tokens[token_id]
