"""`tandem` command line: flags are turned into config dataclasses here and nowhere else."""

from __future__ import annotations

import argparse
import json
import sys

from .config import EngineConfig, SamplingParams, SpecConfig
from .errors import TandemError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # exit 2 with one line, as argparse does, no usage dump
        self.exit(2, f"{self.prog}: error: {message}\n")


def add_model_args(p: argparse.ArgumentParser, *, default_model: str | None = "default") -> None:
    g = p.add_argument_group("model")
    g.add_argument("-m", "--model", default=default_model,
                   help="target: a .gguf file, a Hugging Face directory or a model name "
                        "(default, default-draft, smollm2-135m, gemma3-270m)")
    g.add_argument("-md", "--model-draft", default=None, help="draft model (name or path)")
    g.add_argument("-c", "--ctx-size", type=int, default=4096, help="context per slot (tokens)")
    g.add_argument("-t", "--threads", type=int, default=0, help="CPU threads (0 = all cores)")
    g.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"),
                   help="compute dtype: auto = float32 for float32 files, else bfloat16")
    g.add_argument("--weights", default="auto", choices=("auto", "native", "int4", "dense"),
                   help="native: GGUF blocks read in place by Tandem's AVX2 kernels (exact "
                        "weights, float32 activations); int4: repack 4-bit blocks for PyTorch's "
                        "int4 kernel (exact up to bf16 rounding of scales); dense: dequantize "
                        "everything to --dtype; auto (default): native where the kernels "
                        "build on this machine, else int4")
    g.add_argument("--activations", default="int16", choices=("int16", "int8"),
                   help="native weights only: how the kernels round activations per block. "
                        "int16 (default): within 1/32766 of the block's largest value; int8: "
                        "llama.cpp's Q8_K/Q8_0 rounding (1/254), faster, less exact")
    g.add_argument("--activations-draft", default="int8", choices=("int16", "int8"),
                   help="the same for the draft model; default int8: the draft only proposes, "
                        "the target decides every token, so its rounding cannot change the "
                        "output, only how often its guesses are accepted")


def add_spec_args(p: argparse.ArgumentParser) -> None:
    d = SpecConfig()
    g = p.add_argument_group("speculative decoding (llama-server's spelling)")
    g.add_argument("--spec-type", default=None,
                   help="none, ngram-simple, draft-simple, auto (n-gram then draft, k chosen "
                        "per step from measured costs, 0 when speculation does not pay), or a "
                        "comma-separated list tried in order (default: auto with "
                        "--model-draft, else none)")
    g.add_argument("--spec-draft-n-max", "--draft-max", "--draft-n", type=int, default=d.n_max,
                   dest="spec_draft_n_max", help=f"most tokens drafted per step ({d.n_max})")
    g.add_argument("--spec-draft-n-min", "--draft-min", type=int, default=d.n_min,
                   dest="spec_draft_n_min", help=f"drop shorter drafts ({d.n_min})")
    g.add_argument("--spec-draft-p-min", "--draft-p-min", type=float, default=d.p_min,
                   dest="spec_draft_p_min",
                   help=f"stop drafting below this draft probability ({d.p_min})")
    g.add_argument("--spec-draft-window", type=int, default=d.draft_window,
                   dest="spec_draft_window",
                   help="the draft model processes only this many last tokens of the prompt "
                        f"(0 = all; {d.draft_window})")
    g.add_argument("--spec-draft-vocab", type=int, default=d.draft_vocab,
                   dest="spec_draft_vocab",
                   help="the draft proposes only among the first N token ids plus those of the "
                        f"prompt and output (0 = all; {d.draft_vocab})")
    g.add_argument("--spec-ngram-size-n", "--spec-ngram-simple-size-n", type=int,
                   default=d.ngram_max, dest="spec_ngram_size_n",
                   help=f"longest n-gram to match ({d.ngram_max})")
    g.add_argument("--spec-ngram-min-n", type=int, default=d.ngram_min, dest="spec_ngram_min_n",
                   help=f"shortest n-gram to match ({d.ngram_min})")
    g.add_argument("--spec-ngram-size-m", "--spec-ngram-simple-size-m", type=int,
                   default=d.ngram_m, dest="spec_ngram_size_m",
                   help=f"most tokens an n-gram match proposes ({d.ngram_m})")


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    d = SamplingParams()
    g = p.add_argument_group("sampling")
    g.add_argument("-n", "--n-predict", type=int, default=-1,
                   help="tokens to generate (-1 = until EOS or the context is full)")
    g.add_argument("--temp", type=float, default=d.temperature, help="temperature (0 = greedy)")
    g.add_argument("--top-k", type=int, default=d.top_k)
    g.add_argument("--top-p", type=float, default=d.top_p)
    g.add_argument("--min-p", type=float, default=d.min_p)
    g.add_argument("--seed", type=int, default=-1, help="-1 = random")
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    g.add_argument("--ignore-eos", action="store_true")


