"""Request bodies as pydantic models, and the API error every endpoint answers with.

Field names are llama.cpp's (`/completion`) and OpenAI's (`/v1/...`). Unknown fields are
ignored, as llama-server does; known fields are type-checked strictly (a string where a number
belongs is an error, not a silent default) and range-checked.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ..config import SamplingParams
from ..media import marker

_S = SamplingParams()  # the defaults, defined once in config.py

# OpenAI's error types, as llama-server names them, by HTTP status
ERROR_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
    405: "invalid_request_error", 408: "timeout_error", 413: "invalid_request_error",
    500: "server_error", 501: "not_supported_error", 503: "unavailable_error",
}


class ApiError(Exception):
    """An error answered as {"error": {"message", "type", "code"}} with HTTP status `status`."""

    def __init__(self, status: int, message: str, type_: str | None = None,
                 **extra: object) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_ or ERROR_TYPES.get(status, "server_error")
        self.extra = extra  # more fields of the error object (llama-server's, e.g. n_ctx)

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "code": self.status,
                          **self.extra}}


def feature_disabled() -> ApiError:
    """llama-server's 403 for a route whose feature is off (/tools without --tools,
    /cors-proxy without --ui-mcp-proxy)."""
    return ApiError(403, "this feature is disabled", "feature_disabled")


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class SamplingFields(_Body):
    """Sampling and speculation fields shared by every generation endpoint."""

    temperature: float = Field(_S.temperature, ge=0.0, allow_inf_nan=False)
    top_k: int = Field(_S.top_k, ge=0)
    top_p: float = Field(_S.top_p, ge=0.0, le=1.0, allow_inf_nan=False)
    min_p: float = Field(_S.min_p, ge=0.0, le=1.0, allow_inf_nan=False)
    seed: int = Field(_S.seed, ge=-1, le=2**64 - 1)
    stop: str | list[str] | None = None
    ignore_eos: bool = _S.ignore_eos
    stream: bool = False
    timings_per_token: bool = False  # streamed chunks carry the timings so far
    return_progress: bool = False  # streams report how far the prompt has been read
    cache_prompt: bool = True
    id_slot: int = Field(-1, ge=-1)
    # with --context-shift: tokens a full context keeps (-1: the prompt), tokens it then drops
    # (0: half of the rest)
    n_keep: int = Field(0, ge=-1)
    n_discard: int = Field(0, ge=0)
    # constrained output (grammar.py): llama.cpp's GBNF grammar and JSON schema, OpenAI's
    # response_format; logit biases as llama.cpp's [[token or text, bias or false], ...] or
    # OpenAI's {"token id or text": bias}
    grammar: str | None = None
    json_schema: dict[str, Any] | bool | None = None
    response_format: dict[str, Any] | None = None
    logit_bias: list[list[Any]] | dict[str, Any] | None = None
    # llama.cpp spells per-request speculation as flat dotted keys ("speculative.n_max": 8):
    # gathered here by key, checked against SpecConfig's fields by SpecConfig.override
    speculative: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _gather_speculative(cls, data: Any) -> Any:
        if isinstance(data, dict):
            spec = {k: v for k, v in data.items() if k.startswith("speculative.")}
            if spec:
                data = {k: v for k, v in data.items() if k not in spec} | {"speculative": spec}
        return data

    def stop_list(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return [s for s in stops if s]


# a prompt as llama-server takes it: text, token ids, a mix of both, {"prompt_string": text}, or
# a list of those (several prompts, one answer each); prepare.prompt_list sorts them out
MAX_CHOICES = 16  # n: answers to one request (each a generation of its own)
Prompt = str | dict[str, Any] | list[int | str | list[int | str] | dict[str, Any]]


class CompletionBody(SamplingFields):
    """POST /completion (llama.cpp)."""

    prompt: Prompt
    n_predict: int | None = Field(None, ge=-1)  # None: the server's -n (default -1)
    n_probs: int = Field(0, ge=0, le=100)
    post_sampling_probs: bool = False  # n_probs after the sampler chain, as probabilities
    return_tokens: bool = False  # the answer's token ids in "tokens" (else [])
    response_fields: list[str] | None = None  # only these fields ("a/b" reaches into a["b"])


class OaiCompletionBody(SamplingFields):
    """POST /v1/completions (OpenAI legacy completions)."""

    model: str | None = None
    prompt: Prompt
    max_tokens: int | None = Field(None, ge=-1)
    n_predict: int | None = Field(None, ge=-1)
    n: int = Field(1, ge=1, le=MAX_CHOICES)
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = False
    stream_options: dict | None = None
    presence_penalty: float = Field(0.0, ge=0.0, le=0.0)
    frequency_penalty: float = Field(0.0, ge=0.0, le=0.0)


class TextPart(_Body):
    type: Literal["text"]
    text: str


class MediaPart(_Body):
    """An OpenAI content part carrying media: image_url {"url"} (data:, file://, http(s) or
    base64), input_audio, input_video / video_url. In the rendered text it is the media marker
    (images.marker()), where the image's positions go."""

    type: Literal["image_url", "input_audio", "input_video", "video_url"]
    image_url: dict[str, Any] | None = None
    input_audio: dict[str, Any] | None = None
    input_video: dict[str, Any] | None = None
    video_url: dict[str, Any] | None = None

    @property
    def text(self) -> str:
        return marker()

    @property
    def url(self) -> Any:
        part = getattr(self, self.type) or {}
        return part.get("url", part.get("data"))


