"""Write bench/prompts/structured.jsonl: schema-bound extraction and tool-call prompts for
issue 23's benchmark, built from the Python standard library on this machine (nothing here is
written for the benchmark: the texts are the stdlib's own docstrings and source, the schemas
its own data structures and function signatures).

    python experiments/make_structured_prompts.py --out bench/prompts/structured.jsonl

Extraction: a stdlib function's source (signature and docstring) with the instruction to fill
a JSON schema shaped like `inspect.Signature` (each parameter's name, kind, default); the
answer is constrained by that schema (`json_schema`). Tool calls: tools whose parameters are
the JSON-schema form of real stdlib signatures (shutil.copy2, os.makedirs, ...), a user request,
the tools rendered by the model's chat template, and the call enforced by the grammar that
`tool_choice: "required"` uses (`grammar`), as the server would send it.
"""

from __future__ import annotations

import argparse
import inspect
import json
import textwrap
from pathlib import Path

EXTRACT = ["json.dumps", "shutil.copytree", "textwrap.wrap", "subprocess.run", "re.sub",
           "urllib.parse.urlsplit", "zipfile.ZipFile.write", "logging.basicConfig"]
SIGNATURE_SCHEMA = {  # inspect.Signature / inspect.Parameter as a JSON schema
    "type": "object",
    "properties": {
        "function": {"type": "string"},
        "summary": {"type": "string"},
        "parameters": {"type": "array", "items": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "kind": {"enum": ["POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD", "VAR_POSITIONAL",
                                  "KEYWORD_ONLY", "VAR_KEYWORD"]},
                "default": {"type": ["string", "null"]},
            },
            "required": ["name", "kind", "default"], "additionalProperties": False}},
        "returns": {"type": "string"},
    },
    "required": ["function", "summary", "parameters", "returns"],
    "additionalProperties": False,
}
TOOLS = ["shutil.copy2", "os.makedirs", "shutil.make_archive", "os.rename", "shutil.rmtree",
         "os.chmod"]
REQUESTS = [
    ("copy", "Copy the file reports/2024/q3.csv to /mnt/backup/q3.csv, keeping its metadata."),
    ("makedirs", "Create the directory build/output/logs and everything above it; it is fine "
                 "if it already exists."),
    ("archive", "Make a gzip'ed tar archive named release-1.4 of the folder dist/."),
    ("rename", "Rename notes_draft.md to notes_final.md."),
]


def _resolve(path: str):
    import importlib

    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for p in parts[i:]:
            obj = getattr(obj, p)
        return obj
    raise ImportError(path)


def _source_head(fn) -> str:
    """The function's def line(s) and docstring, as in its source file."""
    src = textwrap.dedent(inspect.getsource(fn))
    doc = inspect.getdoc(fn) or ""
    head = src.split(":\n", 1)[0] + ":"
    return f"{head}\n    \"\"\"{textwrap.indent(doc, '    ').strip()}\n    \"\"\""


def _tool(path: str) -> dict:
    fn = _resolve(path)
    props, required = {}, []
    for p in inspect.signature(fn).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        d = p.default
        kind = ("boolean" if isinstance(d, bool) else "integer" if isinstance(d, int)
                else "string")
        props[p.name] = {"type": kind}
        if d is p.empty:
            required.append(p.name)
    doc = (inspect.getdoc(fn) or path).split("\n\n")[0].replace("\n", " ")
    return {"type": "function", "function": {
        "name": path.replace(".", "_"), "description": doc,
        "parameters": {"type": "object", "properties": props, "required": required,
                       "additionalProperties": False}}}


def main() -> None:
    from tandem.models.gguf_file import GGUFFile
    from tandem.registry import pull
    from tandem.server.tools import calls_lark
    from tandem.tokenizer import Tokenizer

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="bench/prompts/structured.jsonl")
    ap.add_argument("--model", default="default", help="whose chat template renders the prompts")
    args = ap.parse_args()
    tok = Tokenizer.from_gguf_metadata(GGUFFile(pull(args.model, quiet=True)).metadata)

    def chat(text: str, tools=None) -> str:
        return tok.apply_chat_template([{"role": "user", "content": text}], tools=tools)

    lines = []
    for path in EXTRACT:
        text = (f"Here is a function from the Python standard library:\n\n```python\n"
                f"{_source_head(_resolve(path))}\n```\n\nDescribe its signature as JSON: the "
                "function's full dotted name, a one-sentence summary, every parameter (name, "
                "kind as in inspect.Parameter, default as written in the source or null), and "
                "what it returns.")
        lines.append({"task": f"extract-{path}", "prompt": chat(text),
                      "request": {"json_schema": SIGNATURE_SCHEMA}})
    tools = [_tool(p) for p in TOOLS]
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    # one call, as the server enforces by default
    lark = calls_lark(schemas, False, set(tok.tokens))
    for name, text in REQUESTS:
        lines.append({"task": f"tool-{name}", "prompt": chat(text, tools),
                      "request": {"grammar": lark}})
    out = Path(args.out)
    out.write_text("".join(json.dumps(x) + "\n" for x in lines))
    print(f"wrote {len(lines)} prompts to {out}")


if __name__ == "__main__":
    main()
