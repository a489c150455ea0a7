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

import dataclasses
import threading
from pathlib import Path

from ..check import ModelInfo, inspect_model
from ..config import EngineConfig, SpecConfig
from ..errors import TandemError
from ..memory import plan
from ..speculative.compat import check_compatible

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


def _pair_plan(target: ModelInfo, draft: ModelInfo | None, cfg: EngineConfig,
               spec: SpecConfig) -> dict:
    """The memory plan of the target (and the draft) as the server would load them."""
    models = [target.spec]
    if draft is not None:
        models.append(dataclasses.replace(draft.spec, role="draft"))
    pool = spec.suffix_pool if "suffix" in (spec.types or ()) else 0
    return plan(models, cfg, spec.spare_positions, pool_tokens=pool,
                draft_vocab=spec.draft_vocab if draft is not None else 0).as_json()


def draft_choices(model: str, catalog: list[tuple[str, Path]], cfg: EngineConfig,
                  spec: SpecConfig) -> dict:
    """Every other model of `catalog` ((id, first GGUF file) pairs) judged as a draft for
    `model`: accepted with the pair's plan, or refused with the rule that fails. A file that
    cannot be read is refused with the reading's error (the others are still judged)."""
    paths = dict(catalog)
    target = _inspect(paths[model])
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
            row["plan"] = _pair_plan(target, draft, cfg, spec)
            if draft.size >= target.size:
                row["message"] += (f"; it is not smaller than the target ({draft.size >> 20} "
                                   f"MiB against {target.size >> 20} MiB): it will not pay")
        out.append(row)
    return {"model": model, "plan": _pair_plan(target, None, cfg, spec), "data": out}
