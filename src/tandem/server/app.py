"""The FastAPI application: the routers of every concern, the guard (API key, body size), the
error shape.

    props.py        GET /health, /props, /metrics; POST /tokenize, /detokenize
    completion.py   POST /completion, /infill (llama.cpp's fields; SSE when "stream": true)
    slots.py        GET /slots; POST /slots/{id}?action=save|restore|erase
    oai.py          OpenAI's /v1/models, /v1/completions, /v1/chat/completions
    embeddings.py   /v1/embeddings, /embedding(s) (--embedding)
    rerank.py       /rerank (--reranking)
    anthropic.py    Anthropic's /v1/messages, /v1/messages/count_tokens
    experimental.py GET/POST /tools (--tools), /cors-proxy (--ui-mcp-proxy); 403 without
    page/           the web page at / (off with --no-ui)
    openapi.py      GET /openapi.json: this API described, request bodies included

Every error is {"error": {"message", "type", "code"}} with its HTTP status, from any endpoint
but Anthropic's (/v1/messages...), whose errors are {"type": "error", "error": {"type",
"message", "code"}}.
Any origin may call the API (CORS, as llama-server; only localhost with --tools unless
--cors-origins says otherwise); the API key still applies, to /tools and /cors-proxy too.
"""

from __future__ import annotations

import hmac
import logging

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from . import anthropic
from .cors import Cors
from .openapi import describe
from .page import routes as page
from .schemas import ApiError
from .state import ServerState

log = logging.getLogger("tandem.server")

# with --api-key, only these and the page's files (page.PUBLIC) answer without it, as
# llama-server (0c1e570) has it; the model list, /props, /openapi.json and the rest need it
PUBLIC_PATHS = ("/health", "/v1/health")


def error_response(e: ApiError, path: str = "") -> JSONResponse:
    """The error in the shape of the API its path belongs to (OpenAI's, or Anthropic's)."""
    body = anthropic.error_body(e) if anthropic.is_anthropic(path) else e.body()
    return JSONResponse(body, status_code=e.status)


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
            return await error_response(error, scope["path"])(scope, receive, send)
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
        path = scope["path"]
        public = path in PUBLIC_PATHS or self.state.settings.ui and (
            path in page.PUBLIC or path.startswith(page.PUBLIC_PREFIX))
        if key and not public and scope["method"] != "OPTIONS":
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


def error_handlers(app: FastAPI) -> None:
    """Every error in llama-server's shape (error_response): ours, Starlette's 404 / 405,
    a bad path or query parameter, and anything unhandled (500, logged). The router's app
    (router/app.py) takes the same."""
    @app.exception_handler(ApiError)
    async def _api_error(req, e: ApiError):
        return error_response(e, req.url.path)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(req, e: StarletteHTTPException):
        path = req.url.path
        if e.status_code == 404:
            return error_response(ApiError(404, f"no such endpoint: {req.method} {path}"), path)
        if e.status_code == 405:
            return error_response(ApiError(405, f"{req.method} is not allowed on {path}"), path)
        return error_response(ApiError(e.status_code, str(e.detail)), path)

    @app.exception_handler(RequestValidationError)
    async def _bad_parameter(req, e: RequestValidationError):  # a path or query parameter
        first = e.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()) if p not in ("path", "query"))
        return error_response(ApiError(400, f"invalid request: {where}: {first.get('msg')}"),
                              req.url.path)

    @app.exception_handler(Exception)
    async def _internal(req, e: Exception):
        log.exception("unhandled error")
        return error_response(ApiError(500, f"internal error: {type(e).__name__}: {e}"),
                              req.url.path)


def create_app(state: ServerState) -> FastAPI:
    from . import completion, embeddings, experimental, oai, props, rerank, responses, slots

    app = FastAPI(title="tandem", docs_url=None, redoc_url=None, openapi_url="/openapi.json")
    app.state.tandem = state
    error_handlers(app)

    if state.sleeper is not None:  # --sleep-idle-seconds: inside the key check
        from .sleep import SleepGate

        app.add_middleware(SleepGate, sleeper=state.sleeper, routes=lambda: app.routes)
    app.add_middleware(Guard, state=state)
    # outermost: browsers on another origin may call the API (preflight OPTIONS answered
    # here, before the key check), as llama-server allows
    app.add_middleware(Cors, allowed=state.settings.cors_origins)
    for module in (props, completion, slots, oai, embeddings, rerank, responses, anthropic):
        app.include_router(module.router)
    # /tools and /cors-proxy: 403 feature_disabled unless --tools / --ui-mcp-proxy
    app.include_router(experimental.router)
    if state.settings.ui:  # the page at / (page/); --no-ui: 404 there, as llama-server
        app.include_router(page.router)
    describe(app)  # GET /openapi.json with every route's body (openapi.py)
    return app
