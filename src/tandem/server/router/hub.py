"""Downloads from the Hugging Face hub into llama-server's cache (hfcache.py's folder and
layout), as llama-server does them (common/download.cpp, common/hf-cache.cpp), with
huggingface_hub:

    plan(NAME)      NAME = user/model[:TAG]: the repo's files at its current commit; a repo with
                    a preset.ini at its root is a preset (that file only), else the model TAG
                    picks (hfcache.pick: no TAG is Q4_K_M, else Q8_0, else the first), all its
                    shards, and the projector beside it ("mmproj", the nearest in bits)
    fetch(plan)     each file into the cache (blobs/, snapshots/COMMIT/FILE, refs/main), the
                    progress to a callback; a cancel or failure removes what it wrote
    remove(NAME)    a cached model's files (TAG: the files of that tag; none: the whole repo),
                    blobs no other file uses too (llama-server's common_download_remove)

The hub's address is $MODEL_ENDPOINT (llama.cpp's), else $HF_ENDPOINT, else huggingface.co;
$HF_TOKEN is sent when set. Errors are HubError: `status` 400 for a name the hub does not have,
502 when the hub cannot be reached or answers otherwise.

The router's side (POST /models, DELETE /models, a preset's models fetched before they load):
downloads.py.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ...errors import TandemError
from . import hfcache

NAME = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(:[\w.-]+)?$")
PRESET = "preset.ini"


class HubError(TandemError):
    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class Cancelled(Exception):
    """A download stopped on request (DELETE /models of it)."""


def endpoint() -> str:
    for var in ("MODEL_ENDPOINT", "HF_ENDPOINT"):
        if os.environ.get(var):
            return os.environ[var].rstrip("/")
    return "https://huggingface.co"


def token() -> str | None:
    return os.environ.get("HF_TOKEN") or None


def split_name(name: str) -> tuple[str, str]:
    """`user/model[:tag]` -> (repo, tag), or a HubError saying the form."""
    if not isinstance(name, str) or not NAME.match(name) or ".." in name:
        raise HubError(f"model '{name}': not a Hugging Face model name; expected "
                       "<user>/<model>[:quant], e.g. ggml-org/gemma-3-1b-it-GGUF:Q4_K_M")
    repo, _, tag = name.partition(":")
    return repo, tag


@dataclass(slots=True)
class Plan:
    name: str
    repo: str
    tag: str  # the model's TAG ("" for a preset repo)
    commit: str
    files: list[str] = field(default_factory=list)  # paths in the repo, the model's first
    preset: bool = False

    @property
    def id(self) -> str:
        """The name GET /models will list it by (user/model:TAG)."""
        return self.repo if self.preset else f"{self.repo}:{self.tag}"

    def url(self, file: str) -> str:
        return f"{endpoint()}/{self.repo}/resolve/{self.commit}/{file}"


def plan(name: str) -> Plan:
    """What downloading `name` fetches (one request to the hub: the repo's file list)."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import (GatedRepoError, RepositoryNotFoundError,
                                        RevisionNotFoundError)

    repo, tag = split_name(name)
    try:
        info = HfApi(endpoint=endpoint(), token=token()).model_info(repo)
    except GatedRepoError:
        raise HubError(f"model '{name}': {repo} is gated at {endpoint()}: accept its terms "
                       "there and set HF_TOKEN") from None
    except (RepositoryNotFoundError, RevisionNotFoundError):
        raise HubError(f"model '{name}': no repository {repo} at {endpoint()} (or it is "
                       "private: set HF_TOKEN)") from None
    except Exception as e:  # HfHubHTTPError, OSError, its HTTP client's own (httpx)
        raise HubError(f"model '{name}': the hub at {endpoint()} did not answer: "
                       f"{type(e).__name__}: {first_line(e)}", 502) from None
    names = [s.rfilename for s in (info.siblings or [])]
    if not info.sha:
        raise HubError(f"model '{name}': the hub at {endpoint()} gave no commit for {repo}", 502)
    if PRESET in names:
        return Plan(name, repo, "", info.sha, [PRESET], preset=True)
    models = hfcache.model_files(names)
    chosen = hfcache.pick(list(models), tag)
    if chosen is None:
        ggufs = [n for n in names if n.endswith(".gguf")]
        raise HubError(f"model '{name}': {repo} has no GGUF model"
                       f"{f' of tag {tag.upper()}' if tag else ''}; its GGUF files: "
                       f"{', '.join(ggufs) or 'none'}")
    files = models[chosen]
    projector = _mmproj(names, files[0])
    return Plan(name, repo, chosen, info.sha, files + ([projector] if projector else []))


def first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [""])[0]


