"""Turning a validated request body into the engine's Request (tokens, sampling, speculation).

The checks that need the loaded model live here: the prompt must fit the context (else
llama-server's exceed_context_size_error, with n_prompt_tokens and n_ctx), token ids must be in
the vocabulary, and a per-request spec type must be one the loaded models can serve.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..config import SamplingParams, SpecConfig
from ..errors import TandemError
from .schemas import ApiError, ChatBody, SamplingFields

if TYPE_CHECKING:
    from ..engine import Engine, Request


def n_predict_of(*candidates: int | None) -> int | None:
    """The first given limit (-1 = until EOS or the context is full), None when the request
    gives none (the server's -n then). A limit beyond the context is accepted, as llama-server
    does: generation stops when the context is full."""
    return next((c for c in candidates if c is not None), None)


def sampling_of(body: SamplingFields, n_predict: int | None,
                defaults: SamplingParams) -> SamplingParams:
    """The request's sampling: each field it sends, else the server's flag (its default)."""
    sent = body.model_fields_set

    def pick(name: str):
        return getattr(body, name) if name in sent else getattr(defaults, name)

    stop = body.stop_list() if "stop" in sent else list(defaults.stop)
    try:
        return SamplingParams(temperature=pick("temperature"), top_k=pick("top_k"),
                              top_p=pick("top_p"), min_p=pick("min_p"), seed=pick("seed"),
                              n_predict=defaults.n_predict if n_predict is None else n_predict,
                              stop=stop, ignore_eos=pick("ignore_eos"))
    except TandemError as e:
        raise ApiError(400, str(e)) from None


def spec_of(body: SamplingFields, engine: Engine) -> SpecConfig | None:
    """The request's speculation settings, or None for the server's own (--spec-* flags)."""
    if not body.speculative:
        return None
    try:
        spec = engine.spec.override(body.speculative, has_draft=engine.draft is not None)
    except TandemError as e:
        raise ApiError(400, f"speculative settings: {e}") from None
    return None if spec is engine.spec else spec


def prompt_ids(engine: Engine, prompt: str | list) -> list[int]:
    """llama.cpp's prompt forms: text, token ids, or a mix (text pieces are tokenized)."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # OpenAI clients wrap a single prompt in a list
    if isinstance(prompt, list) and any(isinstance(p, list) for p in prompt):
        raise ApiError(400, f"prompt: {len(prompt)} prompts in one request are not supported; "
                            "send one request per prompt")
    if isinstance(prompt, str):
        prompt = [prompt]
    if all(isinstance(p, str) for p in prompt) and len(prompt) > 1:
        raise ApiError(400, f"prompt: {len(prompt)} prompts in one request are not supported; "
                            "send one request per prompt")
    tok = engine.tok
    ids: list[int] = []
    for i, part in enumerate(prompt):
        if isinstance(part, str):
            if part:
                ids.extend(tok.encode(part, add_special=i == 0, parse_special=True))
        else:
            ids.append(part)
    if not ids:
        raise ApiError(400, "the prompt is empty; give some text or token ids")
    return ids


def chat_text(engine: Engine, body: ChatBody) -> str:
    """The messages rendered by the model's chat template, the assistant's turn opened."""
    messages = [{"role": m.role, "content": m.text()} for m in body.messages]
    try:
        return engine.tok.apply_chat_template(messages, add_generation_prompt=True)
    except TandemError as e:
        raise ApiError(400, f"messages: {e}") from None


def chat_ids(engine: Engine, body: ChatBody) -> list[int]:
    text = chat_text(engine, body)
    ids = engine.tok.encode(text, add_special=False, parse_special=True)
    if not ids:
        raise ApiError(400, "the chat template produced an empty prompt")
    return ids


def check_prompt(engine: Engine, ids: list[int]) -> None:
    ctx, vocab = engine.cfg.ctx_size, engine.target.args.vocab_size
    if len(ids) >= ctx:
        raise ApiError(400, f"the prompt has {len(ids)} tokens but the context holds {ctx} "
                            "per slot; shorten the prompt or start the server with a larger "
                            "--ctx-size", "exceed_context_size_error",
                       n_prompt_tokens=len(ids), n_ctx=ctx)
    bad = next((t for t in ids if not 0 <= t < vocab), None)
    if bad is not None:
        raise ApiError(400, f"prompt: token id {bad} is outside the vocabulary (0..{vocab - 1})")


def build_request(engine: Engine, body: SamplingFields, ids: list[int], n_predict: int | None,
                  n_probs: int = 0, defaults: SamplingParams | None = None) -> Request:
    from ..engine import Request

    check_prompt(engine, ids)
    n_slots = engine.cfg.n_parallel
    if body.id_slot >= n_slots:
        raise ApiError(400, f"id_slot {body.id_slot} does not exist; this server has {n_slots} "
                            f"slot(s): 0..{n_slots - 1}, or -1 for any")
    defaults = SamplingParams() if defaults is None else defaults
    return Request(ids, sampling_of(body, n_predict, defaults), spec_of(body, engine),
                   cache_prompt=body.cache_prompt, id_slot=body.id_slot, n_probs=n_probs)
