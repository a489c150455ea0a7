"""An EAGLE-3 head's costs against the default target's on this machine: reading a 512-token
prompt (fc + the layer over the pairs) against the target's prompt pass, and one drafted token (one
pair and its logits) against a 1-row target pass; fastest of 5 each, interleaved.

    python experiments/head_costs.py HEAD.gguf   (bench/results/eagle3-default)
"""
import sys, time, torch
from pathlib import Path
from tandem.config import Numerics
from tandem.models.loader import load_model
from tandem.models.decoder import KVCache
from tandem.models.eagle3 import load_head
torch.set_num_threads(2)
num = Numerics(weights="native", threads=2)
tgt = load_model("default", num, max_len=4096); tgt.prepare_kernels()
head = load_head(sys.argv[1], tgt, num)
tgt.model.feature_layers = head.target_layers
cache = KVCache.of_types(tgt.args, 1, 4096, ("f16", "f16")); hc = head.cache(1, 4096, ("f16", "f16"))
ids = list(range(1000, 1512)); feats = torch.empty(512, 3 * 1536)
best = {}
def t(name, fn):
    t0 = time.perf_counter(); fn(); dt = time.perf_counter() - t0
    best[name] = min(best.get(name, 1e9), dt)
for _ in range(5):
    t("target prompt 512", lambda: tgt.model.forward_packed(ids, cache, [0]*512, list(range(512)), [], features=feats))
    t("head reads 512", lambda: head.forward(ids, head.encode(feats), hc, 0, 0))
    t("target 1 row", lambda: tgt.model.forward_packed(ids[:1], cache, [0], [512], [0], features=feats[:1]))
    t("target 5 rows", lambda: tgt.model.forward_packed(ids[:5], cache, [0]*5, list(range(512, 517)), list(range(5)), features=feats[:5]))
    t("head 1 token", lambda: head.logits(head.forward([5], torch.zeros(1, 1536), hc, 0, 512)))
for k, v in best.items():
    print(f"{k:20s} {v*1e3:8.1f} ms")
print(f"head prompt / target prompt: {best['head reads 512']/best['target prompt 512']:.3f}")
print(f"head token / target 1-row pass: {best['head 1 token']/best['target 1 row']:.3f}")
