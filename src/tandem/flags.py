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

from .config import EngineConfig, Models, SamplingParams, SpecConfig
from .errors import IncompatibleDraftError, TandemError

SPEC_PREFIX = "spec_"  # SpecConfig's fields are spec_<field> in a parsed namespace


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # exit 2 with one line, as argparse does, no usage dump
        self.exit(2, f"{self.prog}: error: {message}\n")


def _default(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


def add_config_args(group, cls: type, prefix: str = "", skip: tuple[str, ...] = (),
                    defaults: dict[str, Any] | None = None) -> None:
    """One flag per field of `cls` that names one (config.flag), dest prefix + field name, and
    one for its off spellings (--no-slots). The first action of each carries the field's
    metadata (`meta`: flagsdoc.py writes docs/flags.md from it), its LLAMA_ARG_* variables
    (`env`) and the spelling that turns it off (`negative`) for server/envargs.py.
    `defaults` replaces some fields' defaults (a command whose --model has none)."""
    for f in dataclasses.fields(cls):
        meta = f.metadata
        if "flags" not in meta or f.name in skip:
            continue
        default = (defaults or {}).get(f.name, _default(f))
        dest = prefix + f.name
        first = None
        if meta["flags"]:
            first = group.add_argument(*meta["flags"], **_argument(meta, dest, default))
        if meta["off"]:
            off = group.add_argument(*meta["off"], dest=dest, action="store_false",
                                     default=default, help=f"turn {_long(meta['flags'])} off")
            first = first or off
        first.meta, first.env = meta, meta["env"]
        first.negative = next(iter(meta["off"]), None) or next(
            (n for n in meta["flags"] if n.startswith("--no-")), None)


def _long(names: tuple[str, ...]) -> str:
    """A flag's first long spelling (--ctx-size for -c, --ctx-size)."""
    return next((n for n in names if n.startswith("--")), names[0] if names else "")


def _argument(meta: dict[str, Any], dest: str, default: Any) -> dict[str, Any]:
    """argparse's keywords for a field's flag, from its metadata and default."""
    kw: dict[str, Any] = {"dest": dest, "help": meta["help"]}
    if meta["action"] is not None:
        return {**kw, "action": meta["action"], "nargs": 0}
    if isinstance(default, bool) or (meta["off"] and default is None):  # a switch
        return {**kw, "action": "store_true", "default": default}
    if isinstance(default, list):
        return {**kw, "action": "append", "default": None}  # argparse would append to a default
    kind = meta["type"] or (str if default is None else type(default))
    kw.update(type=kind, default=default)
    if default is not None:
        kw["help"] = f"{meta['help']} (default {default})"
    if meta["const"] is not None:
        kw.update(nargs="?", const=meta["const"])
    if meta["choices"]:
        kw["choices"] = meta["choices"]
    else:
        kw["metavar"] = meta["metavar"] or {int: "N", float: "X"}.get(kind, "TEXT")
    return kw


def config_of(cls: type, ns: argparse.Namespace, prefix: str = "", **given: Any):
    """The config `cls` from parsed flags (fields without a flag, or not parsed, keep their
    defaults; `given` sets fields that no flag names, such as a nested config)."""
    values = dict(given)
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
    add_config_args(g, Models, defaults={"model": default_model})
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
    cfg = config_of(SpecConfig, a, SPEC_PREFIX).resolved(
        has_draft=bool(a.model_draft), head=bool(a.model_draft) and draft_is_head(a.model_draft))
    if a.model_draft and not cfg.uses_draft:
        print(f"tandem: warning: --model-draft is given but --spec-type "
              f"{','.join(cfg.types)} does not use it", file=sys.stderr)
    return cfg


def draft_is_head(name: str) -> bool:
    """Whether --model-draft names an EAGLE-3 head (a GGUF of architecture eagle3 or a
    Hugging Face EAGLE-3 directory; a named model is resolved without pulling it)."""
    from .models.eagle3 import is_head
    from .registry import local_path

    return is_head(local_path(name) or name)


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
        if isinstance(action, argparse._StoreConstAction):  # a switch, or its off spelling
            argv += [name] if value is action.const and value != action.default else []
        elif isinstance(action, argparse._AppendAction):
            for v in value or []:
                argv += [name, str(v)]
        elif value is not None:
            argv += [name, str(value)]
    return argv


def load_engine(model: str, model_draft: str | None, cfg: EngineConfig, spec: SpecConfig,
                log: Callable[[str], None] | None = None):
    """Load the target (and the draft or head when `spec`, resolved by spec_config, uses it),
    check the pair; the Engine."""
    from .engine import Engine
    from .models.loader import load_model
    from .speculative.compat import check_compatible

    max_len = cfg.max_len(spec)
    target = load_model(model, cfg.numerics("target"), max_len=max_len)
    draft = None
    if "draft-eagle3" in spec.types:  # (resolved: the draft is an EAGLE-3 head)
        from .models.eagle3 import load_head
        from .registry import resolve

        draft = load_head(resolve(model_draft), target, cfg.numerics("draft"), max_len)
    elif spec.uses_draft:
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
            head = getattr(draft, "target_layers", None)
            what = "compatible" if head is None else (
                f"an EAGLE-3 head ({draft.source}, {draft.draft_vocab} draft ids, target "
                f"layers {list(head)}) that matches the target")
            log(f"draft {draft.path} loaded in {draft.load_seconds:.1f} s (kernel layouts "
                f"{laid[1]:.1f} s); {what}")
    return Engine(target, draft, cfg, spec)