def _bits(name: str) -> int:
    tag = hfcache.split_info(name.rsplit("/", 1)[-1])[1]
    m = re.search(r"\d+", tag)
    return int(m.group()) if m else 0


def _mmproj(names: list[str], model: str) -> str | None:
    """llama-server's projector for `model`: a GGUF whose name holds "mmproj" in the model's
    folder or one above it (the deepest first), then the nearest in bits."""
    folder = model.split("/")[:-1]
    best, best_key = None, None
    for n in names:
        if not n.endswith(".gguf") or "mmproj" not in n:
            continue
        parts = n.split("/")[:-1]
        if parts != folder[:len(parts)]:
            continue
        key = (-len(parts), abs(_bits(n) - _bits(model)))
        if best_key is None or key < best_key:
            best, best_key = n, key
    return best


Progress = Callable[[str, int, "int | None"], None]  # (url, bytes done, total)


def fetch(p: Plan, progress: Progress, cancel: threading.Event) -> Path:
    """Every file of `p` into the cache, then refs/main = its commit; the path of its first
    file. On a failure or a cancel (Cancelled), the files it wrote are removed."""
    from huggingface_hub import hf_hub_download

    root = hfcache.cache_dir()
    repo_dir = hfcache.repo_dir(p.repo, root)
    snap = repo_dir / "snapshots" / p.commit
    had = {f for f in p.files if (snap / f).exists()}
    parts = set((repo_dir / "blobs").glob("*.incomplete"))  # another's: left alone
    paths = []
    try:
        for f in p.files:
            if cancel.is_set():
                raise Cancelled()
            paths.append(Path(hf_hub_download(
                p.repo, f, revision=p.commit, cache_dir=root, endpoint=endpoint(),
                token=token(), tqdm_class=_bar(p.url(f), progress, cancel))))
        (repo_dir / "refs").mkdir(parents=True, exist_ok=True)
        tmp = repo_dir / "refs" / ".main.tmp"
        tmp.write_text(p.commit)
        os.replace(tmp, repo_dir / "refs" / "main")
    except BaseException:
        _remove_files(repo_dir, [snap / f for f in p.files if f not in had])
        for part in set((repo_dir / "blobs").glob("*.incomplete")) - parts:
            part.unlink(missing_ok=True)
        raise
    return paths[0]


def _bar(url: str, progress: Progress, cancel: threading.Event):
    """A tqdm class huggingface_hub draws its progress with: each update goes to `progress`
    (at most every 0.1 s, and the last), and raises Cancelled once `cancel` is set."""
    import time

    from tqdm.auto import tqdm

    class Bar(tqdm):
        def __init__(self, *args, **kwargs):
            kwargs.pop("name", None)  # (huggingface_hub's own tqdm's, not tqdm's)
            kwargs["disable"] = True  # no bar on the router's stderr
            super().__init__(*args, **kwargs)
            self._last = 0.0
            progress(url, int(self.n), self.total)

        def update(self, n=1):
            if cancel.is_set():
                raise Cancelled()
            self.n += n  # (a disabled tqdm counts nothing itself)
            now = time.monotonic()
            if now - self._last >= 0.1 or (self.total and self.n >= self.total):
                self._last = now
                progress(url, int(self.n), self.total)

    return Bar


def remove(name: str) -> bool:
    """llama-server's common_download_remove: `user/model:TAG`'s files of that TAG (a split
    model's shards, a projector of the same tag) out of the current snapshot, and the blobs
    nothing else links to; `user/model` alone: the whole repo. False if nothing was there."""
    repo, tag = split_name(name)
    repo_dir = hfcache.repo_dir(repo)
    if not tag:
        if not repo_dir.is_dir():
            return False
        shutil.rmtree(repo_dir)
        return True
    snap = hfcache.snapshot(repo_dir)
    if snap is None:
        return False
    doomed = [p for p in snap.rglob("*.gguf")
              if hfcache.split_info(p.name)[1] == tag.upper()]
    _remove_files(repo_dir, doomed)
    return bool(doomed)


def _remove_files(repo_dir: Path, files: list[Path]) -> None:
    """Snapshot entries, then the blobs they linked to that no other entry links to."""
    blobs = set()
    for f in files:
        if f.is_symlink():
            blobs.add(os.path.realpath(f))
        if f.is_symlink() or f.exists():
            f.unlink()
    if not blobs:
        return
    used = {os.path.realpath(p) for p in (repo_dir / "snapshots").rglob("*") if p.is_symlink()}
    for b in blobs - used:
        if b.startswith(str(repo_dir.resolve()) + os.sep):  # never outside the repo's folder
            Path(b).unlink(missing_ok=True)
