"""Running one generation from an HTTP handler: submit, then wait or stream.

A request whose client goes away is cancelled, streaming or not, so its slot is freed for the
next one: a stream is cancelled by Starlette the moment the disconnect arrives; a plain request
polls for it while it waits.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

from fastapi import Request as HttpRequest
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from .schemas import ApiError
from .state import ServerState
from .worker import Delta, Done, Failed, Job, QueueFull

if TYPE_CHECKING:
    from ..engine import Request

DISCONNECT_POLL_S = 0.25


async def read_body(http: HttpRequest, state: ServerState) -> bytes:
    try:
        return await asyncio.wait_for(http.body(), state.settings.timeout)
    except TimeoutError:
        raise ApiError(408, f"the request body was not received within "
                            f"{state.settings.timeout:g} s (the server's --timeout)") from None


async def off_loop(fn, *args):
    """Tokenizing a long prompt or rendering a template must not stall other requests."""
    return await run_in_threadpool(fn, *args)


def submit(state: ServerState, req: Request, stream: bool) -> Job:
    _, worker = state.ready()
    timeout = state.settings.timeout
    job = Job(req, stream, asyncio.get_running_loop(), time.monotonic() + timeout, timeout)
    try:
        worker.submit(job)
    except QueueFull as e:
        raise ApiError(503, str(e)) from None
    return job


async def next_event(http: HttpRequest, state: ServerState, job: Job) -> Delta | Done:
    """The job's next event; raises its ApiError; cancels the job if the client left."""
    try:
        while True:
            try:
                event = await asyncio.wait_for(job.events.get(), DISCONNECT_POLL_S)
            except TimeoutError:
                if await http.is_disconnected():
                    raise ApiError(499, "the client closed the connection") from None
                continue
            if isinstance(event, Failed):
                raise event.error
            return event
    except BaseException:
        if not job.finished:
            state.worker.cancel(job)
        raise


async def wait_result(http: HttpRequest, state: ServerState, job: Job) -> dict:
    """The finished request's result dict (llama.cpp's /completion fields)."""
    while not isinstance(event := await next_event(http, state, job), Done):
        pass
    return event.result


Render = Callable[[Delta | Done], list[dict | str]]


async def sse_response(http: HttpRequest, state: ServerState, job: Job,
                       render: Render) -> StreamingResponse:
    """Server-sent events: `data: <json>` per item render() gives (a str is sent as is, e.g.
    "[DONE]"). The first event is awaited before answering, so a request that fails before
    its first token (e.g. timed out in the queue) gets its own HTTP status; a later failure is
    sent as `data: {"error": ...}` and ends the stream."""
    first = await next_event(http, state, job)

    async def events() -> AsyncIterator[str]:
        event: Delta | Done | Failed = first
        try:
            while True:
                if isinstance(event, Failed):
                    yield _sse(event.error.body())
                    return
                for item in render(event):
                    yield _sse(item)
                if isinstance(event, Done):
                    return
                event = await job.events.get()
        finally:  # also when Starlette cancels us because the client went away
            if not job.finished:
                state.worker.cancel(job)

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def _sse(item: dict | str) -> str:
    data = item if isinstance(item, str) else json.dumps(item, ensure_ascii=False)
    return f"data: {data}\n\n"
