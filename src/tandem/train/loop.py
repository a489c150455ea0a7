"""Training a head: the training-time-test loss, the validation acceptance curve, and the
loop (AdamW, warmup then cosine, clipping), resumable from DIR/checkpoint.pt.

The loss (EAGLE-3, SpecForge): the head is unrolled `ttt` steps over each sequence
(Eagle3Head.unroll); step j at row i is scored against the target's distribution after
token i+1+j, restricted to the draft vocabulary and renormalized (from the captured top k),
as cross-entropy; rows whose target argmax the draft vocabulary lacks are left out; step j
weighs decay**j, the sum divided by the weights' sum.

Acceptance, on the held-out sequences: acc[j] is the head's top-1 agreement with the target
at step j; cond[j] the same among the rows where every earlier step agreed and each token the
chain read was the target's own choice (there the unrolled chain is exactly what greedy
drafting would compute). Drafting k tokens then accepts on average

    expected(k) = cond[0] + cond[0] cond[1] + ... + cond[0] ... cond[k-1]

(the product rule: a draft is accepted only when every one before it was).
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from ..errors import TandemError
from .data import Captured, _bar
from .head import Eagle3Head


@dataclass(slots=True)
class TrainConfig:
    steps: int = 2000
    ttt: int = 5
    lr: float = 3e-4
    batch: int = 1
    warmup: int = 0  # 0: 5% of the steps
    clip: float = 0.5
    weight_decay: float = 0.0
    decay: float = 0.8  # step j of the unroll weighs decay ** j
    seed: int = 0
    eval_every: int = 0  # 0: a tenth of the steps
    val_batches: int = 8
    bf16: bool = False  # products in bfloat16 (autocast), weights and optimizer float32

    def __post_init__(self) -> None:
        for name in ("steps", "ttt", "batch"):
            if getattr(self, name) < 1:
                raise TandemError(f"--{name} must be at least 1, got {getattr(self, name)}")
        if not self.lr > 0:
            raise TandemError(f"--lr must be positive, got {self.lr}")

    def lr_at(self, step: int) -> float:
        """Linear warmup, then cosine down to a tenth."""
        warm = self.warmup or max(1, self.steps // 20)
        if step < warm:
            return self.lr * (step + 1) / warm
        t = (step - warm) / max(1, self.steps - warm)
        return self.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))

    @property
    def every(self) -> int:
        return self.eval_every or max(1, self.steps // 10)


def draft_index(head: Eagle3Head) -> torch.Tensor:
    """(V,) long: each target id's draft id, -1 where the draft vocabulary lacks it."""
    idx = torch.full((head.config.vocab_size,), -1, dtype=torch.long, device=head.d2t.device)
    draft = torch.arange(head.config.draft_vocab_size, device=head.d2t.device)
    idx[head.draft_to_target(draft)] = draft
    return idx


def ttt_loss(head: Eagle3Head, b: dict[str, torch.Tensor], index: torch.Tensor, ttt: int,
             decay: float) -> tuple[torch.Tensor, dict[str, np.ndarray]]:
    """The weighted loss of one batch and its counts per step: rows, hits, cond_rows,
    cond_hits, loss (mean over the step's scored rows)."""
    tokens, top_ids, top_logp = b["tokens"], b["top_ids"], b["top_logp"]
    B, L = tokens.shape
    n = L - 1
    outs = head.unroll(tokens, head.encode(b["feats"]), ttt)
    total, weights = 0.0, 0.0
    counts = {k: np.zeros(ttt) for k in ("rows", "hits", "cond_rows", "cond_hits", "loss")}
    ok = torch.ones(B, n, dtype=torch.bool, device=tokens.device)
    for j, (_, logits) in enumerate(outs):
        m = n - j  # rows with a target at this step
        ids, logp = top_ids[:, 1 + j:], top_logp[:, 1 + j:]  # (B, m, k)
        didx = index[ids]
        inside = didx >= 0
        p = logp.exp() * inside
        p = p / p.sum(-1, keepdim=True).clamp_min(1e-30)
        scored = inside[..., 0]  # the target's argmax is a draft token
        logq = torch.log_softmax(logits[:, :m], dim=-1)
        ce = -(p * logq.gather(-1, didx.clamp_min(0))).sum(-1)
        loss_j = (ce * scored).sum() / scored.sum().clamp_min(1)
        total, weights = total + decay ** j * loss_j, weights + decay ** j
        with torch.no_grad():
            hit = head.draft_to_target(logits[:, :m].argmax(-1)) == ids[..., 0]
            okj = ok[:, :m]
            for k, v in (("rows", B * m), ("hits", hit.sum()), ("cond_rows", okj.sum()),
                         ("cond_hits", (hit & okj).sum()), ("loss", loss_j.detach())):
                counts[k][j] = float(v)
            # the next step reads token i+2+j: the chain holds where it is the target's choice
            ok = (okj & hit)[:, : m - 1] & (tokens[:, 2 + j:] == ids[:, : m - 1, 0])
    return total / weights, counts


def acceptance(counts: dict[str, np.ndarray]) -> dict:
    acc = counts["hits"] / np.maximum(counts["rows"], 1)
    cond = counts["cond_hits"] / np.maximum(counts["cond_rows"], 1)
    return {"acc": [round(float(a), 4) for a in acc],
            "cond": [round(float(c), 4) for c in cond],
            "expected": round(float(np.cumprod(cond).sum()), 4)}


