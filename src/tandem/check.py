"""`tandem check`: can this target (and draft) run here? Compatibility and memory, no loading.

Reads each model's metadata, tensor shapes and vocabulary (not its weights), applies the
target/draft compatibility rules and prints the memory plan. Exit status: 0 it can run, 1 it
cannot (incompatible draft, or the plan does not fit), 2 bad input (missing or unreadable model
file, bad setting).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from . import flags
from .config import EngineConfig, SpecConfig
from .errors import ModelFileError
from .memory import MemoryPlan, ModelSpec, PlanRow, fmt_bytes, plan
from .models.args import ModelArgs
from .speculative.compat import CompatResult, check_compatible


@dataclass(slots=True)
class ModelInfo:
    """What check reads from one model: no weights are loaded."""

    path: Path
    args: ModelArgs
    spec: ModelSpec
    tokenizer: object  # tandem.tokenizer.Tokenizer
    size: int  # bytes on disk


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `tandem check` (spelled as for serve and generate)."""
    flags.add_model_args(parser, parallel=True)
    flags.add_spec_args(parser)
    parser.add_argument("--mmproj", "-mm", default=None, metavar="FILE",
                        help="the target's multimodal projector (as for serve): checked "
                             "against the target and counted in the memory plan")


def run(a: argparse.Namespace) -> int:
    """Print the verdict; 0 it can run, 1 it cannot; bad input raises TandemError (exit 2,
    reported by cli.main)."""
    spec = flags.spec_config(a)
    cfg = flags.engine_config(a)
    target = inspect_model("target", a.model)
    print(_describe(target))
    draft = head = None
    if "draft-eagle3" in spec.types:
        head = inspect_head(a.model_draft, target)
        print(f"draft: {head.path} (EAGLE-3 head, {head.source}, {head.cfg.dim} wide, reads "
              f"target layers {list(head.cfg.target_layers)}; matches the target)")
    elif spec.uses_draft:
        draft = inspect_model("draft", a.model_draft)
        print(_describe(draft))
    for m in (target, draft):
        if m is not None and cfg.ctx_size > m.args.max_seq_len:
            print(f"warning: --ctx-size {cfg.ctx_size} exceeds the {m.spec.role}'s trained "
                  f"context of {m.args.max_seq_len} tokens; quality degrades beyond it")
    compat = None if draft is None else check_compatible(target.tokenizer, draft.tokenizer)
    if head is None:
        print(_compat_line(compat))
    if a.mmproj is not None:  # the whole file checked, and its width against the target's
        from .models.vision import load_mmproj

        vision = load_mmproj(a.mmproj)
        vision.check_text_model(target.args, target.path)
        print(f"mmproj: {vision.path} (Gemma 3 projector, {vision.image_size} x "
              f"{vision.image_size} images, {vision.tokens_per_image} tokens each, "
              f"{vision.text_dim}-wide)")
    models = [m.spec for m in (target, draft) if m is not None]
    if head is not None:
        models.append(head_spec(head))
    mem = plan(models, cfg, spec.spare_positions, pool_tokens=_pool_tokens(spec),
               draft_vocab=spec.draft_vocab if draft is not None else 0)
    if a.mmproj is not None:
        mem.rows.append(_mmproj_row(a.mmproj))
    print(mem.format())
    return _verdict(compat, mem)


def memory_plan(cfg: EngineConfig, spec: SpecConfig, model: str, model_draft: str | None,
                embeddings: bool = False, mmproj: str | None = None) -> MemoryPlan:
    """The plan for a target (and a draft where `spec` uses it), read without loading;
    embeddings: the server's --embedding / --reranking (memory.plan); mmproj: the target's
    image encoder (--mmproj), held in float32 with one image's activations."""
    if "draft-eagle3" in spec.types:  # the head is checked against the target's vocabulary
        target = inspect_model("target", model)
        models = [target.spec, head_spec(inspect_head(model_draft, target))]
    else:
        models = [inspect_spec("target", model)]
        if spec.uses_draft:
            models.append(inspect_spec("draft", model_draft))
    out = plan(models, cfg, spec.spare_positions, embeddings=embeddings,
               pool_tokens=_pool_tokens(spec),
               draft_vocab=spec.draft_vocab if spec.uses_draft
               and "draft-eagle3" not in spec.types else 0)
    if mmproj is not None:
        out.rows.append(_mmproj_row(mmproj))
    return out


