"""How far int8 activation rounding (llama.cpp's, `--activations int8`) moves the target's
logits from the default int16 rounding, on the benchmark prompts.

For each prompt of bench/prompts/cpu-tasks.jsonl (chat template applied), greedy-decodes
N tokens with both settings (same weights, same C layers) and reports how many leading tokens
agree and the largest logit difference over the rows up to the first disagreement.

    python experiments/activation_fidelity.py --n-predict 48 --out bench/results/activation-fidelity

Writes OUT/report.md and OUT/result.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def greedy(m, ids: list[int], n: int, chunk: int = 512) -> tuple[list[int], torch.Tensor]:
    from tandem.models.decoder import KVCache

    cache = KVCache(m.args, 1, len(ids) + n + 1, torch.float32)
    head = ids[:-1]
    for s in range(0, len(head), chunk):
        m.model(torch.tensor([head[s:s + chunk]]), cache, [0], [s], logits="none")
    cache.append(0, head)
    out, rows, last = [], [], ids[-1]
    for _ in range(n):
        logits = m.model(torch.tensor([[last]]), cache, [0], [cache.length(0)])[0, 0]
        cache.append(0, [last])
        last = int(logits.argmax())
        out.append(last)
        rows.append(logits)
    return out, torch.stack(rows)


def main() -> int:
    from tandem.config import Numerics
    from tandem.models.loader import load_model

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-predict", type=int, default=48)
    ap.add_argument("--prompts", default=str(ROOT / "bench/prompts/cpu-tasks.jsonl"))
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    tasks = [json.loads(line) for line in Path(a.prompts).read_text().splitlines() if line]
    models = {bits: load_model(a.model, Numerics(activations=bits)) for bits in ("int16", "int8")}
    tok = models["int16"].tokenizer
    rows = []
    for t in tasks:
        ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": t["prompt"]}]))
        o16, l16 = greedy(models["int16"], ids, a.n_predict)
        o8, l8 = greedy(models["int8"], ids, a.n_predict)
        agree = next((i for i, (x, y) in enumerate(zip(o16, o8)) if x != y), a.n_predict)
        upto = min(agree + 1, a.n_predict)
        rows.append({"task": t["task"], "prompt_tokens": len(ids), "agree": agree,
                     "max_logit_diff": (l8[:upto] - l16[:upto]).abs().max().item(),
                     "logit_range": l16[:upto].abs().max().item()})
        print(rows[-1], flush=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    cmd = " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]])
    (out / "result.json").write_text(json.dumps({"command": f"python {cmd}", "rows": rows},
                                                indent=1))
    lines = ["# int8 vs int16 activation rounding (same weights, same C layers)", "",
             f"Command: `python {cmd}`", "",
             f"Greedy, {a.n_predict} tokens per prompt.", "",
             "| task | prompt tokens | leading tokens identical | max logit difference "
             "(up to the first different token) | largest logit |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['task']} | {r['prompt_tokens']} | {r['agree']}/{a.n_predict} | "
                     f"{r['max_logit_diff']:.3f} | {r['logit_range']:.1f} |")
    (out / "report.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
