"""Per-category speed-ups of a `tandem bench` folder, each engine against its own target alone.

    python experiments/by_category.py bench/results/held-out-mix-zen4-hopeful

Tasks are grouped by their name without the trailing question id or function name
(`summarization-242` -> summarization, `mt-bench-writing` -> mt-bench, `stdlib-edit-dedent` ->
stdlib-edit). For each configuration and category: wall and decode speed-up over the same
engine's target alone (wall: the ratio of total seconds over the category's requests and
passes, equal work where the texts are equal; decode: the ratio of tokens per second over the
category), the smallest per-request wall ratio, acceptance, and
tokens per verification (1 + accepted / drafts). Tandem's runs are checked for equal work
(the same text as its target alone); llama.cpp's against llama.cpp's alone.
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict
from pathlib import Path

PAIRS = (("candidate", "baseline"), ("llama-ngram", "llama-none"),
         ("llama-ngram-mod", "llama-none"), ("llama-ngram-map-k", "llama-none"),
         ("llama-draft", "llama-none"))


def category(task: str) -> str:
    for prefix in ("mt-bench", "stdlib-edit"):
        if task.startswith(prefix):
            return prefix
    return re.sub(r"-\d+$", "", task)


def requests(folder: Path, name: str) -> dict[tuple[str, int], dict]:
    out = {}
    for f in sorted(folder.glob(f"{name}.pass*.json")) or [folder / f"{name}.json"]:
        if not f.exists():
            continue
        for r in json.loads(f.read_text(encoding="utf-8"))["requests"]:
            out[(r["task"], r["pass"])] = r
    return out


def spec(r: dict) -> tuple[int, int, int]:
    s = r.get("speculative") or {}
    t = r["timings"]
    drafts = s.get("n_drafts")
    if drafts is None:  # llama.cpp reports only draft_n / draft_n_accepted
        drafts = None
    return t.get("draft_n", 0) or 0, t.get("draft_n_accepted", 0) or 0, drafts


def main(folder: str) -> None:
    folder = Path(folder)
    lines = ["| configuration | category | requests | wall speed-up | decode speed-up | "
             "lowest request wall ratio | acceptance | tokens per verification | same text |",
             "|---|---|---|---|---|---|---|---|---|"]
    for cand, base in PAIRS:
        c, b = requests(folder, cand), requests(folder, base)
        if not c or not b:
            continue
        groups: dict[str, list[tuple[dict, dict]]] = defaultdict(list)
        for key, rc in c.items():
            if key in b:
                groups[category(key[0])].append((rc, b[key]))
        groups["all"] = [p for k in list(groups) for p in groups[k]]
        for cat, pairs in groups.items():
            wall_b = sum(rb["wall_s"] for _, rb in pairs)
            wall_c = sum(rc["wall_s"] for rc, _ in pairs)
            def rate(rs):  # decode tokens per ms over the category
                return (sum(r["timings"]["predicted_n"] for r in rs)
                        / sum(r["timings"]["predicted_ms"] for r in rs))
            dec_b = 1 / rate([rb for _, rb in pairs])
            dec_c = 1 / rate([rc for rc, _ in pairs])
            low = min(rb["wall_s"] / rc["wall_s"] for rc, rb in pairs)
            drafted = sum(spec(rc)[0] for rc, _ in pairs)
            accepted = sum(spec(rc)[1] for rc, _ in pairs)
            drafts = [spec(rc)[2] for rc, _ in pairs]
            tpv = ("-" if any(d is None for d in drafts) or not sum(drafts)
                   else f"{1 + accepted / sum(drafts):.2f}")
            same = sum(rc["content"] == rb["content"] for rc, rb in pairs)
            acc = f"{accepted}/{drafted} ({accepted / drafted:.0%})" if drafted else "-"
            lines.append(f"| {cand} vs {base} | {cat} | {len(pairs)} | {wall_b / wall_c:.2f}x | "
                         f"{dec_b / dec_c:.2f}x | {low:.2f}x | {acc} | {tpv} | "
                         f"{same}/{len(pairs)} |")
    print("\n".join(lines))


if __name__ == "__main__":
    main(sys.argv[1])
