"""The FastAPI application: llama.cpp's endpoints, the guard (API key, body size), the error
shape. OpenAI's endpoints are in oai.py.

    GET  /health            503 {"error": {"message": "Loading model"}} while loading, then 200
    POST /completion        llama.cpp's fields in and out; SSE when "stream": true
    POST /infill            fill-in-the-middle (infill.py), answered as /completion
    POST /tokenize          {"content": str, "add_special": bool} -> {"tokens": [...]}
    POST /detokenize        {"tokens": [...]} -> {"content": str}
    GET  /props             default generation settings, total_slots, model path, speculation
    GET  /slots             what every slot is doing
    POST /slots/{id}        ?action=save|restore {"filename"} (--slot-save-path), erase
    GET  /metrics           Prometheus text (see metrics.py)
    GET  /                  the web page (page.py; off with --no-ui)
    GET  /openapi.json      this API described, request bodies included (openapi.py)
    GET  /tools             the agent tools (--tools; agent_tools.py), 403 without
    POST /tools             {"tool", "params", "stream"}: run one (SSE with "stream": true)
    GET  /cors-proxy        ?url=URL: the request forwarded (--ui-mcp-proxy; corsproxy.py),
    POST /cors-proxy        403 without

Every error is {"error": {"message", "type", "code"}} with its HTTP status, from any endpoint.
Any origin may call the API (CORS, as llama-server; only localhost with --tools unless
--cors-origins says otherwise); the API key still applies, to /tools and /cors-proxy too.
"""

from __future__ import annotations

import hmac
import json
import logging

from fastapi import FastAPI, Request as HttpRequest
from fastapi.responses import JSONResponse, Response
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from .metrics import CONTENT_TYPE
from . import page
from .cors import Cors
from .openapi import describe
from . import images
from .jobs import off_loop, read_body, sse_response, submit, wait_results
from .prepare import build_request, constraints_of, n_predict_of, prompt_list
from .results import generation_settings, spec_settings
from ..errors import TandemError
from ..media import prompt_text
from .schemas import ApiError, CompletionBody, parse_body
from .state import ServerState
from .worker import Delta, Done, Progress

log = logging.getLogger("tandem.server")

# with --api-key, only these and the page's files (page.PUBLIC) answer without it, as
# llama-server (0c1e570) has it; the model list, /props, /openapi.json and the rest need it
PUBLIC_PATHS = ("/health", "/v1/health")


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


