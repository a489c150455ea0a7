"""The target's own answers, to train a head on what it will draft: chat prompts written from
the standard library (a function's name, its docstring or its source) and the target's greedy
answers to them, kept in answers.jsonl as they come (a stopped run goes on at the next one).

EAGLE-3 regenerates its training answers with the target for this reason: a head drafts the
target's greedy continuations, and text the target wrote is what it predicts best.
"""

from __future__ import annotations

import ast
import json
import random
import sysconfig
from pathlib import Path

import torch

from ..models.decoder import KVCache
from .data import _bar

TEMPLATES = (
    "What does `{qual}` in Python's standard library do? Show a short example of its use.",
    "Explain this function from Python's `{mod}` module, then suggest one improvement:\n"
    "```python\n{source}\n```",
    "Write a Python function that does this, with a docstring and type hints: {doc}",
    "Write a few pytest tests for `{qual}`.",
)


def _functions(path: Path) -> list[tuple[str, str, str]]:
    """(name, first docstring line, source) of the file's public documented functions."""
    try:
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
    except (SyntaxError, UnicodeDecodeError, OSError, ValueError):
        return []
    lines = text.splitlines()
    out = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
            doc = (ast.get_docstring(node) or "").strip().splitlines()
            if doc and 3 <= node.end_lineno - node.lineno < 40:
                out.append((node.name, doc[0],
                            "\n".join(lines[node.lineno - 1: node.end_lineno])))
    return out


def prompts(n: int, seed: int) -> list[str]:
    """n prompts about documented functions of the standard library's top-level modules."""
    root = Path(sysconfig.get_paths()["stdlib"])
    rng = random.Random(seed)
    pool = [(f.stem, *fn) for f in sorted(root.glob("*.py")) for fn in _functions(f)]
    rng.shuffle(pool)
    return [TEMPLATES[i % len(TEMPLATES)].format(mod=mod, qual=f"{mod}.{name}", doc=doc,
                                                 source=src)
            for i, (mod, name, doc, src) in enumerate(pool[:n])]


@torch.inference_mode()
def greedy(target, ids: list[int], max_new: int) -> list[int]:
    """The target's greedy continuation of ids (up to max_new tokens, to an end-of-generation
    token inclusive)."""
    model, eog = target.model, target.tokenizer.eog_ids
    max_new = min(max_new, model.cos.shape[0] - len(ids))  # the positions it was loaded for
    if max_new < 1:
        return []
    cache = KVCache(target.args, 1, len(ids) + max_new, torch.float32)
    n = len(ids)
    logits = model.forward_packed(ids, cache, [0] * n, list(range(n)), [n - 1])
    out: list[int] = []
    for pos in range(n, n + max_new):
        tok = int(logits[-1].argmax())
        out.append(tok)
        if tok in eog or pos == n + max_new - 1:
            break
        logits = model.forward_packed([tok], cache, [0], [pos], [0])
    return out


def self_answers(target, d: Path, n: int, seed: int, max_new: int = 256,
                 progress: bool = True) -> list[list[int]]:
    """n chat exchanges (prompt and the target's answer) as token ids, from d/answers.jsonl
    as far as it goes, the rest generated and appended."""
    d.mkdir(parents=True, exist_ok=True)
    path, tok = d / "answers.jsonl", target.tokenizer
    have = [json.loads(ln)["ids"] for ln in path.read_text().splitlines()] \
        if path.is_file() else []
    todo = prompts(n, seed)[len(have):]
    bar = _bar(n, len(have), "answers", progress, unit="answer")
    for p in todo:
        ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": p}]),
                         parse_special=True)
        ids += greedy(target, ids, max_new)
        with open(path, "a") as f:
            f.write(json.dumps({"prompt": p, "ids": ids}) + "\n")
        have.append(ids)
        bar.update(1)
    bar.close()
    return have[:n]
