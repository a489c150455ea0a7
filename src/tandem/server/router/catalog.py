"""The models a router may load, as llama-server finds them (common/preset.cpp):

    --models-dir DIR      DIR/NAME.gguf                 model NAME
                          DIR/NAME/*.gguf               model NAME: its GGUF, a projector (a file
                                                        whose name holds "mmproj"), or a split
                                                        model's shards (-00001-of-0000N first)
    llama-server's cache  models--user--repo/...        model user/repo:TAG (hfcache.py; a
                                                        directory model of that name wins)
    --models-preset FILE  [NAME] model = PATH, keys     model NAME with its own flags
                          [NAME] hf-repo = user/repo    the same, the file from the cache
                                                        (not there: downloaded when it loads,
                                                        hub.py; with --offline an error)
                          [*] keys                      every model's flags (a section wins)
                          [NAME] keys (NAME in DIR)     that directory (or cache) model's flags

A key is a `tandem serve` flag without its dashes (ctx-size, c, model-draft, spec-type), or its
LLAMA_ARG_* variable; `jinja = false` is --no-jinja. load-on-startup, stop-timeout and
dedup-cache-models are the preset's own (llama-server's; dedup-cache-models hides the cache
entries of a section's hf-repo files from the list). A key Tandem does not know, a download
Tandem does not make (hf-file, model-url), and with --offline an hf-repo not in the cache, is
an error at start naming the key, the section and the file (exit 2).

`Catalog` holds them as `Entry`s (id, first GGUF, shards, projector, flags); the router's
state keeps it at `app.state.catalog`, and `reload` reads the sources again (GET
/models?reload=1).
"""

from __future__ import annotations

import argparse
import configparser
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import TandemError
from . import hfcache

SHARD = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")
COMPANION_PREFIXES = ("mtp-", "dspark-", "dflash-")  # llama-server's draft sidecars: skipped
PRESET_ONLY = ("load-on-startup", "stop-timeout", "dedup-cache-models")
HF_MODEL, HF_DRAFT = ("hf-repo", "hfr"), ("spec-draft-hf", "hf-repo-draft", "hfd", "hfrd")
# set by the router for each child: a preset's value would be overwritten (llama-server's
# unset_reserved_args), so it is refused rather than silently dropped
RESERVED = ("host", "port", "api-key", "models-dir", "models-preset", "models-max",
            "models-autoload", "no-models-autoload")
DOWNLOADS = ("hf-file", "hff", "model-url", "mu", "hf-token", "hf-file-draft", "hffd")
TRUE, FALSE = ("1", "true", "on", "yes", "enabled"), ("0", "false", "off", "no", "disabled")
GLOBAL = "*"


@dataclass(slots=True)
class Entry:
    """One model the router may load: `path` is the first GGUF (a split model's first shard),
    `files` every file it reads, `args` its own flags (the preset's [*] then its section)."""

    id: str
    path: Path
    source: str  # "cache", "models_dir" or "preset", as llama-server's GET /models says
    files: list[Path] = field(default_factory=list)
    mmproj: Path | None = None
    args: list[str] = field(default_factory=list)
    draft: str | None = None  # the preset's model-draft, as written
    aliases: list[str] = field(default_factory=list)
    tags: list[str] = field(default_factory=list)
    load_on_startup: bool = False
    stop_timeout: float = 10.0
    preset: str = ""  # the section as INI text (GET /models shows it)
    hidden: bool = False  # a cache model a preset's dedup-cache-models hides from the list
    fetch: list[str] = field(default_factory=list)  # hf-repo names to download before a load

    def model_args(self) -> list[str]:
        """The files' flags: --model, --mmproj (the preset's model-draft is among `args`)."""
        out = ["--model", str(self.path)]
        return out + (["--mmproj", str(self.mmproj)] if self.mmproj is not None else [])


