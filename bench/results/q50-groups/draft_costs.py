import torch, time, sys, statistics
from tandem.config import EngineConfig, SpecConfig
from tandem.flags import load_engine
from tandem.speculative.draft import draft_step_seconds
torch.set_num_threads(2)
engine = load_engine("default", "default-draft", EngineConfig(ctx_size=4096, n_threads=2), SpecConfig(types=["draft-simple"]).resolved(True))
dm, dc = engine.draft.model, engine.draft_cache
m, c = engine.target.model, engine.cache
pre = []
for _ in range(3):
    t0 = time.perf_counter(); dm(torch.zeros(1, 512, dtype=torch.long), dc, [0], [0], logits="none"); pre.append((time.perf_counter() - t0) / 512)
steps = [draft_step_seconds(dm, dc, 0, 512, 32768, 5) for _ in range(5)]
tgt = []
m(torch.zeros(1, 512, dtype=torch.long), c, [0], [0], logits="none")
for _ in range(10):
    t0 = time.perf_counter(); m(torch.zeros(1, 1, dtype=torch.long), c, [0], [512]); tgt.append(time.perf_counter() - t0)
print(sys.argv[1], "draft step %.2f ms (median of 5 bests-of-5), draft prompt %.2f ms/token (median of 3 x 512), target 1-row pass %.2f ms (median of 10)" % (statistics.median(steps)*1e3, statistics.median(pre)*1e3, statistics.median(tgt)*1e3), flush=True)