def spec_config(a: argparse.Namespace) -> SpecConfig:
    types = a.spec_type
    if types is None:
        types = "auto" if a.model_draft else "none"
    cfg = SpecConfig(
        types=SpecConfig.parse_types(types),
        n_max=a.spec_draft_n_max, n_min=a.spec_draft_n_min, p_min=a.spec_draft_p_min,
        draft_window=a.spec_draft_window, draft_vocab=a.spec_draft_vocab, ngram_min=a.spec_ngram_min_n, ngram_max=a.spec_ngram_size_n, ngram_m=a.spec_ngram_size_m,
    )
    if cfg.adaptive and not a.model_draft:
        cfg.types = ["ngram-simple"]
    if "draft-simple" in cfg.types and not a.model_draft:
        raise TandemError("--spec-type draft-simple needs a draft model: add --model-draft PATH")
    if a.model_draft and "draft-simple" not in cfg.types:
        print(f"tandem: warning: --model-draft is given but --spec-type {types} does not use it",
              file=sys.stderr)
    return cfg


def sampling_params(a: argparse.Namespace) -> SamplingParams:
    return SamplingParams(temperature=a.temp, top_k=a.top_k, top_p=a.top_p, min_p=a.min_p,
                          seed=a.seed, n_predict=a.n_predict, stop=list(a.stop),
                          ignore_eos=a.ignore_eos)


def engine_config(a: argparse.Namespace, n_parallel: int = 1) -> EngineConfig:
    return EngineConfig(ctx_size=a.ctx_size, n_parallel=n_parallel, n_threads=a.threads,
                        dtype=a.dtype)


def load_engine(a: argparse.Namespace, n_parallel: int = 1, log=None):
    """Build configs from flags, check the pair, load both models; returns the Engine."""
    from .engine import Engine
    from .models.loader import load_model
    from .spec.compat import check_compatible

    spec = spec_config(a)
    cfg = engine_config(a, n_parallel)
    max_len = cfg.ctx_size + spec.spare_positions + 1
    target = load_model(a.model, dtype=cfg.dtype, max_len=max_len, mode=a.weights,
                        activations=a.activations)
    draft = None
    if a.model_draft and "draft-simple" in spec.types:
        draft = load_model(a.model_draft, dtype=cfg.dtype, max_len=max_len, mode=a.weights,
                           activations=a.activations_draft)
        res = check_compatible(target.tokenizer, draft.tokenizer)
        if not res.ok:
            from .errors import IncompatibleDraftError

            raise IncompatibleDraftError(
                f"draft {a.model_draft} cannot be used with target {a.model}: {res.message}")
    if log is not None:
        log(f"target {target.path} ({target.args.arch}, {target.args.n_layers} layers) loaded "
            f"in {target.load_seconds:.1f} s")
        if draft is not None:
            log(f"draft {draft.path} loaded in {draft.load_seconds:.1f} s; compatible")
    return Engine(target, draft, cfg, spec)


