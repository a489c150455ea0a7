"""One config dataclass per concern; every default, check and rule about settings is here once.

Each field that a user can set names its command-line flag in its metadata (`flag(...)`):
flags.py builds the argument parser, turns flags back into configs and writes a server's argv
from these fields, and the HTTP request schemas take their defaults from `SamplingParams()`.
Environment variables that steer the numeric path are read here and nowhere else
(`_env_switch`), as the defaults of EngineConfig's numeric switches.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

from .choices import ACTIVATIONS, CACHE_TYPES, DTYPES, SPEC_TYPES, WEIGHT_MODES
from .errors import TandemError
from .synth import floats, rates_text, synth_rates


def flag(*names: str, help: str, request: str | None = None,
         choices: tuple[str, ...] | None = None, type: type | None = None,
         metavar: str | None = None, env: str | tuple[str, ...] = (), off: tuple[str, ...] = (),
         const: Any = None, action: Any = None) -> dict[str, Any]:
    """A field's metadata: its flags (llama-server's spelling first, then aliases), the help
    text, the allowed values, the key a request may override it with (llama.cpp's /completion
    field), and for a field whose default is None its value's type and name.
    env: llama-server's LLAMA_ARG_* variables that give the flag's value where the command line
    does not (server/envargs.py); off: the spellings that turn a switch off (--no-slots);
    const: the value of the flag given without one (-fa means -fa on); action: an argparse
    Action of its own (--agent sets two settings in the command line's order)."""
    return {"flags": names, "help": help, "request": request, "choices": choices,
            "type": type, "metavar": metavar, "env": (env,) if isinstance(env, str) else env,
            "off": off, "const": const, "action": action}


def _env_switch(name: str) -> bool:
    """An on/off switch from the environment ("0" = off; unset = on), for comparisons."""
    return os.environ.get(name, "1") != "0"


@dataclass(slots=True)
class Models:
    """The models a command runs: the target, and the draft where speculation uses one; each a
    .gguf file, a Hugging Face directory or a model name (registry.MODELS)."""

    model: str | None = field(default="default", metadata=flag(
        "-m", "--model", type=str, metavar="MODEL", env="LLAMA_ARG_MODEL",
        help="target: a .gguf file, a Hugging Face directory or a model name: default, "
             "default-draft, smollm2-135m, gemma3-270m"))
    model_draft: str | None = field(default=None, metadata=flag(
        "-md", "--model-draft", type=str, metavar="MODEL", env="LLAMA_ARG_SPEC_DRAFT_MODEL",
        help="draft model (name or path)"))


@dataclass(slots=True)
class SamplingParams:
    """Per-request sampling, with llama.cpp's defaults and meaning.

    temperature <= 0 means greedy (argmax). top_k <= 0, top_p >= 1 and min_p <= 0 disable
    those filters. seed < 0 picks a random seed. n_predict < 0 means "until EOS or the context
    is full".
    """

    temperature: float = field(default=0.8, metadata=flag(
        "--temp", env="LLAMA_ARG_TEMPERATURE", help="temperature (0 = greedy)"))
    top_k: int = field(default=40, metadata=flag(
        "--top-k", env="LLAMA_ARG_TOP_K", help="keep the k most likely tokens (0 = all)"))
    top_p: float = field(default=0.95, metadata=flag(
        "--top-p", env="LLAMA_ARG_TOP_P", help="nucleus: keep tokens up to this mass"))
    min_p: float = field(default=0.05, metadata=flag(
        "--min-p", env="LLAMA_ARG_MIN_P",
        help="drop tokens below this fraction of the top token's probability"))
    seed: int = field(default=-1, metadata=flag("--seed", help="-1 = random"))
    n_predict: int = field(default=-1, metadata=flag(
        "-n", "--n-predict", env="LLAMA_ARG_N_PREDICT",
        help="tokens to generate (-1 = until EOS or the context is full)"))
    stop: list[str] = field(default_factory=list, metadata=flag(
        "--stop", help="stop string (repeatable)"))
    ignore_eos: bool = field(default=False, metadata=flag(
        "--ignore-eos", help="keep generating past the end-of-generation token"))

    def __post_init__(self) -> None:
        if not isinstance(self.temperature, (int, float)) or self.temperature != self.temperature:
            raise TandemError(f"temperature must be a number, got {self.temperature!r}")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool):
            raise TandemError(f"top_k must be an integer, got {self.top_k!r}")
        if not isinstance(self.top_p, (int, float)) or not 0.0 <= self.top_p <= 1.0:
            raise TandemError(f"top_p must be between 0 and 1, got {self.top_p!r}")
        if not isinstance(self.min_p, (int, float)) or not 0.0 <= self.min_p <= 1.0:
            raise TandemError(f"min_p must be between 0 and 1, got {self.min_p!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise TandemError(f"seed must be an integer, got {self.seed!r}")
        if not isinstance(self.n_predict, int) or isinstance(self.n_predict, bool):
            raise TandemError(f"n_predict must be an integer, got {self.n_predict!r}")
        if self.temperature < 0:
            self.temperature = 0.0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0 or self.top_k == 1




@dataclass(slots=True)
class SpecConfig:
    """Speculative decoding settings (llama-server's --spec-* flags).

    types: proposers tried in order; the first non-empty draft wins. ["none"] = target alone;
    "auto" = suffix then the draft model, each draft sized per step by the controller
    (adaptive). None (nothing given) = auto with a draft model, none without: `resolved` is the
    one place that decides what runs with or without one. A comma-separated string is parsed.
    n_max / n_min / p_min: draft-simple drafts at most n_max tokens, stops when the draft's top
    probability falls below p_min and drops drafts shorter than n_min; p_min -1 is
    llama-server's default, no floor, and under auto the controller decides after each drafted
    token whether one more draft pass pays (`Controller.extend`).
    draft_window: the draft model reads only the last draft_window prompt tokens (0 = all),
    trading some acceptance for time before the first token; the other proposers still see
    the whole prompt.
    draft_vocab: the draft proposes only among the first draft_vocab token ids plus every id of
    the prompt and output so far (0 = all): a smaller output projection per draft step, the
    same drafts wherever the shortlist holds the draft's choice (speculative/draft.py
    Shortlist; bench/results/draft-options).
    ngram_min / ngram_max / ngram_m: ngram-simple matches suffixes of ngram_min..ngram_max
    tokens and proposes up to ngram_m tokens that followed the most recent earlier occurrence.
    suffix_max / suffix_pool: the suffix proposer drafts at most suffix_max tokens (the
    continuation of the longest earlier match, speculative/suffix.py) and also searches
    suffix_pool tokens of earlier outputs shared by every slot (0 = none), as llama.cpp's
    ngram-mod and vLLM's suffix decoding keep theirs: a request that repeats an earlier answer,
    or its structure, is drafted from it (bench/results/suffix-pool). A benchmark that repeats
    its prompts therefore measures that memory in its later passes: `tandem bench` reports the
    first pass apart.
    """

    types: list[str] | None = field(default=None, metadata=flag(
        "--spec-type", request="speculative.type", env="LLAMA_ARG_SPEC_TYPE",
        help="none, ngram-simple, suffix, draft-simple, draft-eagle3 (--model-draft an EAGLE-3 "
             "head), auto (suffix then the draft model or head, each draft "
             "sized per step from measured costs and calibrated confidences, none when "
             "speculation does not pay), or a comma-separated list tried in order (default: "
             "auto with --model-draft, else none)"))
    n_max: int = field(default=4, metadata=flag(
        "--spec-draft-n-max", "--draft-max", "--draft-n", request="speculative.n_max",
        env=("LLAMA_ARG_SPEC_DRAFT_N_MAX", "LLAMA_ARG_DRAFT_MAX"),
        help="most tokens drafted per step"))
    n_min: int = field(default=0, metadata=flag(
        "--spec-draft-n-min", "--draft-min", request="speculative.n_min",
        env=("LLAMA_ARG_SPEC_DRAFT_N_MIN", "LLAMA_ARG_DRAFT_MIN"),
        help="drop shorter drafts"))
    p_min: float = field(default=-1.0, metadata=flag(
        "--spec-draft-p-min", "--draft-p-min", request="speculative.p_min",
        env="LLAMA_ARG_SPEC_DRAFT_P_MIN",
        help="stop drafting below this draft probability (-1: 0, as llama-server; under "
             "auto the controller decides, token by token, whether one more pass pays)"))
    draft_window: int = field(default=0, metadata=flag(
        "--spec-draft-window",
        help="the draft model processes only this many last tokens of the prompt (0 = all)"))
    draft_vocab: int = field(default=32768, metadata=flag(
        "--spec-draft-vocab",
        help="the draft proposes only among the first N token ids plus those of the prompt "
             "and output (0 = all)"))
    draft_rejection: bool = field(default=False, metadata=flag(
        "--spec-draft-rejection",
        help="sampled requests: the draft model samples its drafts and they are verified by "
             "rejection sampling (more accepted at high temperatures; the target's "
             "distribution, but not the same text as without a draft for a seed). Default: "
             "the draft proposes its top token and the target draws its own sample at each "
             "row, so a seed gives the same text with or without speculation, as "
             "llama-server"))
    ngram_min: int = field(default=2, metadata=flag(
        "--spec-ngram-min-n", help="shortest n-gram to match"))
    ngram_max: int = field(default=4, metadata=flag(
        "--spec-ngram-size-n", "--spec-ngram-simple-size-n", help="longest n-gram to match"))
    ngram_m: int = field(default=8, metadata=flag(
        "--spec-ngram-size-m", "--spec-ngram-simple-size-m",
        help="most tokens an n-gram match proposes"))
    suffix_max: int = field(default=16, metadata=flag(
        "--spec-suffix-max", request="speculative.suffix_max",
        help="most tokens the suffix proposer drafts per step"))
    suffix_pool: int = field(default=16384, metadata=flag(
        "--spec-suffix-pool",
        help="tokens of earlier outputs the suffix proposer also searches, shared by every "
             "slot, least recently used out first (0 = only the request's own tokens; "
             "default 16384)"))
    synth_len: float = field(default=-1.0, metadata=flag(
        "--spec-synth-len", env="LLAMA_ARG_SPEC_SYNTH_LEN",
        help="benchmarking only, the output is then not valid: accept drafted tokens at random, "
             "for this mean acceptance length (the target's token included; -1: off)"))
    synth_rates: list[float] | None = field(default=None, metadata=flag(
        "--spec-synth-rates", type=str, metavar="P0,P1,...", env="LLAMA_ARG_SPEC_SYNTH_RATES",
        help="benchmarking only, the output is then not valid: accept drafted tokens at random, "
             "position i with unconditional probability Pi (spec-draft-n-max values, "
             "non-increasing)"))
    adaptive: bool = False  # choose k per step from measured costs (speculative/controller.py)
    # --spec-synth-*, resolved: the unconditional rate of keeping drafted token i (None = off)
    synth: list[float] | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if isinstance(self.types, str):
            self.types = SpecConfig.parse_types(self.types)
        if self.types is not None:
            self.types = list(self.types)
            for t in self.types:
                if t not in SPEC_TYPES:
                    raise TandemError(f"unknown spec type {t!r}; supported: "
                                      f"{', '.join(SPEC_TYPES)} (comma-separated list allowed)")
            if "auto" in self.types:  # suffix, then the draft model, with the controller
                self.types = ["suffix", "draft-simple"]
                self.adaptive = True
        if self.n_max < 0 or self.n_min < 0 or self.n_min > max(self.n_max, 0) and self.n_max > 0:
            raise TandemError(f"spec-draft-n-min ({self.n_min}) and -n-max ({self.n_max}) must "
                              "be >= 0 with n-min <= n-max")
        if not (0.0 <= self.p_min <= 1.0 or self.p_min == -1.0):
            raise TandemError(f"spec-draft-p-min must be between 0 and 1 (or -1 for the "
                              f"default), got {self.p_min}")
        if self.draft_window < 0:
            raise TandemError(f"spec-draft-window must be >= 0 (0 = the whole prompt), "
                              f"got {self.draft_window}")
        if self.draft_vocab < 0:
            raise TandemError(f"spec-draft-vocab must be >= 0 (0 = the whole vocabulary), "
                              f"got {self.draft_vocab}")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise TandemError(f"ngram sizes must satisfy 1 <= min ({self.ngram_min}) <= max "
                              f"({self.ngram_max})")
        if self.ngram_m < 1:
            raise TandemError(f"spec-ngram-size-m must be >= 1, got {self.ngram_m}")
        if not 1 <= self.suffix_max <= 64:
            raise TandemError(f"spec-suffix-max must be between 1 and 64, got {self.suffix_max}")
        if self.suffix_pool < 0:
            raise TandemError(f"spec-suffix-pool must be >= 0 (0 = off), got {self.suffix_pool}")
        if isinstance(self.synth_rates, str):
            self.synth_rates = floats("spec-synth-rates", self.synth_rates)
        self.synth = synth_rates(self.synth_len, self.synth_rates, self.n_max)

    @property
    def synth_probs(self) -> list[float]:
        """--spec-synth-*: the probability of accepting drafted token i given that the ones
        before it were (llama-server's conditional form of the unconditional rates); [] = off."""
        out, before = [], 1.0
        for rate in self.synth or ():
            out.append(rate / before if before > 0 else 0.0)
            before = rate
        return out

    @staticmethod
    def parse_types(text: str) -> list[str]:
        types = [t.strip() for t in text.split(",") if t.strip()]
        if not types:
            raise TandemError(f"empty --spec-type {text!r}; supported: {', '.join(SPEC_TYPES)}")
        return types

    @property
    def draft_p_min(self) -> float:
        """p_min as the draft model uses it: given, else 0 (under auto its controller decides,
        token by token, whether one more pass pays: `Controller.extend`)."""
        return max(self.p_min, 0.0)

    def resolved(self, has_draft: bool, head: bool = False) -> SpecConfig:
        """These settings as they run with (or without) a draft model; the one home of the
        rules: nothing given = auto with a draft model, none without; auto without a draft
        model = suffix only, still adaptive; draft-simple without one is an error. head: the
        --model-draft is an EAGLE-3 head, which auto drafts with (draft-eagle3) and which
        draft-simple cannot run; draft-eagle3 without a head is an error."""
        if self.types is None:
            return dataclasses.replace(self, types=["auto" if has_draft else "none"]) \
                .resolved(has_draft, head)
        if has_draft and head and "draft-simple" in self.types:
            if not self.adaptive:
                raise TandemError("the --model-draft is an EAGLE-3 head, which spec type "
                                  "draft-simple cannot run: use --spec-type draft-eagle3 or "
                                  "auto")
            return dataclasses.replace(self, types=[
                "draft-eagle3" if t == "draft-simple" else t for t in self.types])
        if "draft-eagle3" in self.types and not (has_draft and head):
            raise TandemError("spec type draft-eagle3 needs an EAGLE-3 head as --model-draft "
                              "(a GGUF of architecture eagle3 or a Hugging Face EAGLE-3 "
                              "checkpoint)" + (" and the draft given is a model: use "
                                               "draft-simple" if has_draft else ""))
        if not has_draft and "draft-simple" in self.types:
            if self.adaptive:
                return dataclasses.replace(
                    self, types=[t for t in self.types if t != "draft-simple"], adaptive=True)
            raise TandemError("spec type draft-simple needs a draft model and none is loaded: "
                              "give --model-draft PATH, or use suffix, ngram-simple or none")
        return self

    def override(self, request: dict[str, Any], has_draft: bool, head: bool = False) -> SpecConfig:
        """These settings with a request's llama.cpp keys ("speculative.n_max": 8, ...) applied;
        each value must have its field's type. Keys this server does not know are ignored, as
        llama-server ignores them."""
        over: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            key = f.metadata.get("request")
            if key is None or key not in request:
                continue
            value = request[key]
            want = str if f.name == "types" else type(f.default)
            ok = (isinstance(value, (int, float)) if want is float else isinstance(value, want))
            if not ok or isinstance(value, bool):
                raise TandemError(f"{key} must be {_article(want)}, got {value!r}")
            over[f.name] = value
        if not over:
            return self
        if "types" in over:
            over["adaptive"] = False  # "auto" turns it back on in __post_init__
        return dataclasses.replace(self, **over).resolved(has_draft, head)

    def request_view(self) -> dict[str, Any]:
        """The request-settable values under their llama.cpp keys (generation_settings)."""
        view = {}
        for f in dataclasses.fields(self):
            key = f.metadata.get("request")
            if key is not None:
                value = self.draft_p_min if f.name == "p_min" else getattr(self, f.name)
                view[key] = ",".join(value) if f.name == "types" else value
        return view

    @property
    def enabled(self) -> bool:
        return any(t != "none" for t in self.types or ())

    @property
    def uses_draft(self) -> bool:
        """Whether these settings run the draft model or head (auto does, where there is one)."""
        return bool({"draft-simple", "draft-eagle3"} & set(self.types or ()))

    @property
    def max_k(self) -> int:
        """The most tokens one iteration may draft (sizes the KV cache's spare room)."""
        k = 0
        if self.uses_draft:
            k = max(k, self.n_max)
        if "ngram-simple" in (self.types or ()):
            k = max(k, self.ngram_m)
        if "suffix" in (self.types or ()):
            k = max(k, self.suffix_max)
        return k

    @property
    def spare_positions(self) -> int:
        """KV positions each slot keeps beyond the context for [last, *draft] (at least 16, so
        per-request overrides of n_max up to 16 fit)."""
        return max(self.max_k, 16)

    def describe(self, draft_name: str | None = None) -> str:
        """One line saying what runs, in the order the proposers are tried (the server's log)."""
        if not self.enabled:
            return "speculation: OFF (--spec-type none): the target decodes one token per step"
        parts = []
        for t in self.types:
            if t == "draft-simple":
                parts.append(f"draft-simple with {draft_name} (n_max {self.n_max}, n_min "
                             f"{self.n_min}, p_min {self.draft_p_min:g}"
                             + (f", prompt window {self.draft_window}" if self.draft_window else "")
                             + (f", vocabulary {self.draft_vocab} + used ids"
                                if self.draft_vocab else "") + ")")
            elif t == "draft-eagle3":
                parts.append(f"draft-eagle3 with the head {draft_name} (n_max {self.n_max}, "
                             f"n_min {self.n_min}, p_min {self.draft_p_min:g})")
            elif t == "suffix":
                parts.append(f"suffix (longest earlier match, up to {self.suffix_max} tokens"
                             + (f", pool of {self.suffix_pool} output tokens"
                                if self.suffix_pool else "") + ")")
            elif t == "ngram-simple":
                parts.append(f"ngram-simple (n-gram {self.ngram_min}..{self.ngram_max}, up to "
                             f"{self.ngram_m} tokens)")
        line = "speculation: ON: " + ", then ".join(parts)
        if self.adaptive:
            line += ("; auto: each draft sized per step from measured costs and calibrated "
                     "confidences, none when it does not pay")
        if self.synth:
            line += ("; WARNING: synthetic acceptance for benchmarking, the output is not valid "
                     f"(drafted token i kept with probability {rates_text(self.synth)}, "
                     f"mean acceptance length {1 + sum(self.synth):.3f})")
        return line


def _article(t: type) -> str:
    return {str: "a string", int: "an integer", float: "a number"}.get(t, t.__name__)


@dataclass(slots=True, frozen=True)
class Numerics:
    """How one model computes: the weights' form, the compute dtype, the activation rounding of
    the native kernels, threads, and the switches that pick a numeric path (EngineConfig's,
    for one model: `EngineConfig.numerics(role)`).

    kernels: use Tandem's native kernels where they build (off: --weights auto means int4).
    prompt_kernel: products of 16+ rows take the prompt kernel (same bits as row by row).
    native_layers: all decoder layers of a pass in one C call (off: the PyTorch layers).
    """

    weights: str = "auto"
    dtype: str = "auto"
    activations: str = "int8-down64"
    threads: int = 0  # 0 = PyTorch's default (the physical cores), read once by thread_count
    kernels: bool = True
    prompt_kernel: bool = True
    native_layers: bool = True
    kernel_build: str = ""  # a kernels.VARIANTS name; "" = the fastest this CPU runs

    def __post_init__(self) -> None:
        if self.weights not in WEIGHT_MODES:
            raise TandemError(f"weights must be one of {', '.join(WEIGHT_MODES)}, "
                              f"got {self.weights!r}")
        if self.dtype not in DTYPES:
            raise TandemError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.activations not in ACTIVATIONS:
            raise TandemError(f"activations must be one of {', '.join(ACTIVATIONS)}, "
                              f"got {self.activations!r}")
        if self.threads < 0:
            raise TandemError(f"threads must be >= 0 (0 = all cores), got {self.threads}")

    @property
    def bits(self) -> int:
        """The activation bits of every product but the FFN down projection's."""
        return ACTIVATIONS[self.activations][0]

    @property
    def down_bits(self) -> int:
        """The activation bits of the FFN down projection's product."""
        return ACTIVATIONS[self.activations][1]

    @property
    def down_block(self) -> int:
        """Values per int8 activation block of the FFN down projection (0: the weights')."""
        return ACTIVATIONS[self.activations][2]

    @property
    def thread_count(self) -> int:
        """threads, or for 0 PyTorch's default thread count (the physical cores)."""
        if self.threads > 0:
            return self.threads
        import torch

        return torch.get_num_threads()


@dataclass(slots=True)
class EngineConfig:
    """How the engine is laid out and computes: context per slot (the -c flag is the total
    over slots, divided by flags.engine_config; with kv_unified every slot's, shared), slots,
    threads, weights,
    dtype, activation rounding, and the numeric switches (environment variables
    TANDEM_KERNELS, TANDEM_PROMPT_KERNEL, TANDEM_NATIVE_LAYERS = 0 turn them off;
    TANDEM_KERNEL_BUILD=avx2 runs the AVX2 build on an AVX-512 CPU, to time or rule out a path:
    every build gives the same bits)."""

    ctx_size: int = field(default=4096, metadata=flag(
        "-c", "--ctx-size", env="LLAMA_ARG_CTX_SIZE",
        help="context in tokens over all slots, as llama-server: each of --parallel slots gets "
             "ctx-size / parallel"))
    n_parallel: int = field(default=1, metadata=flag(
        "-np", "--parallel", env="LLAMA_ARG_N_PARALLEL",
        help="slots: requests generated at once, batched in one pass"))
    n_threads: int = field(default=0, metadata=flag(
        "-t", "--threads", env="LLAMA_ARG_THREADS",
        help="CPU threads (0 = PyTorch's default: the physical cores)"))
    threads_fixed: bool = field(default=False, metadata=flag(
        "--threads-fixed",
        help="run every pass on --threads threads even while other processes keep some of the "
             "CPUs busy (default: one thread fewer per CPU they take, since every product waits "
             "for its slowest thread; the output is the same either way)"))
    dtype: str = field(default="auto", metadata=flag(
        "--dtype", choices=DTYPES,
        help="compute dtype: auto = float32 for float32 files and native weights, else bfloat16"))
    weights: str = field(default="auto", metadata=flag(
        "--weights", choices=WEIGHT_MODES,
        help="native: GGUF blocks read in place by Tandem's kernels (exact weights); int4: "
             "repack 4-bit blocks for PyTorch's int4 kernel (exact up to bf16 rounding of "
             "scales); dense: dequantize everything to --dtype; auto: native where the kernels "
             "build here, else int4"))
    activations: str = field(default="int8-down64", metadata=flag(
        "--activations", choices=tuple(ACTIVATIONS),
        help="native weights only: how the kernels round activations per block. int16: within "
             "1/32766 of the block's largest value, slower; int8: llama.cpp's Q8_K/Q8_0 "
             "rounding (1/254 of a block of 256); int8-down64: int8, the FFN down projection's "
             "input (which carries most of int8's error) rounded finer than its weights' "
             "block: a scale per 64 values (K-quants), per 16 (Q4_0, Q5_0), int16 (other "
             "types); closer to float32 than int8 at int8's speed (docs/numerics.md); mixed: "
             "int8 except int16 for the down projection (closer still, slower; "
             "bench/results/kl-divergence-mixed)"))
    activations_draft: str = field(default="int8", metadata=flag(
        "--activations-draft", choices=tuple(ACTIVATIONS),
        help="the same for the draft model; int8 by default: the draft only proposes and the "
             "target decides every token, so its rounding changes how often its guesses are "
             "accepted, never the output"))
    batch_size: int = field(default=512, metadata=flag(
        "-b", "--batch-size", env="LLAMA_ARG_BATCH",
        help="the most rows one target pass carries: a prompt read alone goes in chunks of "
             "this size, as llama-server's; while other slots generate, their decode and "
             "verification rows come first, then a chunk of a waiting prompt sized to take "
             "about twice their time (measured), within this limit, so running streams keep "
             "getting tokens while a long prompt is read"))
    kv_unified: bool = field(default=False, metadata=flag(
        "-kvu", "--kv-unified", env="LLAMA_ARG_KV_UNIFIED",
        help="one context of ctx-size positions shared by all slots, as llama-server's: each "
             "slot may use all of it while the slots together hold no more than ctx-size "
             "tokens (idle slots' cached prompts are dropped first; a request that still "
             "does not fit fails with 'the context size has been exceeded'). Default: each "
             "slot owns ctx-size / parallel"))
    cache_ram: int | None = field(default=None, metadata=flag(
        "-cram", "--cache-ram", type=int, metavar="MIB", env="LLAMA_ARG_CACHE_RAM",
        help="host-memory prompt cache, as llama-server's: what a slot held when a request "
             "with another prompt took it stays in RAM (at most this many MiB, least recently "
             "used out first), and a later prompt that starts the same way reads only what "
             "follows. -1: no limit, 0: off. Default: llama-server's 8192, at most a quarter of "
             "the memory available at start"))
    cache_type_k: str = field(default="f16", metadata=flag(
        "-ctk", "--cache-type-k", choices=tuple(CACHE_TYPES), env="LLAMA_ARG_CACHE_TYPE_K",
        help="how the KV cache holds keys, as llama-server's: f16 (default) half the memory "
             "and half the bytes attention reads each token; f32 exactly what the layers "
             "computed. Attention computes in float32 either way; speculation's output equals "
             "the target's alone under either"))
    cache_type_v: str = field(default="f16", metadata=flag(
        "-ctv", "--cache-type-v", choices=tuple(CACHE_TYPES), env="LLAMA_ARG_CACHE_TYPE_V",
        help="the same for values"))
    cache_type_k_draft: str = field(default="f16", metadata=flag(
        "--spec-draft-type-k", "-ctkd", "--cache-type-k-draft", choices=tuple(CACHE_TYPES),
        env="LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_K",
        help="the same for the draft model's keys"))
    cache_type_v_draft: str = field(default="f16", metadata=flag(
        "--spec-draft-type-v", "-ctvd", "--cache-type-v-draft", choices=tuple(CACHE_TYPES),
        env="LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_V",
        help="the same for the draft model's values"))
    prefill_chunk: int = 512  # prompt tokens per target pass when no slot is generating
    # a full context drops half its tokens after the request's n_keep and generation goes on
    # (llama-server's --context-shift; the server's flag sets it), instead of stopping
    context_shift: bool = False
    # llama-server's --cache-idle-slots (the server's flag sets it; on by default, as there):
    # with the host prompt cache on, a request's start copies every idle slot's cached tokens
    # there, and with kv_unified clears those slots, giving their room to the shared context
    cache_idle_slots: bool = True
    kernels: bool = field(default_factory=lambda: _env_switch("TANDEM_KERNELS"))
    prompt_kernel: bool = field(default_factory=lambda: _env_switch("TANDEM_PROMPT_KERNEL"))
    native_layers: bool = field(default_factory=lambda: _env_switch("TANDEM_NATIVE_LAYERS"))
    kernel_build: str = field(default_factory=lambda: os.environ.get("TANDEM_KERNEL_BUILD", ""))

    def __post_init__(self) -> None:
        if self.ctx_size < 16:
            raise TandemError(f"ctx-size must be >= 16, got {self.ctx_size}")
        if self.n_parallel < 1:
            raise TandemError(f"parallel must be >= 1, got {self.n_parallel}")
        if self.batch_size < 2:
            raise TandemError(f"batch-size must be >= 2 (a generating slot's row and a prompt "
                              f"token), got {self.batch_size}")
        if self.cache_ram is not None and self.cache_ram < -1:
            raise TandemError(f"cache-ram must be -1 (no limit), 0 (off) or a size in MiB, "
                              f"got {self.cache_ram}")
        for name in ("cache_type_k", "cache_type_v", "cache_type_k_draft", "cache_type_v_draft"):
            if getattr(self, name) not in CACHE_TYPES:
                raise TandemError(f"{name.replace('_', '-')} {getattr(self, name)!r}: expected "
                                  f"one of {', '.join(CACHE_TYPES)}")
        if self.prefill_chunk < 1:
            raise TandemError(f"prefill chunk must be >= 1, got {self.prefill_chunk}")
        for role in ("target", "draft"):
            self.numerics(role)  # checks weights, dtype and both activations

    def cache_types(self, role: str = "target") -> tuple[str, str]:
        """The KV cache's (key, value) types (CACHE_TYPES) for the target's or the draft's."""
        return ((self.cache_type_k_draft, self.cache_type_v_draft) if role == "draft"
                else (self.cache_type_k, self.cache_type_v))

    def cache_ram_bytes(self, available: int) -> int | None:
        """The host prompt cache's limit in bytes (0: off, None: no limit), `available` the
        memory free at start (for the default)."""
        if self.cache_ram is None:
            return min(8192 << 20, available // 4)
        return None if self.cache_ram < 0 else self.cache_ram << 20

    @property
    def pool(self) -> int | None:
        """With --kv-unified, the tokens all slots may hold together (ctx_size); else None."""
        return self.ctx_size if self.kv_unified else None

    def max_len(self, spec: SpecConfig) -> int:
        """KV positions per slot: the context, room for the largest [last, *draft], one more."""
        return self.ctx_size + spec.spare_positions + 1

    def numerics(self, role: str = "target") -> Numerics:
        """How the target's or the draft's model computes under this config."""
        return Numerics(weights=self.weights, dtype=self.dtype,
                        activations=self.activations_draft if role == "draft" else self.activations,
                        threads=self.n_threads,
                        kernels=self.kernels, prompt_kernel=self.prompt_kernel,
                        native_layers=self.native_layers, kernel_build=self.kernel_build)
