"""llama-server's experimental routes, off by default: GET/POST /tools (--tools: the agent
tools) and GET/POST /cors-proxy (--ui-mcp-proxy: the MCP CORS proxy). Off, both answer 403
feature_disabled, as llama-server's, and the agent package (tandem.agent, the optional extra
`tandem[agent]`) is never imported. Neither route is in the described API (the fuzzer must
not run commands). The API key applies to both.

    GET  /tools         the tools --tools enabled, with their definitions
    POST /tools         {"tool", "params", "stream"}: run one (SSE with "stream": true)
    GET  /cors-proxy    ?url=URL: the request forwarded, its answer streamed back
    POST /cors-proxy
"""

from __future__ import annotations

import asyncio
import json
import threading

from fastapi import APIRouter, Request as HttpRequest
from fastapi.responses import StreamingResponse

from .jobs import off_loop, read_body
from .schemas import ApiError, feature_disabled

router = APIRouter(include_in_schema=False)


def _toolbox(http: HttpRequest):
    """The server's agent.tools.Toolbox, or 403 without --tools."""
    state = http.app.state.tandem
    state.ready()
    if state.tools is None:
        raise feature_disabled()
    return state.tools


@router.get("/tools")
async def list_tools(http: HttpRequest):
    return [t.to_json() for t in _toolbox(http).tools.values()]


@router.post("/tools")
async def call_tool(http: HttpRequest):
    box = _toolbox(http)
    raw = await read_body(http, http.app.state.tandem)
    tool, params, stream = await off_loop(_call, box.prepare, raw, http.headers)
    if stream:
        return _stream(tool, params)
    return await off_loop(_call, tool.run, params, None)


def _call(fn, *args):
    """fn(*args) with the tools' errors as the API's: a body that is not a call 400, an
    unknown tool 404, an unusable runtime 500."""
    from ..agent.runtime import ToolRuntimeError
    from ..agent.tools import BadParams, UnknownTool

    try:
        return fn(*args)
    except BadParams as e:
        raise ApiError(400, str(e)) from None
    except UnknownTool as e:
        raise ApiError(404, str(e), "invalid_request_error") from None
    except ToolRuntimeError as e:
        raise ApiError(500, str(e)) from None


def _stream(tool, params: dict) -> StreamingResponse:
    """SSE: {"chunk": text} as the output comes, then {"done": true} (with "error" when the
    tool failed); no [DONE]. A client that leaves stops the command."""
    from ..agent.tools import Stream

    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    alive = threading.Event()
    alive.set()

    def put(item: dict) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, item)
        except RuntimeError:  # the loop is gone: the server is stopping
            alive.clear()

    def work() -> None:
        done: dict = {"done": True}
        try:
            tool.run(params, Stream(lambda chunk: put({"chunk": chunk}), alive.is_set))
        except Exception as e:  # noqa: BLE001 (reported to the client, as llama-server)
            done["error"] = str(e) or "An unknown error occurred"
        put(done)

    async def events():
        try:
            while True:
                item = await queue.get()
                yield f"data: {json.dumps(item, ensure_ascii=False)}\n\n"
                if item.get("done"):
                    return
        finally:
            alive.clear()

    threading.Thread(target=work, name="tandem-tool", daemon=True).start()
    return StreamingResponse(events(), media_type="text/event-stream")


@router.get("/cors-proxy")
@router.post("/cors-proxy")
async def cors_proxy(http: HttpRequest):
    state = http.app.state.tandem
    state.ready()
    if not state.settings.ui_mcp_proxy:
        raise feature_disabled()
    from ..agent import proxy

    body = await read_body(http, state)
    try:
        answer = await proxy.forward(http.method, http.query_params.get("url", ""),
                                     proxy.proxied_headers(http.headers), body)
    except proxy.ProxyError as e:
        raise ApiError(e.status, str(e)) from None
    # the content type too, as it came (Starlette would add a charset to a media_type)
    return StreamingResponse(answer.body, status_code=answer.status, headers=answer.headers)
