"""How far Tandem's activation rounding moves the target's next-token distributions, measured as
llama.cpp's `llama-perplexity --kl-divergence` measures its own, on the same text and weights.

Tandem's variants: int16, int8, mixed and int8-down64 activations with a float32 KV cache, and
int8-down64 (the default) and mixed with the f16 cache (the default; llama-perplexity's too).
The reference is the same GGUF weights dequantized, with float32 activations (Tandem: `--weights
dense --dtype float32`, PyTorch float32 GEMMs and cache; llama.cpp: an F32 GGUF written from the
same dequantized tensors, run with a float32 KV cache and no flash attention, `--llama-base-cache
f32`: llama.cpp's CPU flash attention rounds Q, K and V to f16 even with an f32 cache, so a
reference run with it shares the f16 cache's rounding and the figure leaves it out; so both
engines' figures count it: ~3e-6, F16's whole KL).
The text is real and written by nobody here: the head of a Python standard library module and of
a licence text shipped with the system, joined into one file that both tokenize whole. As
llama-perplexity does, the tokens are cut into chunks of --ctx (no BOS for Qwen), each chunk is
one pass, and the positions of its second half are scored (n_ctx/2 .. n_ctx - 2 predict the next
token): the reference's log-probabilities are stored as llama.cpp stores them (uint16 over the
top 16 nats, probabilities below e^-16 left out of the KL sum), so the statistics are computed
by the same arithmetic for every engine.

    python experiments/kl_divergence.py --threads 2 --chunks 8 \\
        --llama-perplexity /path/to/llama.cpp/build/bin/llama-perplexity \\
        --out bench/results/kl-divergence-NAME

Writes OUT/text.txt (the text), OUT/results.json (every statistic, the command, the CPU flags)
and OUT/report.md; with --llama-perplexity also OUT/llama-*.log (llama.cpp's own output;
llama-q.log holds its KL divergence, llama-base.log only the base run: not kept in bench/).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shlex
import subprocess
import sysconfig
import tempfile
from pathlib import Path

import numpy as np
import torch

from common import command_line, cpu_line

CODE = Path(sysconfig.get_paths()["stdlib"]) / "textwrap.py"
PROSE = Path("/usr/share/common-licenses/GPL-3")
# label -> (activations, KV cache type); llama-perplexity's cache is f16, its default
VARIANTS = {"tandem int16": ("int16", "f32"), "tandem int8": ("int8", "f32"),
            "tandem mixed": ("mixed", "f32"), "tandem int8-down64": ("int8-down64", "f32"),
            "tandem int8-down64, f16 cache": ("int8-down64", "f16"),
            "tandem mixed, f16 cache": ("mixed", "f16")}


def pick_variants(spec: str) -> list[str]:
    """The VARIANTS labels of a comma-separated list; labels that hold a comma themselves
    ("tandem int8-down64, f16 cache") are matched whole, the longest first (split on every
    comma, that one read as "tandem int8-down64": the float32 cache, not the default)."""
    parts = [p.strip() for p in spec.split(",")]
    out, i = [], 0
    while i < len(parts):
        for j in range(len(parts), i, -1):
            if ", ".join(parts[i:j]) in VARIANTS:
                out.append(", ".join(parts[i:j]))
                i = j
                break
        else:
            raise SystemExit(f"--variants: {parts[i]!r} is not one of: " + "; ".join(VARIANTS))
    return out


def build_text(chars: int) -> str:
    code = CODE.read_text(encoding="utf-8")[:chars]
    prose = PROSE.read_text(encoding="utf-8")[:chars]
    return code + "\n\n" + prose


class Stats:
    """llama-perplexity's kl_divergence_result and its sums, per scored position."""

    def __init__(self) -> None:
        self.kld: list[float] = []
        self.nll: list[float] = []
        self.nll_base: list[float] = []
        self.same_top = 0

    def add(self, logits: np.ndarray, base: tuple[np.ndarray, np.ndarray, np.ndarray],
            tokens: np.ndarray) -> None:
        """logits (T, V) float32 of this engine; base = (scale (T,), min_log_prob (T,),
        q (T, V) uint16); tokens (T,) the actual next tokens."""
        scale, min_lp, q = base
        lg = logits.astype(np.float64)
        mx = lg.max(axis=1, keepdims=True)
        lse = np.log(np.exp(lg - mx).sum(axis=1, keepdims=True)) + mx  # (T, 1)
        logp = lg - lse
        base_lp = scale[:, None] * q.astype(np.float64) + min_lp[:, None]
        keep = base_lp > -16.0
        p = np.where(keep, np.exp(base_lp), 0.0)
        kld = (p * (base_lp - logp)).sum(axis=1)
        rows = np.arange(len(tokens))
        self.kld += kld.tolist()
        self.nll += (-logp[rows, tokens]).tolist()
        self.nll_base += (-base_lp[rows, tokens]).tolist()
        self.same_top += int((lg.argmax(axis=1) == base_lp.argmax(axis=1)).sum())

    def summary(self) -> dict:
        k = np.array(self.kld)
        n = len(k)
        return {
            "positions": n,
            "mean_kld": float(k.mean()), "mean_kld_uncertainty": float(k.std(ddof=1) / math.sqrt(n)),
            "median_kld": float(np.median(k)), "kld_99": float(np.quantile(k, 0.99)),
            "kld_99_9": float(np.quantile(k, 0.999)), "max_kld": float(k.max()),
            "same_top": self.same_top / n,
            "ppl": float(math.exp(np.mean(self.nll))),
            "ppl_base": float(math.exp(np.mean(self.nll_base))),
        }