def create_app(state: ServerState) -> FastAPI:
    from .agent_tools import router as tools_router
    from .corsproxy import router as proxy_router
    from .embeddings import router as embeddings_router
    from .rerank import router as rerank_router
    from .oai import router as oai_router

    app = FastAPI(title="tandem", docs_url=None, redoc_url=None, openapi_url="/openapi.json")
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

    @app.exception_handler(RequestValidationError)
    async def _bad_parameter(_req, e: RequestValidationError):  # a path or query parameter
        first = e.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()) if p not in ("path", "query"))
        return error_response(ApiError(400, f"invalid request: {where}: {first.get('msg')}"))

    @app.exception_handler(Exception)
    async def _internal(_req, e: Exception):
        log.exception("unhandled error")
        return error_response(ApiError(500, f"internal error: {type(e).__name__}: {e}"))

    app.add_middleware(Guard, state=state)
    # outermost: browsers on another origin may call the API (preflight OPTIONS answered
    # here, before the key check), as llama-server allows
    app.add_middleware(Cors, allowed=state.settings.cors_origins)
    _llama_routes(app, state)
    app.include_router(oai_router)
    app.include_router(embeddings_router)
    app.include_router(rerank_router)
    app.include_router(tools_router)  # 403 feature_disabled unless --tools, as llama-server
    app.include_router(proxy_router)  # 403 feature_disabled unless --ui-mcp-proxy
    if state.settings.ui:  # the page at / (page.py); --no-ui: 404 there, as llama-server
        app.include_router(page.router)
    describe(app)  # GET /openapi.json with every route's body (openapi.py)
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
        prompts = await off_loop(prompt_list, engine, body.prompt)
        shaped = await off_loop(constraints_of, engine, body)
        reqs = [build_request(engine, body, ids, n_predict_of(body.n_predict), body.n_probs,
                              state.settings.sampling, body.post_sampling_probs, shaped)
                for ids in prompts]  # every prompt checked before any is submitted
        jobs = submit(state, reqs, body.stream, body.return_progress)
        if body.stream:
            return await sse_response(http, state, jobs, [
                _completion_chunks(state, body, i) for i in range(len(jobs))])
        results = await wait_results(http, state, jobs)
        out = [_completion_answer(state, body, i, ids, r)
               for i, (ids, r) in enumerate(zip(prompts, results))]
        # several prompts get a list of answers, one an answer, as llama-server's
        return out[0] if len(out) == 1 else out

    @app.post("/infill")
    async def infill(http: HttpRequest):
        from .infill import InfillBody, infill_ids

        engine, _ = state.ready()
        body: InfillBody = parse_body(await read_body(http, state), InfillBody)
        ids = await off_loop(infill_ids, engine, body, engine.cfg.batch_size,
                             state.settings.sampling.n_predict)
        req = build_request(engine, body, ids, n_predict_of(body.n_predict), body.n_probs,
                            state.settings.sampling, body.post_sampling_probs,
                            await off_loop(constraints_of, engine, body))
        (job,) = submit(state, [req], body.stream, body.return_progress)
        if body.stream:
            return await sse_response(http, state, job, _completion_chunks(state, body))
        (result,) = await wait_results(http, state, [job])
        return _completion_answer(state, body, 0, ids, result)

    @app.post("/tokenize")
    async def tokenize(http: HttpRequest):
        engine, _ = state.ready()
        data = _json_object(await read_body(http, state))
        content, add_special = data.get("content", ""), data.get("add_special", False)
        parse_special, with_pieces = data.get("parse_special", True), data.get("with_pieces",
                                                                                False)
        if not isinstance(content, str) or not all(
                isinstance(v, bool) for v in (add_special, parse_special, with_pieces)):
            raise ApiError(400, "tokenize: 'content' must be a string; 'add_special', "
                                "'parse_special' and 'with_pieces' booleans")
        tokens = await off_loop(lambda: engine.tok.encode(content, add_special=add_special,
                                                          parse_special=parse_special))
        if with_pieces:  # llama-server's: the piece as text, or its bytes if not valid UTF-8
            return {"tokens": [{"id": t, "piece": _piece(engine, t)} for t in tokens]}
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
            "modalities": {"vision": engine.vision is not None, "video": False,
                           "audio": False},
            "media_marker": images.marker(),
            "build_info": "tandem",
            "cors_proxy_enabled": state.settings.ui_mcp_proxy,
        }

    @app.get("/slots")
    async def slots():
        if not state.settings.slots_endpoint:
            raise ApiError(501, "this server was started with --no-slots: GET /slots is off")
        _, worker = state.ready()
        return worker.slots()

    @app.post("/slots/{id_slot}")
    async def slot_action(id_slot: int, http: HttpRequest, action: str = ""):
        """llama-server's slot files: ?action=save|restore {"filename"} (needs
        --slot-save-path, files only inside it), ?action=erase."""
        import asyncio
        import time
        from pathlib import Path

        engine, worker = state.ready()
        if action not in ("save", "restore", "erase"):
            raise ApiError(400, f"action {action!r}: expected ?action=save, restore or erase")
        data = _json_object(await read_body(http, state))
        if action == "erase":
            fn, path = (lambda: engine.erase_slot(id_slot)), None
        else:
            root = state.settings.slot_save_path
            if root is None:
                raise ApiError(501, "this server was started without --slot-save-path: slot "
                                    "save and restore are off")
            name = data.get("filename")
            if not isinstance(name, str) or not _safe_filename(name):
                raise ApiError(400, "filename: expected a plain file name (no directories, "
                                    f"no leading dot), got {json.dumps(name)[:80]}")
            path = Path(root) / name
            if action == "restore" and not path.is_file():
                raise ApiError(400, f"filename: no saved slot {name!r} in --slot-save-path")
            fn = (lambda: engine.save_slot(id_slot, path)) if action == "save" else \
                (lambda: engine.restore_slot(id_slot, path))
        t0 = time.perf_counter()
        try:
            out = await asyncio.wrap_future(worker.call(fn))
        except TandemError as e:
            raise ApiError(400, str(e)) from None
        ms = 1e3 * (time.perf_counter() - t0)
        if action == "erase":
            return {"id_slot": id_slot, "n_erased": out}
        n, nbytes = out
        if action == "save":
            return {"id_slot": id_slot, "filename": path.name, "n_saved": n, "n_written": nbytes,
                    "timings": {"save_ms": ms}}
        return {"id_slot": id_slot, "filename": path.name, "n_restored": n, "n_read": nbytes,
                "timings": {"restore_ms": ms}}

    @app.get("/metrics")
    async def metrics():
        if not state.settings.metrics_endpoint:
            raise ApiError(501, "this server was started without --metrics: GET /metrics is "
                                "off")
        response = Response(state.metrics.render(), media_type=CONTENT_TYPE)
        # llama-server's header, capitalized as it sends it (Starlette lowercases names)
        response.raw_headers.append((b"Process-Start-Time-Unix",
                                     str(state.metrics.t_start).encode()))
        return response