class Catalog:
    """The entries of llama-server's cache (hfcache.py), --models-dir and --models-preset, by
    id; `parser` is `tandem serve`'s, whose flags a preset's keys name."""

    def __init__(self, models_dir: str | None, preset: str | None,
                 parser: argparse.ArgumentParser, offline: bool = False) -> None:
        self.models_dir, self.preset_path, self.parser = models_dir, preset, parser
        self.offline = offline  # a preset's hf-repo must be in the cache already
        self._entries: dict[str, Entry] = {}
        self.reload()

    def reload(self) -> None:
        """Read the cache, the directory and the preset again (a missing folder or file is a
        TandemError); a directory model replaces a cache model of its name."""
        cache = hfcache.cached_models()
        # (not resolved: a hub cache's files are links to blobs without their names)
        entries = {m.id: Entry(m.id, Path(os.path.abspath(m.path)), "cache", files=m.files,
                               mmproj=m.mmproj) for m in cache}
        if self.models_dir:
            for e in scan_dir(Path(self.models_dir)):
                entries[e.id] = e
        if self.preset_path:
            read_preset(Path(self.preset_path), entries, self.parser, cache, self.offline)
        self._entries = dict(sorted(entries.items()))

    def entries(self, hidden: bool = False) -> list[Entry]:
        """Every entry GET /models lists (hidden=True: the hidden ones too)."""
        return [e for e in self._entries.values() if hidden or not e.hidden]

    def get(self, name: str) -> Entry | None:
        """The entry named `name`, or whose aliases hold it."""
        if name in self._entries:
            return self._entries[name]
        return next((e for e in self._entries.values() if name in e.aliases), None)

    def by_path(self, path: str) -> Entry | None:
        """The entry whose first GGUF is `path` (a draft given as a file)."""
        p = os.path.realpath(path)
        return next((e for e in self._entries.values() if os.path.realpath(e.path) == p), None)


def scan_dir(d: Path) -> list[Entry]:
    """llama-server's --models-dir: NAME.gguf files, and NAME/ folders of several files."""
    if not d.is_dir():
        raise TandemError(f"--models-dir {d}: no such folder")
    out = []
    for p in sorted(d.iterdir()):
        if p.is_dir():
            e = _scan_subdir(p)
            if e is not None:
                out.append(e)
        elif p.suffix == ".gguf" and not _companion(p.name):
            out.append(Entry(p.stem, p.resolve(), "models_dir", files=_shards(p)))
    return out


def _companion(name: str) -> bool:
    return "mmproj" in name or name.startswith(COMPANION_PREFIXES)


def _scan_subdir(d: Path) -> Entry | None:
    model = first = mmproj = None
    for p in sorted(d.iterdir()):
        if p.suffix != ".gguf" or not p.is_file():
            continue
        if "mmproj" in p.name:
            mmproj = p
        elif p.name.startswith(COMPANION_PREFIXES):
            continue
        elif "-00001-of-" in p.name:
            first = p
        elif SHARD.search(p.name) is None:
            model = p
    path = first or model
    if path is None:
        return None
    return Entry(d.name, path.resolve(), "models_dir", files=_shards(path),
                 mmproj=None if mmproj is None else mmproj.resolve())


def _shards(first: Path) -> list[Path]:
    """Every shard a split model's first names (-00001-of-00003: three), present or not: a
    missing one is refused when the model loads, naming it (models/gguf_file.py)."""
    m = SHARD.search(first.name)
    if m is None:
        return [first.resolve()]
    n, stem = int(m.group(2)), first.name[:m.start()]
    return [(first.parent / f"{stem}-{k:05d}-of-{n:05d}.gguf").resolve() for k in range(1, n + 1)]


