"""Teacher-forced agreement of the draft with the target: the draft reads each validation
prompt and the target alone's answer (baseline.json of a `tandem bench` run) in one pass; at each
answer position, whether its top token is the target's next token (what draft-simple's greedy
draft needs to be accepted). python agreement.py BASELINE.json PROMPTS.jsonl"""
import json, torch, sys
from tandem.config import EngineConfig, SpecConfig
from tandem.flags import load_engine
torch.set_num_threads(2)
cfg = EngineConfig(ctx_size=4096, n_threads=2)
spec = SpecConfig(types=["draft-simple"]).resolved(True)
engine = load_engine("default", "default-draft", cfg, spec)
tok = engine.tok
prompts = {json.loads(l)["task"]: json.loads(l)["prompt"] for l in open(sys.argv[2])}
b = json.load(open(sys.argv[1]))
tot = [0, 0]
for r in b["requests"]:
    if r["pass"] != 0: continue
    p = tok.encode(prompts[r["task"]], add_special=True, parse_special=True)
    o = tok.encode(r["content"], add_special=False, parse_special=False)
    ids = p + o
    engine.draft_cache.clear(0) if hasattr(engine.draft_cache, "clear") else None
    lg = engine.draft.model(torch.tensor([ids]), engine.draft_cache, [0], [0], logits="all")[0]
    pred = lg[len(p)-1:len(ids)-1].argmax(-1).tolist()
    ok = [a == b for a, b in zip(pred, o)]
    # expected run lengths: mean accepted before first miss from each position
    n = sum(ok); tot[0] += n; tot[1] += len(ok)
    print(f"{r['task']:28s} {len(o):4d} tokens, draft agrees {n/len(o):.2f}")
print("all", tot[0]/tot[1])
