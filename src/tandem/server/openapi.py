"""GET /openapi.json: the server's OpenAPI 3.1 description, every route's real request body
included (the handlers read their bodies themselves, through schemas.parse_body, so that every
error is OpenAI-shaped; FastAPI alone would describe no body). Schemathesis fuzzes the server
from it (tests/test_http_fuzz.py, experiments/fuzz_http.py)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, Field

from .anthropic import CountBody, MessagesBody
from .responses import ResponsesBody
from .embeddings import EmbeddingBody
from .rerank import RerankBody
from .infill import InfillBody
from .schemas import ChatBody, CompletionBody, OaiCompletionBody


class TokenizeBody(BaseModel):
    """POST /tokenize (the handler checks the same fields)."""

    content: str = ""
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeBody(BaseModel):
    """POST /detokenize."""

    tokens: list[int] = Field(default_factory=list)


class SlotFileBody(BaseModel):
    """POST /slots/{id_slot}?action=save|restore|erase."""

    filename: str | None = None


BODIES: dict[str, type[BaseModel]] = {
    "/completion": CompletionBody, "/completions": CompletionBody, "/infill": InfillBody,
    "/tokenize": TokenizeBody, "/detokenize": DetokenizeBody, "/slots/{id_slot}": SlotFileBody,
    "/v1/completions": OaiCompletionBody, "/v1/chat/completions": ChatBody,
    "/chat/completions": ChatBody, "/apply-template": ChatBody,
    "/v1/chat/completions/input_tokens": ChatBody, "/chat/completions/input_tokens": ChatBody,
    "/v1/embeddings": EmbeddingBody, "/embedding": EmbeddingBody, "/embeddings": EmbeddingBody,
    **dict.fromkeys(("/rerank", "/reranking", "/v1/rerank", "/v1/reranking"), RerankBody),
    "/v1/messages": MessagesBody, "/v1/messages/count_tokens": CountBody,
    **dict.fromkeys(("/v1/responses", "/responses", "/v1/responses/input_tokens",
                     "/responses/input_tokens"), ResponsesBody),
}
ERROR = {
    "type": "object", "required": ["error"],
    "properties": {"error": {"type": "object", "required": ["message", "type", "code"],
                             "properties": {"message": {"type": "string"},
                                            "type": {"type": "string"},
                                            "code": {"type": "integer"}}}},
}


def describe(app: FastAPI) -> None:
    """Make app.openapi() describe each route's JSON body and the error shape of its 4xx."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        spec = get_openapi(title="tandem", version=_version(), routes=app.routes,
                           description="llama-server's and OpenAI's API, served by Tandem")
        schemas = spec.setdefault("components", {}).setdefault("schemas", {})
        schemas["Error"] = ERROR
        for path, ops in spec["paths"].items():
            for method, op in ops.items():
                model = BODIES.get(path) if method == "post" else None
                if model is not None:
                    body = model.model_json_schema(ref_template="#/components/schemas/{model}")
                    schemas.update(body.pop("$defs", {}))
                    schemas[model.__name__] = body
                    op["requestBody"] = {"required": True, "content": {"application/json": {
                        "schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}}
                op.setdefault("responses", {})["4XX"] = {
                    "description": "the request was refused; the message names the field",
                    "content": {"application/json": {
                        "schema": {"$ref": "#/components/schemas/Error"}}}}
        app.openapi_schema = spec
        return spec

    app.openapi = openapi


def _version() -> str:
    from .. import __version__

    return __version__
