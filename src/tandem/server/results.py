"""What the server says about a finished request, a slot, and its settings (llama.cpp's fields).

Built in the worker thread, which owns the engine; the HTTP side only reshapes these dicts.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from ..config import SamplingParams, SpecConfig

if TYPE_CHECKING:
    from ..engine import Engine, Sequence
    from ..sampling import TokenLogprobs


def completion_json(seq: Sequence) -> dict:
    """llama.cpp's /completion fields for a finished sequence (also `tandem generate --json`)."""
    out = {
        "content": seq.text,
        "tokens": list(seq.output),
        "tokens_predicted": len(seq.output),
        "tokens_evaluated": seq.n_prompt,
        "stop_type": seq.stop_type,
        "stopping_word": seq.stopping_word,
        "stop": True,
        "truncated": False,
        "seed": seq.seed,
        "id_slot": seq.slot,
        "timings": seq.timings(),
    }
    if seq.spec.enabled:
        out["speculative"] = {"type": ",".join(seq.spec.types), **seq.stats.as_dict()}
    return out


def completion_result(seq: Sequence, engine: Engine) -> dict:
    """llama.cpp's /completion response for a finished sequence.

    truncated: generation stopped because the slot's context was full, or went on after a
    context shift dropped tokens (llama.cpp's meaning: the answer lost context).
    """
    out = completion_json(seq)
    out["truncated"] = seq.truncated or (seq.stop_type == "limit"
                                         and len(seq.tokens) >= engine.cfg.ctx_size)
    out["tokens_cached"] = len(seq.tokens) - 1
    out["generation_settings"] = generation_settings(seq.req.sampling, seq.spec,
                                                     engine.cfg.ctx_size)
    out["generation_settings"]["n_probs"] = seq.req.n_probs
    out["generation_settings"]["cache_prompt"] = seq.req.cache_prompt
    out["generation_settings"]["n_keep"] = seq.req.n_keep
    out["generation_settings"]["n_discard"] = seq.req.n_discard
    # llama-server's report of biases, ignore_eos's among them: a -inf bias is null in JSON
    bias = dict(seq.req.logit_bias)
    if seq.req.sampling.ignore_eos:
        bias.update((t, float("-inf")) for t in engine.tok.eog_ids)
    out["generation_settings"]["logit_bias"] = [
        {"token": t, "bias": None if b == float("-inf") else b} for t, b in sorted(bias.items())]
    out["generation_settings"]["grammar"] = seq.req.grammar or ""
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
        **spec.request_view(),  # speculative.type, .n_max, .n_min, .p_min
    }


def spec_settings(spec: SpecConfig, draft_path: str | None) -> dict:
    """/props: every speculation setting (types as one string) and the draft model loaded.
    adaptive: --spec-type auto, k chosen per step by the controller; draft_window 0: the draft
    reads the whole prompt; draft_vocab 0: the draft proposes from the whole vocabulary."""
    view = dataclasses.asdict(spec)
    view["type"] = ",".join(view.pop("types"))
    view["p_min"] = spec.draft_p_min  # the floor in use (unset: 0)
    return {"type": view.pop("type"), "enabled": spec.enabled, "draft_model": draft_path,
            **view}


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