# -- generate ---------------------------------------------------------------------------------

def cmd_generate(a: argparse.Namespace) -> int:
    from .engine import Request

    sampling = sampling_params(a)
    engine = load_engine(a)
    tok = engine.tok
    if a.chat:
        text = tok.apply_chat_template([{"role": "user", "content": a.prompt}])
        ids = tok.encode(text, add_special=False, parse_special=True)
    else:
        ids = tok.encode(a.prompt, add_special=True, parse_special=True)

    def out(s: str) -> None:
        sys.stdout.write(s)
        sys.stdout.flush()

    seq = engine.generate(Request(ids, sampling), on_text=None if a.json else out)
    result = completion_json(seq)
    if a.json:
        print(json.dumps(result, ensure_ascii=False))
    else:
        sys.stdout.write("\n")
        t = result["timings"]
        print(f"tandem: {t['prompt_n']} prompt tokens in {t['prompt_ms']:.0f} ms "
              f"({t['prompt_per_second']:.1f} tok/s), {t['predicted_n']} generated in "
              f"{t['predicted_ms']:.0f} ms ({t['predicted_per_second']:.1f} tok/s), "
              f"stop: {result['stop_type']}", file=sys.stderr)
        if seq.spec.enabled:
            print(f"tandem: {seq.stats.summary()}", file=sys.stderr)
    return 0


def completion_json(seq) -> dict:
    """llama.cpp's /completion response fields for a finished sequence."""
    out = {
        "content": seq.content,
        "tokens": list(seq.output),
        "tokens_predicted": len(seq.output),
        "tokens_evaluated": seq.n_prompt,
        "stop_type": seq.stop_type,
        "stopping_word": seq.stopping_word,
        "stop": True,
        "truncated": False,
        "seed": seq.seed,
        "id_slot": seq.slot,
        "timings": seq.timings(),
    }
    if seq.spec.enabled:
        out["speculative"] = {"type": ",".join(seq.spec.types), **seq.stats.as_dict()}
    return out


# -- models -----------------------------------------------------------------------------------

def cmd_models(a: argparse.Namespace) -> int:
    from . import registry

    if a.action == "pull":
        names = a.names or ["default", "default-draft"]
        for n in names:
            registry.pull(n)
        return 0
    for name, state, desc, path in registry.listing():
        print(f"{name:<14} {state:<11} {desc}\n{'':<14} {path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="tandem", description="Speculative decoding for local LLMs.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    g = sub.add_parser("generate", help="generate text from a prompt")
    add_model_args(g)
    add_spec_args(g)
    add_sampling_args(g)
    g.add_argument("-p", "--prompt", required=True)
    g.add_argument("--chat", action="store_true",
                   help="wrap the prompt as one user message with the model's chat template")
    g.add_argument("--json", action="store_true",
                   help="print one JSON object with llama.cpp's /completion fields")
    g.set_defaults(func=cmd_generate)

    m = sub.add_parser("models", help="pull or list the named default models")
    m.add_argument("action", choices=("pull", "list"))
    m.add_argument("names", nargs="*", help="names to pull (default: default default-draft)")
    m.set_defaults(func=cmd_models)

    from . import check
    from .bench import compare
    from .bench import run as bench_run
    from .server import cli as server_cli

    for name, module, help_ in (
        ("check", check, "compatibility verdict and memory plan for a target/draft"),
        ("serve", server_cli, "serve the HTTP API (llama-server's flags)"),
        ("compare", compare, "compare two benchmark JSON files (equal work)"),
        ("bench", bench_run, "serve target alone, then speculation; compare (equal work)"),
    ):
        sp = sub.add_parser(name, help=help_)
        module.add_arguments(sp)
        sp.set_defaults(func=module.run)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except TandemError as e:
        print(f"tandem: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
