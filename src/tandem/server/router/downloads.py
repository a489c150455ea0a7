"""The router's downloads, llama-server's (tools/server/server-models.cpp), the files fetched by
hub.py in a thread while the router keeps serving:

    POST /models {"model": "user/model[:tag]"}   checks the name against the hub (its file list)
        and answers {"success": true} at once; then on /models/sse download_progress events
        ({"progress": {URL: {"done", "total"}}}), and download_finished, or download_failed
        with {"error": why}; once finished, the model is listed (source "cache") as
        user/model:TAG. A name the hub does not have, a tag it has no file of, a model already
        listed, a download of that name already running: 400 naming it; no hub: 502.
    DELETE /models?model=ID   a cache model: stopped if it runs, its files removed, unlisted
        (model_remove); a running download: cancelled, its files removed; a failed one:
        forgotten. Not listed: 404; not from the cache: 400.
    a preset's hf-repo not in the cache   downloaded when the model is first loaded
        (POST /models/load answers at once and loads it after; a request that autoloads waits)

--offline forbids the downloads no request asked for (a preset's models), not POST /models: an
explicit download, as llama-server makes it whatever its --offline.

While it downloads, GET /models lists the name with status "downloading" (its progress); a
failed download stays listed as "failed" with its error until DELETE or a new POST, and leaves
no file of its own in the cache. Downloads of one repo run one after the other.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass, field

from ...errors import TandemError
from ..schemas import ApiError
from . import hub
from .models import Instance, Models

log = logging.getLogger("tandem.server")


@dataclass(slots=True)
class Download:
    name: str  # as asked (POST /models's "model", a preset's hf-repo)
    plan: hub.Plan
    cancel: threading.Event = field(default_factory=threading.Event)
    status: str = "downloading"  # or "failed"
    error: str = ""
    progress: dict = field(default_factory=dict)  # URL -> {"done", "total"}
    task: asyncio.Task | None = None
    listed: bool = True  # a row of its own in GET /models (not a preset model's file)

    def item(self, now: int) -> dict:
        """Its GET /models row (llama-server lists a download as a cache model)."""
        status: dict = {"value": self.status, "progress": self.progress}
        if self.status == "failed":
            status.update(failed=True, error=self.error)
        return {"id": self.name, "aliases": [], "tags": [], "object": "model",
                "owned_by": "tandem", "created": now, "status": status,
                "architecture": {"input_modalities": ["text"], "output_modalities": ["text"]},
                "source": "cache", "can_remove": True, "path": None, "mmproj": None,
                "draft": None, "files": self.plan.files}


class Downloads:
    def __init__(self, models: Models, offline: bool) -> None:
        self.models, self.offline = models, offline
        self.by_name: dict[str, Download] = {}
        self._repo_locks: dict[str, asyncio.Lock] = {}

    def running(self, name: str) -> Download | None:
        d = self.by_name.get(name)
        return d if d is not None and d.status == "downloading" else None

    def rows(self, listed: set[str], now: int) -> list[dict]:
        """GET /models's rows of the downloads asked by POST /models, but those listed."""
        return [d.item(now) for d in self.by_name.values()
                if d.listed and d.name not in listed]

    def status_of(self, inst: Instance) -> dict | None:
        """A preset model's status while what it needs downloads: "downloading" and the
        progress of each file; None when nothing of its own downloads."""
        ds = [d for d in map(self.running, inst.entry.fetch) if d is not None]
        if not ds or inst.status != "unloaded":
            return None
        return {"value": "downloading",
                "progress": {u: p for d in ds for u, p in d.progress.items()}}

    # --- POST /models -------------------------------------------------------------------
    async def start(self, name: str) -> Download:
        """Check `name` against the hub, then download it in the background."""
        if self.running(name):
            raise ApiError(400, f"model '{name}' is already being downloaded (GET /models "
                                "shows its progress)")
        self._refuse_listed(name, name)  # (before asking the hub)
        p = await self._plan(name)
        if p.preset:
            raise ApiError(400, f"model '{name}': {p.repo} is a preset repo (it has a "
                                f"preset.ini), not a model: serve it with -hf {p.repo}")
        self._refuse_listed(name, p.id)
        return self._begin(name, p)

    def _refuse_listed(self, name: str, key: str) -> None:
        inst = self.models.get(key)
        if inst is not None and not inst.entry.fetch:
            raise ApiError(400, f"model '{name}' already exists (as {inst.entry.id}, source "
                                f"{inst.entry.source})")

    async def _plan(self, name: str) -> hub.Plan:
        try:
            return await asyncio.to_thread(hub.plan, name)
        except hub.HubError as e:
            raise ApiError(e.status, str(e)) from None

    def _begin(self, name: str, p: hub.Plan, listed: bool = True) -> Download:
        d = self.by_name[name] = Download(name, p, listed=listed)
        d.task = asyncio.create_task(self._run(d))
        log.info("downloading %s from %s: %s", name, hub.endpoint(), ", ".join(p.files))
        return d

    async def _run(self, d: Download) -> None:
        loop = asyncio.get_running_loop()

        def progress(url: str, done: int, total: int | None) -> None:  # (the download thread)
            loop.call_soon_threadsafe(self._progress, d, url, done, total)

        lock = self._repo_locks.setdefault(d.plan.repo, asyncio.Lock())
        try:
            async with lock:
                if d.cancel.is_set():
                    raise hub.Cancelled()
                await asyncio.to_thread(hub.fetch, d.plan, progress, d.cancel)
        except hub.Cancelled:
            log.info("download of %s cancelled", d.name)
            return
        except Exception as e:  # the hub's, the network's, the disk's: said, not raised
            d.status, d.error = "failed", f"{type(e).__name__}: {hub.first_line(e)}"
            log.error("download of %s failed: %s", d.name, d.error)
            self.models.notify("download_failed", d.name, {"error": d.error})
            return
        self.by_name.pop(d.name, None)
        log.info("downloaded %s into %s", d.name, hub.hfcache.cache_dir())
        self.reload()
        self.models.notify("download_finished", d.name, {})

    def _progress(self, d: Download, url: str, done: int, total: int | None) -> None:
        if d.status != "downloading" or d.cancel.is_set():
            return
        d.progress[url] = {"done": done, "total": total}
        self.models.notify("download_progress", d.name, {"progress": dict(d.progress)})

    def reload(self) -> str:
        """The catalog read again (the cache changed); "" or why it could not be."""
        try:
            self.models.reload()
        except TandemError as e:
            log.error("the models could not be read again: %s", e)
            return str(e)
        return ""

    def close(self) -> None:
        """The router stops: every download cancelled (at its next piece), its part removed."""
        for d in self.by_name.values():
            d.cancel.set()

    # --- DELETE /models -----------------------------------------------------------------
    async def remove(self, name: str) -> None:
        d = self.by_name.get(name)
        if d is not None:  # a download running (cancelled: its files go) or failed
            d.cancel.set()
            if d.task is not None:
                await asyncio.gather(d.task, return_exceptions=True)
            self.by_name.pop(name, None)
            self.models.notify("model_remove", name, {})
            return
        inst = self.models.get(name)
        if inst is None:
            raise ApiError(404, f"model '{name}' not found (GET /models lists them)")
        e = inst.entry
        if e.source != "cache":
            raise ApiError(400, f"model '{e.id}' is not removable: it is not from the cache "
                                f"(source {e.source}); only downloaded models are deleted")
        if inst.status != "unloaded" or inst.stopping:
            log.info("stopping %s before removing its files", e.id)
            await self.models.unload(inst, wait=True)
        try:
            await asyncio.to_thread(hub.remove, e.id)
        except OSError as err:
            raise ApiError(500, f"model '{e.id}': its files could not be removed: {err}") \
                from None
        log.info("removed %s from the cache", e.id)
        why = self.reload()
        if why:
            raise ApiError(500, f"model '{e.id}' removed, but the models could not be read "
                                f"again: {why}")

    # --- a preset's models not in the cache ---------------------------------------------
    async def ensure(self, inst: Instance) -> None:
        """Download what `inst`'s preset section names and the cache lacks (its hf-repo, its
        spec-draft-hf), then read the catalog again; an ApiError if it failed."""
        for name in list(inst.entry.fetch):
            d = self.by_name.get(name)
            if d is None or d.status == "failed":
                if self.offline:
                    raise ApiError(400, f"model {inst.entry.id}: {name} is not in the cache "
                                        "and --offline forbids downloading it")
                d = self._begin(name, await self._plan(name), listed=False)
            await asyncio.shield(d.task)
            if d.status == "failed":
                raise ApiError(502, f"model {inst.entry.id}: downloading {name} failed: "
                                    f"{d.error}")
        if inst.entry.fetch:
            why = self.reload()
            if why or inst.entry.fetch:
                raise ApiError(500, f"model {inst.entry.id}: downloaded, but not found in the "
                                    f"cache after: {why or 'its file is not there'}")

    async def load_later(self, inst: Instance, load) -> None:
        """POST /models/load of a model to download first: the download, then `load()`; a
        failure marks the model failed (GET /models) with why."""
        try:
            await self.ensure(inst)
            await load()
        except Exception as e:  # (a task's: said here, or nowhere)
            why = e.message if isinstance(e, ApiError) else f"{type(e).__name__}: {e}"
            log.error("model %s: %s", inst.entry.id, why)
            if inst.status == "unloaded":
                inst.failed, inst.error = True, why
                self.models.notify("status_change", inst.entry.id,
                                   {"status": inst.status, "failed": True, "error": why})
