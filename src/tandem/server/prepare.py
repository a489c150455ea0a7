"""Turning a validated request body into the engine's Request (tokens, sampling, speculation).

The checks that need the loaded model live here: the prompt must fit the context (else
llama-server's exceed_context_size_error, with n_prompt_tokens and n_ctx), token ids must be in
the vocabulary, and a per-request spec type must be one the loaded models can serve.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import TYPE_CHECKING

from .. import grammar
from ..config import SamplingParams, SpecConfig
from ..errors import TandemError
from .schemas import ApiError, ChatBody, MediaPart, SamplingFields
from .tools import plan, render_messages

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
        spec = engine.spec.override(body.speculative, *engine.has_draft)
    except TandemError as e:
        raise ApiError(400, f"speculative settings: {e}") from None
    return None if spec is engine.spec else spec


def grammar_of(body: SamplingFields, engine: Engine) -> str | None:
    """The request's constraint as an llguidance grammar, or None: llama.cpp's `grammar` (GBNF)
    first, then `json_schema`, then OpenAI's `response_format` ({"type": "json_object"}
    optionally with a "schema", {"type": "json_schema", "json_schema": {"schema": ...}}). An
    invalid grammar or schema is a 400 naming the field."""
    try:
        if body.grammar:
            g, where = grammar.from_gbnf(body.grammar), "grammar"
        elif body.json_schema is not None and body.json_schema is not False:
            g, where = grammar.from_json_schema(body.json_schema), "json_schema"
        elif body.response_format is not None:
            found = _response_format(body.response_format)
            if found is None:
                return None
            g, where = found
        else:
            return None
        grammar.check(engine.tok, engine.target.args.vocab_size, g, where)
    except grammar.GrammarError as e:
        raise ApiError(400, f"invalid request: {e}") from None
    return g


def _response_format(fmt: dict) -> tuple[str, str] | None:
    kind = fmt.get("type")
    where = "response_format"
    if kind == "text":
        return None
    if kind == "json_object":
        schema = fmt.get("schema", {"type": "object"})
        return grammar.from_json_schema(schema, f"{where}.schema"), f"{where}.schema"
    if kind == "json_schema":
        inner = fmt.get("json_schema")
        if not isinstance(inner, dict) or "schema" not in inner:
            raise ApiError(400, f"invalid request: {where}.json_schema: expected an object with "
                                "a 'schema' (and optionally 'name', 'strict')")
        return (grammar.from_json_schema(inner["schema"], f"{where}.json_schema.schema"),
                f"{where}.json_schema.schema")
    raise ApiError(400, "invalid request: response_format: expected type 'text', 'json_object' "
                        f"or 'json_schema', got {json.dumps(kind)[:60]}")


def logit_bias_of(body: SamplingFields, engine: Engine) -> dict[int, float]:
    """{token id: added logit}: llama.cpp's [[id or text, bias], ...] (false = never) or
    OpenAI's {"id or text": bias}; a text stands for each of its tokens, as in llama.cpp."""
    raw = body.logit_bias
    if not raw:
        return {}
    pairs = list(raw.items()) if isinstance(raw, dict) else raw
    vocab = engine.target.args.vocab_size
    out: dict[int, float] = {}
    for i, pair in enumerate(pairs):
        where = f"logit_bias[{i}]"
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise ApiError(400, f"invalid request: {where}: expected [token id or text, bias]")
        key, bias = pair
        if bias is False:
            bias = float("-inf")
        elif isinstance(bias, bool) or not isinstance(bias, (int, float)) or bias != bias:
            raise ApiError(400, f"invalid request: {where}: the bias must be a number or false, "
                                f"got {json.dumps(bias)[:40]}")
        if isinstance(key, str) and key.lstrip("-").isdigit() and isinstance(raw, dict):
            key = int(key)  # OpenAI's keys are token ids written as strings
        if isinstance(key, bool):
            raise ApiError(400, f"invalid request: {where}: expected a token id or a text")
        if isinstance(key, int):
            if not 0 <= key < vocab:
                raise ApiError(400, f"invalid request: {where}: token id {key} is outside the "
                                    f"vocabulary (0..{vocab - 1})")
            ids = [key]
        elif isinstance(key, str):
            ids = engine.tok.encode(key, add_special=False, parse_special=False)
        else:
            raise ApiError(400, f"invalid request: {where}: expected a token id or a text")
        for t in ids:
            out[t] = out.get(t, 0.0) + float(bias)
    return out


PROMPT_STRING, MULTIMODAL = "prompt_string", "multimodal_data"  # llama-server's object prompt


def prompt_list(engine: Engine, prompt) -> list[list[int]]:
    """llama-server's prompt forms, as token ids per prompt. One prompt: text, token ids, a mix
    of both in one list, or {"prompt_string": text}. Several: a list of those (a list holding
    both numbers and strings is one mixed prompt, as llama-server reads it)."""
    if isinstance(prompt, list) and prompt:
        numbers = any(isinstance(p, int) for p in prompt)
        if not (numbers and all(isinstance(p, (int, str)) for p in prompt)):
            if numbers:
                raise ApiError(400, "prompt: a list mixing token ids with lists or objects; "
                                    "give one prompt (ids and text) or a list of prompts")
            return [_one_prompt(engine, p, f"prompt[{i}]") for i, p in enumerate(prompt)]
    return [_one_prompt(engine, prompt, "prompt")]


