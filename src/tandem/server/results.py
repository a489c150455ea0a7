"""What the server says about a finished request, a slot, and its settings (llama.cpp's fields).

Built in the worker thread, which owns the engine; the HTTP side only reshapes these dicts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..cli import completion_json
from ..config import SamplingParams, SpecConfig

if TYPE_CHECKING:
    from ..engine import Engine, Sequence, TokenLogprobs


def completion_result(seq: Sequence, engine: Engine) -> dict:
    """llama.cpp's /completion response for a finished sequence.

    truncated: generation stopped because the slot's context was full (llama.cpp's meaning:
    the answer was cut, not finished).
    """
    out = completion_json(seq)
    out["truncated"] = seq.stop_type == "limit" and len(seq.tokens) >= engine.cfg.ctx_size
    out["tokens_cached"] = len(seq.tokens) - 1
    out["generation_settings"] = generation_settings(seq.req.sampling, seq.spec,
                                                     engine.cfg.ctx_size)
    out["generation_settings"]["n_probs"] = seq.req.n_probs
    out["generation_settings"]["cache_prompt"] = seq.req.cache_prompt
    if seq.req.n_probs:
        out["completion_probabilities"] = probabilities(engine, seq.logprobs)
    return out


def generation_settings(s: SamplingParams, spec: SpecConfig, n_ctx: int) -> dict:
    return {
        "n_ctx": n_ctx,
        "n_predict": s.n_predict,
        "temperature": s.temperature,
        "top_k": s.top_k,
        "top_p": s.top_p,
        "min_p": s.min_p,
        "seed": s.seed,
        "stop": list(s.stop),
        "ignore_eos": s.ignore_eos,
        "speculative.type": ",".join(spec.types),
        "speculative.n_max": spec.n_max,
        "speculative.n_min": spec.n_min,
        "speculative.p_min": spec.p_min,
    }


def spec_settings(spec: SpecConfig, draft_path: str | None) -> dict:
    return {
        "type": ",".join(spec.types),
        "adaptive": spec.adaptive,  # --spec-type auto: k chosen per step by the controller
        "enabled": spec.enabled,
        "draft_model": draft_path,
        "n_max": spec.n_max,
        "n_min": spec.n_min,
        "p_min": spec.p_min,
        "draft_window": spec.draft_window,  # 0: the draft processes the whole prompt
        "draft_vocab": spec.draft_vocab,  # 0: the draft proposes from the whole vocabulary
        "ngram_min": spec.ngram_min,
        "ngram_max": spec.ngram_max,
        "ngram_m": spec.ngram_m,
    }


def probabilities(engine: Engine, logprobs: list[TokenLogprobs]) -> list[dict]:
    """llama.cpp's completion_probabilities: per output token its logprob and the top n."""
    return [{**_token(engine, lp.id, lp.logprob),
             "top_logprobs": [_token(engine, i, v) for i, v in lp.top]} for lp in logprobs]


def _token(engine: Engine, token_id: int, logprob: float) -> dict:
    piece = engine.tok.token_to_piece(token_id)
    return {"id": token_id, "token": piece.decode("utf-8", errors="replace"),
            "bytes": list(piece), "logprob": logprob}


def slot_view(engine: Engine, i: int, job) -> dict:
    """GET /slots: one slot, as the worker last saw it."""
    seq = None if job is None else job.seq
    view = {
        "id": i,
        "id_task": -1 if job is None else job.id,
        "n_ctx": engine.cfg.ctx_size,
        "is_processing": seq is not None and not seq.done,
        "n_cached": engine.cache.length(i),
        "speculative": (seq.spec if seq is not None else engine.spec).enabled,
    }
    if seq is not None:
        view["params"] = generation_settings(seq.req.sampling, seq.spec, engine.cfg.ctx_size)
        view["n_prompt_tokens"] = seq.n_prompt
        view["n_decoded"] = len(seq.output)
        view["speculative_stats"] = seq.stats.as_dict()
    return view
