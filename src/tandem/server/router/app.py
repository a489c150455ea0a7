"""The router's HTTP API, llama-server's (tools/server/server-models.cpp):

    GET  /models, /v1/models     every model with its status (?reload=1 reads the sources again)
    POST /models/load            {"model", "draft"?}: start it (Tandem: "draft" loads it with
                                 that model of the catalog as its draft, null with none)
    POST /models/unload          {"model"}: stop it
    POST /models                 {"model": "user/model[:tag]"}: download it from the Hugging
                                 Face hub into llama-server's cache, in the background
                                 (download_* events; listed once done), llama-server's
    DELETE /models?model=ID      a downloaded (cache) model's files removed, or a download
                                 cancelled (downloads.py)
    GET  /models/sse             the models' events as server-sent events
    GET  /models/drafts?model=X  Tandem's: every other model judged as X's draft (drafts.py)
    GET  /props                  the router's own (?model=X: that model's)
    GET  /health                 the router is up
    /, /static/...               the web page (--no-ui: off)
    anything else                forwarded to the child of the model named by the JSON body's
                                 "model" (POST) or ?model= (GET), loaded first with autoload;
                                 streamed answers pass through as they come

The catalog is at `app.state.catalog` (tandem.server.router.catalog.Catalog), the models at
`app.state.models`, the downloads at `app.state.downloads`. A preset model whose hf-repo is
not in the cache yet is downloaded first when it loads. Errors are llama-server's
{"error": {"code", "message", "type"}}.
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from ... import __version__
from ..app import Guard, error_handlers
from ..cors import Cors
from ..page import routes as page
from ..schemas import ApiError
from .downloads import Downloads
from .drafts import router as drafts_router
from .models import FAKE_TIMING, Instance, Models, sse_line

HOP = {"host", "content-length", "connection", "keep-alive", "transfer-encoding",
       "authorization", "x-api-key", "upgrade", "te", "trailer", "proxy-authorization"}
METHODS = ["GET", "POST", "PUT", "DELETE", "PATCH"]


def create_router_app(state, models: Models, autoload: bool) -> FastAPI:
    """`state` has the router's ServerSettings (.settings: key, CORS, body size, --ui)."""
    app = FastAPI(title="tandem router", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.tandem, app.state.models, app.state.catalog = state, models, models.catalog
    app.state.autoload = autoload
    downloads = app.state.downloads = Downloads(models, state.settings.offline)

    error_handlers(app)

    app.add_middleware(Guard, state=state)
    app.add_middleware(Cors, allowed=state.settings.cors_origins)
    _routes(app, models, downloads)
    _events_and_downloads(app, models, downloads)
    app.include_router(drafts_router)  # GET /models/drafts: the page's draft picker
    if state.settings.ui:
        app.include_router(page.router)
    app.add_api_route("/{path:path}", _forward, methods=METHODS)
    return app


def _routes(app: FastAPI, models: Models, downloads: Downloads) -> None:
    @app.get("/health")
    @app.get("/v1/health")
    async def health():
        return {"status": "ok"}

    @app.get("/models")
    @app.get("/v1/models")
    async def list_models(reload: str = ""):
        if reload:
            models.reload()
        now = int(time.time())
        rows = [_item(i, models, now, downloads.status_of(i))
                for i in models.instances.values() if not i.entry.hidden]
        rows += downloads.rows({r["id"] for r in rows}, now)
        return {"data": rows, "object": "list"}

    @app.post("/models/load")
    async def load(request: Request):
        body = await _json(request)
        name = _name(body)
        inst = models.get(name)
        if inst is None:
            raise ApiError(404, f"model '{name}' not found: not in --models-dir or "
                                "--models-preset (GET /models lists them)")
        if "draft" in body:
            draft = body["draft"]
            if draft is not None and not isinstance(draft, str):
                raise ApiError(400, "draft: a model id (string) or null")
            if inst.status in ("loading", "loaded", "sleeping"):
                if _same_draft(models, inst, draft):
                    return {"success": True}
                await models.unload(inst, wait=True)
            await models.load(inst.entry.id, draft)
            return {"success": True}
        if inst.status != "unloaded" or inst.stopping:
            raise ApiError(400, f"model '{inst.entry.id}' is already running")
        if inst.entry.fetch:  # its files first: answered now, loaded once they are there
            asyncio.create_task(downloads.load_later(inst, lambda: models.load(inst.entry.id)))
            return {"success": True}
        await models.load(inst.entry.id)
        return {"success": True}

    @app.post("/models/unload")
    async def unload(request: Request):
        name = _name(await _json(request))
        inst = models.get(name)
        if inst is None:
            raise ApiError(400, f"model '{name}' not found")
        if inst.status == "unloaded" or inst.stopping:
            raise ApiError(400, f"model '{inst.entry.id}' is not running")
        await models.unload(inst)
        return {"success": True}

    @app.get("/props")
    async def props(request: Request):
        if request.query_params.get("model"):
            return await _forward(request)
        s = app.state.tandem.settings
        return {"role": "router", "max_instances": models.models_max,
                "models_autoload": app.state.autoload, "model_alias": "tandem",
                "model_path": "none",
                "default_generation_settings": {"params": {}, "n_ctx": 0},
                "ui_settings": {}, "build_info": f"b{__version__}-tandem",
                "cors_proxy_enabled": s.ui_mcp_proxy}


def _events_and_downloads(app: FastAPI, models: Models, downloads: Downloads) -> None:
    """GET /models/sse; POST and DELETE /models, llama-server's cache downloads."""

    @app.post("/models")
    async def download(request: Request):  # into llama-server's cache, in the background
        await downloads.start(_name(await _json(request)))
        return {"success": True}

    @app.delete("/models")
    async def remove(model: str = ""):  # a cache model's files, or a download
        if not model:
            raise ApiError(400, "model name is missing from the request (?model=ID)")
        await downloads.remove(model)
        return {"success": True}

    @app.get("/models/sse")
    async def sse(request: Request):
        queue: asyncio.Queue = asyncio.Queue()
        models.subscribers.add(queue)

        async def events():
            try:
                while not models.closing():  # a stopping server ends its streams
                    try:
                        yield sse_line(await asyncio.wait_for(queue.get(), 0.5))
                    except asyncio.TimeoutError:
                        continue
            finally:
                models.subscribers.discard(queue)

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})


