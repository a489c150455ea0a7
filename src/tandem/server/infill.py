"""POST /infill: fill-in-the-middle, as llama-server builds its prompt.

The code before the cursor (input_prefix, then the typed prompt), the code after it
(input_suffix), and other files of the project (input_extra: [{"filename", "text"}]) become the
repo-level FIM pattern the Qwen2.5-Coder models are trained on (arXiv 2409.12186):

    [FIM_REP]myproject\\n [FIM_SEP]file0\\n text0 ... [FIM_SEP]filename\\n
    [FIM_PRE]prefix prompt [FIM_SUF]suffix [FIM_MID]

The prefix keeps its last 3/4 of --batch-size tokens, the suffix its first 1/4 (less the prompt
and two markers), and the extra files the tail of what the context leaves (n_ctx - batch -
2 * n_predict), as llama-server's format_prompt_infill. Generation then runs like /completion,
speculation included: an edit inside a file is the most input-grounded request there is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import Field

from .schemas import ApiError, CompletionBody

if TYPE_CHECKING:
    from ..engine import Engine


class InfillBody(CompletionBody):
    """POST /infill: /completion's fields, the prompt (text typed at the cursor) optional."""

    input_prefix: str | list[int | str]
    input_suffix: str | list[int | str]
    input_extra: list[Any] = Field(default_factory=list)
    prompt: str = ""


def check_extra(extra: list[Any]) -> None:
    for i, chunk in enumerate(extra):
        if not isinstance(chunk, dict) or not isinstance(chunk.get("text"), str):
            raise ApiError(400, f"input_extra[{i}]: each chunk must be an object with a "
                                "\"text\" string (and an optional \"filename\" string)")
        if "filename" in chunk and not isinstance(chunk["filename"], str):
            raise ApiError(400, f"input_extra[{i}].filename: expected a string, got "
                                f"{type(chunk['filename']).__name__}")


def infill_ids(engine: Engine, body: InfillBody, n_batch: int, n_predict: int) -> list[int]:
    tok = engine.tok
    fim = tok.fim_ids()
    missing = [k for k in ("fim_pre", "fim_suf", "fim_mid") if fim[k] is None]
    if missing:
        raise ApiError(501, "infill is not supported by this model: it has no "
                            f"{', '.join(missing)} token (a FIM-trained model, e.g. "
                            "Qwen2.5-Coder, has them)")
    check_extra(body.input_extra)

    def ids(text: str) -> list[int]:
        return tok.encode(text, add_special=False, parse_special=False)

    def mixed(value) -> list[int]:
        parts = [value] if isinstance(value, str) else value
        return [t for p in parts for t in (ids(p) if isinstance(p, str) else [p])]

    prefix, suffix, prompt = mixed(body.input_prefix), mixed(body.input_suffix), ids(body.prompt)
    extra: list[int] = []
    if fim["fim_rep"] is not None:
        extra += [fim["fim_rep"], *ids("myproject\n")]
    for chunk in body.input_extra:
        if fim["fim_sep"] is not None:
            extra += [fim["fim_sep"], *ids(chunk.get("filename", "tmp") + "\n")]
        else:
            extra += ids("\n\n--- snippet ---\n\n")
        extra += ids(chunk["text"])
    if fim["fim_sep"] is not None:
        extra += [fim["fim_sep"], *ids("filename\n")]
    n_prefix = min(len(prefix), 3 * (n_batch // 4))
    n_suffix = min(len(suffix), max(0, n_batch // 4 - (2 + len(prompt))))
    n_extra = min(max(0, engine.cfg.ctx_size - n_batch - 2 * max(n_predict, 0)), len(extra))
    out = extra[len(extra) - n_extra:]
    head = [fim["fim_pre"], *prefix[len(prefix) - n_prefix:], *prompt]
    if tok.add_bos and tok.bos_id is not None:
        head = [tok.bos_id, *head]
    return [*out, *head, fim["fim_suf"], *suffix[:n_suffix], fim["fim_mid"]]
