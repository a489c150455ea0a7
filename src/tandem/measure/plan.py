"""What `tandem bench` runs, checked before any server loads: the configurations (Variant), the
models, the client, the prompts and the out dir with its command record (Plan, `make_plan`)."""

from __future__ import annotations

import argparse
import importlib.util
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from .. import flags
from ..config import SpecConfig
from ..errors import TandemError

CLIENT = Path("scripts") / "speculative-benchmark.py"  # relative to the repository root


@dataclass(slots=True, frozen=True)
class Variant:
    """One server configuration: the file stem of its results and its speculation flags."""

    name: str
    spec_type: str
    n_max: int | None = None  # None: the --spec-draft-n-max flag
    engine: str = "tandem"  # or "llama.cpp": --llama-server, with llama.cpp's own defaults

    @property
    def uses_draft(self) -> bool:
        if self.engine != "tandem":  # llama.cpp's own type names
            return bool({"draft-simple", "draft-eagle3"} & set(self.spec_type.split(",")))
        return SpecConfig(types=self.spec_type).uses_draft

    def label(self, n_max: int) -> str:
        if self.engine != "tandem":
            return f"{self.engine} {self.spec_type}"
        return f"{self.spec_type} n-max {n_max}" if self.uses_draft else self.spec_type


BASELINE = Variant("baseline", "none")
SWEEP = (
    Variant("draft-n2", "draft-simple", 2),
    Variant("draft-n4", "draft-simple", 4),
    Variant("draft-n8", "draft-simple", 8),
    Variant("ngram", "ngram-simple"),
    Variant("suffix", "suffix"),
    Variant("auto", "auto"),
)
LLAMA = (  # --llama-server: the same client against llama.cpp, in the same turns
    Variant("llama-none", "none", engine="llama.cpp"),
    Variant("llama-draft", "draft-simple", engine="llama.cpp"),
    Variant("llama-eagle3", "draft-eagle3", engine="llama.cpp"),  # -md an EAGLE-3 head
    Variant("llama-ngram", "ngram-simple", engine="llama.cpp"),
    Variant("llama-ngram-mod", "ngram-mod", engine="llama.cpp"),
    Variant("llama-ngram-map-k", "ngram-map-k", engine="llama.cpp"),
)
LLAMA_TYPES = tuple(v.spec_type for v in LLAMA[1:])  # --llama-spec-types can name these


@dataclass(slots=True)
class Plan:
    """What to run, resolved from the flags once: models, client, out dir, the command record."""

    args: argparse.Namespace
    target: str
    draft: str | None
    variants: list[Variant]  # the speculative configurations, measured after the baseline
    client: Path
    out_dir: Path
    command: str  # the bench command line, as typed
    record: list[str]  # lines of command.txt, written again after every command

    def note(self, line: str) -> None:
        self.record.append(line)
        (self.out_dir / "command.txt").write_text("\n".join(self.record) + "\n", encoding="utf-8")

    def configuration(self, variant: Variant) -> argparse.Namespace:
        """The flags `tandem serve` gets for this configuration (see `configuration`)."""
        return configuration(self.args, variant, self.target, self.draft)

    def llama_variants(self) -> list[Variant]:
        """llama.cpp's configurations for --llama-server: its target alone, then those of
        --llama-spec-types (draft-simple only with a draft)."""
        if self.args.llama_server is None:
            return []
        wanted = {"none", *llama_types(self.args)}
        return [v for v in LLAMA
                if v.spec_type in wanted and (self.draft is not None or not v.uses_draft)]


def llama_types(args: argparse.Namespace) -> list[str]:
    """--llama-spec-types as a checked list."""
    text = getattr(args, "llama_spec_types", None) or "draft-simple,ngram-simple"
    types = [t.strip() for t in text.split(",") if t.strip()]
    for t in types:
        if t not in LLAMA_TYPES:
            raise TandemError(f"--llama-spec-types: unknown type {t!r}; choose from "
                              f"{', '.join(LLAMA_TYPES)}")
    return types


def concurrency_levels(text: str) -> list[int]:
    """--concurrency as a checked list of positive integers, in the order given."""
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        levels = []
    if not levels or min(levels) < 1:
        raise TandemError(f"--concurrency must list positive integers, e.g. 1,2,4; got {text!r}")
    return levels


def say(message: str) -> None:
    print(f"tandem bench: {message}", file=sys.stderr, flush=True)


def make_plan(args: argparse.Namespace) -> Plan:
    """Check every flag and the prompts before any server loads, then create the out dir."""
    for name, low in (("passes", 1), ("warmup", 0), ("n_predict", 1)):
        if getattr(args, name) < low:
            flag = "--" + name.replace("_", "-")
            raise TandemError(f"{flag} must be >= {low}, got {getattr(args, name)}")
    if args.port is not None and not 1 <= args.port <= 65535:
        raise TandemError(f"--port must be 1..65535, got {args.port}")
    if not args.load_timeout > 0:
        raise TandemError(f"--load-timeout must be > 0 seconds, got {args.load_timeout:g}")
    if getattr(args, "load", False):
        if args.sweep:
            raise TandemError("--load and --sweep are separate runs; choose one")
        concurrency_levels(args.concurrency)
    if args.sweep and args.spec_types is not None:
        raise TandemError(f"--sweep chooses the spec types itself; drop --spec-type "
                          f"{args.spec_types} (or drop --sweep to measure just that one)")
    target, draft = resolve_models(args)
    todo = variants(args, draft)
    for variant in [BASELINE, *todo]:
        validate(configuration(args, variant, target, draft))
    if args.llama_server is not None:
        llama_types(args)
        check_llama_server(args.llama_server, target, draft)
    client = find_client(args.client)
    check_prompts(client, args)
    out_dir = make_out_dir(args.out_dir)
    command = shlex.join(getattr(args, "argv", None) or sys.argv)
    plan = Plan(args, target, draft, todo, client, out_dir, command, [])
    for line in header(command):
        plan.note(line)
    return plan