def _item(inst: Instance, models: Models, now: int, downloading: dict | None) -> dict:
    e = inst.entry
    status: dict = downloading or {"value": inst.status}
    if inst.child is not None:
        status["args"] = inst.child.argv[3:]
    if e.preset:
        status["preset"] = e.preset
    if inst.failed:
        status.update(failed=True, exit_code=inst.exit_code, error=inst.error)
    item = {"id": e.id, "aliases": e.aliases, "tags": e.tags, "object": "model",
            "owned_by": "tandem", "created": now, "status": status,
            "architecture": {"input_modalities": ["text"] + (["image"] if e.mmproj else []),
                             "output_modalities": ["text"]},
            "source": e.source, "can_remove": e.source == "cache",
            # Tandem's: the first GGUF (null until downloaded), every file, the projector,
            # the draft it runs with
            "path": None if e.fetch else str(e.path), "files": [str(p) for p in e.files],
            "mmproj": None if e.mmproj is None else str(e.mmproj),
            "draft": inst.draft if inst.status != "unloaded" else None}
    if inst.status in ("loaded", "sleeping"):
        for k, v in inst.info.items():
            item.setdefault(k, v)
    return item


def _same_draft(models: Models, inst: Instance, draft: str | None) -> bool:
    if draft is None:
        return inst.draft is None
    other = models.catalog.get(draft)
    return other is not None and inst.draft == other.id


async def _json(request: Request) -> dict:
    try:
        body = json.loads(await request.body() or b"{}")
    except ValueError as e:
        raise ApiError(400, f"invalid JSON body: {e}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object")
    return body


def _name(body: dict) -> str:
    name = body.get("model")
    if not isinstance(name, str) or not name:
        raise ApiError(400, "model name is missing from the request")
    return name


async def _forward(request: Request) -> Response:
    """The request to its model's child (loaded first with autoload), the answer back as it
    comes."""
    app = request.app
    models: Models = app.state.models
    body = await request.body()
    if request.method == "GET":
        name = request.query_params.get("model") or ""
    else:
        try:
            parsed = json.loads(body or b"{}")
        except ValueError as e:
            raise ApiError(400, f"invalid JSON body: {e}") from None
        name = parsed.get("model") if isinstance(parsed, dict) else None
        if not isinstance(name, str):
            name = ""
    if not name:
        raise ApiError(400, "model name is missing from the request")
    inst = models.get(name)
    if inst is None:
        raise ApiError(400, f"model '{name}' not found: not in --models-dir or --models-preset "
                            "(GET /models lists them)")
    autoload = request.query_params.get("autoload")
    autoload = app.state.autoload if autoload is None else autoload in ("true", "1")
    if not autoload and (inst.status not in ("loaded", "sleeping") or inst.stopping):
        raise ApiError(400, f"model '{inst.entry.id}' is not loaded (POST /models/load, or "
                            "?autoload=true)")
    if inst.entry.fetch:  # a preset's model not downloaded yet
        await app.state.downloads.ensure(inst)
    await models.ensure_ready(inst.entry.id, request.is_disconnected)
    return await _proxy(request, models, inst, body)


async def _proxy(request: Request, models: Models, inst: Instance, body: bytes) -> Response:
    inst.busy += 1
    inst.last_used = time.monotonic()
    done = False

    def release() -> None:
        nonlocal done
        if not done:
            done = True
            inst.busy -= 1
            models.tick()
            models.wake()

    try:
        if FAKE_TIMING:
            await asyncio.sleep(2)
        child = inst.child
        if child is None:
            raise ApiError(503, f"model {inst.entry.id} was unloaded; send the request again")
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
        url = httpx.URL(f"{child.url}{request.url.path}",
                        query=request.url.query.encode("latin-1"))
        upstream = await models.client.send(
            models.client.build_request(request.method, url, headers=headers, content=body),
            stream=True)
    except httpx.TransportError as e:
        release()
        raise ApiError(502, f"model {inst.entry.id}: its server did not answer ({e})") from None
    except BaseException:
        release()
        raise

    async def relay():
        try:
            async for chunk in upstream.aiter_raw():
                yield chunk
        finally:
            await upstream.aclose()
            release()

    out = {k: v for k, v in upstream.headers.items() if k.lower() not in HOP}
    return StreamingResponse(relay(), status_code=upstream.status_code, headers=out)