def read_preset(path: Path, entries: dict[str, Entry], parser: argparse.ArgumentParser,
                cache: list[hfcache.CachedModel] = (), offline: bool = True) -> None:
    """llama-server's INI presets into `entries`: a section naming a directory or cache model
    adds its flags to it, any other section is a model of its own and needs `model = PATH` or
    `hf-repo = user/model[:tag]` (a model of llama-server's cache; not there, it is listed in
    `fetch` to be downloaded when it loads, its path a stand-in: an error if `offline`)."""
    fetch: list[str] = []

    def hub_model(section: str, key: str, name: str | None) -> hfcache.CachedModel | None:
        found = _from_cache(path, section, key, name, cache, offline)
        if name and found is None:
            fetch.append(name)
        return found

    ini = _parse_ini(path)
    glob = ini.pop(GLOBAL, {})
    glob_flags, glob_own = _section_flags(path, GLOBAL, glob, parser)
    for name, keys in ini.items():
        words, own = _section_flags(path, name, keys, parser)
        fetch.clear()
        model = keys.get("model")
        hub = None if model else hub_model(name, "hf-repo", own.get("hf-repo"))
        e = entries.get(name)
        if e is None:
            if not model and hub is None and not fetch:
                raise TandemError(f"{path}: [{name}] is not a model of --models-dir or the "
                                  "cache and has neither 'model = PATH' nor 'hf-repo = "
                                  "user/model[:tag]'")
            p = Path(os.path.abspath(hub.path)) if hub is not None and not model else \
                Path(model).expanduser().resolve() if model else Path(f"hf:{fetch[0]}")
            e = entries[name] = Entry(name, p, "preset", files=[] if fetch else _shards(p))
            if hub is not None and not model:
                e.files, e.mmproj = hub.files, hub.mmproj
        elif keys.get("model"):
            e.path = Path(keys["model"]).expanduser().resolve()
            e.files = _shards(e.path)
        if own.get("mmproj") or glob_own.get("mmproj"):
            e.mmproj = Path(own.get("mmproj") or glob_own["mmproj"]).expanduser().resolve()
        merged = {**glob, **keys}
        e.args = glob_flags + words
        e.draft = own.get("model-draft", glob_own.get("model-draft")) or None
        hub_draft = hub_model(name, "spec-draft-hf", own.get("hf-draft",
                                                             glob_own.get("hf-draft")))
        if hub_draft is not None:
            e.draft = str(hub_draft.path)
        e.fetch = list(fetch)
        if _bool(path, name, "dedup-cache-models", own.get(
                "dedup-cache-models", glob_own.get("dedup-cache-models", "0"))):
            _hide_cached(entries, [e.path] + ([Path(e.draft)] if e.draft else []))
        e.aliases = _list(merged.get("alias") or merged.get("a"))
        e.tags = _list(merged.get("tags"))
        e.load_on_startup = _bool(path, name, "load-on-startup",
                                  own.get("load-on-startup", glob.get("load-on-startup", "0")))
        e.stop_timeout = _number(path, name, "stop-timeout",
                                 own.get("stop-timeout", glob.get("stop-timeout", "10")))
        e.preset = "\n".join([f"[{name}]", *(f"{k} = {v}" for k, v in merged.items())])


def _from_cache(path: Path, section: str, key: str, name: str | None,
                cache: list[hfcache.CachedModel], offline: bool) -> hfcache.CachedModel | None:
    if not name:
        return None
    found = hfcache.find(name, cache)
    if found is None and offline:
        raise TandemError(f"{path}: [{section}] {key} = {name}: not in llama-server's cache "
                          f"({hfcache.cache_dir()}), and --offline forbids downloading it: "
                          "download it first (without --offline), or give 'model = PATH'")
    if found is None:
        from .hub import HubError, split_name

        try:
            split_name(name)
        except HubError as err:
            raise TandemError(f"{path}: [{section}] {key}: {err}") from None
    return found


def _hide_cached(entries: dict[str, Entry], paths: list[Path]) -> None:
    """dedup-cache-models: the cache entries of these files leave the list (still usable)."""
    real = {os.path.realpath(p) for p in paths}
    for e in entries.values():
        if e.source == "cache" and os.path.realpath(e.path) in real:
            e.hidden = True


