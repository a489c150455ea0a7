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
from .worker import Delta, Done, Failed, Job, Progress, QueueFull

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


MAX_ANSWERS = 64  # answers (prompts x n) one request may ask for


def submit(state: ServerState, reqs: list[Request], stream: bool,
           progress: bool = False) -> list[Job]:
    """Queue a request's generations (one per prompt and answer) together: all or none, so a
    refused request leaves nothing behind. progress: a stream also gets Progress events."""
    _, worker = state.ready()
    if len(reqs) > MAX_ANSWERS:
        raise ApiError(400, f"{len(reqs)} answers (prompts x n) in one request; at most "
                            f"{MAX_ANSWERS}: send several requests")
    timeout = state.settings.timeout
    loop = asyncio.get_running_loop()
    jobs = [Job(req, stream, loop, time.monotonic() + timeout, timeout,
                progress=stream and progress) for req in reqs]
    try:
        worker.submit(jobs)
    except QueueFull as e:
        raise ApiError(503, str(e)) from None
    return jobs


async def next_event(http: HttpRequest, state: ServerState,
                     job: Job) -> Delta | Progress | Done:
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


async def wait_results(http: HttpRequest, state: ServerState, jobs: list[Job]) -> list[dict]:
    """Every job's result, in order (they generate at once, in slots or queued); if one fails,
    the others are cancelled and its error is raised."""
    tasks = [asyncio.ensure_future(wait_result(http, state, job)) for job in jobs]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        for job in jobs:
            if not job.finished:
                state.worker.cancel(job)
        raise


# what a render gives per event: dicts (sent as JSON), strings (sent as they are, e.g. "[DONE]"),
# or (event name, dict): an SSE `event:` line before the data (Anthropic's and the Responses
# API's typed streams)
Item = dict | str | tuple[str, dict]
Render = Callable[[Delta | Progress | Done], list[Item]]


async def sse_response(http: HttpRequest, state: ServerState, job: Job | list[Job],
                       render: Render | list[Render],
                       failed: Callable[[ApiError], Item] = ApiError.body) -> StreamingResponse:
    """Server-sent events: `data: <json>` per item render() gives (a str is sent as is, e.g.
    "[DONE]"; an (event, dict) pair also names the event). The first event is awaited before answering, so a request that fails before
    its first token (e.g. timed out in the queue) gets its own HTTP status; a later failure is
    sent as `data: {"error": ...}` and ends the stream. Several jobs (one render each) are
    sent interleaved, in the order their events come. failed(error): the item a failure mid-stream
    is sent as (OpenAI's error object unless the API has its own)."""
    jobs = job if isinstance(job, list) else [job]
    renders = render if isinstance(render, list) else [render]
    try:
        firsts = [await next_event(http, state, j) for j in jobs]
    except BaseException:
        for j in jobs:
            if not j.finished:
                state.worker.cancel(j)
        raise
    merged: asyncio.Queue = asyncio.Queue()

    async def pump(i: int) -> None:
        event = firsts[i]
        while True:
            await merged.put((i, event))
            if isinstance(event, (Done, Failed)):
                return
            event = await jobs[i].events.get()

    async def events() -> AsyncIterator[str]:
        pumps = [asyncio.ensure_future(pump(i)) for i in range(len(jobs))]
        left = len(jobs)
        try:
            while left:
                i, event = await merged.get()
                if isinstance(event, Failed):
                    yield _sse(failed(event.error))
                    return
                for item in renders[i](event):
                    yield _sse(item)
                left -= isinstance(event, Done)
        finally:  # also when Starlette cancels us because the client went away
            for p in pumps:
                p.cancel()
            for j in jobs:
                if not j.finished:
                    state.worker.cancel(j)

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def _sse(item: Item) -> str:
    if isinstance(item, tuple):
        name, item = item
        return f"event: {name}\ndata: {json.dumps(item, ensure_ascii=False)}\n\n"
    data = item if isinstance(item, str) else json.dumps(item, ensure_ascii=False)
    return f"data: {data}\n\n"