class Message(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart | MediaPart] | None = None
    tool_calls: list[dict[str, Any]] | None = None  # an assistant's calls (OpenAI's shape)
    tool_call_id: str | None = None  # a tool message: the call it answers
    name: str | None = None
    reasoning_content: str | None = None  # an assistant's earlier thought (templates show it)

    def text(self, joiner: str = "") -> str:
        if isinstance(self.content, list):
            return joiner.join(p.text for p in self.content)
        return self.content or ""

    def media(self) -> list[MediaPart]:
        return [p for p in self.content if isinstance(p, MediaPart)] \
            if isinstance(self.content, list) else []


class ChatBody(SamplingFields):
    """POST /v1/chat/completions (OpenAI chat)."""

    model: str | None = None
    messages: list[Message] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=-1)
    max_completion_tokens: int | None = Field(None, ge=-1)
    n_predict: int | None = Field(None, ge=-1)
    n: int = Field(1, ge=1, le=MAX_CHOICES)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    stream_options: dict | None = None
    presence_penalty: float = Field(0.0, ge=0.0, le=0.0)
    frequency_penalty: float = Field(0.0, ge=0.0, le=0.0)
    add_generation_prompt: bool = True
    # continue the last (assistant) message instead of opening a new turn (vLLM's and
    # transformers' name; a trailing assistant message is continued without it too)
    continue_final_message: bool | None = None
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    tools: list[dict[str, Any]] | None = None  # OpenAI's function tools (server/tools.py)
    tool_choice: str | dict[str, Any] | None = None  # none | auto | required | a function
    parallel_tool_calls: bool | None = None
    # where the answer's thought goes (--reasoning-format's values; None: the server's)
    reasoning_format: Literal["none", "deepseek", "deepseek-legacy", "auto"] | None = None
    verbose: bool = False  # "__verbose": the rendered prompt and the raw result
    return_tokens: bool = False  # streamed chunks carry tokens, pieces, origins (oai.py)


def parse_body(raw: bytes, model: type[BaseModel], explain=None) -> Any:
    """JSON bytes -> a validated body; every failure is a 400 that names the field (as
    explain(error) words it: describe's dotted path unless the API has its own)."""
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ApiError(400, f"the request body is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise ApiError(400, f"the request body must be a JSON object, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise ApiError(400, (explain or describe)(e)) from None


def json_object(raw: bytes) -> dict:
    """A body that must be a JSON object (the endpoints without a body schema)."""
    try:
        data = json.loads(raw or b"{}")
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ApiError(400, f"the request body is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise ApiError(400, "the request body must be a JSON object")
    return data


_HINTS = {
    "n": f"at most {MAX_CHOICES} answers per request",
    "presence_penalty": "penalties are not implemented; leave it at 0",
    "frequency_penalty": "penalties are not implemented; leave it at 0",
}


def describe(e: ValidationError) -> str:
    """The first invalid field, what was wrong with it, and the value received."""
    errors = e.errors()
    field = errors[0]["loc"][0] if errors[0]["loc"] else "body"
    same = [x for x in errors if x["loc"] and x["loc"][0] == field]
    where = ".".join(str(p) for p in same[0]["loc"] if not _is_type_label(p))
    if len(same) > 1:  # a union: say every accepted form once
        msgs = sorted({x["msg"] for x in same})
        what = " or ".join(m.removeprefix("Input should be ") for m in msgs)
        msg = f"{where}: expected {what}"
    else:
        msg = f"{where}: {same[0]['msg']}"
    if same[0]["type"] != "missing":
        shown = json.dumps(same[0]["input"], default=str)
        msg += f", got {shown[:80]}"
    hint = _HINTS.get(str(field))
    return f"invalid request: {msg}" + (f" ({hint})" if hint else "")


def _is_type_label(part: object) -> bool:
    # pydantic names union members in the location (e.g. "list[str]"); users never wrote those
    return isinstance(part, str) and ("[" in part or part in ("str", "int", "float", "bool"))
