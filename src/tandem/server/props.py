"""What the server says about itself and its tokenizer: GET /health, GET /props, GET /metrics,
POST /tokenize and POST /detokenize (llama.cpp's).

    GET  /health            503 {"error": {"message": "Loading model"}} while loading, then 200
    GET  /props             default generation settings, total_slots, model path, speculation,
                            the memory plan beside the process's resident memory,
                            is_sleeping (--sleep-idle-seconds; answered asleep, not woken)
    GET  /metrics           Prometheus text (metrics.py; off without --metrics)
    POST /tokenize          {"content": str, "add_special": bool} -> {"tokens": [...]}
    POST /detokenize        {"tokens": [...]} -> {"content": str}
"""

from __future__ import annotations

from fastapi import APIRouter, Request as HttpRequest
from fastapi.responses import Response

from . import images
from .jobs import off_loop, read_body
from .metrics import CONTENT_TYPE
from .results import generation_settings, spec_settings
from .schemas import ApiError, json_object
from .state import ServerState

router = APIRouter()


@router.get("/health")
@router.get("/v1/health")
async def health(http: HttpRequest):
    http.app.state.tandem.alive()  # asleep (--sleep-idle-seconds) is healthy
    return {"status": "ok"}


@router.post("/tokenize")
async def tokenize(http: HttpRequest):
    state: ServerState = http.app.state.tandem
    engine, _ = state.ready()
    data = json_object(await read_body(http, state))
    content, add_special = data.get("content", ""), data.get("add_special", False)
    parse_special, with_pieces = data.get("parse_special", True), data.get("with_pieces", False)
    if not isinstance(content, str) or not all(
            isinstance(v, bool) for v in (add_special, parse_special, with_pieces)):
        raise ApiError(400, "tokenize: 'content' must be a string; 'add_special', "
                            "'parse_special' and 'with_pieces' booleans")
    tokens = await off_loop(lambda: engine.tok.encode(content, add_special=add_special,
                                                      parse_special=parse_special))
    if with_pieces:  # llama-server's: the piece as text, or its bytes if not valid UTF-8
        return {"tokens": [{"id": t, "piece": _piece(engine, t)} for t in tokens]}
    return {"tokens": tokens}


@router.post("/detokenize")
async def detokenize(http: HttpRequest):
    state: ServerState = http.app.state.tandem
    engine, _ = state.ready()
    tokens = json_object(await read_body(http, state)).get("tokens", [])
    vocab = engine.tok.vocab_size
    if not (isinstance(tokens, list) and all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab
            for t in tokens)):
        raise ApiError(400, f"detokenize: 'tokens' must be a list of token ids in "
                            f"0..{vocab - 1}")
    return {"content": engine.tok.decode(tokens)}


@router.get("/props")
async def props(http: HttpRequest):
    state: ServerState = http.app.state.tandem
    if (before := state.asleep()) is not None:  # the model is away: what it said, not woken
        return {**before["props"], "memory": _memory(state)}
    engine, _ = state.ready()
    return props_body(state, engine)


def props_body(state: ServerState, engine, sleeping: bool = False) -> dict:
    return {
        "default_generation_settings": {
            "id": 0, "n_ctx": engine.cfg.ctx_size,
            "params": generation_settings(state.settings.sampling, engine.spec,
                                          engine.cfg.ctx_size),
        },
        "total_slots": engine.cfg.n_parallel,
        "model_path": state.model_path,
        "model_alias": state.model_name,
        "draft_model_path": state.draft_path,
        "speculative": spec_settings(engine.spec, state.draft_path),
        "chat_template": engine.tok.chat_template or "",
        "bos_token": _token_text(engine, engine.tok.bos_id),
        "eos_token": _token_text(engine, engine.tok.eos_id),
        "modalities": {"vision": engine.vision is not None, "video": False, "audio": False},
        "media_marker": images.marker(),
        "build_info": "tandem",
        "cors_proxy_enabled": state.settings.ui_mcp_proxy,
        "is_sleeping": sleeping,
        "memory": _memory(state),
    }


def _memory(state: ServerState) -> dict:
    """Tandem's: the memory plan printed before loading, beside what the process holds now
    and held at its peak (bytes)."""
    from ..memory import resident

    plan = state.memory_plan
    return {"plan": None if plan is None else plan.as_json(), **resident()}


@router.get("/metrics")
async def metrics(http: HttpRequest):
    state: ServerState = http.app.state.tandem
    if not state.settings.metrics_endpoint:
        raise ApiError(501, "this server was started without --metrics: GET /metrics is off")
    response = Response(state.metrics.render(), media_type=CONTENT_TYPE)
    # llama-server's header, capitalized as it sends it (Starlette lowercases names)
    response.raw_headers.append((b"Process-Start-Time-Unix",
                                 str(state.metrics.t_start).encode()))
    return response


def _piece(engine, token_id: int) -> str | list[int]:
    raw = engine.tok.token_to_piece(token_id)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return list(raw)


def _token_text(engine, token_id: int | None) -> str:
    return "" if token_id is None else engine.tok.tokens[token_id]