def quantize_base(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """llama-perplexity's log_softmax(..., uint16 *log_prob, ...): per row the log-probabilities
    of the top 16 nats as uint16 steps above their minimum."""
    lg = logits.astype(np.float32)
    mx = lg.max(axis=1)
    mn = np.maximum(lg.min(axis=1), mx - 16)
    lse = np.log(np.exp(lg.astype(np.float64) - mx[:, None]).sum(axis=1)).astype(np.float32)
    min_lp = mn - mx - lse
    scale = (mx - mn) / np.float32(65535)
    inv = np.where(scale > 0, 1 / np.where(scale > 0, scale, 1), 0).astype(np.float32)
    q = np.where(lg > mn[:, None], np.rint(inv[:, None] * (lg - mn[:, None])), 0)
    return scale.astype(np.float64), min_lp.astype(np.float64), q.astype(np.uint16)


def reference_logits(model, ids: list[int]) -> np.ndarray:
    """Every position's logits of the dense float32 model in one batched pass (the PyTorch
    layers without the row-by-row path verification needs: only the numbers matter here)."""
    from tandem.models.decoder import KVCache, StepContext, rms_norm

    m = model.model
    cache = KVCache(m.args, 1, len(ids) + 1, torch.float32)
    with torch.inference_mode():
        x = m.tok_embeddings[torch.tensor([ids])].float()
        ctx = StepContext(m, [0], [0], len(ids))
        for i, layer in enumerate(m.layers):
            x = layer(x, i, cache, ctx)
        x = rms_norm(x, m.norm, m.args.norm_eps)
        return m.output(x)[0].float().numpy()


def tandem_logits(model, ids: list[int], cache_type: str) -> np.ndarray:
    from tandem.models.decoder import KVCache

    cache = KVCache.of_types(model.args, 1, len(ids) + 1, (cache_type, cache_type))
    return model.model(torch.tensor([ids]), cache, [0], [0], logits="all")[0].numpy()


def write_f32_gguf(src: Path, dst: Path) -> None:
    """The file's metadata and every tensor dequantized to F32 (llama.cpp's reference)."""
    import gguf

    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(str(dst), arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), vtype, sub_type=sub)
    writer.add_key_value("general.file_type", 0, gguf.GGUFValueType.UINT32)  # ALL_F32
    for t in reader.tensors:
        values = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        writer.add_tensor(t.name, values.reshape([int(d) for d in reversed(t.shape)]))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def run_llama(exe: str, model: Path, text: Path, base: Path, args, log: Path, kld: bool) -> str:
    """llama-perplexity writing the reference (kld False: the F32 file, its KV cache
    --llama-base-cache) or reading it (kld True: the file under test, the default f16 cache)."""
    cmd = [exe, "-m", str(model), "-f", str(text), "-c", str(args.ctx), "-b", str(args.ctx),
           "-t", str(args.threads), "--chunks", str(args.chunks), "--kl-divergence-base",
           str(base)] + (["--kl-divergence"] if kld else
                         ["-ctk", args.llama_base_cache, "-ctv", args.llama_base_cache]
                         + (["-fa", "off"] if args.llama_base_cache == "f32" else []))
    r = subprocess.run(cmd, capture_output=True, text=True)
    log.write_text(shlex.join(cmd) + "\n\n" + r.stdout + r.stderr)
    if r.returncode != 0:
        raise SystemExit(f"llama-perplexity failed ({r.returncode}); see {log}")
    return r.stdout + r.stderr