@torch.no_grad()
def evaluate(head: Eagle3Head, cap: Captured, val: list[int], cfg: TrainConfig,
             device: torch.device) -> dict:
    index = draft_index(head)
    total: dict[str, np.ndarray] = {}
    losses = []
    for i in range(0, min(len(val), cfg.val_batches * cfg.batch), cfg.batch):
        b = _to(cap.batch(val[i: i + cfg.batch]), device)
        loss, counts = ttt_loss(head, b, index, cfg.ttt, cfg.decay)
        losses.append(float(loss))
        for k, v in counts.items():
            total[k] = total.get(k, 0) + v
    return {"val_loss": round(float(np.mean(losses)), 4), **acceptance(total)}


def batch_indices(train: list[int], step: int, size: int, seed: int) -> list[int]:
    """The sequences of a step: epochs of seeded permutations, so any step's batch is known
    without replaying the ones before it (a resumed run reads what an unbroken one would)."""
    out = []
    for g in range(step * size, (step + 1) * size):
        epoch, at = divmod(g, len(train))
        perm = np.random.default_rng([seed, epoch]).permutation(len(train))
        out.append(train[perm[at]])
    return out


def _to(b: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device) for k, v in b.items()}


def _save(path: Path, state: dict) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def _log(out: Path, record: dict) -> None:
    with open(out / "curve.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")


def _resume(head: Eagle3Head, opt: torch.optim.Optimizer, out: Path) -> dict:
    """The checkpoint's step, tokens and seconds (zeros without one); the model, optimizer and
    RNG restored, curve.jsonl cut back to the checkpoint's step."""
    path = out / "checkpoint.pt"
    if not path.is_file():
        return {"step": 0, "tokens": 0, "seconds": 0.0}
    ck = torch.load(path, map_location=head.d2t.device, weights_only=False)
    if ck["config"] != head.config.to_hf():
        raise TandemError(f"{path} holds a head of another shape; use another --out or the "
                          f"same --draft-vocab, --ffn and --layers")
    head.load_state_dict(ck["model"])
    opt.load_state_dict(ck["optimizer"])
    torch.set_rng_state(ck["rng"])
    curve = out / "curve.jsonl"
    if curve.is_file():
        keep = [ln for ln in curve.read_text().splitlines()
                if ln and json.loads(ln)["step"] <= ck["step"]]
        curve.write_text("".join(ln + "\n" for ln in keep))
    return {k: ck[k] for k in ("step", "tokens", "seconds")}


def train(head: Eagle3Head, cap: Captured, cfg: TrainConfig, out: Path,
          device: torch.device | str = "cpu", progress: bool = True,
          log=print) -> dict:
    """Train head on the capture's training sequences until cfg.steps, resuming from
    out/checkpoint.pt; the last validation record."""
    device = torch.device(device)
    out.mkdir(parents=True, exist_ok=True)
    train_idx, val_idx = cap.split()
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay,
                            betas=(0.9, 0.95))
    state = _resume(head, opt, out)
    index = draft_index(head)
    if state["step"] == 0:
        torch.manual_seed(cfg.seed)
        rec = {"step": 0, "tokens": 0, "seconds": 0.0, **evaluate(head, cap, val_idx, cfg, device)}
        _log(out, rec)
        log(_line(rec))
    rec: dict = {}
    bar = _bar(cfg.steps, state["step"], "train", progress, unit="step")
    t0 = time.perf_counter() - state["seconds"]
    for step in range(state["step"], cfg.steps):
        head.train()
        b = _to(cap.batch(batch_indices(train_idx, step, cfg.batch, cfg.seed)), device)
        for g in opt.param_groups:
            g["lr"] = cfg.lr_at(step)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.bf16):
            loss, _ = ttt_loss(head, b, index, cfg.ttt, cfg.decay)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.clip)
        opt.step()
        state["tokens"] += b["tokens"].numel()
        bar.update(1)
        bar.set_postfix(loss=f"{float(loss.detach()):.3f}")
        done = step + 1
        if done % cfg.every == 0 or done == cfg.steps:
            head.eval()
            rec = {"step": done, "tokens": state["tokens"],
                   "seconds": round(time.perf_counter() - t0, 2),
                   "train_loss": round(float(loss.detach()), 4),
                   **evaluate(head, cap, val_idx, cfg, device)}
            _log(out, rec)
            _save(out / "checkpoint.pt", {
                "model": head.state_dict(), "optimizer": opt.state_dict(), "step": done,
                "tokens": state["tokens"], "seconds": time.perf_counter() - t0,
                "rng": torch.get_rng_state(), "config": head.config.to_hf(),
                "train": asdict(cfg)})
            log(_line(rec))
    bar.close()
    head.eval()
    return rec


def _line(r: dict) -> str:
    acc = " ".join(f"{a:.2f}" for a in r["cond"])
    return (f"step {r['step']:>6}  tokens {r['tokens']:>9}  {r['seconds']:>8.1f} s  "
            f"val loss {r['val_loss']:.3f}  cond acc [{acc}]  expected accepted "
            f"{r['expected']:.2f} of {len(r['cond'])}")
