"""The router's own flags (llama-server's spelling), each on its field as the server's are
(settings.py one folder up): the parser, LLAMA_ARG_* variables and docs/flags.md read them."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...config import flag


@dataclass(slots=True)
class RouterSettings:
    models_dir: str | None = field(default=None, metadata=flag(
        "--models-dir", metavar="DIR", env="LLAMA_ARG_MODELS_DIR",
        help="router mode (with no --model): serve the models of DIR, each .gguf file one, "
             "a subfolder one model of several files (a projector whose name holds 'mmproj', "
             "the shards of a split model); each loaded one runs in its own child server"))
    models_preset: str | None = field(default=None, metadata=flag(
        "--models-preset", metavar="FILE", env="LLAMA_ARG_MODELS_PRESET",
        help="router mode (with no --model): llama-server's INI model presets, a section per "
             "model (its flags as keys without dashes, e.g. model, model-draft, ctx-size), "
             "[*] for every model; load-on-startup, stop-timeout as llama-server's"))
    hf_repo: str | None = field(default=None, metadata=flag(
        "-hf", "-hfr", "--hf-repo", metavar="USER/MODEL[:QUANT]", env="LLAMA_ARG_HF_REPO",
        help="a Hugging Face repo, downloaded into llama-server's cache ($LLAMA_CACHE, "
             "$HF_HUB_CACHE, ~/.cache/huggingface/hub; the hub at $MODEL_ENDPOINT or "
             "$HF_ENDPOINT, $HF_TOKEN sent) unless there already: a repo with a preset.ini "
             "starts the router with that preset (its models downloaded as they load); else "
             "its QUANT model (none: Q4_K_M, else Q8_0, else the first) and its projector are "
             "served, as --model and --mmproj. With --offline, the cache only"))
    models_max: int = field(default=4, metadata=flag(
        "--models-max", metavar="N", env="LLAMA_ARG_MODELS_MAX",
        help="router mode: at most N models loaded at once, the least recently used unloaded "
             "first (0: no limit)"))
    models_autoload: bool = field(default=True, metadata=flag(
        "--models-autoload", off=("--no-models-autoload",), env="LLAMA_ARG_MODELS_AUTOLOAD",
        help="router mode: a request for a model that is not loaded loads it (a request's "
             "?autoload=true|false overrides); off, it gets 400 until POST /models/load"))

    def __post_init__(self) -> None:
        from ...errors import TandemError

        if self.models_max < 0:
            raise TandemError(f"--models-max must be >= 0 (0: no limit), got {self.models_max}")

    @property
    def on(self) -> bool:
        return bool(self.models_dir or self.models_preset)
