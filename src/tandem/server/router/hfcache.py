"""The models downloaded from the Hugging Face hub (by llama-server -hf user/model:tag, or by
Tandem's router: POST /models, a preset's hf-repo, serve -hf; hub.py), read where llama-server
keeps them, offline: its router lists them as its "cache" source, and a preset's `hf-repo`
names one.

The cache is Hugging Face's hub layout (common/hf-cache.cpp), in the first of $LLAMA_CACHE,
$HF_HUB_CACHE, $HUGGINGFACE_HUB_CACHE, $HF_HOME/hub, $XDG_CACHE_HOME/huggingface/hub,
~/.cache/huggingface/hub:

    models--ggml-org--gemma-3-4b-it-GGUF/refs/main                  the commit
    models--ggml-org--gemma-3-4b-it-GGUF/snapshots/COMMIT/FILE.gguf

A model is "repo:TAG", TAG the file name's last -word or .word in capitals (gemma-3-4b-it-Q4_K_M
.gguf: Q4_K_M), a split model named by its first shard; projectors ("mmproj") and draft
sidecars are not models. A repo named without a tag is its Q4_K_M, else its Q8_0, else its
first model (llama-server's find_best_model); the hub's file lists are read by the same rules.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

SPLIT = re.compile(r"^(.+)-(\d{5})-of-(\d{5})$", re.I)
TAG = re.compile(r"[-.]([A-Z0-9_]+)$", re.I)
COMMIT = re.compile(r"^[0-9a-f]{40}$")
NOT_MODELS = ("mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-")
PREFERRED_TAGS = ("Q4_K_M", "Q8_0")  # llama-server's choice when a repo is named without a tag


@dataclass(slots=True)
class CachedModel:
    repo: str
    tag: str
    path: Path  # the first shard
    mmproj: Path | None = None
    files: list[Path] = field(default_factory=list)

    @property
    def id(self) -> str:
        return f"{self.repo}:{self.tag}"


def repo_dir(repo: str, root: Path | None = None) -> Path:
    """The folder of `user/model` in the cache."""
    return (cache_dir() if root is None else root) / ("models--" + repo.replace("/", "--"))


def cache_dir() -> Path:
    for var, sub in (("LLAMA_CACHE", ""), ("HF_HUB_CACHE", ""), ("HUGGINGFACE_HUB_CACHE", ""),
                     ("HF_HOME", "hub"), ("XDG_CACHE_HOME", "huggingface/hub")):
        if os.environ.get(var):
            return Path(os.environ[var]) / sub if sub else Path(os.environ[var])
    return Path.home() / ".cache" / "huggingface" / "hub"


def split_info(name: str) -> tuple[str, str, int, int]:
    """(prefix, TAG, shard index, shard count) of a GGUF file name, as llama.cpp reads it."""
    prefix = name.removesuffix(".gguf")
    index = count = 1
    m = SPLIT.match(prefix)
    if m:
        prefix, index, count = m.group(1), int(m.group(2)), int(m.group(3))
    t = TAG.search(prefix)
    return prefix, (t.group(1).upper() if t else ""), index, count


def model_files(names: list[str]) -> dict[str, list[str]]:
    """A repo's file names (paths in the repo) -> its models by TAG, each its files (a split
    model's shards, first first), in the order given; projectors and sidecars left out."""
    out: dict[str, list[str]] = {}
    for n in names:
        prefix, tag, index, count = split_info(n.rsplit("/", 1)[-1])
        if not n.endswith(".gguf") or index != 1 or not tag or \
                any(w in prefix for w in NOT_MODELS) or tag in out:
            continue
        folder = n[:len(n) - len(n.rsplit("/", 1)[-1])]
        out[tag] = [n] if count == 1 else [
            f"{folder}{prefix}-{k:05d}-of-{count:05d}.gguf" for k in range(1, count + 1)]
    return out


def pick(tags: list[str], tag: str) -> str | None:
    """The TAG a name asks for among a repo's: its own (any case), or with none llama-server's
    Q4_K_M, else Q8_0, else the first."""
    if tag:
        return tag.upper() if tag.upper() in tags else None
    return next((t for t in PREFERRED_TAGS if t in tags), tags[0] if tags else None)


def snapshot(repo_dir: Path) -> Path | None:
    """The snapshot folder refs/main (else another ref) names, if it is there."""
    refs = repo_dir / "refs"
    if not refs.is_dir():
        return None
    commits = {}
    for ref in sorted(refs.iterdir()):
        if ref.is_file():
            c = ref.read_text().strip()
            if COMMIT.match(c):
                commits[ref.name] = c
    commit = commits.get("main") or next(iter(commits.values()), None)
    snap = repo_dir / "snapshots" / commit if commit else None
    return snap if snap is not None and snap.is_dir() else None


def cached_models(root: Path | None = None) -> list[CachedModel]:
    """Every model of the cache, by repo and tag."""
    root = cache_dir() if root is None else root
    if not root.is_dir():
        return []
    out: dict[str, CachedModel] = {}
    for repo_dir in sorted(root.iterdir()):
        if not repo_dir.name.startswith("models--") or not repo_dir.is_dir():
            continue
        repo = repo_dir.name.removeprefix("models--").replace("--", "/")
        snap = snapshot(repo_dir)
        if snap is None:
            continue
        files = sorted(p for p in snap.rglob("*.gguf"))
        mmproj = next((p for p in files if "mmproj" in p.name), None)
        for p in files:
            prefix, tag, index, count = split_info(p.name)
            if index != 1 or not tag or any(w in prefix for w in NOT_MODELS):
                continue
            shards = [p] if count == 1 else [p.with_name(
                f"{prefix}-{k:05d}-of-{count:05d}.gguf") for k in range(1, count + 1)]
            out.setdefault(f"{repo}:{tag}", CachedModel(repo, tag, p, mmproj, shards))
    return list(out.values())


def find(name: str, models: list[CachedModel]) -> CachedModel | None:
    """`user/model[:tag]` among the cached models (no tag: Q4_K_M, else Q8_0, else the
    first)."""
    repo, _, tag = name.partition(":")
    same = {m.tag: m for m in models if m.repo == repo}
    chosen = pick(list(same), tag)
    return None if chosen is None else same[chosen]