def resolve_models(args: argparse.Namespace) -> tuple[str, str | None]:
    """The target and draft to serve; no --model and no --model-draft is the default pair."""
    target = args.model or "default"
    draft = args.model_draft or ("default-draft" if args.model is None else None)
    return target, draft


def variants(args: argparse.Namespace, draft: str | None) -> list[Variant]:
    """The speculative configurations to measure against the baseline."""
    if args.sweep:
        usable = [v for v in SWEEP if draft is not None or not v.uses_draft]
        if len(usable) < len(SWEEP):
            say("no --model-draft: the sweep measures ngram-simple only")
        return usable
    if args.spec_types is not None:
        return [Variant("candidate", args.spec_types)]
    if draft is None:
        raise TandemError(f"nothing to speculate with: --model {args.model} has no draft; add "
                          "--model-draft PATH or --spec-type ngram-simple")
    return [Variant("candidate", "auto")]  # what the server runs with a draft and no --spec-type


def configuration(args: argparse.Namespace, variant: Variant, target: str,
                  draft: str | None) -> argparse.Namespace:
    """The flags of one configuration: the bench's model, engine and speculation flags with the
    variant's spec type, the draft only where that type uses it, the bench's --parallel slots
    (1 unless told); a sweep's n-max lowers --spec-draft-n-min to fit."""
    n_max, n_min = args.spec_n_max, args.spec_n_min
    if variant.n_max is not None:
        n_max, n_min = variant.n_max, min(n_min, variant.n_max)
    return argparse.Namespace(**{
        **vars(args), "model": target, "model_draft": draft if variant.uses_draft else None,
        "spec_types": variant.spec_type, "spec_n_max": n_max, "spec_n_min": n_min,
        "n_parallel": getattr(args, "n_parallel", 1),
    })


def validate(config: argparse.Namespace) -> None:
    """The checks `tandem serve` makes at start-up, made now so a typo costs no loading time."""
    flags.engine_config(config)
    flags.spec_config(config)


def check_llama_server(path: str, target: str, draft: str | None) -> None:
    """--llama-server must be an executable, and the models GGUF files (llama.cpp reads no
    safetensors folder)."""
    from ..registry import resolve

    exe = Path(path)
    if not exe.is_file() or not os.access(exe, os.X_OK):
        raise TandemError(f"--llama-server {path!r} is not an executable file")
    for flag, model in (("--model", target), ("--model-draft", draft)):
        if model is not None and resolve(model, quiet=True).is_dir():
            raise TandemError(f"--llama-server needs GGUF files; {flag} {model} is a folder")


def find_client(path: str | None) -> Path:
    """--client, or scripts/speculative-benchmark.py of the source tree tandem is imported from."""
    import tandem

    client = Path(path) if path else Path(tandem.__file__).resolve().parents[2] / CLIENT
    if not client.is_file():
        how = "pass --client PATH" if path else (
            "tandem bench needs the source tree (pip install -e .), or pass --client "
            "PATH/TO/scripts/speculative-benchmark.py")
        raise TandemError(f"the benchmark client {str(client)!r} does not exist; {how}")
    return client


def check_prompts(client: Path, args: argparse.Namespace) -> None:
    """Read --prompts with the client's own reader, so a bad file fails before any loading."""
    spec = importlib.util.spec_from_file_location("tandem_bench_client", client)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        module.load_tasks(args.prompts, args.n_predict)
    except module.BenchError as e:
        raise TandemError(str(e)) from None


def make_out_dir(path: str | None) -> Path:
    """A new (or empty) folder, so results committed under bench/ are never overwritten."""
    out = Path(path) if path else Path("bench", "results", datetime.now().strftime("%Y%m%d-%H%M%S"))
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise TandemError(f"--out-dir {str(out)!r} exists and is not an empty folder; pick a new "
                          "one, so earlier results are kept")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise TandemError(f"cannot create --out-dir {str(out)!r}: {e.strerror or e}") from None
    return out


def header(command: str) -> list[str]:
    """command.txt's first lines: when and where, the source's commit, the bench command."""
    lines = [f"# {datetime.now().astimezone().isoformat(timespec='seconds')}, cwd {Path.cwd()}",
             command]
    commit = git_commit()
    if commit:
        lines.insert(1, f"# source: {commit}")
    return lines


def git_commit() -> str | None:
    import tandem

    root = Path(tandem.__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return None
    try:
        sha = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", "src",
                                "scripts"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    return f"git {sha}{' with uncommitted changes' if dirty.strip() else ''}" if sha else None
