"""--sleep-idle-seconds N (llama-server's idle sleep): after N seconds in which no request
used the model, the engine (weights, kernel layouts, KV caches, the host prompt cache, the
mapped files) leaves memory; the server keeps listening. The next request that needs the model
loads it again and is answered.

    GET /health, /props, /models, /v1/models, /metrics   answered while asleep, without waking
                                                         it: /props and /models from what they
                                                         said before the sleep ("is_sleeping":
                                                         true), /metrics from the live counters
                                                         (nothing moves them while asleep)
    GET /slots                                           the same (llama-server's wakes): every
                                                         slot idle, nothing cached
    every other endpoint of the API                      wakes the model first, then answers

The clock: `Sleeper.enter` / `leave` (the middleware, around every request that wakes) count
the requests in flight; the model sleeps only when none is, and none was for N seconds (a
queued or streaming request is in flight until its answer is sent). Sleeping and waking take
`_turn`, one at a time; a request that comes while the model is being put to sleep waits for
that to finish, then wakes it. The host prompt cache (--cache-ram) goes with the engine, as
llama-server makes a new one when it reloads; slot files (--slot-save-path) stay on disk.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import logging
import threading
import time
import weakref
from collections.abc import Callable

from starlette.routing import Match

from .oai import models_body
from .page import routes as page
from .props import props_body
from .state import ServerState

log = logging.getLogger("tandem.server")

# llama-server's: these answer from what the server knew before sleeping; and Tandem's: GET
# /slots (the page polls it: an open page would keep the model awake), the page's files and
# the API's description, which never touch the model
EXEMPT = frozenset(("/health", "/v1/health", "/props", "/models", "/v1/models", "/metrics",
                    "/slots", "/openapi.json", *page.PUBLIC))


class Sleeper:
    """The idle clock and the two moves: `sleep` (the watcher thread's) and `wake` (a
    request's, on a worker thread of the event loop's pool). `load` builds the engine and its
    worker into the state (the loader's own code, cli.py)."""

    def __init__(self, state: ServerState, seconds: float, load: Callable[[], None]) -> None:
        self.state, self.seconds, self._load = state, seconds, load
        self._cond = threading.Condition()
        self._turn = threading.Lock()  # sleeping or waking, one at a time
        self._active = 0  # requests in flight that use the model
        self._last = time.monotonic()  # when the last of them ended
        self._closed = False
        self._thread = threading.Thread(target=self._watch, name="tandem-sleep", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def loaded(self) -> None:
        """The first load is done: the idle clock starts now."""
        with self._cond:
            self._last = time.monotonic()
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    # -- the request side ---------------------------------------------------------------------

    def enter(self) -> bool:
        """A request that needs the model begins; True when it must wake it first."""
        with self._cond:
            self._active += 1
            return self.state.status == "sleeping"

    def leave(self) -> None:
        with self._cond:
            self._active -= 1
            self._last = time.monotonic()
            self._cond.notify_all()

    def wake(self) -> None:
        """Load the model again if it is asleep (the first of several waiting requests does;
        the others find it awake). A failure leaves the server in error, as a failed load."""
        with self._turn:
            if self.state.status != "sleeping":
                return
            log.info("waking up: loading the model again")
            t0 = time.perf_counter()
            try:
                self._load()
            except Exception:  # as a failed first load: the server answers 503 from now on
                log.exception("error: reloading the model after sleeping failed")
                self.state.status = "error"
                return
            with self._cond:  # (the snapshot stays: /props may have read "sleeping" just now)
                self.state.status = "ready"
                self._last = time.monotonic()
            log.info("awake: the model was reloaded in %.2f s", time.perf_counter() - t0)

    # -- the watcher thread -------------------------------------------------------------------

    def _watch(self) -> None:
        while True:
            with self._cond:
                if self._closed:
                    return
                due = self._due()
                if due > 0:
                    self._cond.wait(due)
                    continue
            try:
                self.sleep()
            except Exception:  # a bug: the model stays awake, the server serves on
                log.exception("going to sleep failed; the model stays loaded")
                self.close()

    def _due(self) -> float:
        """Seconds until the model may sleep (<= 0: now); caller holds _cond."""
        if self.state.status != "ready" or self._active:
            return self.seconds
        return self._last + self.seconds - time.monotonic()

    def sleep(self) -> None:
        """Put the model to sleep if it is still idle: what /props and /models say is kept,
        then the worker is stopped and every reference to the engine dropped."""
        with self._turn:
            state = self.state
            if state.status != "ready" or state.engine is None:
                return
            snapshot = {"props": props_body(state, state.engine, sleeping=True),
                        "models": models_body(state, state.engine),
                        "slots": [{**v, "n_cached": 0} for v in state.worker.slots()]}
            with self._cond:
                if self._closed or self._due() > 0:  # a request came in meanwhile
                    return
                state.snapshot, state.status = snapshot, "sleeping"
            idle = time.monotonic() - self._last
            rss = _rss()
            engine, worker = weakref.ref(state.engine), state.worker
            state.worker = state.engine = None
            worker.stop()  # nothing is queued: no request is in flight
            worker.engine = None
            del worker
            _release(engine)
            log.info("going to sleep after %.1f s idle: the model left memory (resident %s -> "
                     "%s); the next request reloads it", idle, _fmt(rss), _fmt(_rss()))


def _rss() -> int:
    from ..memory import resident

    return resident().get("resident", 0)


def _fmt(n: int) -> str:
    from ..memory import fmt_bytes

    return fmt_bytes(n)


def _release(engine: weakref.ref, wait: float = 2.0) -> None:
    """Collect until the engine is gone (a /props answer begun just before the sleep may hold
    it a moment), then give the freed heap back."""
    deadline = time.monotonic() + wait
    while gc.collect() >= 0 and engine() is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    if engine() is not None:
        log.warning("sleep: something still holds the engine; its memory stays until it lets go")
    _trim()


def _trim() -> None:
    """Hand the freed heap back to the system (glibc keeps freed small blocks otherwise)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class SleepGate:
    """ASGI middleware (inside the API-key guard): a request for an endpoint that uses the
    model is counted in flight until its answer is sent, and wakes the model first if it
    sleeps. The exempt endpoints, the page's files, CORS preflights and unknown paths pass."""

    def __init__(self, app, sleeper: Sleeper, routes: Callable[[], list]) -> None:
        self.app, self.sleeper, self._routes = app, sleeper, routes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or not self._wakes(scope):
            return await self.app(scope, receive, send)
        must_wake = self.sleeper.enter()
        try:
            if must_wake:
                await asyncio.to_thread(self.sleeper.wake)
            await self.app(scope, receive, send)
        finally:
            self.sleeper.leave()

    def _wakes(self, scope) -> bool:
        path = scope["path"]
        if scope["method"] == "OPTIONS" or path in EXEMPT or path.startswith(
                page.PUBLIC_PREFIX):
            return False
        return any(r.matches(scope)[0] == Match.FULL for r in self._routes())