def inspect_head(model_draft: str, target: ModelInfo):
    """An EAGLE-3 head (name or path) read and checked against the target, nothing loaded."""
    from .models.eagle3 import read_head
    from .registry import resolve

    return read_head(resolve(model_draft), target.args, getattr(target.tokenizer, "tokens", None))


def head_spec(head) -> ModelSpec:
    """The plan's view of a head: one layer, no vocabulary of its own to hold."""
    args = dataclasses.replace(head.cfg.args(), vocab_size=0)
    return ModelSpec("draft", args, head.shapes(), head.path.name, head.source)


def _mmproj_row(path: str) -> PlanRow:
    """The projector's row of the plan: its tensors in float32, one image's activations."""
    from .models.vision import mmproj_memory

    weights, working = mmproj_memory(path)
    return PlanRow("mmproj", Path(path).name, "dense float32", weights, 0, working, ("-", "-"))


def _pool_tokens(spec: SpecConfig) -> int:
    """The suffix pool's budget where the server's speculation searches it."""
    return spec.suffix_pool if "suffix" in (spec.types or ()) else 0


def inspect_model(role: str, model: str) -> ModelInfo:
    """A model name or path (GGUF file or Hugging Face directory) -> its args, shapes, vocab."""
    from .registry import resolve

    path = resolve(model)
    if path.is_dir() and (path / "config.json").is_file():
        return _inspect_hf(role, path)
    return _inspect_gguf(role, path)


def inspect_spec(role: str, model: str) -> ModelSpec:
    """What the memory plan reads of a model: its args and tensors. A GGUF's vocabulary is not
    built (the tokenizer is most of inspect_model's time: 0.3 of 0.5 s for the default target);
    a Hugging Face folder is read as inspect_model reads it."""
    from .registry import resolve

    path = resolve(model)
    if path.is_dir() and (path / "config.json").is_file():
        return _inspect_hf(role, path).spec
    from .models.gguf_file import GGUFFile
    from .models.loader import args_from_gguf

    g = GGUFFile(path)
    return ModelSpec.from_gguf(role, g, args_from_gguf(g))


def _inspect_gguf(role: str, path: Path) -> ModelInfo:
    from .models.gguf_file import GGUFFile
    from .models.loader import args_from_gguf
    from .tokenizer import Tokenizer

    g = GGUFFile(path)
    args = args_from_gguf(g)
    tok = Tokenizer.from_gguf_metadata(g.metadata)
    return ModelInfo(path, args, ModelSpec.from_gguf(role, g, args), tok, g.size_on_disk)


def _inspect_hf(role: str, path: Path) -> ModelInfo:
    from .models.loader import args_from_hf_config
    from .tokenizer import Tokenizer

    try:
        cfg = json.loads((path / "config.json").read_text())
        args = args_from_hf_config(cfg, path)
    except (OSError, json.JSONDecodeError) as e:
        raise ModelFileError(f"{path}/config.json cannot be read: {e}") from None
    except KeyError as e:
        raise ModelFileError(f"{path}/config.json has no {e.args[0]!r}") from None
    spec = ModelSpec.from_hf_dir(role, path, args)
    if not spec.tensors:
        raise ModelFileError(f"{path} has config.json but no *.safetensors files")
    size = sum(f.stat().st_size for f in path.glob("*.safetensors"))
    return ModelInfo(path, args, spec, Tokenizer.from_hf_dir(path), size)


def _describe(m: ModelInfo) -> str:
    a = m.args
    return (f"{m.spec.role}: {m.path} ({a.arch}, {a.n_layers} layers, dim {a.dim}, "
            f"{a.n_heads}/{a.n_kv_heads} heads, vocab {a.vocab_size}, {fmt_bytes(m.size)} on disk)")


def _compat_line(r: CompatResult | None) -> str:
    if r is None:
        return "draft: none (no --model-draft, or --spec-type does not use it)"
    if r.ok:
        return f"draft: {r.message}"
    return f"draft: INCOMPATIBLE ({r.rule}): {r.message}"


def _verdict(compat: CompatResult | None, mem: MemoryPlan) -> int:
    reasons = []
    if compat is not None and not compat.ok:
        reasons.append(f"the draft fails the {compat.rule} rule")
    if not mem.fits:
        reasons.append(f"the plan needs {fmt_bytes(mem.total)} but {fmt_bytes(mem.available)} "
                       f"is available (lower --ctx-size or --parallel, or use a smaller model)")
    if reasons:
        print("verdict: cannot run: " + "; ".join(reasons))
        return 1
    print("verdict: can run")
    return 0
