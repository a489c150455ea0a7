"""`tandem train-head`: capture the target's features over the corpus, train an EAGLE-3 head
on them, export it. Everything lives in --out; running the same command again resumes (the
capture at its next sequence, the training at its last checkpoint).

    DIR/capture/      the corpus as the target read it (data.py), its answers (answers.py)
    DIR/checkpoint.pt the model, optimizer and step (loop.py)
    DIR/curve.jsonl   one validation record per evaluation: step, tokens, seconds,
                      acc / cond per unrolled step, expected accepted drafts
    DIR/config.json, DIR/model.safetensors   the HF checkpoint (SpecForge's layout)
    DIR/head.gguf     llama.cpp's EAGLE-3 GGUF (a GGUF target only)
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from ..config import Numerics
from ..errors import TandemError
from .answers import self_answers
from .data import capture, choose_vocabulary
from .export import GGUF_TYPES, export
from .head import Eagle3Head, HeadConfig
from .loop import TrainConfig, train


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", "-m", required=True, metavar="T",
                   help="the target: a model name (tandem models list), a .gguf file or a "
                        "Hugging Face directory")
    p.add_argument("--out", required=True, metavar="DIR", help="where everything is kept")
    p.add_argument("--corpus-tokens", type=int, default=200_000, metavar="N",
                   help="tokens of the standard library's sources to read (default 200000)")
    p.add_argument("--answers", type=int, default=0, metavar="N",
                   help="also the target's greedy answers to N prompts written from the "
                        "standard library, in the corpus (slow: decoding; default 0)")
    p.add_argument("--answer-tokens", type=int, default=256, metavar="N",
                   help="the longest answer, in tokens (default 256)")
    p.add_argument("--seq-len", type=int, default=512, metavar="N",
                   help="tokens per training sequence (default 512)")
    p.add_argument("--layers", default="", metavar="A,B,C",
                   help="the target layers whose inputs the head reads (default 2, n/2, n-3; "
                        "n: the final output)")
    p.add_argument("--topk", type=int, default=16, metavar="K",
                   help="the target's likeliest tokens kept per position (default 16)")
    p.add_argument("--draft-vocab", type=int, default=32000, metavar="N",
                   help="the draft vocabulary's size (default 32000)")
    p.add_argument("--ffn", type=int, default=0, metavar="N",
                   help="the head's FFN width (default 0: the target's)")
    p.add_argument("--steps", type=int, default=2000, metavar="N", help="optimizer steps")
    p.add_argument("--ttt", type=int, default=5, metavar="N",
                   help="training-time-test unroll: draft positions trained (default 5)")
    p.add_argument("--batch", type=int, default=1, metavar="N", help="sequences per step")
    p.add_argument("--lr", type=float, default=3e-4, help="peak learning rate (default 3e-4)")
    p.add_argument("--eval-every", type=int, default=0, metavar="N",
                   help="steps between validations and checkpoints (default: a tenth)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", "-t", type=int, default=0, metavar="N",
                   help="CPU threads (default 0: all cores)")
    p.add_argument("--gguf-type", default="q4_0", choices=list(GGUF_TYPES),
                   help="the GGUF's matrices; norms stay f32 (default q4_0: a head of the "
                        "default size on the default target, 32000 draft tokens and its FFN "
                        "width, is then under 64 MiB; q8_0 about 114)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                   help="where training runs (auto: CUDA when there is one)")
    p.add_argument("--precision", default="auto", choices=["auto", "bf16", "fp32"],
                   help="the training products: bf16 (autocast; weights, optimizer and "
                        "validation float32) or fp32; auto: bf16 where the device computes it "
                        "natively (about twice as fast on an AVX-512 BF16 CPU)")
    p.add_argument("--no-progress", dest="progress", action="store_false",
                   help="no progress bars")


def _layers(text: str, n_layers: int) -> list[int]:
    if not text:
        return [2, n_layers // 2, n_layers - 3]
    try:
        ids = [int(x) for x in text.split(",")]
    except ValueError:
        raise TandemError(f"--layers must be three comma-separated integers, got {text!r}")
    if len(ids) != 3 or not all(0 <= i <= n_layers for i in ids):
        raise TandemError(f"--layers must be three layer ids in 0 .. {n_layers} "
                          f"(the target has {n_layers} layers), got {text!r}")
    return ids


def _bf16(precision: str, device: str) -> bool:
    if precision != "auto":
        return precision == "bf16"
    if device == "cuda":
        return torch.cuda.is_bf16_supported()
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def build_head(target, cap, ids, ffn: int, seed: int) -> Eagle3Head:
    """A new head shaped after the target (its width, heads, rope and norm epsilon), randomly
    initialized as SpecForge does. (lm_head and norm started from the target's output rows and
    final norm were tried on the default target: a worse start, no better after 120 steps.)"""
    a = target.args
    c = HeadConfig(hidden_size=a.dim, intermediate_size=ffn or a.ffn_dim,
                   num_attention_heads=a.n_heads, num_key_value_heads=a.n_kv_heads,
                   head_dim=a.head_dim, vocab_size=a.vocab_size, draft_vocab_size=len(ids),
                   target_hidden_size=a.dim,
                   eagle_aux_hidden_state_layer_ids=list(cap.meta["layers"]),
                   rms_norm_eps=a.norm_eps, rope_theta=a.rope_theta,
                   max_position_embeddings=a.max_seq_len)
    torch.manual_seed(seed)
    head = Eagle3Head(c)
    head.set_vocabulary(torch.as_tensor(ids))
    return head


def run(a: argparse.Namespace) -> int:
    from ..models.loader import load_model

    if a.threads < 0:
        raise TandemError(f"--threads must be >= 0 (0 = all cores), got {a.threads}")
    if a.threads:
        torch.set_num_threads(a.threads)
    device = "cuda" if a.device == "cuda" or (a.device == "auto" and torch.cuda.is_available()) \
        else "cpu"
    cfg = TrainConfig(steps=a.steps, ttt=a.ttt, lr=a.lr, batch=a.batch, seed=a.seed,
                      eval_every=a.eval_every, bf16=_bf16(a.precision, device))
    if a.seq_len < cfg.ttt + 2:
        raise TandemError(f"--seq-len must be at least --ttt + 2 = {cfg.ttt + 2}, got {a.seq_len}")
    for flag, value in (("--topk", a.topk), ("--answer-tokens", a.answer_tokens),
                        ("--corpus-tokens", a.corpus_tokens)):
        if value < 1:
            raise TandemError(f"{flag} must be at least 1, got {value}")
    if a.answers < 0:
        raise TandemError(f"--answers must be >= 0, got {a.answers}")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    # positions: a training sequence's, or a prompt and its answer's
    target = load_model(a.target, Numerics(threads=a.threads),
                        max_len=max(a.seq_len, 4096 if a.answers else 0))
    layers = _layers(a.layers, target.args.n_layers)
    t0 = time.perf_counter()
    answers = self_answers(target, out / "capture", a.answers, a.seed, a.answer_tokens,
                           a.progress) if a.answers > 0 else []
    cap = capture(target, out / "capture", n_tokens=a.corpus_tokens, seq_len=a.seq_len,
                  layers=layers, topk=a.topk, seed=a.seed, progress=a.progress,
                  answers=answers)
    print(f"capture: {cap.meta['n_seqs']} sequences of {a.seq_len} tokens, layers {layers}, "
          f"{cap.meta['n_seqs'] * a.seq_len / max(cap.meta['seconds'], 1e-9):.1f} tokens/s "
          f"({time.perf_counter() - t0:.1f} s this run)")
    train_idx, _ = cap.split()
    ids = choose_vocabulary(cap, train_idx, a.draft_vocab, target.args.vocab_size)
    head = build_head(target, cap, ids, a.ffn, a.seed).to(device)
    embed = target.model.embed
    head.target_embed = lambda t: embed(t.cpu()).to(t.device)
    last = train(head, cap, cfg, out, device=device, progress=a.progress)
    if last:
        per_step = cfg.batch * (a.seq_len - 1)
        print(f"train: {last['tokens'] / max(last['seconds'], 1e-9):.1f} tokens/s, "
              f"{last['tokens'] * cfg.ttt / max(last['seconds'], 1e-9):.1f} tokens x ttt steps/s "
              f"({per_step} tokens a step)")
    for p in export(head.cpu(), out, target.path, a.gguf_type):
        print(f"wrote {p} ({p.stat().st_size / 2**20:.1f} MiB)")
    (out / "summary.json").write_text(json.dumps({"last": last, "layers": layers}, indent=1))
    return 0