def _completion_answer(state: ServerState, body: CompletionBody, index: int, ids: list[int],
                       result: dict) -> dict:
    """llama-server's /completion answer: the ids only when asked for (return_tokens), the
    prompt as text, whether the answer has a new line; response_fields keeps only the fields
    named ("generation_settings/n_predict" reaches into generation_settings)."""
    engine = state.engine
    out = {"index": index, **result, "model": state.model_name,
           "tokens": result["tokens"] if body.return_tokens else [],
           "prompt": prompt_text(engine.tok, ids), "has_new_line": "\n" in result["content"]}
    if body.n_probs and body.post_sampling_probs:
        out["completion_probabilities"] = [_post(p) for p in out["completion_probabilities"]]
    if body.response_fields:
        out = {path: _nested(out, path) for path in body.response_fields}
    return out


def _nested(obj, path: str):
    for key in path.split("/"):
        obj = obj.get(key) if isinstance(obj, dict) else None
    return obj


def _post(p: dict) -> dict:
    """A completion_probabilities entry in llama-server's post_sampling_probs form: "prob" and
    "top_probs" (probabilities after the sampler chain) in place of the logprobs."""
    import math

    def one(t: dict) -> dict:
        t = dict(t)
        t["prob"] = math.exp(t.pop("logprob"))
        return t

    out = one({k: v for k, v in p.items() if k != "top_logprobs"})
    out["top_probs"] = [one(t) for t in p["top_logprobs"]]
    return out


def _progress_timings(p: Progress) -> dict:
    """The timings of a request whose prompt is being read: nothing predicted yet."""
    n = p.processed - p.cache
    return {"cache_n": p.cache, "prompt_n": n, "prompt_ms": p.time_ms if n else 0.0,
            "prompt_per_token_ms": p.time_ms / n if n else 0.0,
            "prompt_per_second": 1e3 * n / p.time_ms if n and p.time_ms > 0 else 0.0,
            "predicted_n": 0, "predicted_ms": 0.0, "predicted_per_token_ms": 0.0,
            "predicted_per_second": 0.0}


def _completion_chunks(state: ServerState, body: CompletionBody, index: int = 0):
    """llama-server's /completion stream: a chunk per step (its token ids only with
    return_tokens), then the full result with stop: true. `from_draft` says, per token,
    whether it was an accepted draft token, `origins` who proposed it (target, draft, suffix,
    ngram, grammar). `index`: which prompt of the request."""

    def render(event: Delta | Progress | Done) -> list[dict]:
        if isinstance(event, Progress):
            chunk = {"index": index, "content": "", "tokens": [], "stop": False,
                     "tokens_predicted": 0, "tokens_evaluated": event.total,
                     "prompt_progress": event.as_dict()}
            if body.timings_per_token:
                chunk["timings"] = _progress_timings(event)
            return [chunk]
        if isinstance(event, Delta):
            chunk = {"index": index, "content": event.text,
                     "tokens": event.tokens if body.return_tokens else [], "stop": False,
                     "from_draft": event.from_draft, "origins": event.origins}
            if body.timings_per_token and event.timings is not None:
                chunk["timings"] = event.timings
            if event.logprobs:
                from .results import probabilities

                probs = probabilities(state.engine, event.logprobs)
                chunk["completion_probabilities"] = (
                    [_post(p) for p in probs] if body.post_sampling_probs else probs)
            return [chunk]
        # the text went out in the chunks; the final one carries the stats, as llama-server's
        final = {"index": index, **event.result, "content": "", "tokens": [],
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


def _safe_filename(name: str) -> bool:
    """llama.cpp's fs_validate_filename, in short: one path component, no separators, no
    leading dot, no control characters, at most 255 bytes."""
    return (0 < len(name.encode()) <= 255 and not name.startswith(".")
            and not any(c in name for c in '/\\:*?"<>|') and name.isprintable())


def _piece(engine, token_id: int) -> str | list[int]:
    raw = engine.tok.token_to_piece(token_id)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return list(raw)


def _token_text(engine, token_id: int | None) -> str:
    return "" if token_id is None else engine.tok.tokens[token_id]
