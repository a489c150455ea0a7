import json, statistics, sys, time, torch
from tandem.config import EngineConfig, SpecConfig
from tandem.flags import load_engine
torch.set_num_threads(2)
cfg = EngineConfig(ctx_size=4096, n_threads=2)
spec = SpecConfig(types=["none"]).resolved(False)
engine = load_engine("default", None, cfg, spec)
cache, model = engine.cache, engine.target.model
base = 600
model(torch.zeros(1, base, dtype=torch.long), cache, [0], [0], logits="none")
t = {}
rounds = int(sys.argv[2])
for _ in range(rounds):
    for r in range(1, 11):
        t0 = time.perf_counter()
        model(torch.zeros(1, r, dtype=torch.long), cache, [0], [base])
        t.setdefault(r, []).append(time.perf_counter() - t0)
out = {r: statistics.median(v) * 1e3 for r, v in t.items()}
json.dump(out, open(sys.argv[1], "w"))
print(sys.argv[1], {r: round(v, 1) for r, v in out.items()})
