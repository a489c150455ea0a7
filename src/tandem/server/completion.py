"""llama.cpp's generation endpoints: POST /completion (/completions) and POST /infill.

llama.cpp's fields in and out; SSE when "stream": true. Several prompts in one request get a
list of answers, one an answer. /infill (fill-in-the-middle, infill.py) is answered as
/completion.
"""

from __future__ import annotations

from fastapi import APIRouter, Request as HttpRequest

from ..media import prompt_text
from .jobs import off_loop, read_body, sse_response, submit, wait_results
from .prepare import build_request, constraints_of, n_predict_of, prompt_list
from .schemas import CompletionBody, parse_body
from .state import ServerState
from .worker import Delta, Done, Progress

router = APIRouter()


@router.post("/completion")
@router.post("/completions")
async def completion(http: HttpRequest):
    state: ServerState = http.app.state.tandem
    engine, _ = state.ready()
    body: CompletionBody = parse_body(await read_body(http, state), CompletionBody)
    prompts = await off_loop(prompt_list, engine, body.prompt)
    shaped = await off_loop(constraints_of, engine, body)
    reqs = [build_request(engine, body, ids, n_predict_of(body.n_predict), body.n_probs,
                          state.settings.sampling, body.post_sampling_probs, shaped)
            for ids in prompts]  # every prompt checked before any is submitted
    jobs = submit(state, reqs, body.stream, body.return_progress)
    if body.stream:
        return await sse_response(http, state, jobs, [
            _completion_chunks(state, body, i) for i in range(len(jobs))])
    results = await wait_results(http, state, jobs)
    out = [_completion_answer(state, body, i, ids, r)
           for i, (ids, r) in enumerate(zip(prompts, results))]
    # several prompts get a list of answers, one an answer, as llama-server's
    return out[0] if len(out) == 1 else out


@router.post("/infill")
async def infill(http: HttpRequest):
    from .infill import InfillBody, infill_ids

    state: ServerState = http.app.state.tandem
    engine, _ = state.ready()
    body: InfillBody = parse_body(await read_body(http, state), InfillBody)
    ids = await off_loop(infill_ids, engine, body, engine.cfg.batch_size,
                         state.settings.sampling.n_predict)
    req = build_request(engine, body, ids, n_predict_of(body.n_predict), body.n_probs,
                        state.settings.sampling, body.post_sampling_probs,
                        await off_loop(constraints_of, engine, body))
    (job,) = submit(state, [req], body.stream, body.return_progress)
    if body.stream:
        return await sse_response(http, state, job, _completion_chunks(state, body))
    (result,) = await wait_results(http, state, [job])
    return _completion_answer(state, body, 0, ids, result)


def _completion_answer(state: ServerState, body: CompletionBody, index: int, ids: list[int],
                       result: dict) -> dict:
    """llama-server's /completion answer: the ids only when asked for (return_tokens), the
    prompt as text, whether the answer has a new line; response_fields keeps only the fields
    named ("generation_settings/n_predict" reaches into generation_settings)."""
    engine = state.engine
    out = {"index": index, **result, "model": state.model_name,
           "tokens": result["tokens"] if body.return_tokens else [],
           "prompt": prompt_text(engine.tok, ids), "has_new_line": "\n" in result["content"]}
    if body.n_probs and body.post_sampling_probs:
        out["completion_probabilities"] = [_post(p) for p in out["completion_probabilities"]]
    if body.response_fields:
        out = {path: _nested(out, path) for path in body.response_fields}
    return out


def _nested(obj, path: str):
    for key in path.split("/"):
        obj = obj.get(key) if isinstance(obj, dict) else None
    return obj


def _post(p: dict) -> dict:
    """A completion_probabilities entry in llama-server's post_sampling_probs form: "prob" and
    "top_probs" (probabilities after the sampler chain) in place of the logprobs."""
    import math

    def one(t: dict) -> dict:
        t = dict(t)
        t["prob"] = math.exp(t.pop("logprob"))
        return t

    out = one({k: v for k, v in p.items() if k != "top_logprobs"})
    out["top_probs"] = [one(t) for t in p["top_logprobs"]]
    return out


def _progress_timings(p: Progress) -> dict:
    """The timings of a request whose prompt is being read: nothing predicted yet."""
    n = p.processed - p.cache
    return {"cache_n": p.cache, "prompt_n": n, "prompt_ms": p.time_ms if n else 0.0,
            "prompt_per_token_ms": p.time_ms / n if n else 0.0,
            "prompt_per_second": 1e3 * n / p.time_ms if n and p.time_ms > 0 else 0.0,
            "predicted_n": 0, "predicted_ms": 0.0, "predicted_per_token_ms": 0.0,
            "predicted_per_second": 0.0}


def _completion_chunks(state: ServerState, body: CompletionBody, index: int = 0):
    """llama-server's /completion stream: a chunk per step (its token ids only with
    return_tokens), then the full result with stop: true. `from_draft` says, per token,
    whether it was an accepted draft token, `origins` who proposed it (target, draft, suffix,
    ngram, grammar). `index`: which prompt of the request."""

    def render(event: Delta | Progress | Done) -> list[dict]:
        if isinstance(event, Progress):
            chunk = {"index": index, "content": "", "tokens": [], "stop": False,
                     "tokens_predicted": 0, "tokens_evaluated": event.total,
                     "prompt_progress": event.as_dict()}
            if body.timings_per_token:
                chunk["timings"] = _progress_timings(event)
            return [chunk]
        if isinstance(event, Delta):
            chunk = {"index": index, "content": event.text,
                     "tokens": event.tokens if body.return_tokens else [], "stop": False,
                     "from_draft": event.from_draft, "origins": event.origins}
            if body.timings_per_token and event.timings is not None:
                chunk["timings"] = event.timings
            if event.logprobs:
                from .results import probabilities

                probs = probabilities(state.engine, event.logprobs)
                chunk["completion_probabilities"] = (
                    [_post(p) for p in probs] if body.post_sampling_probs else probs)
            return [chunk]
        # the text went out in the chunks; the final one carries the stats, as llama-server's
        final = {"index": index, **event.result, "content": "", "tokens": [],
                 "model": state.model_name}
        final.pop("completion_probabilities", None)  # each chunk carried its own
        return [final]

    return render