def parse_llama(out: str) -> dict:
    def num(label: str) -> float:
        m = re.search(rf"^{re.escape(label)}\s*:\s*([-\d.]+)", out, re.M)
        return float(m.group(1)) if m else float("nan")

    def pct(label: str) -> float:  # "Same top p: 98.655 ± 0.273 %"
        m = re.search(rf"^{re.escape(label)}\s*:\s*([-\d.]+)", out, re.M)
        return float(m.group(1)) / 100 if m else float("nan")

    m = re.search(r"^Mean\s+KLD:\s*([-\d.]+)\s*±\s*([-\d.]+)", out, re.M)
    return {"mean_kld": float(m.group(1)) if m else float("nan"),
            "mean_kld_uncertainty": float(m.group(2)) if m else float("nan"),
            "median_kld": num("Median  KLD"), "kld_99": num("99.0%   KLD"),
            "kld_99_9": num("99.9%   KLD"), "max_kld": num("Maximum KLD"),
            "same_top": pct("Same top p"),
            "ppl": num("Mean PPL(Q)"), "ppl_base": num("Mean PPL(base)")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--chars", type=int, default=9000, help="characters of each text")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--llama-perplexity", metavar="PATH")
    ap.add_argument("--llama-base-cache", choices=("f32", "f16"), default="f32",
                    help="llama.cpp's reference run: f32, a float32 cache and no flash "
                         "attention (its CPU flash attention rounds Q, K and V to f16 whatever "
                         "the cache holds), as Tandem's reference, so both figures count the "
                         "f16 cache's rounding; f16: its defaults (f16 cache, flash attention), "
                         "as before (bench/results/gguf-types/kl.md says which)")
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help="comma-separated labels of VARIANTS to measure (default: all)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    from tandem.config import Numerics
    from tandem.models.loader import load_model
    from tandem.registry import resolve

    chosen = pick_variants(a.variants)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    text = build_text(a.chars)
    (out / "text.txt").write_text(text, encoding="utf-8")
    torch.set_num_threads(a.threads)
    ref = load_model(a.model, Numerics(weights="dense", dtype="float32", threads=a.threads),
                     max_len=a.ctx + 1)
    ids = ref.tokenizer.encode(text, add_special=True, parse_special=False)
    n_chunks = min(a.chunks, len(ids) // a.ctx)
    first = a.ctx // 2
    variants = {label: (load_model(a.model, Numerics(activations=act, threads=a.threads),
                                   max_len=a.ctx + 1), cache)
                for label, (act, cache) in VARIANTS.items() if label in chosen}
    stats = {label: Stats() for label in variants}
    for c in range(n_chunks):
        chunk = ids[c * a.ctx:(c + 1) * a.ctx]
        nxt = np.array(chunk[first + 1:])
        base = quantize_base(reference_logits(ref, chunk)[first:-1])
        for label, (model, cache) in variants.items():
            stats[label].add(tandem_logits(model, chunk, cache)[first:-1], base, nxt)
        print(f"chunk {c + 1}/{n_chunks}: " + ", ".join(
            f"{lab} KLD {np.mean(s.kld):.6f}" for lab, s in stats.items()), flush=True)
    results = {label: s.summary() for label, s in stats.items()}
    del ref, variants  # the dense float32 model holds ~7 GB; the F32 file is written next
    if a.llama_perplexity:
        with tempfile.TemporaryDirectory(dir=out) as tmp:
            f32, base = Path(tmp) / "f32.gguf", Path(tmp) / "base.kld"
            write_f32_gguf(resolve(a.model), f32)
            run_llama(a.llama_perplexity, f32, out / "text.txt", base, a, out / "llama-base.log",
                      kld=False)
            said = run_llama(a.llama_perplexity, resolve(a.model), out / "text.txt", base, a,
                             out / "llama-q.log", kld=True)
        results["llama.cpp"] = parse_llama(said)
    command = command_line()
    (out / "results.json").write_text(json.dumps(
        {"command": command, "cpu": cpu_line(), "tokens": len(ids), "chunks": n_chunks,
         "ctx": a.ctx, "text": [str(CODE), str(PROSE)], "results": results}, indent=1))
    lines = [f"# KL divergence from float32 activations: {a.model}", "", f"Command: `{command}`", "",
             f"CPU: {cpu_line()}", "",
             f"Text: the first {a.chars} characters of `{CODE}` and of `{PROSE}` "
             f"({len(ids)} tokens); {n_chunks} chunks of {a.ctx}, the second half of each "
             f"scored ({results[next(iter(results))]['positions']} positions).", "",
             "| engine | mean KLD (±) | median | 99% | 99.9% | max | same top token | "
             "PPL | PPL of the reference |", "|---|---|---|---|---|---|---|---|---|"]
    for label, r in results.items():
        lines.append(f"| {label} | {r['mean_kld']:.6f} ± {r['mean_kld_uncertainty']:.6f} | "
                     f"{r['median_kld']:.6f} | {r['kld_99']:.6f} | {r['kld_99_9']:.6f} | "
                     f"{r['max_kld']:.6f} | {100 * r['same_top']:.2f}% | {r['ppl']:.4f} | "
                     f"{r['ppl_base']:.4f} |")
    (out / "report.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