def prompt_ids(engine: Engine, prompt) -> list[int]:
    """The one prompt of a request that takes one (several are refused, naming the field)."""
    prompts = prompt_list(engine, prompt)
    if len(prompts) != 1:
        raise ApiError(400, f"prompt: {len(prompts)} prompts; this endpoint takes one")
    return prompts[0]


def _one_prompt(engine: Engine, prompt, where: str) -> list[int]:
    if isinstance(prompt, dict) and prompt.get(MULTIMODAL):  # an image per media marker
        from . import images

        data = prompt[MULTIMODAL]
        text = prompt.get(PROMPT_STRING)
        if not isinstance(data, list) or not all(isinstance(d, str) for d in data):
            raise ApiError(400, f"{where}.{MULTIMODAL}: expected a list of base64 strings")
        if not isinstance(text, str):
            raise ApiError(400, f"{where}.{PROMPT_STRING}: expected the prompt's text, with "
                                "a media marker where each image goes")
        if engine.vision is None:
            raise ApiError(400, f"{where}.{MULTIMODAL}: multimodal data provided, but the "
                                "model does not support multimodal requests (start the server "
                                "with --mmproj)")
        files = [images.from_base64(d, f"{where}.{MULTIMODAL}[{i}]") for i, d in enumerate(data)]
        return images.prompt(engine, text, files, True, where)
    if isinstance(prompt, dict):
        prompt = _object_prompt(prompt, where)
    parts = [prompt] if isinstance(prompt, (str, int)) else prompt
    if not isinstance(parts, list) or not all(isinstance(p, (str, int)) and
                                              not isinstance(p, bool) for p in parts):
        raise ApiError(400, f"{where}: expected text, token ids, or a list mixing both")
    tok = engine.tok
    ids: list[int] = []
    for i, part in enumerate(parts):
        if isinstance(part, str):
            if part:
                ids.extend(tok.encode(part, add_special=i == 0, parse_special=True))
        else:
            ids.append(part)
    if not ids:
        raise ApiError(400, f"{where}: the prompt is empty; give some text or token ids")
    return ids


def _object_prompt(prompt: dict, where: str) -> str:
    """{"prompt_string": text} or {"content": [{"type": "text", "text": ...}, ...]} (the
    content form's media parts are refused: images go in multimodal_data)."""
    if PROMPT_STRING not in prompt and "content" in prompt:
        parts = prompt["content"]
        if not isinstance(parts, list):
            raise ApiError(400, f"{where}.content: expected a list of parts "
                                "([{\"type\": \"text\", \"text\": ...}])")
        texts = []
        for i, part in enumerate(parts):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text" and isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif kind in ("image_url", "input_audio", "input_video", "image", "audio"):
                raise ApiError(400, f"{where}.content[{i}]: a {kind} part; a prompt object's "
                                    f"images go in '{MULTIMODAL}' (base64), each marked in "
                                    f"'{PROMPT_STRING}' by the media marker (GET /props)")
            else:
                raise ApiError(400, f"{where}.content[{i}]: expected a text part "
                                    "({\"type\": \"text\", \"text\": string})")
        return "".join(texts)
    text = prompt.get(PROMPT_STRING)
    if not isinstance(text, str):
        raise ApiError(400, f"{where}: an object prompt needs '{PROMPT_STRING}' (a string) or "
                            "'content' (a list of text parts)")
    return text


