"""Write benchmark prompt files (JSONL for `tandem bench --prompts`) from text nobody here wrote.

    python experiments/make_prompts.py specbench --per-category 2 --mt-bench 4 \
        --out bench/prompts/specbench-even-subset.jsonl
    python experiments/make_prompts.py stdlib-edits --out bench/prompts/stdlib-edits.jsonl
    python experiments/make_prompts.py specbench --offset 3 --per-category 2 --mt-bench 8 \
        --out bench/prompts/specbench-even-validation.jsonl
    cat bench/prompts/specbench-even-subset.jsonl > bench/prompts/held-out-mix.jsonl
    head -3 bench/prompts/stdlib-edits.jsonl >> bench/prompts/held-out-mix.jsonl

specbench: a fixed subset of ../shared/specbench/questions-even.jsonl (the public half of
Spec-Bench): the first `--per-category` questions (by question_id) of translation,
summarization, qa, math_reasoning and rag, and the first question of the first `--mt-bench`
MT-bench categories (their first turn; task "mt-bench"), each rendered with the target's own chat template (a user message, then
the assistant's turn). The task name is the category and the question_id (task names are unique in a prompts file).

stdlib-edits: functions from the Python standard library's own source on this machine (the
interpreter's, so the text is whatever that version ships), each with an edit instruction
(rename a function and its callers, add type hints, change an error path) and the request to
output the whole edited function: the work of a code-editing assistant, on code nobody here
wrote. The functions are chosen by a fixed rule (modules and names listed below; each must
be 25-70 lines), not by how well speculation does on them.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPECBENCH = ROOT.parent / "shared" / "specbench" / "questions-even.jsonl"
CATEGORIES = ("translation", "summarization", "qa", "math_reasoning", "rag")
MT_BENCH = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem",
            "humanities")

# (module, function, instruction): the function is looked up in the module's own source
EDITS = (
    ("textwrap", "dedent",
     "Rename the local variable `margin` to `common_prefix` everywhere in the function."),
    ("difflib", "get_close_matches",
     "Add type hints to the parameters and the return value."),
    ("posixpath", "relpath",
     "Change the error path: when `path` is empty, return '.' instead of raising ValueError."),
    ("heapq", "nsmallest",
     "Rename the parameter `n` to `count` everywhere in the function, docstring included."),
    ("statistics", "correlation",
     "Change the error path: when either input is constant, return math.nan instead of "
     "raising StatisticsError."),
)


def chat(tokenizer, text: str) -> str:
    return tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                         add_generation_prompt=True)


def load_tokenizer(model: str):
    from tandem.models.gguf_file import GGUFFile
    from tandem.registry import resolve
    from tandem.tokenizer import Tokenizer

    return Tokenizer.from_gguf_metadata(GGUFFile(str(resolve(model))).metadata)


def specbench(args) -> list[dict]:
    rows = [json.loads(line) for line in SPECBENCH.read_text(encoding="utf-8").splitlines()
            if line.strip()]
    rows.sort(key=lambda r: r["question_id"])
    tok = load_tokenizer(args.model)
    out = []
    for cat in CATEGORIES:
        of = [r for r in rows if r["category"] == cat]
        for r in of[args.offset: args.offset + args.per_category]:
            out.append({"task": f"{cat}-{r['question_id']}", "prompt": chat(tok, r["turns"][0]),
                        "question_id": r["question_id"]})
    for cat in MT_BENCH[: args.mt_bench]:
        of = [r for r in rows if r["category"] == cat]
        if args.offset >= len(of):
            continue
        r = of[args.offset]
        out.append({"task": f"mt-bench-{cat}", "prompt": chat(tok, r["turns"][0]),
                    "question_id": r["question_id"], "category": cat})
    return out


def function_source(module: str, name: str) -> str:
    import importlib

    mod = importlib.import_module(module)
    src = inspect.getsource(mod)
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            text = ast.get_source_segment(src, node, padded=True)
            lines = text.splitlines()
            if not 25 <= len(lines) <= 70:
                print(f"note: {module}.{name} has {len(lines)} lines", file=sys.stderr)
            return text
    raise SystemExit(f"{module}.{name} not found in {mod.__file__}")


def stdlib_edits(args) -> list[dict]:
    tok = load_tokenizer(args.model)
    out = []
    for module, name, instruction in EDITS:
        code = function_source(module, name)
        text = (f"{instruction}\n\nOutput the complete edited function and nothing else.\n\n"
                f"```python\n{code}\n```")
        out.append({"task": f"stdlib-edit-{name}", "prompt": chat(tok, text),
                    "source": f"{module}.{name} (Python {sys.version.split()[0]})"})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=("specbench", "stdlib-edits"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="default", help="whose chat template (default: default)")
    ap.add_argument("--per-category", type=int, default=3,
                    help="specbench: questions per category of translation .. rag (3)")
    ap.add_argument("--mt-bench", type=int, default=8,
                    help="specbench: the first question of this many MT-bench categories, in "
                         "the order writing, roleplay, reasoning, math, coding, extraction, "
                         "stem, humanities (8)")
    ap.add_argument("--offset", type=int, default=0,
                    help="specbench: skip this many questions of each category first (a set "
                         "disjoint from the default's: --offset 3 --per-category 2, and the "
                         "MT-bench categories' question at that index, where they have one)")
    args = ap.parse_args()
    rows = specbench(args) if args.what == "specbench" else stdlib_edits(args)
    with open(args.out, "w", encoding="utf-8") as f:
        for r in rows:  # the bench reads task and prompt only; where each came from: stderr
            print(f"{r['task']}: {r.get('source') or r.get('question_id')}"
                  f"{' (' + r['category'] + ')' if 'category' in r else ''}", file=sys.stderr)
            f.write(json.dumps({"task": r["task"], "prompt": r["prompt"]},
                               ensure_ascii=False) + "\n")
    print(f"{len(rows)} prompts -> {args.out}")


if __name__ == "__main__":
    main()
