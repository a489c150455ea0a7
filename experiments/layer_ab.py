"""Time the C decoder layers (one `tq_forward` call: every layer, no output projection) of this
tree against those of git revision REV, in one process, call by call.

Both kernel libraries are loaded side by side (REV's C files built with the same compiler flags
as this tree's) and called in turn on the same model, cache and rows: A, B, A, B, ... So a noisy
neighbour slows both alike, which whole-process runs (target_speed.py) cannot promise within
a few percent. Reports per row count the median time per call of each, the range over rounds of
round medians, and the ratio of medians per round.

    python experiments/layer_ab.py --against HEAD --rows 1 9 --rounds 7 --calls 40
    python experiments/layer_ab.py --against HEAD --kv f16 f32 ...  # KV cache types of each
    python experiments/layer_ab.py --activations int8-down64 mixed ...  # this tree, two roundings

--kv gives the KV cache's type for this tree and for REV (f32 or f16; a revision from before
the f16 cache takes f32 only). The struct layout (tq.h) must be the same at REV.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from common import ROOT, cpu_line, export_rev

sys.path.insert(0, str(ROOT / "src"))

from tandem import kernels  # noqa: E402
from tandem.config import Numerics  # noqa: E402
from tandem.models.loader import load_model  # noqa: E402


def build_rev(rev: str, out_dir: Path) -> tuple[ctypes.CDLL, bool]:
    """REV's kernels (its src/tandem/kernels), compiled as this tree compiles its own, and
    whether its tq_forward takes the KV cache types (the f16 cache)."""
    src = export_rev(rev, out_dir, "src/tandem/kernels")
    files = [str(src / p.name) for p in kernels.SOURCES if (src / p.name).exists()]
    flags = [*kernels.CFLAGS, *kernels.VARIANTS[kernels.variant()][0]]
    lib_path = out_dir / "rev.so"
    subprocess.run(["gcc", *flags, "-o", str(lib_path), *files, "-lm"], check=True)
    lib = ctypes.CDLL(str(lib_path))
    typed = "TQ_K_F16" in (src / "tq.h").read_text()
    i64, ptr, c_int = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
    lib.tq_forward.argtypes = [ptr, ptr, ptr, i64, i64, ptr, i64, ptr, ptr, c_int] + (
        [c_int] if typed else [])
    lib.tq_forward.restype = c_int
    return lib, typed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--against", metavar="REV")
    ap.add_argument("--activations", nargs=2, metavar=("A", "B"),
                    help="instead of --against: this tree's layers with --activations A against "
                         "B (the model loaded twice)")
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 9])
    ap.add_argument("--position", type=int, default=600, help="the first row's position")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=40, help="calls per library per round")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kv", nargs=2, default=["f32", "f32"], choices=["f32", "f16"],
                    metavar=("HERE", "REV"), help="KV cache type of this tree and of REV")
    ap.add_argument("--build", default="", choices=["", *kernels.VARIANTS],
                    help="the kernel build of both sides (default: this CPU's fastest)")
    a = ap.parse_args()
    if (a.against is None) == (a.activations is None):
        sys.exit("give --against REV or --activations A B")
    kernels.choose_build(a.build)

    def load(act: str):
        return load_model(a.model, Numerics(weights="native", activations=act, threads=a.threads,
                                            kernel_build=a.build),
                          max_len=a.position + max(a.rows) + 64)

    lm = load(a.activations[0] if a.activations else "mixed")
    model = lm.model
    args = model.args
    native = kernels.NativeLayers.from_model(args, list(model.layers), model.cos, model.sin)
    if native is None:
        sys.exit("this model does not take the C layers")
    # REV's kernels read the GGUF blocks: no layout of this tree's own (kernels.repack)
    plain = kernels.NativeLayers(args, list(model.layers), model.cos, model.sin,
                                 kernels.PROMPT_ROWS, repacked=False)
    here = kernels._lib_or_raise(None)
    max_len = a.position + max(a.rows) + 64
    shape = (args.n_layers, 1, args.n_kv_heads, max_len, args.head_dim)
    g = torch.Generator().manual_seed(0)
    kc = torch.randn(shape, generator=g) * 0.5
    vc = torch.randn(shape, generator=g) * 0.5
    dtypes = {"f32": torch.float32, "f16": torch.float16}
    with tempfile.TemporaryDirectory(prefix="layer-ab-") as tmp:
        # name -> (library, key cache, value cache, extra arguments: the cache types, layers)
        libs = {}
        if a.activations:
            mb = load(a.activations[1]).model
            other = kernels.NativeLayers.from_model(args, list(mb.layers), mb.cos, mb.sin)
            for (act, t), layers in zip(zip(a.activations, a.kv), (native, other)):
                types = [3 if t == "f16" else 0]
                libs[f"{act} {t}"] = (here, kc.to(dtypes[t]), vc.to(dtypes[t]), types, layers)
        else:
            rev, typed = build_rev(a.against, Path(tmp))
            if a.kv[1] != "f32" and not typed:
                sys.exit(f"{a.against}'s kernels take a float32 KV cache only")
            for name, lib, t, takes_types in ((f"this tree {a.kv[0]}", here, a.kv[0], True),
                                              (f"at {a.against} {a.kv[1]}", rev, a.kv[1], typed)):
                types = [3 if t == "f16" else 0] if takes_types else []
                libs[name] = (lib, kc.to(dtypes[t]), vc.to(dtypes[t]), types,
                              native if lib is here else plain)
        print(f"CPU: {cpu_line()}; build {kernels.variant()}; {a.threads} threads; model {a.model}")
        for m in a.rows:
            x0 = torch.randn(m, args.dim, generator=g)
            slots = (ctypes.c_int64 * m)(*([0] * m))
            pos = (ctypes.c_int64 * m)(*range(a.position, a.position + m))
            outs, times = {}, {k: [] for k in libs}
            for r in range(a.rounds):
                for name, (lib, k, v, types, layers) in libs.items():
                    ts = []
                    for _ in range(a.calls):
                        x = x0.clone()
                        t0 = time.perf_counter()
                        rc = lib.tq_forward(ctypes.byref(layers._model), k.data_ptr(),
                                            v.data_ptr(), 1, max_len, x.data_ptr(), m, slots,
                                            pos, a.threads, *types)
                        ts.append(time.perf_counter() - t0)
                        if rc != 0:
                            sys.exit(f"{name}: tq_forward returned {rc}")
                    outs[name] = x
                    times[name].append(statistics.median(ts))
            names = list(libs)
            same = torch.equal(outs[names[0]], outs[names[1]])
            ratios = [b / t for t, b in zip(times[names[0]], times[names[1]])]
            print(f"\nrows {m} (positions {a.position}..{a.position + m - 1}), "
                  f"{a.rounds} rounds x {a.calls} calls; same bits: {same}")
            for name in names:
                t = times[name]
                print(f"  {name:>14}: median {statistics.median(t) * 1e3:.2f} ms "
                      f"(round medians {min(t) * 1e3:.2f}-{max(t) * 1e3:.2f})")
            print(f"  speed-up of the first, per round: median {statistics.median(ratios):.3f}x "
                  f"({min(ratios):.3f}-{max(ratios):.3f})")


if __name__ == "__main__":
    main()
