"""llama.cpp's slot endpoints: GET /slots (what every slot is doing; off with --no-slots) and
POST /slots/{id}?action=save|restore {"filename"} (slot files in --slot-save-path) or erase."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from fastapi import APIRouter, Request as HttpRequest

from ..errors import TandemError
from .jobs import read_body
from .schemas import ApiError, json_object
from .state import ServerState

router = APIRouter()


@router.get("/slots")
async def slots(http: HttpRequest):
    state: ServerState = http.app.state.tandem
    if not state.settings.slots_endpoint:
        raise ApiError(501, "this server was started with --no-slots: GET /slots is off")
    if (before := state.asleep()) is not None:  # --sleep-idle-seconds: answered, not woken
        return before["slots"]
    _, worker = state.ready()
    return worker.slots()


@router.post("/slots/{id_slot}")
async def slot_action(id_slot: int, http: HttpRequest, action: str = ""):
    """llama-server's slot files: ?action=save|restore {"filename"} (needs --slot-save-path,
    files only inside it), ?action=erase."""
    state: ServerState = http.app.state.tandem
    engine, worker = state.ready()
    if action not in ("save", "restore", "erase"):
        raise ApiError(400, f"action {action!r}: expected ?action=save, restore or erase")
    data = json_object(await read_body(http, state))
    path = None if action == "erase" else _slot_file(state, action, data.get("filename"))
    fn = {"erase": lambda: engine.erase_slot(id_slot),
          "save": lambda: engine.save_slot(id_slot, path),
          "restore": lambda: engine.restore_slot(id_slot, path)}[action]
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


def _slot_file(state: ServerState, action: str, name) -> Path:
    """The file a save or restore names, inside --slot-save-path."""
    root = state.settings.slot_save_path
    if root is None:
        raise ApiError(501, "this server was started without --slot-save-path: slot "
                            "save and restore are off")
    if not isinstance(name, str) or not _safe_filename(name):
        raise ApiError(400, "filename: expected a plain file name (no directories, "
                            f"no leading dot), got {json.dumps(name)[:80]}")
    path = Path(root) / name
    if action == "restore" and not path.is_file():
        raise ApiError(400, f"filename: no saved slot {name!r} in --slot-save-path")
    return path


def _safe_filename(name: str) -> bool:
    """llama.cpp's fs_validate_filename, in short: one path component, no separators, no
    leading dot, no control characters, at most 255 bytes."""
    return (0 < len(name.encode()) <= 255 and not name.startswith(".")
            and not any(c in name for c in '/\\:*?"<>|') and name.isprintable())