def _parse_ini(path: Path) -> dict[str, dict[str, str]]:
    """The sections in file order, keys as written; keys before any section (llama-server's
    `version = 1`) are not a model's."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise TandemError(f"--models-preset {path}: {e.strerror or e}") from None
    cp = configparser.ConfigParser(interpolation=None, strict=False, default_section="\0",
                                   comment_prefixes=(";", "#"), inline_comment_prefixes=None)
    cp.optionxform = str  # LLAMA_ARG_* keys keep their case
    try:
        cp.read_string("[\0top]\n" + text, source=str(path))
    except configparser.Error as e:
        raise TandemError(f"--models-preset {path}: not an INI file: {e}".replace(
            "[\0top]\n", "")) from None
    return {s: {k: v.strip() for k, v in cp.items(s)} for s in cp.sections() if s != "\0top"}


def _section_flags(path: Path, section: str, keys: dict[str, str],
                   parser: argparse.ArgumentParser) -> tuple[list[str], dict[str, str]]:
    """A section's keys as `tandem serve` words, and its preset-only keys."""
    words: list[str] = []
    own: dict[str, str] = {}
    for key, value in keys.items():
        if key in PRESET_ONLY:
            own[key] = value
        elif key == "model" and section != GLOBAL:
            continue  # the entry's path
        elif key in HF_MODEL or key in HF_DRAFT:  # read from llama-server's cache
            own["hf-repo" if key in HF_MODEL else "hf-draft"] = value
        elif key in DOWNLOADS:
            raise TandemError(f"{path}: [{section}] {key}: not supported by Tandem; give "
                              "'model = PATH' of a local GGUF file, or 'hf-repo = "
                              "user/model[:tag]' (downloaded into the cache if not there)")
        elif key.removeprefix("no-") in RESERVED:
            raise TandemError(f"{path}: [{section}] {key}: set by the router for every model "
                              "(llama-server overwrites it too); remove it from the preset")
        else:
            action, _ = _action(parser, key)
            if action is not None and action.dest in ("model_draft", "mmproj"):
                own[action.dest.replace("_", "-")] = value  # the entry's files
                continue
            words += _words(path, section, key, value, parser)
    return words, own


def _words(path: Path, section: str, key: str, value: str,
           parser: argparse.ArgumentParser) -> list[str]:
    action, flag = _action(parser, key)
    if action is None:
        raise TandemError(f"{path}: [{section}] unknown key {key!r}: not a flag of tandem serve "
                          "(`tandem serve --help`), its LLAMA_ARG_* variable, or one of the "
                          f"preset's own ({', '.join(PRESET_ONLY)})")
    if action.nargs != 0:  # a flag with a value
        return [f"{flag}={value}"]
    on = _bool(path, section, key, value)
    if isinstance(action, argparse._StoreFalseAction):  # the key is an off spelling (no-x)
        on = not on
        return [flag] if not on else []
    return [flag] if on else ([action.negative] if getattr(action, "negative", None) else [])


def _action(parser: argparse.ArgumentParser, key: str):
    """The parser action a key names: the flag (long or short) or its LLAMA_ARG_* variable."""
    known = parser._option_string_actions
    for flag in (f"--{key}", f"-{key}"):
        if flag in known:
            return known[flag], flag
    for action in parser._actions:
        if key in getattr(action, "env", ()):
            return action, next(s for s in action.option_strings if s.startswith("--"))
    return None, None


def _bool(path: Path, section: str, key: str, value: str) -> bool:
    v = value.strip().lower()
    if v in TRUE or v == "":
        return True
    if v in FALSE:
        return False
    raise TandemError(f"{path}: [{section}] {key} = {value!r}: expected true or false")


def _number(path: Path, section: str, key: str, value: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise TandemError(f"{path}: [{section}] {key} = {value!r}: expected a number of "
                          "seconds") from None


def _list(value: str | None) -> list[str]:
    return [w.strip() for w in (value or "").split(",") if w.strip()]
