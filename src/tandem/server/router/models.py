"""The router's models: each one's state, the requests waiting for one, --models-max.

A model is unloaded -> loading -> loaded (-> sleeping, a child's --sleep-idle-seconds) ->
unloaded again; a child that exits while loading leaves it unloaded with failed: true and its
exit code, as llama-server's GET /models shows. Everything runs on the server's event loop, so
the state changes between awaits only.

The queue is llama-server's (server_lru_sched): requests for a model that is not loaded join
one entry per model, in arrival order; the entry at the head loads its model when a slot is
free (fewer than --models-max running). While entries outnumber the free slots, an idle model
is stopped for them, the least recently used first; a model serving a request, one still
loading, and one a queued request wants are never chosen. A request that goes away leaves the
queue, and costs no model its slot.

Before a load, the model's memory plan (tandem.memory, as `tandem serve` prints it) must fit in
what the machine has available, less what the models still loading will take: otherwise the
load is refused, naming both numbers.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Callable

import httpx

from ..schemas import ApiError
from .catalog import Catalog, Entry
from .children import Child, child_argv, free_port

log = logging.getLogger("tandem.server")

RUNNING = ("loading", "loaded", "sleeping")
# llama-server's test switch: each load and each forwarded request waits 2 s first, so that its
# tests can see a model busy (tools/server/tests/unit/test_router.py)
FAKE_TIMING = bool(os.environ.get("LLAMA_SERVER_DEBUG_FAKE_TIMING"))
POLL = 0.2


@dataclass(slots=True)
class Instance:
    """A model's state; `child` while it runs."""

    entry: Entry
    status: str = "unloaded"
    child: Child | None = None
    draft: str | None = None  # the draft's id (or path, if not in the catalog) it runs with
    last_used: float = 0.0
    busy: int = 0  # requests being forwarded to it
    stopping: bool = False
    failed: bool = False
    exit_code: int | None = None
    error: str = ""  # the failed child's last error line
    planned: int = 0  # bytes its memory plan counts, while loading
    info: dict = field(default_factory=dict)  # its own /v1/models item, once loaded


@dataclass(slots=True)
class Waiting:
    name: str
    waiters: int = 1
    loading: bool = False


