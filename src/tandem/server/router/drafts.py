"""The page's draft picker (router mode): which models of the catalog `tandem check` accepts as
drafts for a target, the rule that refuses each other one, and the memory plan of each pair.
LM Studio's workflow (load the target, measure, then pick a compatible draft) with Tandem's
compatibility rules (speculative/compat.py, llama.cpp's) and memory plan (memory.py) behind it.

    GET /models/drafts?model=ID
      {"model": ID, "plan": the target alone's memory plan (MemoryPlan.as_json),
       "data": [{"id", "path", "accepted": bool, "rule": null | the rule that refuses it,
                 "message": check's line, "plan": the pair's plan | null}, ...]}

Only metadata, shapes and vocabularies are read (check.inspect_model), never weights; each
file's reading is kept while the file is unchanged (size, mtime), so the picker answers at
once after its first look.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path

from fastapi import APIRouter, Request

from ...check import ModelInfo, inspect_model
from ...errors import TandemError
from ...memory import fmt_bytes
from ...speculative.compat import check_compatible
from ..schemas import ApiError

_lock = threading.Lock()
_seen: dict[tuple[str, int, int], ModelInfo] = {}


def _inspect(path: Path) -> ModelInfo:
    """check's reading of one file, kept while the file is unchanged."""
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns)
    with _lock:
        info = _seen.get(key)
    if info is None:
        info = inspect_model("target", str(path))
        with _lock:
            _seen[key] = info
    return info


def draft_choices(model: str, catalog: list[tuple[str, Path]],
                  plan_for: Callable[[Path | None], dict]) -> dict:
    """Every other model of `catalog` ((id, first GGUF file) pairs) judged as a draft for
    `model`: accepted with the pair's plan, or refused with the rule that fails. A file that
    cannot be read is refused with the reading's error (the others are still judged).
    plan_for(draft file or None): the memory plan (as_json) of the target loaded with it, as
    the server would load them."""
    paths = dict(catalog)
    try:
        target = _inspect(paths[model])
    except FileNotFoundError:
        raise ApiError(409, f"model '{model}' is not downloaded yet ({paths[model]}): its "
                            "drafts are judged once it is (POST /models/load fetches it)") from None
    except (TandemError, OSError, ValueError) as e:
        raise ApiError(400, f"model '{model}' cannot be read: {e}") from None
    out = []
    for cid, path in catalog:
        row = {"id": cid, "path": str(path), "accepted": False, "rule": None, "message": "",
               "plan": None}
        if cid == model:
            row.update(rule="the target itself",
                       message="a model cannot draft for itself: every pass would cost a "
                               "target pass")
            out.append(row)
            continue
        try:
            draft = _inspect(path)
        except (TandemError, OSError, ValueError) as e:
            row.update(rule="unreadable", message=str(e))
            out.append(row)
            continue
        compat = check_compatible(target.tokenizer, draft.tokenizer)
        row.update(accepted=compat.ok, rule=compat.rule, message=compat.message)
        if compat.ok:
            row["plan"] = plan_for(path)
            if draft.size >= target.size:
                row["message"] += (f"; it is not smaller than the target ({fmt_bytes(draft.size)}"
                                   f" against {fmt_bytes(target.size)}): it will not pay")
        out.append(row)
    return {"model": model, "plan": plan_for(None), "data": out}


router = APIRouter()


@router.get("/models/drafts")
async def drafts(request: Request, model: str = ""):
    """The router's catalog judged as drafts for `model` (app.state.models: models.py)."""
    models = request.app.state.models
    entry = models.catalog.get(model)
    if entry is None:
        raise ApiError(404, f"model '{model}' not found: not in --models-dir or "
                            "--models-preset (GET /models lists them)")
    catalog = [(e.id, e.path) for e in models.catalog.entries()]

    def plan_for(draft: Path | None) -> dict:
        # the child's own command line, so the plan is the one its load will check
        return models.plan(entry, None if draft is None else str(draft)).as_json()

    return await asyncio.to_thread(draft_choices, entry.id, catalog, plan_for)

