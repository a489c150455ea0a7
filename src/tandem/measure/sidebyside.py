"""llama.cpp side by side (`tandem bench --llama-server`): every run's speed against llama.cpp's
target alone, measured by the same client on the same prompts and token budget, built on
compare's public figures (`pass_totals`, `speedup_of`, `side_stats`, `Spread`)."""

from __future__ import annotations

import statistics
from dataclasses import asdict
from pathlib import Path

from . import compare


def side_by_side(runs: list[tuple[str, compare.Run]]) -> list[dict]:
    """Every run's figures over the tasks and passes all runs have, against the llama-none run
    (llama.cpp's target alone): wall seconds of a whole pass (median, range), the ratio of
    llama.cpp's median to this run's (with the per-pass range), decode tokens/s over the pass,
    acceptance, and on how many tasks the text equals llama.cpp's and Tandem's baseline's.
    `vs_own_first` / `vs_own_later`: the speed-up over the same engine's target alone (Tandem's
    baseline, or llama-none) in the first pass, where every prompt is seen for the first time,
    and the median of the later passes, where a configuration that remembers earlier requests
    (llama.cpp's ngram-mod pool, Tandem's `--spec-suffix-pool`) may answer a repeated prompt
    from memory.

    Across engines the text can differ (other float arithmetic), so these are speeds on the
    same prompts and token budget, not an equal-work check; `tokens` says how much each
    generated per pass."""
    ref = dict(runs)["llama-none"]
    own = runs[0][1]  # Tandem's target alone
    tasks = [t for t in ref.samples if all(t in r.samples for _, r in runs)]
    passes = set.intersection(
        *({s.pass_index for s in r.samples[t]} for _, r in runs for t in tasks)) if tasks else set()
    if not tasks or not passes:
        return []
    ref_walls = [s.wall_s for s in compare.pass_totals(ref, tasks, passes)]
    own_walls = {name: [s.wall_s for s in compare.pass_totals(r, tasks, passes)]
                  for name, r in (runs[0], ("llama-none", ref))}
    rows = []
    for name, run in runs:
        totals = compare.pass_totals(run, tasks, passes)
        walls = [s.wall_s for s in totals]
        speedup, span = compare.speedup_of(ref_walls, walls, list(zip(ref_walls, walls)))
        stats = compare.side_stats(totals)

        # prompt tokens/s of each pass whose requests all report their prompt time
        prompt = [1000 * s.prompt_n / s.prompt_ms for s in totals
                  if s.prompt_ms and s.prompt_n is not None]

        def same_text(other: compare.Run) -> int:
            return sum({s.content for s in run.samples[t]} == {s.content for s in other.samples[t]}
                       for t in tasks)

        alone = own_walls["llama-none" if name.startswith("llama-") else runs[0][0]]
        per_pass = [a / w for a, w in zip(alone, walls)]
        rows.append({
            "vs_own_first": per_pass[0],
            "vs_own_later": statistics.median(per_pass[1:]) if len(per_pass) > 1 else None,
            "name": name, "label": run.label, "file": Path(run.path).name,
            "wall_s": asdict(compare.Spread.of(walls)), "vs_llama_alone": speedup, "range": span,
            "decode_tokens_per_second": stats.tokens_per_second.median,
            "prompt_tokens_per_second": statistics.median(prompt) if prompt else None,
            "tokens": stats.tokens_predicted, "acceptance_rate": stats.acceptance_rate,
            "same_text_as_llama": same_text(ref), "same_text_as_tandem": same_text(own),
            "tasks": len(tasks),
        })
    return rows


def side_by_side_markdown(rows: list[dict]) -> str:
    """report.md's section for side_by_side's rows."""
    lines = ["## llama.cpp on the same client", "",
             "The same benchmark client, prompts and token budget against llama.cpp's "
             "llama-server on the same GGUF files, threads and context, measured in the same "
             "turns. `vs llama.cpp alone`: llama.cpp target-alone median wall seconds of a "
             "pass / this configuration's (range over passes). Decode tok/s: tokens / decode "
             "time over a pass; prompt tok/s likewise. The engines round differently, so "
             "their texts may differ: the last columns count the tasks whose text is "
             "identical. `vs own alone`: over the same engine's target alone, in the first "
             "pass (every prompt seen for the first time) and the later passes' median, where "
             "a configuration that remembers earlier requests (llama.cpp's ngram-mod pool, "
             "Tandem's --spec-suffix-pool) may answer a repeated prompt from memory.", ""]
    if not rows:
        return "\n".join(lines + ["(no task and pass measured by every configuration)"]) + "\n"
    lines += ["| configuration | wall s per pass, median (range) | vs llama.cpp alone (range) "
              "| vs own alone, first pass / later | prompt tok/s | decode tok/s | tokens | acceptance | same text as llama.cpp | "
              "same text as Tandem alone |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        w, span = r["wall_s"], r["range"] or (r["vs_llama_alone"], r["vs_llama_alone"])
        w = compare.Spread(**w)
        acc = "-" if r["acceptance_rate"] is None else f"{r['acceptance_rate']:.1%}"
        pp = r["prompt_tokens_per_second"]
        pp = "-" if pp is None else f"{pp:.1f}"
        own = f"{r['vs_own_first']:.2f}x / " + (
            "-" if r["vs_own_later"] is None else f"{r['vs_own_later']:.2f}x")
        lines.append(
            f"| {r['label']} ({r['file']}) | {w.median:.2f} ({w.min:.2f}-{w.max:.2f}) | "
            f"{r['vs_llama_alone']:.2f}x ({span[0]:.2f}-{span[1]:.2f}) | {own} | {pp} | "
            f"{r['decode_tokens_per_second']:.1f} | {r['tokens']:g} | {acc} | "
            f"{r['same_text_as_llama']}/{r['tasks']} | {r['same_text_as_tandem']}/{r['tasks']} |")
    return "\n".join(lines) + "\n"