def chat_text(engine: Engine, body: ChatBody, reasoning: str = "auto") -> str:
    """The messages rendered by the model's chat template: the assistant's turn opened (unless
    add_generation_prompt is false), or, when the last message is the assistant's (or
    continue_final_message is set), that message continued: the template renders the turns
    before it and its text follows the opened turn, as llama-server's prefill.
    reasoning (--reasoning): the template's enable_thinking is true unless "off" (as
    llama-server's), and "off" also closes a thought the template opens (an empty
    <think>\n</think>, or Command R7B's empty thinking block), as llama-server does."""
    msgs = body.messages
    cont = body.continue_final_message
    if cont and body.add_generation_prompt and "add_generation_prompt" in body.model_fields_set:
        raise ApiError(400, "add_generation_prompt and continue_final_message cannot both be "
                            "true")
    if cont is None and msgs[-1].role == "assistant":
        if len(msgs) >= 2 and msgs[-2].role == "assistant":
            raise ApiError(400, "messages: two or more assistant messages at the end; the "
                                "last one is continued, so the one before must not be")
        cont = True
    if cont and msgs[-1].role != "assistant":
        raise ApiError(400, "continue_final_message: the last message must be the assistant's")
    head = msgs[:-1] if cont else msgs
    messages = [{"role": m.role, "content": m.text(), "tool_calls": m.tool_calls,
                 "tool_call_id": m.tool_call_id, "name": m.name,
                 **({"reasoning_content": m.reasoning_content}
                    if m.reasoning_content is not None else {})} for m in head]
    tools = plan(engine, body, enforce=False).tools
    messages = render_messages(messages, tools, engine.tok.chat_template if tools else None)
    # llama-server gives templates today's date (Llama 3.x prints it); a request may override
    now = datetime.now()  # both of llama.cpp's spellings (Llama 3.x, FireFunction v2)
    extra = {"date_string": now.strftime("%d %b %Y"), "datetime": now.strftime("%b %d %Y"),
             **body.chat_template_kwargs}
    # thinking on unless --reasoning off: llama-server's default where a template has it
    extra.setdefault("enable_thinking", reasoning != "off")
    try:
        text = engine.tok.apply_chat_template(
            messages, add_generation_prompt=bool(cont) or body.add_generation_prompt,
            tools=tools or None, **extra)
    except TandemError as e:
        raise ApiError(400, f"messages: {e}") from None
    if cont:
        return text + msgs[-1].text("\n\n")
    if reasoning == "off" and body.add_generation_prompt:
        if text.endswith("<think>\n"):  # DeepSeek-R1, QwQ: the template opens a thought
            text += "</think>"
        elif (text.endswith("<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>")
              and "<|START_THINKING|>" in (engine.tok.chat_template or "")):
            text += "<|START_THINKING|><|END_THINKING|>"
    return text


def chat_ids(engine: Engine, body: ChatBody, reasoning: str = "auto",
             media_path: str | None = None) -> list[int]:
    """The rendered messages' token ids; with image parts, their images' positions where the
    parts were (images.prompt), files read under media_path (--media-path)."""
    parts = [(i, j, p) for i, m in enumerate(body.messages)
             for j, p in enumerate(m.content if isinstance(m.content, list) else [])
             if isinstance(p, MediaPart)]
    if parts:
        from . import images

        files = []
        for i, j, p in parts:
            where = f"messages[{i}].content[{j}]"
            kind = "image" if p.type == "image_url" else p.type.split("_")[-1].replace(
                "url", "video")
            if p.type != "image_url":
                raise ApiError(400, f"{where}: {kind} input is not supported - hint: if this "
                                    "is unexpected, you may need to provide the mmproj")
            if engine.vision is None:
                raise ApiError(400, f"{where}: {images.NO_VISION}")
            files.append(images.load(p.url, media_path, where))
        return images.prompt(engine, chat_text(engine, body, reasoning), files, False,
                             "messages")
    ids = engine.tok.encode(chat_text(engine, body, reasoning), add_special=False,
                            parse_special=True)
    if not ids:
        raise ApiError(400, "the chat template produced an empty prompt")
    return ids


def check_prompt(engine: Engine, ids: list[int]) -> None:
    ctx, vocab = engine.cfg.ctx_size, engine.target.args.vocab_size
    media = getattr(ids, "media", None)  # an image's positions have negative ids (media.py)
    if len(ids) >= ctx:
        raise ApiError(400, f"the prompt has {len(ids)} tokens but the context holds {ctx} "
                            "per slot; shorten the prompt or start the server with a larger "
                            "--ctx-size", "exceed_context_size_error",
                       n_prompt_tokens=len(ids), n_ctx=ctx)
    bad = next((t for t in ids if not (0 <= t < vocab or (media and t < 0))), None)
    if bad is not None:
        raise ApiError(400, f"prompt: token id {bad} is outside the vocabulary (0..{vocab - 1})")


def constraints_of(engine: Engine, body: SamplingFields) -> tuple[str | None, dict[int, float]]:
    """(grammar, logit biases) of a request, checked once for all its prompts and answers
    (compiling a grammar can take milliseconds: run it off the event loop)."""
    return grammar_of(body, engine), logit_bias_of(body, engine)


def build_request(engine: Engine, body: SamplingFields, ids: list[int], n_predict: int | None,
                  n_probs: int = 0, defaults: SamplingParams | None = None,
                  post_sampling: bool = False,
                  constraints: tuple[str | None, dict[int, float]] | None = None) -> Request:
    from ..engine import Request

    check_prompt(engine, ids)
    n_slots = engine.cfg.n_parallel
    if body.id_slot >= n_slots:
        raise ApiError(400, f"id_slot {body.id_slot} does not exist; this server has {n_slots} "
                            f"slot(s): 0..{n_slots - 1}, or -1 for any")
    defaults = SamplingParams() if defaults is None else defaults
    g, bias = constraints_of(engine, body) if constraints is None else constraints
    return Request(ids, sampling_of(body, n_predict, defaults), spec_of(body, engine),
                   media=list(getattr(ids, "media", [])),
                   cache_prompt=body.cache_prompt, id_slot=body.id_slot, n_probs=n_probs,
                   post_sampling=post_sampling, grammar=g, logit_bias=bias,
                   n_keep=body.n_keep, n_discard=body.n_discard)