class Models:
    """Every catalog entry's Instance, the queue, the SSE subscribers."""

    def __init__(self, catalog: Catalog, common: list[str], models_max: int,
                 plan_of: Callable[[list[str]], object]) -> None:
        self.catalog, self.common, self.models_max = catalog, common, models_max
        self.plan_of = plan_of  # a child's argv -> its memory plan (tandem.memory.MemoryPlan)
        self._plans: dict[tuple, object] = {}  # plan()'s, by argv and the files' stamps
        self.instances: dict[str, Instance] = {
            e.id: Instance(e) for e in catalog.entries(hidden=True)}
        self.queue: list[Waiting] = []
        self.subscribers: set[asyncio.Queue] = set()
        self.client = httpx.AsyncClient(timeout=None)
        self._changed = asyncio.Event()
        self.closing: Callable[[], bool] = lambda: False  # the server is stopping (main.py)

    # --- events -------------------------------------------------------------------------
    def notify(self, event: str, name: str, data: dict | None = None) -> None:
        message = {"model": name, "event": event, **({"data": data} if data is not None else {})}
        for q in list(self.subscribers):
            q.put_nowait(message)
        self.wake()

    def wake(self) -> None:
        """Every request waiting in `changed` looks again."""
        self._changed.set()
        self._changed = asyncio.Event()

    def _set(self, inst: Instance, status: str, **data) -> None:
        inst.status = status
        event = "model_status" if status == "loading" else "status_change"
        self.notify(event, inst.entry.id, {"status": status, **data})
        self.tick()

    async def changed(self, timeout: float = POLL) -> None:
        try:
            await asyncio.wait_for(self._changed.wait(), timeout)
        except asyncio.TimeoutError:
            pass

    # --- lookups ------------------------------------------------------------------------
    def get(self, name: str) -> Instance | None:
        entry = self.catalog.get(name)
        return None if entry is None else self.instances.get(entry.id)

    def running(self) -> list[Instance]:
        return [i for i in self.instances.values() if i.status in RUNNING]

    def has_capacity(self) -> bool:
        return self.models_max <= 0 or len(self.running()) < self.models_max

    def draft_name(self, path: str | None) -> str | None:
        if path is None:
            return None
        entry = self.catalog.by_path(path)
        return path if entry is None else entry.id

    # --- loading ------------------------------------------------------------------------
    async def load(self, name: str, draft: str | None | type = ...) -> None:
        """Start `name`'s child (draft: an entry id, None for no draft, ... for the preset's).
        Returns once it is spawned; its status says when it is loaded."""
        if FAKE_TIMING:
            await asyncio.sleep(2)
        inst = self.instances[name]
        await self.unload_lru()
        if inst.status != "unloaded":
            return
        self._check_capacity(name)
        draft_path = self._draft_path(inst.entry, draft)
        port = free_port()
        argv = child_argv(inst.entry, self.common, port, draft_path)
        child = Child(name, argv, port)
        # started while its plan is read (~0.1 s, against the child's ~1.2 s of Python imports
        # before it reads any weight), and stopped if the plan refuses it
        try:
            await child.start()
        except OSError as e:
            raise ApiError(500, f"model {name}: its server could not start: {e}") from None
        try:
            planned = await self._check_memory(inst.entry, draft_path)
            if inst.status == "unloaded":
                self._check_capacity(name)  # (another load may have taken the last slot)
        except BaseException:
            child.discard()
            raise
        if inst.status != "unloaded":  # another request loaded it meanwhile
            child.discard()
            return
        inst.child, inst.draft, inst.planned = child, self.draft_name(draft_path), planned
        inst.failed, inst.exit_code, inst.error, inst.info = False, None, "", {}
        inst.last_used = time.monotonic()
        log.info("loading %s on port %d: %s", name, port, " ".join(argv[4:]))
        self._set(inst, "loading")  # no second load of it starts
        if inst.stopping:  # unloaded while it was starting
            child.kill()
        asyncio.create_task(self._watch(inst, child))

    def _check_capacity(self, name: str) -> None:
        if not self.has_capacity():
            raise ApiError(400, f"model {name}: the limit of {self.models_max} loaded models "
                                "(--models-max) is reached and every loaded model is busy; "
                                "try again later")

    def _draft_path(self, entry: Entry, draft) -> str | None:
        if draft is ...:
            return entry.draft
        if draft is None:
            return None
        other = self.catalog.get(draft)
        if other is None:
            raise ApiError(404, f"draft model '{draft}' not found: it is not in --models-dir or "
                                "--models-preset (GET /models lists them)")
        if other.id == entry.id:
            raise ApiError(400, f"draft model '{draft}' is the target itself")
        return str(other.path)

    def plan(self, entry: Entry, draft_path: str | None):
        """The memory plan of `entry`'s child with that draft, read once while its files are
        unchanged (check.inspect_spec: ~0.1 s a model), with what is available now."""
        import dataclasses

        from ...memory import available_memory

        argv = child_argv(entry, self.common, 0, draft_path)[4:]
        files = [*entry.files, entry.path, *([draft_path] if draft_path else [])]
        key = (tuple(argv), *((st.st_size, st.st_mtime_ns) for st in map(os.stat, files)))
        if key not in self._plans:
            self._plans[key] = self.plan_of(argv)
        now, source = available_memory()
        return dataclasses.replace(self._plans[key], available=now, available_source=source)

    async def _check_memory(self, entry: Entry, draft_path: str | None) -> int:
        """The model's memory plan against what is available less what loading models will
        still take; its total, or a 400 naming the numbers (or the file that is wrong)."""
        from ...errors import TandemError
        from ...memory import fmt_bytes

        try:
            plan = await asyncio.to_thread(self.plan, entry, draft_path)
        except (TandemError, OSError) as e:
            raise ApiError(400, f"model {entry.id}: {e}") from None
        pending = [i for i in self.instances.values() if i.status == "loading"]
        reserved = sum(i.planned for i in pending)
        available = plan.available - reserved
        if plan.total > available:
            beside = (f" ({fmt_bytes(plan.available)} {plan.available_source} less "
                      f"{fmt_bytes(reserved)} for {', '.join(i.entry.id for i in pending)}, "
                      "still loading)") if pending else f" ({plan.available_source})"
            raise ApiError(400, f"model {entry.id} does not fit in memory: its plan needs "
                                f"{fmt_bytes(plan.total)}, {fmt_bytes(max(available, 0))} is "
                                f"available{beside}; unload a model, or lower its --ctx-size "
                                "or --parallel")
        return plan.total

    async def _watch(self, inst: Instance, child: Child) -> None:
        """loading -> loaded when the child answers /health; unloaded when it exits."""
        ready = await child.wait_ready(self.client)
        if ready and inst.child is child and child.proc.returncode is None:
            inst.planned = 0
            inst.info = await self._child_info(child)
            self._set(inst, "loaded", info=inst.info)
            asyncio.create_task(self._watch_sleep(inst, child))
        code = await child.wait()
        if inst.child is not child:
            return
        asked = inst.stopping  # unloaded on request, not failed
        failed = not asked and (inst.status == "loading" or code != 0)
        inst.child, inst.stopping, inst.planned, inst.exit_code = None, False, 0, code
        inst.failed = failed
        if inst.failed:
            inst.error = child.last_error()
            log.error("model %s exited with %d: %s", inst.entry.id, code, inst.error)
        self._set(inst, "unloaded", exit_code=code)

    async def _child_info(self, child: Child) -> dict:
        try:
            r = await self.client.get(f"{child.url}/v1/models", timeout=10)
            return (r.json().get("data") or [{}])[0]
        except (httpx.HTTPError, ValueError, IndexError, AttributeError):
            return {}

    async def _watch_sleep(self, inst: Instance, child: Child) -> None:
        """loaded <-> sleeping as the child's /props says (--sleep-idle-seconds)."""
        if not any(w.startswith("--sleep-idle-seconds") for w in child.argv):
            return
        while inst.child is child and child.proc.returncode is None:
            try:
                r = await self.client.get(f"{child.url}/props", timeout=5)
                asleep = bool(r.json().get("is_sleeping"))
            except (httpx.HTTPError, ValueError):
                asleep = None
            if inst.child is child and not inst.stopping and asleep is not None:
                want = "sleeping" if asleep else "loaded"
                if inst.status in ("loaded", "sleeping") and inst.status != want:
                    self._set(inst, want)
            await asyncio.sleep(0.5)

    # --- unloading ----------------------------------------------------------------------
    def request_stop(self, inst: Instance) -> None:
        if inst.child is None or inst.stopping:
            return
        inst.stopping = True
        child = inst.child
        if inst.status == "loading":  # as llama-server: a loading model is killed
            child.kill()
        else:
            asyncio.create_task(child.stop(inst.entry.stop_timeout))

    async def unload(self, inst: Instance, wait: bool = False) -> None:
        self.request_stop(inst)
        while wait and inst.status in RUNNING:
            await self.changed()

    async def unload_lru(self) -> None:
        """At --models-max, stop the least recently used idle model and wait for it."""
        if self.has_capacity():
            return
        victim = self.pick_victim()
        if victim is not None:
            log.info("--models-max %d reached: unloading %s, the least recently used",
                     self.models_max, victim.entry.id)
            await self.unload(victim, wait=True)

    def pick_victim(self) -> Instance | None:
        wanted = {w.name for w in self.queue}
        idle = [i for i in self.instances.values()
                if i.busy == 0 and i.status in ("loaded", "sleeping") and not i.stopping
                and i.entry.id not in wanted]
        return min(idle, key=lambda i: i.last_used, default=None)

    def tick(self) -> None:
        """Stop idle models while queued entries outnumber the free (or freeing) slots."""
        if self.models_max <= 0 or not self.queue:
            return
        running = self.running()
        stopping = sum(1 for i in running if i.stopping)
        needed = sum(1 for w in self.queue if not w.loading)
        claimed = sum(1 for w in self.queue if w.loading
                      and self.instances[w.name].status not in RUNNING)
        free = self.models_max - len(running) + stopping - claimed
        while free < needed:
            victim = self.pick_victim()
            if victim is None:
                return  # every model is busy: a request's end calls tick again
            log.info("unloading %s, the least recently used idle model, for a queued request",
                     victim.entry.id)
            self.request_stop(victim)
            free += 1

    # --- waiting for a model ------------------------------------------------------------
    async def ensure_ready(self, name: str, gone: Callable) -> None:
        """Wait until `name` is loaded, loading it when its turn comes; `gone()` (awaitable)
        says the client went away, which leaves the queue."""
        inst = self.instances[name]
        if inst.status in ("loaded", "sleeping") and not inst.stopping:
            return
        entry = self._join(name) if inst.status == "unloaded" else None
        did_load = saw_loading = False
        try:
            while True:
                status = inst.status
                if inst.stopping:  # a stopping child takes no request: the next one will
                    entry = entry or self._join(name)
                elif status in ("loaded", "sleeping"):
                    return
                elif status == "loading":
                    saw_loading = True
                elif did_load or saw_loading:  # unloaded again after a load
                    if inst.failed:
                        raise ApiError(400, f"model {name} failed to load: {inst.error}")
                    raise ApiError(503, f"model {name} was unloaded while loading")
                else:
                    entry = entry or self._join(name)
                if await gone():
                    raise ApiError(499, f"request cancelled while waiting for model {name}")
                if status == "unloaded" and not inst.stopping and self._claim(entry):
                    try:
                        await self.load(name)
                    except ApiError:
                        entry.loading = False
                        raise
                    did_load = True
                    continue
                await self.changed()
        finally:
            if entry is not None:
                self._leave(entry)

    def _join(self, name: str) -> Waiting:
        for w in self.queue:
            if w.name == name:
                w.waiters += 1
                return w
        w = Waiting(name)
        self.queue.append(w)
        self.tick()
        return w

    def _leave(self, w: Waiting) -> None:
        w.waiters -= 1
        if w.waiters <= 0 and w in self.queue:
            self.queue.remove(w)
        self.wake()

    def _claim(self, w: Waiting | None) -> bool:
        if w is None or not self.queue or self.queue[0] is not w or w.loading:
            return False
        if not self.has_capacity():
            return False
        w.loading = True
        return True

    # --- the catalog read again ---------------------------------------------------------
    def reload(self) -> None:
        """GET /models?reload=1: new entries added, removed ones stopped and dropped, a
        changed one that is not running updated."""
        self.catalog.reload()
        fresh = {e.id: e for e in self.catalog.entries(hidden=True)}
        for name in list(self.instances):
            inst = self.instances[name]
            if name not in fresh:
                self.request_stop(inst)
                del self.instances[name]
                self.notify("model_remove", name)
            elif inst.status == "unloaded":
                inst.entry = fresh[name]
            else:
                inst.entry.hidden = fresh[name].hidden
        for name, e in fresh.items():
            self.instances.setdefault(name, Instance(e))
        self.notify("models_reload", "*")

    async def close(self) -> None:
        children = [i.child for i in self.instances.values() if i.child is not None]
        await asyncio.gather(*(c.stop(5) for c in children), return_exceptions=True)
        await self.client.aclose()


def sse_line(message: dict) -> str:
    return f"data: {json.dumps(message)}\n\n"
