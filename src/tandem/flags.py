"""Command-line flags shared by every command, and loading the models they name.

Below every command (generate, check, serve, bench) and above the engine. The flags of the
config dataclasses are built from their fields (`config.flag` metadata: names, help, choices),
so a setting is spelled once; `config_of` turns parsed flags back into a config, and `to_argv`
writes parsed flags back out as a command line (`tandem bench` starts its servers with it).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any, Callable

from .config import EngineConfig, SamplingParams, SpecConfig
from .errors import IncompatibleDraftError, TandemError

SPEC_PREFIX = "spec_"  # SpecConfig's fields are spec_<field> in a parsed namespace


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # exit 2 with one line, as argparse does, no usage dump
        self.exit(2, f"{self.prog}: error: {message}\n")


def _default(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


def add_config_args(group, cls: type, prefix: str = "", skip: tuple[str, ...] = ()) -> None:
    """One flag per field of `cls` that names one (config.flag), dest prefix + field name."""
    for f in dataclasses.fields(cls):
        meta = f.metadata
        if "flags" not in meta or f.name in skip:
            continue
        default = _default(f)
        kw: dict[str, Any] = {"dest": prefix + f.name, "help": meta["help"]}
        if isinstance(default, bool):
            kw.update(action="store_true", default=default)
        elif isinstance(default, list):
            kw.update(action="append", default=None)  # argparse would append to a shared default
        elif default is None:
            kw.update(default=None)
            if meta.get("type"):
                kw.update(type=meta["type"], metavar=meta.get("metavar") or "N")
        else:
            kw.update(type=type(default), default=default,
                      help=f"{meta['help']} (default {default})")
        if meta.get("choices"):
            kw["choices"] = meta["choices"]
        elif "action" not in kw and "metavar" not in kw:
            kw["metavar"] = {int: "N", float: "X"}.get(type(default), "TEXT")
        group.add_argument(*meta["flags"], **kw)


def config_of(cls: type, ns: argparse.Namespace, prefix: str = ""):
    """The config `cls` from parsed flags (fields without a flag, or not parsed, keep their
    defaults)."""
    values = {}
    for f in dataclasses.fields(cls):
        if "flags" in f.metadata and hasattr(ns, prefix + f.name):
            value = getattr(ns, prefix + f.name)
            if isinstance(_default(f), list):
                value = list(value or [])
            values[f.name] = value
    return cls(**values)


def add_model_args(p: argparse.ArgumentParser, *, default_model: str | None = "default",
                   parallel: bool = False) -> None:
    """The target and draft models and the engine's settings (-np/--parallel where a command
    serves several requests at once)."""
    g = p.add_argument_group("model and engine")
    g.add_argument("-m", "--model", default=default_model,
                   help="target: a .gguf file, a Hugging Face directory or a model name "
                        "(default, default-draft, smollm2-135m, gemma3-270m)")
    g.add_argument("-md", "--model-draft", default=None, help="draft model (name or path)")
    add_config_args(g, EngineConfig,
                    skip=() if parallel else ("n_parallel", "batch_size", "kv_unified",
                                              "cache_ram"))


def add_spec_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("speculative decoding (llama-server's spelling)")
    add_config_args(g, SpecConfig, prefix=SPEC_PREFIX)


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    add_config_args(p.add_argument_group("sampling"), SamplingParams)


def spec_config(a: argparse.Namespace) -> SpecConfig:
    """The speculation settings as they will run with the given draft model (or none)."""
    cfg = config_of(SpecConfig, a, SPEC_PREFIX).resolved(has_draft=bool(a.model_draft))
    if a.model_draft and not cfg.uses_draft:
        print(f"tandem: warning: --model-draft is given but --spec-type "
              f"{','.join(cfg.types)} does not use it", file=sys.stderr)
    return cfg


def engine_config(a: argparse.Namespace) -> EngineConfig:
    """The engine's config; --ctx-size is the context over all slots (llama-server's meaning),
    so each slot gets ctx-size / parallel, or with --kv-unified may use all of it (shared)."""
    cfg = config_of(EngineConfig, a)
    if cfg.n_parallel > 1 and not cfg.kv_unified:
        per_slot = cfg.ctx_size // cfg.n_parallel
        if per_slot < 16:
            raise TandemError(f"--ctx-size {cfg.ctx_size} over --parallel {cfg.n_parallel} "
                              f"slots leaves {per_slot} tokens per slot; each needs >= 16")
        cfg = dataclasses.replace(cfg, ctx_size=per_slot)
    return cfg


def sampling_params(a: argparse.Namespace) -> SamplingParams:
    return config_of(SamplingParams, a)


def to_argv(a: argparse.Namespace, *groups: Callable[[argparse.ArgumentParser], None]) -> list[str]:
    """The flags of `groups` (add_model_args, add_spec_args, ...) with their values in `a`,
    as a command line: each flag under its first long name, a value that is None left out."""
    p = argparse.ArgumentParser(add_help=False)
    for add in groups:
        add(p)
    argv: list[str] = []
    for action in p._actions:
        if not action.option_strings or not hasattr(a, action.dest):
            continue
        name = next((o for o in action.option_strings if o.startswith("--")),
                    action.option_strings[0])
        value = getattr(a, action.dest)
        if isinstance(action, argparse._StoreTrueAction):
            argv += [name] if value else []
        elif isinstance(action, argparse._StoreFalseAction):
            argv += [] if value else [name]
        elif isinstance(action, argparse._AppendAction):
            for v in value or []:
                argv += [name, str(v)]
        elif value is not None:
            argv += [name, str(value)]
    return argv


def load_engine(model: str, model_draft: str | None, cfg: EngineConfig, spec: SpecConfig,
                log: Callable[[str], None] | None = None):
    """Load the target (and the draft when `spec` uses it), check the pair; the Engine."""
    from .engine import Engine
    from .models.loader import load_model
    from .speculative.compat import check_compatible

    max_len = cfg.max_len(spec)
    target = load_model(model, cfg.numerics("target"), max_len=max_len)
    draft = None
    if spec.uses_draft:
        draft = load_model(model_draft, cfg.numerics("draft"), max_len=max_len)
        res = check_compatible(target.tokenizer, draft.tokenizer)
        if not res.ok:
            raise IncompatibleDraftError(
                f"draft {model_draft} cannot be used with target {model}: {res.message}")
    # the kernels' own layouts now, so that no request's prompt time pays them
    laid = [m.prepare_kernels() for m in (target, draft) if m is not None]
    if log is not None:
        log(f"target {target.path} ({target.args.arch}, {target.args.n_layers} layers) loaded "
            f"in {target.load_seconds:.1f} s (kernel layouts {laid[0]:.1f} s)")
        if draft is not None:
            log(f"draft {draft.path} loaded in {draft.load_seconds:.1f} s (kernel layouts "
                f"{laid[1]:.1f} s); compatible")
    return Engine(target, draft, cfg, spec)
